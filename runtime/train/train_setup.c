/*
 * train_setup.c - everything before the first step of a run, in the order
 * the ranks agree on it: the job, the run directory (rank 0), the dataset
 * and its identity, the backend, the batch plan, the model and its
 * initial parameters, the loaders and the gradient reducer. Each stage
 * ends in an agreement, so a failure on any rank stops every rank with the
 * failing rank's message and nobody waits in a collective.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/model_file.h"
#include "core/bf16.h"
#include "dist.h"
#include "core/fault.h"
#include "core/log.h"
#include "runtime/monitor/memory.h"
#include "train_impl.h"
#include "weights.h"
#include "core/alloc.h"
#include "core/files.h"
#include "core/host.h"
#include "core/text.h"

#define TRAIN_LOG "train.log"
#define TRAIN_METRICS "metrics.jsonl"
#define TRAIN_CONFIG "config.yaml"
#define DIVISORS_SHOWN 6
#define FIRST_BUCKET_MB 1.0
#define SLOT_TEXT 256 /* host name and GPU UUID in the rank-to-GPU table */
/* The longest name dtrain gives a file below output.dir (a TensorBoard
 * file with its host name, an earlier run's checkpoint set aside) */
#define RUN_DIR_NAMES 192

/* ---- run directory (rank 0) ------------------------------------------ */

/* The job as config.yaml records it: data.path made absolute (each entry of
 * a list; a glob pattern is prefixed like a path), so the file names the
 * same dataset wherever a requeued or copied job starts from (the path is
 * not resolved further: a node-local copy stays node-local). */
static dt_status absolute_job(const struct dt_job *job, struct dt_job **out)
{
    char cwd[DT_JOB_PATH];
    dt_status st = dt_calloc(1, sizeof **out, "the resolved job", (void **)out);
    if (st != DT_OK)
        return st;
    **out = *job;
    if (job->data.path[0] == '\0' || !getcwd(cwd, sizeof cwd))
        return DT_OK;
    char *dst = (*out)->data.path;
    size_t cap = sizeof(*out)->data.path, len = 0;
    for (const char *p = job->data.path; *p;) {
        size_t n = strcspn(p, "\n");
        const char *e = p;
        int w;
        if (e[0] == '.' && e[1] == '/')
            e += 2;
        if (p[0] == '/')
            w = snprintf(dst + len, cap - len, "%s%.*s", len ? "\n" : "", (int)n, p);
        else
            w = snprintf(dst + len, cap - len, "%s%s/%.*s", len ? "\n" : "", cwd,
                         (int)(n - (size_t)(e - p)), e);
        if (w < 0 || (size_t)w >= cap - len) {
            snprintf(dst, cap, "%s", job->data.path);
            return DT_OK;
        }
        len += (size_t)w;
        p += n + (p[n] == '\n');
    }
    return DT_OK;
}

static dt_status write_config(const struct dt_job *job, const char *dir)
{
    char tmp[4096 + 64], final[4096 + 64];
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, TRAIN_CONFIG);
    snprintf(final, sizeof final, "%s/%s", dir, TRAIN_CONFIG);
    FILE *fp;
    struct dt_job *abs = NULL;
    dt_status st = absolute_job(job, &abs);
    if (st != DT_OK)
        return st;
    if ((st = dt_output_open(tmp, "the resolved job", 0, &fp)) != DT_OK) {
        free(abs);
        return st;
    }
    dt_job_write_yaml(abs, fp);
    free(abs);
    int bad = ferror(fp);
    bad |= fclose(fp) != 0;
    if (bad || rename(tmp, final) != 0) {
        unlink(tmp);
        return dt_set_error(DT_ERR_IO, "cannot write '%s': %s", final, strerror(errno));
    }
    return DT_OK;
}

static dt_status open_run_dir_local(struct run *r)
{
    const char *dir = r->job->output.dir;
    char path[4096 + 64];
    dt_status st = dt_rundir_claim(dir, r->job->output.adopt, &r->rundir);
    if (st != DT_OK)
        return st;
    if ((st = dt_mkdir_p(r->ckpt_dir)) != DT_OK)
        return dt_error_context(st, "output.dir");
    if ((st = write_config(r->job, dir)) != DT_OK)
        return st;
    snprintf(path, sizeof path, "%s/%s", dir, TRAIN_LOG);
    if ((st = dt_output_open(path, "log", 1, &r->logf)) != DT_OK)
        return st;
    int64_t cut = 0; /* a line the last run was writing when it died */
    if ((st = dt_output_end_line(r->logf, path, "log", 0, &cut)) != DT_OK) return st;
    dt_log_set_file(r->logf);
    snprintf(path, sizeof path, "%s/%s", dir, TRAIN_METRICS);
    return dt_metrics_open(path, &r->metrics);
}

dt_status dt_train_open_run_dir(struct run *r)
{
    snprintf(r->ckpt_dir, sizeof r->ckpt_dir, "%s/checkpoints", r->job->output.dir);
    /* every rank writes checkpoints through MPI-IO, by full path */
    dt_status st = dt_path_fits(r->job->output.dir, RUN_DIR_NAMES, "output.dir");
    if (st == DT_OK && r->rank == 0) st = open_run_dir_local(r);
    return dt_dist_agree(r->comm, st);
}

/* ---- data ---------------------------------------------------------------- */

static dt_status open_data_local(struct run *r)
{
    const struct dt_job *job = r->job;
    dt_status st;
    if (dt_fault_armed("open", r->rank, -1))
        return dt_set_error(DT_ERR_NOT_FOUND, "data.path: dataset %s: cannot open (DTRAIN_FAULT)",
                            job->data.path);
    for (const char *p = job->data.path; *p;) { /* one entry per line */
        char one[sizeof job->data.path];
        size_t n = strcspn(p, "\n");
        snprintf(one, sizeof one, "%.*s", (int)n, p);
        if ((st = dt_path_fits(one, 0, "data.path")) != DT_OK) return st;
        p += n + (p[n] == '\n');
    }
    if ((st = dt_dataset_open(job->data.path, &r->ds)) != DT_OK)
        return dt_error_context(st, "data.path");
    const struct dt_dataset_info *info = dt_dataset_get_info(r->ds);
    int gpt = strcmp(job->model.type, "gpt") == 0;
    if (info->lm && (st = dt_dataset_set_seq_len(r->ds, job->data.seq_len)) != DT_OK)
        return dt_error_context(st, "data.seq_len");
    if (info->lm && !gpt && strcmp(job->model.type, "layers") != 0)
        return dt_set_error(DT_ERR_USAGE,
                            "model.type %s classifies samples, but dataset %s holds token "
                            "streams (a language-model dataset); use model.type gpt, or layers",
                            job->model.type, info->path);
    if (!info->lm && gpt)
        return dt_set_error(DT_ERR_USAGE,
                            "model.type gpt is a language model, but dataset %s holds "
                            "classification samples; import text or tokens with 'dtrain data "
                            "import text' or 'dtrain data import tokens'",
                            info->path);
    if (info->lm && job->model.vocab_size > 0 && job->model.vocab_size < info->vocab_size)
        return dt_set_error(DT_ERR_USAGE,
                            "model.vocab_size %lld is smaller than the vocabulary of dataset %s "
                            "(%lld tokens); use 0 (the dataset's) or at least %lld",
                            (long long)job->model.vocab_size, info->path,
                            (long long)info->vocab_size, (long long)info->vocab_size);
    DT_CHECK(dt_dataset_split(r->ds, job->data.train_split, &r->train));
    DT_CHECK(dt_dataset_split(r->ds, job->data.test_split, &r->test));
    for (int k = 0; k < 2; k++) {
        const struct dt_split_info *s = k ? r->test : r->train;
        if (s->n < 1) {
            st = dt_set_error(DT_ERR_BAD_DATA,
                              "dataset %s: split '%s' (data.%s_split) holds no samples",
                              dt_dataset_get_info(r->ds)->path, s->name, k ? "test" : "train");
            goto out;
        }
    }
    int same = r->train->ndim == r->test->ndim;
    for (int i = 0; same && i < r->train->ndim; i++)
        same = r->train->shape[i] == r->test->shape[i];
    if (!same)
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "dataset '%s': splits '%s' and '%s' have different sample shapes",
                          dt_dataset_get_info(r->ds)->path, r->train->name, r->test->name);
out:
    return st;
}

/* What must be the same on every rank: classes, normalisation, and per
 * split the size, shape, dtypes and label counts. */
static void split_identity(const struct dt_split_info *s, int classes, char *out, size_t len)
{
    int k = snprintf(out, len, "%s: %lld x ", s->name, (long long)s->n);
    for (int d = 0; d < s->ndim && k > 0 && (size_t)k < len; d++)
        k += snprintf(out + k, len - (size_t)k, "%s%lld", d ? "x" : "", (long long)s->shape[d]);
    if (k > 0 && (size_t)k < len)
        snprintf(out + k, len - (size_t)k, " %s/%s labels %016llx", dt_dtype_name(s->x_dtype),
                 dt_dtype_name(s->y_dtype),
                 (unsigned long long)dt_hash64(s->class_counts,
                                               (size_t)classes * sizeof s->class_counts[0]));
}

static void dataset_identity(const struct run *r, char *out, size_t len)
{
    const struct dt_dataset_info *info = dt_dataset_get_info(r->ds);
    char tr[256], te[256];
    if (info->lm) {
        snprintf(out, len, "[vocabulary %lld %s; %s %lld tokens; %s %lld tokens; windows of %lld]",
                 (long long)info->vocab_size, info->tokenizer, r->train->name,
                 (long long)r->train->tokens, r->test->name, (long long)r->test->tokens,
                 (long long)info->seq_len);
        return;
    }
    split_identity(r->train, info->num_classes, tr, sizeof tr);
    split_identity(r->test, info->num_classes, te, sizeof te);
    snprintf(out, len, "[%d classes, norm %.9g/%.9g/%.9g; %s; %s]", info->num_classes,
             (double)info->norm_scale, (double)info->norm_mean, (double)info->norm_std, tr, te);
}

dt_status dt_train_open_data(struct run *r)
{
    dt_status st = dt_dist_agree(r->comm, open_data_local(r));
    if (st != DT_OK)
        return st;
    char id[600];
    dataset_identity(r, id, sizeof id);
    return dt_dist_check_same(r->comm, "the dataset", id, DT_ERR_BAD_DATA);
}

/* ---- backend --------------------------------------------------------------- */

static int rank_threads(const struct run *r)
{
    return dt_rank_threads(r->job->runtime.threads, dt_comm_local_size(r->comm));
}

/* One GPU per rank of a node: local rank -> visible device. With fewer
 * devices than ranks (a per-task CUDA_VISIBLE_DEVICES from Slurm shows each
 * rank one), ranks wrap around, and check_gpu_sharing tells a real sharing
 * apart by device UUID. */
static int rank_device(const struct run *r)
{
    int count = dt_cuda_device_count();
    return count > 0 ? dt_comm_local_rank(r->comm) % count : 0;
}

/* runtime.device resolved: auto takes the backend the registry prefers
 * that is usable here (a GPU, else the CPU, with the reason logged once). */
static dt_status resolve_device(struct run *r, const char **name)
{
    const struct dt_job *job = r->job;
    char why[512];
    *name = job->runtime.device;
    if (strcmp(*name, "auto") != 0)
        return DT_OK;
    *name = dt_backend_auto(rank_device(r), why, sizeof why);
    if (r->rank == 0 && why[0]) DT_LOG_INFO("runtime", "device: %s; %s", *name, why);
    return DT_OK;
}

static dt_status backend_local(struct run *r, const char **name)
{
    const struct dt_job *job = r->job;
    struct dt_backend_opts o = {.threads = r->threads,
                                .reference_kernels = job->runtime.reference_kernels,
                                .allow_tf32 = job->runtime.allow_tf32,
                                .precision = (enum dt_dtype)dt_precision_parse(
                                    job->train.precision)};
    dt_status st = resolve_device(r, name);
    if (st != DT_OK)
        return st;
    const struct dt_backend_caps *caps = dt_backend_caps_named(*name);
    if (caps && caps->per_device) o.device = rank_device(r);
    st = dt_backend_create(*name, &o, &r->be);
    if (st != DT_OK)
        return dt_error_context(st, "runtime.device=%s", *name);
    if (r->rank == 0 && !dt_backend_caps(r->be)->device_memory && getenv(DT_BLAS_FALLBACK_ENV)) {
        char blas[512];
        dt_blas_info(blas, sizeof blas);
        DT_LOG_INFO("runtime", "BLAS: %s", blas);
    }
    return DT_OK;
}

/* Ranks of one node on one GPU: an error unless runtime.share_gpus. */
static dt_status check_gpu_sharing(struct run *r, int *shared)
{
    struct slot {
        char host[SLOT_TEXT];
        char uuid[SLOT_TEXT];
    } mine, *all = NULL;
    dt_status st = DT_OK;
    *shared = 0;
    memset(&mine, 0, sizeof mine);
    if (r->world == 1 || dt_backend_device_uuid(r->be)[0] == '\0')
        return DT_OK;
    snprintf(mine.host, sizeof mine.host, "%s", dt_comm_host(r->comm));
    snprintf(mine.uuid, sizeof mine.uuid, "%s", dt_backend_device_uuid(r->be));
    DT_CHECK(dt_calloc((size_t)r->world, sizeof *all, "the rank-to-GPU table", (void **)&all));
    DT_CHECK(dt_comm_allgather(r->comm, &mine, all, sizeof mine));
    for (int i = 0; i < r->world && !*shared; i++)
        for (int j = i + 1; j < r->world && !*shared; j++)
            if (!strcmp(all[i].host, all[j].host) && !strcmp(all[i].uuid, all[j].uuid)) {
                *shared = 1;
                if (!r->job->runtime.share_gpus) {
                    st = dt_set_error(
                        DT_ERR_USAGE,
                        "ranks %d and %d on %s would share one GPU (%s): this node runs %d "
                        "ranks but they see %d GPU%s. Start one rank per GPU, give each rank "
                        "its own (CUDA_VISIBLE_DEVICES, srun --gpus-per-task=1), or set "
                        "runtime.share_gpus: true to share them (slower)",
                        i, j, all[i].host, all[i].uuid, dt_comm_local_size(r->comm),
                        dt_cuda_device_count(), dt_cuda_device_count() == 1 ? "" : "s");
                    goto out;
                }
                if (r->rank == 0)
                    DT_LOG_WARN("runtime", "ranks %d and %d on %s share GPU %s "
                                           "(runtime.share_gpus); gradients go through host "
                                           "memory over MPI",
                                i, j, all[i].host, all[i].uuid);
            }
out:
    free(all);
    return st;
}

/* The gradient communicator: comm.backend; auto = a device-buffer one
 * (nccl) for device memory, unless ranks share a GPU (which NCCL
 * refuses), else a host-buffer one (mpi). A host-buffer communicator on
 * device memory stages the gradients through host memory. */
static dt_status open_grad_comm(struct run *r, int shared)
{
    const char *want = r->job->comm.backend;
    int device = dt_backend_caps(r->be)->device_memory;
    r->grad_comm = r->comm;
    if (r->world == 1 || r->eval_only)
        return DT_OK;
    if (strcmp(want, "auto") == 0) want = dt_comm_auto(device, shared);
    const struct dt_comm_caps *cc = dt_comm_caps_named(want);
    if (!cc)
        return dt_set_error(DT_ERR_USAGE,
                            "comm.backend=%s is not a communicator this dtrain "
                            "knows; set comm.backend to auto",
                            want);
    if (cc->device_buffers && !device)
        return dt_set_error(DT_ERR_USAGE,
                            "comm.backend=%s all-reduces GPU memory, but this run trains on the "
                            "%s; set comm.backend to mpi or auto",
                            want, dt_backend_name(r->be));
    if (cc->device_buffers && shared && !cc->shares_device)
        return dt_set_error(DT_ERR_USAGE,
                            "comm.backend=%s cannot run two ranks on one GPU "
                            "(runtime.share_gpus); set comm.backend to mpi or auto",
                            want);
    if (dt_comm_is(r->comm, want)) { /* the control communicator serves */
        r->stage_grads = device && !cc->device_buffers;
        return DT_OK;
    }
    dt_status st = dt_comm_create(want, &r->own_comm);
    if (st == DT_OK)
        st = dt_comm_bind_stream(r->own_comm, dt_backend_stream(r->be));
    if (st == DT_OK) {
        dt_comm_set_timeout(r->own_comm, r->job->runtime.timeout_s);
        r->grad_comm = r->own_comm;
    }
    return st == DT_OK ? st : dt_error_context(st, "comm.backend=%s", want);
}

dt_status dt_train_choose_backend(struct run *r)
{
    const char *name = "cpu";
    int shared = 0;
    r->threads = rank_threads(r);
    dt_status st = dt_dist_agree(r->comm, backend_local(r, &name));
    if (st != DT_OK)
        return st;
    st = dt_dist_check_same(r->comm, "the compute device (runtime.device)", name, DT_ERR_USAGE);
    if (st == DT_OK)
        st = dt_dist_agree(r->comm, check_gpu_sharing(r, &shared));
    if (st == DT_OK)
        st = dt_dist_agree(r->comm, open_grad_comm(r, shared));
    if (st != DT_OK)
        return st;
    r->scaling = strcmp(r->job->train.precision, "fp16") == 0;
    dt_scaler_init(&r->scaler);
    int precision = dt_precision_parse(r->job->train.precision);
    if (r->rank == 0 && precision >= 0 &&
        !(dt_backend_caps(r->be)->native_precisions & DT_PRECISION_BIT(precision)))
        DT_LOG_WARN("runtime",
                    "train.precision=%s on the %s rounds matmul inputs as a GPU's "
                    "tensor cores would, but is slower than fp32 here",
                    r->job->train.precision, dt_backend_name(r->be));
    char line[DT_DIST_MSG];
    snprintf(line, sizeof line, "rank %d/%d on %s, local rank %d/%d, device %s, %s, %d thread%s%s",
             r->rank, r->world, dt_comm_host(r->comm), dt_comm_local_rank(r->comm),
             dt_comm_local_size(r->comm), dt_backend_device(r->be), r->job->train.precision,
             r->threads, r->threads == 1 ? "" : "s",
             r->job->runtime.reference_kernels ? ", reference kernels" : "");
    return dt_dist_log_lines(r->comm, "runtime", line);
}

/* ---- batch plan -------------------------------------------------------- */

static void list_divisors(int64_t n, char *out, size_t len)
{
    int shown = 0, k = 0;
    out[0] = '\0';
    for (int64_t d = 1; d <= n && shown < DIVISORS_SHOWN; d++) {
        if (n % d)
            continue;
        k += snprintf(out + k, len - (size_t)k, "%s%lld", shown ? ", " : "", (long long)d);
        shown++;
        if ((size_t)k >= len)
            break;
    }
}

/* global batch = micro-batch x accumulation x ranks */
static dt_status plan_batches(struct run *r)
{
    const struct dt_job *job = r->job;
    int64_t g = job->train.global_batch, n = r->world;
    if (g < n)
        return dt_set_error(DT_ERR_USAGE,
                            "train.global_batch=%lld is smaller than the %lld ranks; every rank "
                            "needs at least one sample per step: use at least %lld",
                            (long long)g, (long long)n, (long long)n);
    if (g % n)
        return dt_set_error(DT_ERR_USAGE,
                            "train.global_batch=%lld does not split evenly over %lld ranks; use "
                            "a multiple of %lld such as %lld or %lld",
                            (long long)g, (long long)n, (long long)n, (long long)(g / n * n),
                            (long long)((g / n + 1) * n));
    r->per_rank = g / n;
    r->micro = job->train.micro_batch > 0 ? job->train.micro_batch : r->per_rank;
    if (r->per_rank % r->micro) {
        char divs[128];
        list_divisors(r->per_rank, divs, sizeof divs);
        return dt_set_error(DT_ERR_USAGE,
                            "train.micro_batch=%lld does not divide the %lld samples each rank "
                            "takes per step (train.global_batch=%lld over %lld ranks); use a "
                            "divisor of %lld: %s, ...",
                            (long long)r->micro, (long long)r->per_rank, (long long)g,
                            (long long)n, (long long)r->per_rank, divs);
    }
    if (g > r->train->n)
        return dt_set_error(DT_ERR_USAGE,
                            "train.global_batch=%lld is larger than split '%s' (%lld samples)",
                            (long long)g, r->train->name, (long long)r->train->n);
    return dt_repro_plan(r);
}

/* ---- model, loaders, reducer ---------------------------------------------- */

static void log_layer(void *ctx, const char *s) { DT_LOG_INFO("model", "%s", s); }

/* Evaluation batch over all ranks: train.eval_batch, but no larger than the
 * test split, at least one row per rank, and a multiple of the ranks. */
static int64_t eval_global_batch(const struct run *r)
{
    int64_t eg = r->job->train.eval_batch < r->test->n ? r->job->train.eval_batch : r->test->n;
    if (r->repro) { /* reproducible: whole shards on every rank */
        int64_t unit = r->shard_rows * r->world;
        return eg < unit ? unit : eg - eg % unit;
    }
    if (eg < r->world)
        eg = r->world;
    return eg - eg % r->world;
}

/* The run's length from train.steps, or train.epochs x steps per epoch,
 * and the warm-up checked against it. */
static dt_status plan_length(struct run *r)
{
    const struct dt_job *job = r->job;
    if (job->train.steps > 0)
        r->total_steps = job->train.steps;
    else if (!dt_mul_i64(job->train.epochs, r->bpe, &r->total_steps))
        return dt_set_error(DT_ERR_USAGE,
                            "train.epochs=%lld x %lld steps per epoch is more steps than dtrain "
                            "can count; use fewer epochs",
                            (long long)job->train.epochs, (long long)r->bpe);
    r->epochs = (r->total_steps + r->bpe - 1) / r->bpe;
    if (job->train.schedule.warmup_steps > r->total_steps)
        return dt_set_error(DT_ERR_USAGE,
                            "train.schedule.warmup_steps (%lld) is longer than the whole run "
                            "(%lld steps: train.epochs=%lld x %lld steps per epoch); the learning "
                            "rate would never reach train.optimizer.lr",
                            (long long)job->train.schedule.warmup_steps, (long long)r->total_steps,
                            (long long)job->train.epochs, (long long)r->bpe);
    return DT_OK;
}

/* The loaders' batch buffers come from the backend (pinned on a GPU, so
 * an upload reads them directly). */
static dt_status batch_alloc(void *be, size_t bytes, void **out)
{
    return dt_backend_host_alloc(be, bytes, out);
}
static void batch_free(void *be, void *p)
{
    dt_backend_host_free(be, p);
}
static dt_status batch_idle(void *be, const void *p)
{
    return dt_backend_host_idle(be, p);
}

static dt_status create_loaders(struct run *r)
{
    const struct dt_job *job = r->job;
    dt_status st;
    struct dt_loader_opts lo = {.ds = r->ds,
                                .split = job->data.train_split,
                                .global_batch = job->train.global_batch,
                                .micro_batch = r->micro,
                                .rank = r->rank,
                                .world = r->world,
                                .seed = (uint64_t)job->train.seed,
                                .shuffle = job->data.shuffle,
                                .drop_last = job->data.drop_last,
                                .workers = (int)job->data.workers,
                                .prefetch = (int)job->data.prefetch,
                                .crop_padding = (int)job->data.augment.crop_padding,
                                .hflip = job->data.augment.hflip,
                                .shift_windows = 1,
                                .cache = strcmp(job->data.cache, "memory") == 0
                                             ? DT_LOADER_CACHE_MEMORY
                                             : DT_LOADER_CACHE_NONE,
                                .cache_max_mb = job->data.cache_max_mb,
                                .buffers = {batch_alloc, batch_free, batch_idle, r->be},
                                .aligned = r->repro};
    if (!r->eval_only && (st = dt_loader_create(&lo, &r->train_ld)) != DT_OK)
        return st;
    /* evaluation: every test sample once, each rank a slice of each batch */
    int64_t eg = eval_global_batch(r);
    lo.split = job->data.test_split;
    lo.global_batch = eg;
    lo.micro_batch = eg / r->world;
    r->eval_global = eg;
    lo.shuffle = 0;
    lo.drop_last = 0;
    lo.crop_padding = 0; /* the test split is never augmented */
    lo.hflip = 0;
    lo.shift_windows = 0; /* the same windows at every evaluation */
    lo.cache = DT_LOADER_CACHE_NONE; /* data.cache is the training split's */
    if ((st = dt_loader_create(&lo, &r->test_ld)) != DT_OK || r->eval_only)
        return st;
    r->bpe = dt_loader_batches_per_epoch(r->train_ld);
    if (r->bpe < 1)
        return dt_set_error(DT_ERR_USAGE, "an epoch of split '%s' has no full global batch",
                            r->train->name);
    return plan_length(r);
}

/* comm.grad_dtype=bf16: the reducer packs each bucket to bf16 before its
 * all-reduce and unpacks the sum after. Gradients in the backend's memory
 * go through the backend's cast ops (in stream order on a GPU); staged
 * host copies are converted here. */
static dt_status wire_pack(void *ctx, uint16_t *wire, const float *g, size_t n)
{
    struct run *r = ctx;
    if (!r->stage_grads)
        return dt_backend_ops(r->be)->to_bf16(r->be, wire, g, n);
    dt_bf16_pack(wire, g, n);
    return DT_OK;
}

static dt_status wire_unpack(void *ctx, float *g, const uint16_t *wire, size_t n)
{
    struct run *r = ctx;
    if (!r->stage_grads)
        return dt_backend_ops(r->be)->from_bf16(r->be, g, wire, n);
    dt_bf16_unpack(g, wire, n);
    return DT_OK;
}

static dt_status open_wire(struct run *r, size_t n)
{
    r->wire = (struct dt_reducer_wire){.pack = wire_pack, .unpack = wire_unpack, .ctx = r};
    return !r->stage_grads ? dt_backend_alloc(r->be, n * sizeof(uint16_t), (void **)&r->wire.wire)
                           : dt_malloc(n * sizeof(uint16_t), "the bf16 copy of the gradients",
                                       (void **)&r->wire.wire);
}

/* Loader buffers for `rows`-row micro-batches of a split: the prefetch
 * slots (inputs, labels, ids), each reader's staging of one read, and the
 * epoch permutation. */
static uint64_t loader_bytes(const struct run *r, const struct dt_split_info *s, int64_t rows)
{
    const struct dt_job *job = r->job;
    /* a row: its inputs, its labels (a language model's: one per token) and its id */
    int64_t labels = dt_dataset_get_info(r->ds)->lm ? s->sample_elems : 1;
    int64_t row = s->sample_elems * (int64_t)sizeof(float) + 4 * labels + 8, slots, reads, perm,
            all;
    int64_t staging = s->sample_elems * (int64_t)sizeof(float) + 32;
    if (!dt_mul_i64(job->data.prefetch * rows, row, &slots) ||
        !dt_mul_i64(job->data.workers * rows, staging, &reads) || !dt_mul_i64(s->n, 8, &perm) ||
        __builtin_add_overflow(slots, reads, &all) || __builtin_add_overflow(all, perm, &all))
        return UINT64_MAX;
    return (uint64_t)all;
}

static uint64_t times(uint64_t a, uint64_t b)
{
    uint64_t p;
    return __builtin_mul_overflow(a, b, &p) ? UINT64_MAX : p;
}

/* The job asks for a sharded optimizer state: comm.shard optimizer or
 * auto, and not the older comm.sharded_update: false. */
static int sharding(const struct dt_job *job)
{
    return strcmp(job->comm.shard, "none") != 0 && job->comm.sharded_update;
}

/* Whether the optimizer state can be sharded here, which takes the
 * sharded update: each bucket reduce-scattered over the ring in fp32,
 * every gradient in the backend's memory; else 0 and why. */
static int shard_why(const struct run *r, char *why, size_t len)
{
    const struct dt_job *job = r->job;
    why[0] = '\0';
    if (!dt_comm_has_ring(r->grad_comm))
        snprintf(why, len, "the %.40s communicator has no reduce-scatter for it (comm.backend)",
                 dt_comm_backend(r->grad_comm));
    else if (!dt_comm_device_buffers(r->grad_comm) && strcmp(job->comm.mpi_allreduce, "ring") != 0)
        snprintf(why, len, "comm.mpi_allreduce is %.40s; it takes the ring",
                 job->comm.mpi_allreduce);
    else if (r->stage_grads)
        snprintf(why, len, "the gradients travel through host memory (a GPU with the mpi "
                           "communicator)");
    else if (strcmp(job->comm.grad_dtype, "bf16") == 0)
        snprintf(why, len, "comm.grad_dtype is bf16; it takes fp32 gradients");
    return !why[0];
}

/* Whether the gradients can be sharded too (comm.shard: gradients, and
 * parameters, which shards them as well): the same, with the gradients
 * and parameters in host memory (their staging area and gather slots are
 * the reducer's); else 0 and why. */
static int shard_grads_why(const struct run *r, char *why, size_t len)
{
    if (!shard_why(r, why, len)) return 0;
    if (dt_backend_caps(r->be)->device_memory)
        snprintf(why, len,
                 "the gradients are in the %.40s backend's device memory; sharded "
                 "gradients and parameters run on the cpu backend",
                 dt_backend_name(r->be));
    return !why[0];
}

/* What this run shards (comm.shard) into r->shard: 0 nothing, 1 the
 * optimizer state, 2 the gradients too. A stage asked for by name where
 * it cannot run is a usage error saying why; auto quietly shards the
 * optimizer state where it can and keeps it whole elsewhere. One rank has
 * nothing to shard. */
static dt_status plan_shard(struct run *r)
{
    char why[256];
    const char *stage = r->job->comm.shard;
    int params = strcmp(stage, "parameters") == 0;
    int grads = params || strcmp(stage, "gradients") == 0;
    r->shard = 0;
    if (sharding(r->job) && r->world < 2 && !r->eval_only && strcmp(stage, "auto") != 0)
        DT_LOG_INFO("comm", "comm.shard: %s has nothing to split on one rank: it keeps the whole "
                            "model state",
                    stage);
    if (!sharding(r->job) || r->world < 2 || r->eval_only) return DT_OK;
    /* auto shards the optimizer state on host backends; with a GPU's
     * memory (NCCL) it keeps it whole unless comm.shard: optimizer asks */
    if (strcmp(stage, "auto") == 0 && dt_backend_caps(r->be)->device_memory) return DT_OK;
    if (grads ? shard_grads_why(r, why, sizeof why) : shard_why(r, why, sizeof why)) {
        r->shard = params ? 3 : grads ? 2 : 1;
        if (grads && !r->job->comm.overlap && r->rank == 0)
            DT_LOG_WARN("comm", "comm.shard: %s with comm.overlap: false keeps every "
                                "gradient bucket in the staging area until backward ends, so "
                                "it saves no gradient memory; set comm.overlap: true",
                        stage);
        return DT_OK;
    }
    if (strcmp(stage, "auto") != 0)
        return dt_set_error(DT_ERR_USAGE,
                            "comm.shard: %s cannot run here: %s; set comm.shard: none "
                            "(or auto, which shards the optimizer state where it can)",
                            stage, why);
    return DT_OK;
}

/* The gradient staging area of sharded gradients, before the first step
 * sizes it: the buckets being written and one in flight, taken as three
 * buckets, at most the whole gradient buffer. */
static uint64_t staging_estimate(const struct run *r, uint64_t p4)
{
    double b = 3.0 * r->job->comm.bucket_mb * 1048576.0;
    return b < (double)p4 ? (uint64_t)b : p4;
}

/* The stage whose memory is counted: this run's, or in dtrain
 * find-batch's one-rank trial of a job for opts->plan_world ranks the one
 * the job asks for there (auto: the optimizer state). */
static int counted_stage(const struct run *r)
{
    if (r->world > 1) return r->shard;
    if (!sharding(r->job)) return 0;
    if (strcmp(r->job->comm.shard, "parameters") == 0) return 3;
    return strcmp(r->job->comm.shard, "gradients") == 0 ? 2 : 1;
}

/* Each of n ranks' share of the state comm.shard splits, where it can
 * run: the optimizer state about 1/n of it (one bucket's rounding more),
 * with sharded gradients 1/n of them and the staging area. Counted for
 * the stage counted_stage gives; on a job of several ranks that does not
 * shard, what each stage would save, for the refusal's advice. A trial's
 * difference goes to opts->plan_saving. */
static void shard_need(const struct run *r, struct dt_mem_need *need, uint64_t p4, int states,
                       uint64_t n)
{
    char why[256];
    int stage = counted_stage(r), advise = r->world > 1;
    uint64_t before = dt_mem_add(dt_mem_add(need->optim, need->grads), need->params);
    uint64_t part = need->optim / n + times(1024, (uint64_t)states);
    int can = states && shard_why(r, why, sizeof why) && part < need->optim;
    if (can && stage >= 1)
        need->optim = part;
    else if (can && advise)
        need->shard_saving = need->optim - part;
    /* gradients and parameters alike: the shard and about three buckets of
     * room (the staging area, the gather slots) */
    part = dt_mem_add(p4 / n, staging_estimate(r, p4));
    can = shard_grads_why(r, why, sizeof why) && part < need->grads;
    if (can && stage >= 2)
        need->grads = part;
    else if (can && advise)
        need->grads_saving = need->grads - part;
    if (can && stage == 3 && part < need->params)
        need->params = part;
    else if (can && advise && part < need->params)
        need->params_saving = need->params - part;
    if (r->opts && r->opts->plan_saving)
        *r->opts->plan_saving =
            before - dt_mem_add(dt_mem_add(need->optim, need->grads), need->params);
}

/* Host memory this rank is about to allocate, against what it can have
 * (runtime/monitor/memory.h): refused with the numbers before anything large is
 * allocated. On a GPU the model lives in device memory, whose shortage
 * the CUDA backend reports itself. */
static dt_status check_memory(struct run *r, const struct dt_model_io *io, int64_t max_rows)
{
    const struct dt_job *job = r->job;
    struct dt_model_size ms;
    struct dt_mem_need need = {.rows = max_rows};
    struct dt_mem_avail avail;
    dt_status st = dt_model_measure(job, io, max_rows, &ms);
    if (st != DT_OK)
        return st;
    uint64_t p4 = times(ms.params, sizeof(float));
    int host = !dt_backend_caps(r->be)->device_memory;
    int states = r->eval_only ? 0 : dt_optim_state_count_for(job);
    need.params = host ? p4 : 0;
    need.grads = host ? p4 : 0;
    need.optim = host ? times(p4, (uint64_t)states) : 0;
    int64_t ranks = r->world > 1 ? r->world : r->opts ? r->opts->plan_world : 1;
    if (host && ranks > 1 && !r->eval_only && !r->repro) /* reproducible: never sharded */
        shard_need(r, &need, p4, states, (uint64_t)ranks);
    need.activations = host ? ms.arena_bytes : 0;
    /* checkpoints: a host backend's are written and read where the state
     * is; a device's pass through a host copy of it, and a background
     * write needs one of what this rank holds */
    need.staging = !host ? times(p4, 1 + (uint64_t)states) : 0;
    if (host && r->writer) { /* the snapshot: what this rank holds of both */
        int pshard = ranks > 1 && !r->eval_only && counted_stage(r) == 3;
        need.staging = dt_mem_add(pshard ? p4 / (uint64_t)ranks : p4, need.optim);
        /* in-memory snapshots: room for the copy kept for a rank of
         * another node, about as large */
        if (job->checkpoint.memory_every_steps > 0 && ranks > 1)
            need.staging = dt_mem_add(need.staging, need.staging);
        need.async_saving = need.staging;
        /* a stage that shards the optimizer state or the parameters
         * shrinks the snapshot by as much again */
        need.shard_saving = dt_mem_add(need.shard_saving, need.shard_saving);
        if (need.params_saving)
            need.params_saving = dt_mem_add(need.params_saving, p4 - p4 / (uint64_t)ranks);
    }
    uint64_t test = r->gen_only ? 0 : loader_bytes(r, r->test, eval_global_batch(r) / r->world);
    uint64_t train = r->eval_only ? 0 : loader_bytes(r, r->train, r->micro);
    if (!r->eval_only && strcmp(job->data.cache, "memory") == 0) { /* the split, or a shard */
        uint64_t cap = (uint64_t)job->data.cache_max_mb << 20,
                 cache = dt_loader_split_cache_bytes(r->train);
        cache = cache < cap ? cache : cap;
        train = dt_mem_add(train, cache);
    }
    need.loaders = dt_mem_add(test, train);
    uint64_t per_param = 0; /* the reducer's host buffers */
    if (!r->eval_only && r->world > 1) {
        if (strcmp(job->comm.grad_dtype, "bf16") == 0 && (host || r->stage_grads))
            per_param += sizeof(uint16_t); /* the bf16 wire */
        if (r->stage_grads)
            per_param += sizeof(float); /* host copies of the gradients */
    }
    if (!r->eval_only && r->repro) { /* the sum tree: its partial sums, the leaf, the chunks */
        int64_t k = r->nshards / r->world;
        uint64_t levels = 1;
        while (((int64_t)1 << levels) <= k)
            levels++;
        per_param += sizeof(float) * (levels + 1 + (r->world > 1 ? 2 : 0));
    }
    need.other = times(ms.params, per_param);
    need.resident = dt_mem_resident();
    dt_mem_probe(dt_comm_local_size(r->comm), &avail);
    return dt_mem_check(&need, &avail, job->runtime.memory_limit, r->rank);
}

/* Rows of the activation arena: the micro-batch (evaluation runs its
 * batches in pieces of that size), for an evaluation-only run its batch
 * per rank, for generation one. */
static int64_t arena_rows(const struct run *r)
{
    int64_t eval_rows = eval_global_batch(r) / r->world;
    if (r->gen_only)
        return 1;
    if (!r->eval_only) /* evaluation runs its batches in pieces of this size */
        return r->repro ? r->shard_rows : r->micro;
    return eval_rows > 0 ? eval_rows : 1;
}

/* The memory check, where a refusal that a micro-batch of one row would
 * not meet is due to the micro-batch's activations alone: then it is
 * reported as out of memory, which dt_train_build answers by halving
 * train.micro_batch, like a failed allocation. */
static dt_status check_memory_for_micro(struct run *r, const struct dt_model_io *io)
{
    dt_status st = check_memory(r, io, arena_rows(r));
    if (st == DT_OK || st == DT_ERR_NOMEM || r->eval_only || r->micro == 1)
        return st;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    int64_t micro = r->micro;
    r->micro = 1;
    int small_fits = check_memory(r, io, arena_rows(r)) == DT_OK;
    r->micro = micro;
    return small_fits ? dt_set_error(DT_ERR_NOMEM, "%s", msg) : dt_set_error(st, "%s", msg);
}

/* DTRAIN_FAULT oom:ROWS: the arena for a micro-batch above ROWS rows
 * cannot be allocated. */
static dt_status oom_fault(const struct run *r, const struct dt_model_io *io)
{
    int64_t rows;
    struct dt_model_size ms;
    char size[32];
    if (r->eval_only || !dt_fault_value("oom", r->rank, &rows) || r->micro <= rows)
        return DT_OK;
    dt_status st = dt_model_measure(r->job, io, arena_rows(r), &ms);
    if (st != DT_OK)
        return st;
    dt_format_bytes(ms.arena_bytes, size, sizeof size);
    return dt_set_error(DT_ERR_NOMEM,
                        "out of memory allocating %s for the activations of a %lld-row "
                        "micro-batch (DTRAIN_FAULT oom:%lld)",
                        size, (long long)r->micro, (long long)rows);
}

/* model.sync_bn: batch statistics summed over every rank (host memory). */
static dt_status sum_ranks_f64(void *ctx, double *host, size_t n)
{
    return dt_comm_allreduce((dt_comm_t *)ctx, host, n, DT_F64, DT_COMM_SUM);
}

/* comm.shard's stages this version has, and agreement with the older
 * comm.sharded_update. */
static dt_status check_shard_keys(const struct dt_job *job)
{
    const char *stage = job->comm.shard;
    if (strcmp(stage, "none") != 0 && strcmp(stage, "auto") != 0 && !job->comm.sharded_update)
        return dt_set_error(DT_ERR_USAGE,
                            "comm.shard: %s and comm.sharded_update: false disagree; "
                            "comm.sharded_update is the older spelling of comm.shard: leave it "
                            "out",
                            stage);
    return DT_OK;
}

static dt_status fetch_param(void *ctx, size_t off, size_t n, float **p)
{
    return dt_reducer_fetch(ctx, off, n, p);
}

static dt_status fetch_ahead(void *ctx, size_t off, size_t n)
{
    return dt_reducer_fetch_ahead(ctx, off, n);
}

static dt_status release_params(void *ctx) { return dt_reducer_release(ctx); }

/* Sharded parameters: this rank's chunks initialised where they are kept,
 * and the model reading every layer's parameters through the gather
 * slots. */
static dt_status own_params(struct run *r)
{
    size_t n;
    float *p = dt_reducer_shard_params(r->red, &n);
    for (size_t k = 0; k < r->nown; k++)
        dt_model_init_range(r->model, (uint64_t)r->job->train.seed, r->own_lo[k], r->own_hi[k],
                            p + r->pk_lo[k]);
    struct dt_param_hook hook = {
        .fetch = fetch_param, .ahead = fetch_ahead, .release = release_params, .ctx = r->red};
    dt_model_set_param_hook(r->model, &hook);
    return DT_OK;
}

const char *dt_train_shard_name(int shard)
{
    static const char *const names[] = {"none", "optimizer", "gradients", "parameters"};
    return shard >= 0 && shard <= 3 ? names[shard] : "?";
}

/* Sharded update: this rank's chunk of every gradient bucket. */
static dt_status own_chunks(struct run *r)
{
    size_t n = dt_reducer_bucket_count(r->red);
    dt_status st;
    DT_CHECK(dt_calloc(n, sizeof *r->own_lo, "the sharded update's ranges", (void **)&r->own_lo));
    DT_CHECK(dt_calloc(n, sizeof *r->own_hi, "the sharded update's ranges", (void **)&r->own_hi));
    DT_CHECK(dt_calloc(n, sizeof *r->pk_lo, "the sharded update's ranges", (void **)&r->pk_lo));
    DT_CHECK(dt_calloc(n, sizeof *r->pk_hi, "the sharded update's ranges", (void **)&r->pk_hi));
    size_t most = 0, at = 0;
    for (size_t k = 0; k < n; k++) {
        dt_reducer_owned(r->red, k, &r->own_lo[k], &r->own_hi[k]);
        if (r->own_hi[k] - r->own_lo[k] > most) most = r->own_hi[k] - r->own_lo[k];
        r->pk_lo[k] = at;
        at += r->own_hi[k] - r->own_lo[k];
        r->pk_hi[k] = at;
    }
    r->nown = n;
    DT_CHECK(dt_backend_reserve(r->be, DT_OP_step_gate, (int64_t)most, (int64_t)n, 0));
out:
    return st;
}

/* The offsets of the model's parameters, for the bucket plan of sharded
 * gradients (*out, freed by the caller). */
static dt_status param_offsets(const struct run *r, size_t **out)
{
    int n = dt_model_param_count(r->model);
    dt_status st = dt_calloc((size_t)n + 1, sizeof **out, "parameter offsets", (void **)out);
    for (int i = 0; st == DT_OK && i < n; i++)
        (*out)[i] = dt_model_param(r->model, i)->offset;
    return st;
}

/* micro_cap > 0: the micro-batch the out-of-memory fallback chose. */
static dt_status build_local(struct run *r, int64_t micro_cap)
{
    const struct dt_job *job = r->job;
    dt_status st;
    const struct dt_dataset_info *info = dt_dataset_get_info(r->ds);
    struct dt_model_io io = {.ndim = r->train->ndim, .num_classes = info->num_classes};
    size_t *offs = NULL;
    if (info->lm) /* the classes are the next tokens */
        io.num_classes = job->model.vocab_size > info->vocab_size ? job->model.vocab_size
                                                                  : info->vocab_size;
    for (int i = 0; i < r->train->ndim && i < 4; i++)
        io.shape[i] = r->train->shape[i];
    if (dt_split_image_shape(r->train, &io.shape[0], &io.shape[1], &io.shape[2]))
        io.ndim = 3; /* images channels first: (H, W) is (1, H, W) */
    if (r->eval_only)
        r->micro = r->per_rank = 1;
    else
        DT_CHECK(plan_batches(r));
    if (micro_cap > 0 && r->micro > micro_cap)
        r->micro = micro_cap;
    int64_t max_rows = arena_rows(r);
    if (!r->eval_only) {
        DT_CHECK(check_shard_keys(job));
        DT_CHECK(dt_repro_check_backend(r));
        if (!r->repro) DT_CHECK(plan_shard(r)); /* reproducible: the whole state everywhere */
    }
    io.grads_placed = r->shard >= 2;
    io.params_placed = r->shard == 3;
    if (dt_fault_armed("nomem", r->rank, -1)) {
        st = dt_set_error(DT_ERR_NOMEM, "out of memory allocating the model (DTRAIN_FAULT)");
        goto out;
    }
    DT_CHECK(check_memory_for_micro(r, &io));
    DT_CHECK(oom_fault(r, &io));
    DT_CHECK(dt_model_create(job, &io, r->be, max_rows, &r->model));
    /* bf16/fp16 on a GPU: the weights are rounded once per update */
    if (r->shard < 3)
        DT_CHECK(dt_backend_set_params(r->be, dt_model_params(r->model),
                                       dt_model_num_params(r->model)));
    DT_CHECK(dt_model_init_params(r->model, (uint64_t)job->train.seed));
    if (strcmp(job->model.init_from, "none") != 0 && !r->eval_only) {
        if (r->shard == 3) {
            st = dt_set_error(DT_ERR_USAGE,
                              "model.init_from needs the whole parameters on every rank; "
                              "comm.shard %s keeps a part of them per rank: start from it with "
                              "comm.shard gradients (or none), then resume with the stage you want",
                              job->comm.shard);
            goto out;
        }
        DT_CHECK(dt_weights_load(r->model, job, job->model.init_from, "model.init_from"));
    }
    if (job->model.sync_bn && r->world > 1 && !r->repro) {
        struct dt_model_sync sync = {.sum_f64 = sum_ranks_f64, .ctx = r->comm};
        dt_model_set_sync(r->model, &sync);
    }
    if (!r->eval_only) {
        /* the gradient check's partial sums, so the first step does not
         * grow the scratch (the layers reserved theirs when the model was
         * built; the sharded update's ranges, own_chunks) */
        DT_CHECK(dt_backend_reserve(r->be, DT_OP_step_gate, (int64_t)dt_model_num_params(r->model),
                                    1, 0));
    }
    r->flops_per_sample = dt_model_flops_per_sample(r->model, 1);
    r->lm = info->lm;
    r->labels_per_row = (double)dt_model_labels_per_row(r->model);
    if (!r->gen_only)
        DT_CHECK(create_loaders(r));
    DT_CHECK(dt_repro_open(r));
    if (r->world > 1 && !r->eval_only && !r->repro) {
        struct dt_reducer_opts ro = {.bucket_mb = job->comm.bucket_mb,
                                     .first_bucket_mb = FIRST_BUCKET_MB < job->comm.bucket_mb
                                                            ? FIRST_BUCKET_MB
                                                            : job->comm.bucket_mb,
                                     .overlap = job->comm.overlap};
        size_t n = dt_model_num_params(r->model);
        dt_comm_set_ring_min_bytes(r->grad_comm, strcmp(job->comm.mpi_allreduce, "library") == 0
                                                     ? SIZE_MAX
                                                     : DT_COMM_RING_MIN_BYTES);
        if (r->stage_grads) {
            DT_CHECK(dt_malloc(n * sizeof(float), "host copies of the gradients",
                               (void **)&r->host_grads));
            ro.overlap = 0; /* the whole buffer is copied out after backward */
        }
        if (strcmp(job->comm.grad_dtype, "bf16") == 0) {
            DT_CHECK(open_wire(r, n));
            ro.wire = &r->wire;
        }
        ro.shard = r->shard > 0;
        if (r->shard >= 2) {
            DT_CHECK(param_offsets(r, &offs));
            ro.shard_grads = 1;
            ro.shard_params = r->shard == 3;
            ro.param_off = offs;
            ro.nparams = (size_t)dt_model_param_count(r->model);
        }
        DT_CHECK(dt_reducer_create(r->grad_comm, r->stage_grads ? r->host_grads
                                                                : dt_model_grads(r->model),
                                   n, &ro, &r->red));
        if (ro.shard)
            DT_CHECK(own_chunks(r));
        if (r->shard == 3)
            DT_CHECK(own_params(r));
    }
    if (!r->eval_only) { /* sharded: the state of this rank's chunks only */
        DT_CHECK(dt_optim_create_sharded(job, r->be, dt_model_num_params(r->model), r->own_lo,
                                         r->own_hi, r->nown, &r->opt));
        DT_CHECK(dt_optim_groups_from_model(r->opt, job, r->model));
    }
out:
    free(offs);
    return st;
}

/* Every rank must start from the same parameters. Sharded, each rank
 * initialised its own chunks alone: there is nothing to compare. */
static dt_status check_params(struct run *r)
{
    if (r->shard == 3) {
        DT_LOG_INFO("model", "initial parameters: each of the %d ranks initialised its own "
                             "1/%d of them",
                    r->world, r->world);
        return DT_OK;
    }
    size_t n = dt_model_num_params(r->model);
    float *host = NULL;
    dt_status st = dt_malloc(n * sizeof(float), "a parameter checksum", (void **)&host);
    if (st == DT_OK)
        st = dt_model_get_params(r->model, host);
    char sum[32] = "";
    if (st == DT_OK)
        snprintf(sum, sizeof sum, "%016llx", (unsigned long long)dt_hash64(host, n * sizeof(float)));
    free(host);
    st = dt_dist_agree(r->comm, st);
    if (st != DT_OK)
        return st;
    st = dt_dist_check_same(r->comm, "the initial parameter checksum", sum, DT_ERR_INTERNAL);
    if (st == DT_OK)
        DT_LOG_INFO("model", "initial parameters identical on all %d rank%s (checksum %s)",
                    r->world, r->world == 1 ? "" : "s", sum);
    return st;
}

/* Frees what build_local made: for another try with a smaller micro-batch,
 * and at the end of the run. */
static void unbuild(struct run *r)
{
    dt_reducer_destroy(r->red);
    dt_repro_close(r);
    free(r->own_lo);
    free(r->own_hi);
    free(r->pk_lo);
    free(r->pk_hi);
    free(r->host_grads);
    if (!r->stage_grads)
        dt_backend_free(r->be, r->wire.wire);
    else
        free(r->wire.wire);
    dt_loader_destroy(r->train_ld);
    dt_loader_destroy(r->test_ld);
    dt_optim_destroy(r->opt);
    if (r->model) (void)dt_backend_set_params(r->be, NULL, 0);
    dt_model_destroy(r->model);
    r->red = NULL;
    r->own_lo = r->own_hi = r->pk_lo = r->pk_hi = NULL;
    r->nown = 0;
    r->host_grads = NULL;
    r->wire.wire = NULL;
    r->train_ld = r->test_ld = NULL;
    r->opt = NULL;
    r->model = NULL;
}

/* The largest divisor of the per-rank batch at most half of `micro`
 * (half itself when micro is even and divides it), 0 below one row. */
static int64_t smaller_micro(int64_t per_rank, int64_t micro)
{
    for (int64_t m = micro / 2; m >= 1; m--)
        if (per_rank % m == 0)
            return m;
    return 0;
}

/* build_local on every rank; out of memory for the micro-batch on any
 * rank (agreed, so every rank takes the same branch) halves
 * train.micro_batch and doubles the accumulation, which keeps the global
 * batch and so the results, down to one row. */
static dt_status build_agreed(struct run *r)
{
    int64_t cap = 0;
    for (;;) {
        dt_status st = dt_dist_agree(r->comm, build_local(r, cap));
        int fixed = r->opts && r->opts->fixed_micro_batch;
        if (st != DT_ERR_NOMEM || r->eval_only || fixed)
            return st;
        int64_t next = smaller_micro(r->per_rank, r->micro);
        if (next < 1)
            return st;
        if (r->rank == 0)
            DT_LOG_WARN("train",
                        "train.micro_batch=%lld does not fit: %s; trying micro-batch %lld x "
                        "accumulation %lld instead of %lld x %lld (global batch %lld, unchanged, "
                        "so the results are the same)",
                        (long long)r->micro, dt_last_error(), (long long)next,
                        (long long)(r->per_rank / next), (long long)r->micro,
                        (long long)(r->per_rank / r->micro), (long long)r->job->train.global_batch);
        unbuild(r);
        cap = next;
    }
}

/* The model state each rank holds (parameters, gradients, optimizer
 * state), the largest over the ranks into r->state_bytes and optim_bytes,
 * and a log line. */
static dt_status state_bytes(struct run *r)
{
    uint64_t total = (uint64_t)dt_model_num_params(r->model) * sizeof(float);
    double optim = (double)dt_optim_state_count(r->opt) * (double)dt_optim_state_numel(r->opt) *
                   sizeof(float);
    double grads = (double)total, params = (double)total;
    if (r->shard >= 2) { /* this rank's shard, and the staging area's estimate */
        size_t n = 0;
        (void)dt_reducer_shard_grads(r->red, &n);
        grads = (double)n * sizeof(float) + (double)staging_estimate(r, total);
        if (r->shard == 3) /* and the gather slots' */
            params = grads;
    }
    double d[4] = {optim, params + grads + optim, grads, params};
    dt_status st = r->world > 1 ? dt_comm_allreduce(r->comm, d, 4, DT_F64, DT_COMM_MAX) : DT_OK;
    if (st != DT_OK)
        return st;
    r->optim_bytes = (uint64_t)d[0];
    r->state_bytes = (uint64_t)d[1];
    char all[32], p[32], o[32], g[32];
    dt_format_bytes(r->state_bytes, all, sizeof all);
    dt_format_bytes((uint64_t)d[3], p, sizeof p);
    dt_format_bytes(r->optim_bytes, o, sizeof o);
    dt_format_bytes((uint64_t)d[2], g, sizeof g);
    DT_LOG_INFO("model",
                "model state %s per rank: parameters %s%s, gradients %s%s, optimizer state %s%s",
                all, p, r->shard == 3 ? " (each rank's shard and the gather slots' estimate)" : "",
                g, r->shard >= 2 ? " (each rank's shard and the staging area's estimate)" : "",
                o, r->shard ? " (each rank's shard, about 1/world of it)" : "");
    return DT_OK;
}

dt_status dt_train_build(struct run *r)
{
    const struct dt_job *job = r->job;
    dt_status st = build_agreed(r);
    if (st != DT_OK)
        return st;
    if (!r->eval_only && (st = state_bytes(r)) != DT_OK)
        return st;
    DT_LOG_INFO("model", "%s: %zu parameters in %d tensors, %.2f MFLOP per sample forward",
                job->model.type, dt_model_param_numel(r->model), dt_model_param_count(r->model),
                dt_model_flops_per_sample(r->model, 0) / 1e6);
    DT_LOG_DEBUG("model",
                 "flat buffers of %zu floats: each tensor starts on %d bytes, %zu floats "
                 "of padding between them",
                 dt_model_num_params(r->model), DT_MODEL_ALIGN_BYTES,
                 dt_model_num_params(r->model) - dt_model_param_numel(r->model));
    dt_model_describe(r->model, log_layer, NULL);
    {
        char a[32], f[32];
        uint64_t arena = dt_model_arena_bytes(r->model), full = dt_model_arena_bytes_full(r->model);
        dt_format_bytes(arena, a, sizeof a);
        dt_format_bytes(full, f, sizeof f);
        if (arena != full)
            DT_LOG_INFO("model", "activation memory %s per rank for %lld rows (model.recompute: %s; "
                                 "%s without recomputation)",
                        a, (long long)arena_rows(r), job->model.recompute, f);
        else
            DT_LOG_INFO("model", "activation memory %s per rank for %lld rows", a,
                        (long long)arena_rows(r));
    }
    if (r->eval_only)
        return check_params(r);
    DT_LOG_INFO("data",
                "%s: train %lld samples, test %lld; global batch %lld = micro-batch %lld "
                "x %lld accumulation x %d rank%s; %lld steps/epoch, %lld steps",
                dt_dataset_get_info(r->ds)->path, (long long)r->train->n, (long long)r->test->n,
                (long long)job->train.global_batch, (long long)r->micro,
                (long long)(r->per_rank / r->micro), r->world, r->world == 1 ? "" : "s",
                (long long)r->bpe, (long long)r->total_steps);
    if (r->repro && r->world > 1)
        DT_LOG_INFO("comm", "fp32 gradients summed over %s in the reproducible tree (no overlap "
                            "with backward)",
                    dt_comm_backend(r->comm));
    if (r->red)
        DT_LOG_INFO(
            "comm",
            "%s gradients %s over %s%s%s in %zu bucket%s of up to %.3g MiB, "
            "overlap %s%s",
            job->comm.grad_dtype, r->nown ? "reduce-scattered" : "all-reduced",
            dt_comm_backend(r->grad_comm),
            !(dt_comm_caps(r->grad_comm)->collectives & DT_COMM_HAS_RING) ? ""
            : strcmp(job->comm.mpi_allreduce, "library") == 0 ? " (the library's all-reduce)"
                                                              : " (ring)",
            r->stage_grads ? " (through host memory)" : "", dt_reducer_bucket_count(r->red),
            dt_reducer_bucket_count(r->red) == 1 ? "" : "s", job->comm.bucket_mb,
            job->comm.overlap ? "on" : "off",
            r->shard == 3 ? " at parameter boundaries; each rank keeps its 1/world of the "
                            "parameters, their gradients and optimizer state and updates them; "
                            "each layer's parameters are gathered before it runs"
            : r->shard == 2 ? " at parameter boundaries; each rank keeps the gradients and the "
                            "optimizer state of its 1/world of the parameters and updates them, "
                            "then they are gathered"
            : r->nown     ? "; each rank keeps the optimizer state of its 1/world of the "
                            "parameters and updates them, then they are gathered"
                          : "");
    return check_params(r);
}

#define TRAIN_MODEL "model.h5"


/* Sharded parameters: model.h5 is written tensor by tensor, each
 * parameter read from its gather slot as rank 0 comes to it; every rank
 * fetches the same parameters in the same order (fetch is collective),
 * and rank 0, after a failure, fetches the rest with the others. */
struct sourced {
    struct run *r;
    int next, np; /* parameters fetched so far, and in all */
    const float *bufs;
};

static dt_status fetch_next(struct sourced *c, const float **data)
{
    const struct dt_param_info *p = dt_model_param(c->r->model, c->next++);
    float *at = NULL;
    dt_status st = dt_reducer_release(c->r->red);
    if (st == DT_OK) st = dt_reducer_fetch(c->r->red, p->offset, p->numel, &at);
    *data = at;
    return st;
}

static dt_status source_get(void *ctx, int i, const float **data)
{
    struct sourced *c = ctx;
    if (i >= c->np) {
        *data = c->bufs + dt_model_buffer(c->r->model, i - c->np)->offset;
        return DT_OK;
    }
    return fetch_next(c, data);
}

/* Every rank: the fetches rank 0's save has not made (all of them on the
 * other ranks). */
static dt_status fetch_rest(struct sourced *c)
{
    dt_status st = DT_OK;
    const float *data;
    while (c->next < c->np && st == DT_OK)
        st = fetch_next(c, &data);
    dt_status rst = dt_reducer_release(c->r->red);
    return st != DT_OK ? st : rst;
}

static dt_status save_model_local(struct run *r, struct sourced *src)
{
    size_t n = dt_model_num_params(r->model), nb = dt_model_num_buffer_elems(r->model);
    int np = dt_model_param_count(r->model), count = np + dt_model_buffer_count(r->model);
    float *host = NULL, *params;
    struct dt_named_tensor *t = NULL;
    dt_status st;
    /* where the backend's memory is the host's, the parameters are read
     * where they are (sharded: from the gather slots, one by one); else
     * copied, the buffers after them */
    int direct = src || !dt_backend_caps(r->be)->device_memory;
    size_t copied = direct ? nb : n + nb;
    DT_CHECK(dt_malloc((copied + 1) * sizeof(float), "the final parameters", (void **)&host));
    DT_CHECK(dt_calloc((size_t)count, sizeof *t, "the model's tensor list", (void **)&t));
    params = direct ? dt_model_params(r->model) : host;
    if (!direct) DT_CHECK(dt_model_get_params(r->model, host));
    DT_CHECK(dt_model_get_buffers(r->model, host + copied - nb));
    for (int i = 0; i < count; i++) {
        const struct dt_param_info *p =
            i < np ? dt_model_param(r->model, i) : dt_model_buffer(r->model, i - np);
        snprintf(t[i].name, sizeof t[i].name, "%s", p->name);
        t[i].shape = p->shape;
        t[i].data = src && i < np ? NULL : (i < np ? params : host + copied - nb) + p->offset;
    }
    char path[4096 + 64];
    snprintf(path, sizeof path, "%s/%s", r->job->output.dir, TRAIN_MODEL);
    if (src) src->bufs = host + copied - nb;
    DT_CHECK(src ? dt_model_file_save_from(path, t, count, source_get, src)
                 : dt_model_file_save(path, t, count));
    DT_LOG_INFO("train", "final parameters written to %s", path);
out:
    free(t);
    free(host);
    return st;
}

dt_status dt_train_save_model(struct run *r)
{
    struct sourced src = {.r = r, .np = dt_model_param_count(r->model)};
    dt_status st = dt_train_sync_buffers(r);
    if (st != DT_OK)
        return st;
    dt_status local = r->rank == 0 ? save_model_local(r, r->shard == 3 ? &src : NULL) : DT_OK;
    if (r->shard == 3) {
        st = fetch_rest(&src);
        if (st != DT_OK) return st; /* the communicator failed: no agreement to reach */
    }
    return dt_dist_agree(r->comm, local);
}

void dt_train_close(struct run *r, dt_status st)
{
    /* after a communication failure a peer may never finish its part of
     * a background write: the job is being ended, so nothing is waited for */
    if (st != DT_ERR_COMM && st != DT_ERR_TIMEOUT)
        dt_train_ckpt_async_close(r);
    free(r->snap_peer_buf);
    free(r->snap_to_of);
    free(r->snap_layout_of);
    unbuild(r);
    dt_comm_destroy(r->own_comm);
    if (r->be && r->opts && r->opts->mem)
        dt_backend_mem_info(r->be, r->opts->mem);
    dt_backend_destroy(r->be);
    if (r->ds)
        dt_dataset_close(r->ds);
    dt_metrics_close(r->metrics);
    if (r->logf) {
        dt_log_set_file(NULL);
        if (st != DT_OK) /* the launcher prints it; the log keeps it too */
            fprintf(r->logf, "error: %s\n", dt_last_error());
        fclose(r->logf);
    }
    dt_rundir_release(r->rundir);
}
