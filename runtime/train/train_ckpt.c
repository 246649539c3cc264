/*
 * train_ckpt.c - a run's checkpoints: what goes in (every parameter and
 * optimizer-state tensor by name, the position in the data, the optimizer
 * step, the seed, the bad-step and rollback counts), when they are
 * written, and how a run resumes or rolls back. The file format and the
 * atomic commit live in io/checkpoint.c.
 *
 * The position is (step, epoch, batch in epoch, samples): the global batch
 * is fixed by the job, so a checkpoint resumes on any number of ranks at
 * the same sample, with the accumulation recomputed for the new world size.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/checkpoint.h"
#include "io/snapshot.h"
#include "dist.h"
#include "core/log.h"
#include "train_impl.h"
#include "weights.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "runtime/monitor/watchdog.h"

/* parameters and two optimizer states each, and the buffers */
#define MAX_CKPT_TENSORS (DT_MODEL_MAX_PARAMS * 4)
#define MAX_LISTED 256

/* Host staging for the checkpoint: one block per flat buffer (parameters,
 * then each optimizer state), then the model's buffers (running
 * statistics), and the tensor list pointing into it. A sharded optimizer
 * (comm.shard) stages its own state only: each of its tensors is given as
 * the pieces this rank holds (io/checkpoint.h), which a save writes and a
 * load reads, whatever the world size or shard the file was saved with
 * (the file holds every tensor whole). */
#define MAX_BLOCKS 3 /* the parameters and at most two optimizer states */
struct ckpt_staging {
    float *host;
    int nbuf;
    size_t off[MAX_BLOCKS]; /* where each block starts in host */
    int shard;              /* the optimizer blocks are this rank's shard */
    int pshard;             /* and the parameters' block (comm.shard: parameters) */
    /* On a backend whose memory is the host's the tensors point into the
     * parameters and the optimizer state themselves, and only the model's
     * buffers are copied: a save runs between steps, so nothing changes
     * them meanwhile; a load reads a file verified first, and a load that
     * fails ends the run (or the evaluation) anyway, so a state half read
     * is never trained on. */
    int direct;
    /* A background checkpoint's snapshot: always a copy (training goes on
     * while it is written), in dt_backend_host_alloc's memory (pinned on a
     * GPU, so the device's copy into it runs at full speed). */
    dt_backend_t *pinned;
    float *bufs; /* the model's buffers: after the nbuf blocks */
    struct dt_ckpt_tensor *t; /* MAX_CKPT_TENSORS entries */
    int n;
    struct dt_ckpt_piece *pieces; /* the shard's pieces of the optimizer tensors */
};

/* The pieces of elements [a, b) of the flat buffers that the shard holds,
 * as runs of the tensor starting at a, into q (returned count), and where
 * the first one's values are in a state block (*at). The shard's ranges
 * are packed in order, so a tensor's pieces are one run of the block. */
static int shard_pieces(const struct run *r, size_t a, size_t b, struct dt_ckpt_piece *q,
                        size_t *at)
{
    const size_t *lo, *hi, *base;
    size_t count = dt_optim_shard(r->opt, &lo, &hi, &base);
    int n = 0;
    *at = 0;
    for (size_t k = 0; k < count; k++) {
        size_t x = lo[k] > a ? lo[k] : a, y = hi[k] < b ? hi[k] : b;
        if (x >= y)
            continue;
        if (n == 0)
            *at = base[k] + (x - lo[k]);
        q[n++] = (struct dt_ckpt_piece){x - a, y - a};
    }
    return n;
}

static float *buffer(struct run *r, int b)
{
    const char *name;
    size_t n;
    if (b == 0)
        return r->shard == 3 ? dt_reducer_shard_params(r->red, &n) : dt_model_params(r->model);
    return dt_optim_state(r->opt, b - 1, &name);
}

/* Whether block b holds this rank's shard only, and its floats. */
static int block_sharded(const struct ckpt_staging *s, int b)
{
    return b > 0 ? s->shard : s->pshard;
}

static size_t block_numel(struct run *r, const struct ckpt_staging *s, int b)
{
    size_t n = dt_model_num_params(r->model);
    if (b > 0 && s->shard) n = dt_optim_state_numel(r->opt);
    if (b == 0 && s->pshard) (void)dt_reducer_shard_params(r->red, &n);
    return n;
}

static void stage_names(struct run *r, struct ckpt_staging *s)
{
    size_t np = 0;
    s->n = 0;
    for (int b = 0; b < s->nbuf; b++) {
        const char *state = NULL;
        if (b > 0)
            dt_optim_state(r->opt, b - 1, &state);
        for (int i = 0; i < dt_model_param_count(r->model); i++) {
            const struct dt_param_info *p = dt_model_param(r->model, i);
            struct dt_ckpt_tensor *t = &s->t[s->n++];
            if (b == 0)
                snprintf(t->name, sizeof t->name, "params/%s", p->name);
            else
                snprintf(t->name, sizeof t->name, "optim/%s/%s", state, p->name);
            float *block = s->direct ? buffer(r, b) : s->host + s->off[b];
            t->shape = p->shape;
            t->data = block + p->offset;
            t->pieces = NULL;
            t->npieces = 0;
            if (block_sharded(s, b)) {
                size_t at;
                t->pieces = s->pieces + np;
                t->npieces = shard_pieces(r, p->offset, p->offset + p->numel, s->pieces + np, &at);
                t->data = block + at;
                np += (size_t)t->npieces;
            }
        }
    }
    for (int i = 0; i < dt_model_buffer_count(r->model); i++) {
        const struct dt_param_info *p = dt_model_buffer(r->model, i);
        struct dt_ckpt_tensor *t = &s->t[s->n++];
        snprintf(t->name, sizeof t->name, "buffers/%s", p->name);
        t->shape = p->shape;
        t->data = s->bufs + p->offset;
        t->pieces = NULL;
        t->npieces = 0;
    }
}

/* Staging for a save or a load; states: the optimizer's blocks (0 for
 * the parameters alone); snapshot: a copy of everything in the backend's
 * host memory, for a background write. */
static dt_status staging_open(struct run *r, struct ckpt_staging *s, int states, int snapshot)
{
    const size_t *lo, *hi, *base;
    size_t nshard = states ? dt_optim_shard(r->opt, &lo, &hi, &base) : 0;
    s->nbuf = 1 + states;
    s->shard = nshard > 0;
    s->pshard = r->shard == 3 && nshard > 0;
    s->direct = !snapshot && !dt_backend_caps(r->be)->device_memory;
    s->pinned = snapshot ? r->be : NULL;
    size_t at = 0;
    for (int b = 0; b < s->nbuf && !s->direct; b++) {
        s->off[b] = at;
        at += block_numel(r, s, b);
    }
    /* zeroed: the padding between tensors, which loading does not fill */
    size_t bytes = (at + dt_model_num_buffer_elems(r->model) + 1) * sizeof(float);
    dt_status st = snapshot ? dt_backend_host_alloc(r->be, bytes, (void **)&s->host)
                            : dt_calloc(bytes, 1, "checkpoint staging", (void **)&s->host);
    if (st != DT_OK && snapshot)
        st = dt_error_context(st, "the background checkpoint's snapshot (%zu MiB; "
                                  "checkpoint.async: off writes without one)", bytes >> 20);
    if (st == DT_OK)
        st = dt_calloc(MAX_CKPT_TENSORS, sizeof *s->t, "checkpoint staging", (void **)&s->t);
    if (st == DT_OK && s->shard) /* a piece per tensor and per range at most */
        st = dt_calloc(((size_t)dt_model_param_count(r->model) + nshard) * (size_t)s->nbuf + 1,
                       sizeof *s->pieces, "checkpoint staging", (void **)&s->pieces);
    if (st == DT_OK) {
        s->bufs = s->host + at;
        stage_names(r, s);
    }
    return st;
}

static void staging_close(struct ckpt_staging *s)
{
    if (s->pinned)
        dt_backend_host_free(s->pinned, s->host);
    else
        free(s->host);
    free(s->t);
    free(s->pieces);
}

/* device -> staging (to_host) or staging -> device */
static dt_status staging_copy(struct run *r, struct ckpt_staging *s, int to_host)
{
    dt_status st = DT_OK;
    for (int b = 0; b < s->nbuf && st == DT_OK && !s->direct; b++) {
        float *host = s->host + s->off[b];
        size_t bytes = block_numel(r, s, b) * sizeof(float);
        st = to_host ? dt_backend_copy(r->be, host, buffer(r, b), bytes, DT_COPY_D2H)
                     : dt_backend_copy(r->be, buffer(r, b), host, bytes, DT_COPY_H2D);
    }
    if (st == DT_OK)
        st = to_host ? dt_model_get_buffers(r->model, s->bufs)
                     : dt_model_set_buffers(r->model, s->bufs);
    return st;
}

static char *job_yaml(const struct dt_job *job)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    if (!fp)
        return NULL;
    dt_job_write_yaml(job, fp);
    fclose(fp);
    return buf;
}

/* ---- buffers ------------------------------------------------------------ */

/* Running statistics are each rank's own (unless model.sync_bn made them
 * global): before they are used for evaluation or saved, every rank takes
 * their mean over the ranks, so all ranks hold, evaluate with and save the
 * same values. */
dt_status dt_train_sync_buffers(struct run *r)
{
    size_t n = dt_model_num_buffer_elems(r->model);
    float *host = NULL;
    dt_status st = DT_OK;
    if (n == 0 || r->world == 1 || r->repro) /* reproducible: the same on every rank */
        return DT_OK;
    /* every rank trained the same steps, so every rank agrees on this flag;
     * averaging again would only add rounding (three equal values averaged
     * need not give the value back) */
    if (r->buffers_synced)
        return DT_OK;
    st = dt_malloc(n * sizeof(float), "running statistics", (void **)&host);
    if (st == DT_OK)
        st = dt_model_get_buffers(r->model, host);
    st = dt_dist_agree(r->comm, st);
    if (st == DT_OK)
        st = dt_comm_allreduce(r->comm, host, n, DT_F32, DT_COMM_AVG);
    if (st == DT_OK)
        st = dt_model_set_buffers(r->model, host);
    r->buffers_synced = st == DT_OK;
    free(host);
    return st;
}

/* ---- saving ------------------------------------------------------------- */

static void fill_meta(const struct run *r, struct dt_ckpt_meta *m)
{
    memset(m, 0, sizeof *m);
    m->step = r->step;
    m->epoch = r->epoch;
    m->batch = r->batch;
    m->samples = r->samples;
    m->seed = (uint64_t)r->job->train.seed;
    m->world = r->world;
    m->loss_scale = r->scaling ? r->scaler.scale : 1.0;
    m->optim_t = dt_optim_steps(r->opt);
    m->bad_steps = r->bad_steps;
    m->rollbacks = r->rollbacks;
    m->train_seconds = r->prior_seconds + (r->seg_start > 0 ? dt_now() - r->seg_start : 0.0);
    m->segments = r->prior_segments + 1;
    snprintf(m->version, sizeof m->version, "%s", DT_VERSION);
    snprintf(m->optimizer, sizeof m->optimizer, "%.*s", (int)sizeof m->optimizer - 1,
             r->job->train.optimizer.name);
}

static dt_status save(struct run *r, char *path, size_t len)
{
    struct ckpt_staging s = {0};
    struct dt_ckpt_meta meta;
    char *yaml = job_yaml(r->job);
    dt_status st = yaml ? DT_OK : dt_set_error(DT_ERR_NOMEM, "out of memory writing the job");
    if (st == DT_OK)
        st = dt_train_sync_buffers(r);
    if (st == DT_OK)
        st = staging_open(r, &s, dt_optim_state_count(r->opt), 0);
    if (st == DT_OK)
        st = staging_copy(r, &s, 1);
    st = dt_dist_agree(r->comm, st);
    if (st == DT_OK) {
        fill_meta(r, &meta);
        st = dt_ckpt_save(r->comm, r->ckpt_dir, &meta, s.t, s.n, yaml, path, len);
    }
    staging_close(&s);
    free(yaml);
    return st;
}

/* The checkpoint record of metrics.jsonl (rank 0): how long training was
 * blocked by the checkpoint at `step` (its snapshot, or the whole write),
 * of that how long it waited for the write before it, and how long the
 * write took. */
static dt_status ckpt_record(struct run *r, int64_t step, const char *path, int background,
                            double blocked_s, double wait_s, double write_s)
{
    if (r->rank != 0 || !r->metrics)
        return DT_OK;
    struct dt_metrics_rec rec;
    dt_metrics_begin(&rec, "checkpoint");
    dt_metrics_int(&rec, "step", step);
    const char *slash = strrchr(path, '/');
    dt_metrics_str(&rec, "file", slash ? slash + 1 : path); /* in the run's checkpoints/ */
    dt_metrics_str(&rec, "mode", background ? "background" : "synchronous");
    dt_metrics_num(&rec, "blocked_s", blocked_s, 6);
    dt_metrics_num(&rec, "checkpoint_wait_s", wait_s, 6);
    dt_metrics_num(&rec, "write_s", write_s, 6);
    return dt_metrics_put(r->metrics, &rec);
}

/* A written checkpoint: the step is on disk; rank 0 prunes. */
static void written(struct run *r, int64_t step)
{
    r->last_ckpt_step = step;
    dt_status pst = r->rank == 0 ? dt_ckpt_prune(r->ckpt_dir, (int)r->job->checkpoint.keep_last,
                                                 r->job->checkpoint.keep_every)
                                 : DT_OK;
    if (pst != DT_OK)
        DT_LOG_WARN("ckpt", "retention: %s", dt_last_error());
}

/* A checkpoint of `step` that could not be written: the run stops, or
 * with checkpoint.on_error=continue goes on with a warning. */
static dt_status not_written(struct run *r, dt_status st, int64_t step)
{
    if (st == DT_ERR_COMM || st == DT_ERR_TIMEOUT ||
        strcmp(r->job->checkpoint.on_error, "continue") != 0)
        return dt_error_context(st, "checkpoint at step %lld", (long long)step);
    DT_LOG_WARN("ckpt", "step %lld: checkpoint not written, training continues "
                        "(checkpoint.on_error=continue): %s",
                (long long)step, dt_last_error());
    r->last_ckpt_time = dt_now();
    return DT_OK;
}

int dt_train_ckpt_writing(struct run *r) { return r->writer && dt_ckpt_writer_busy(r->writer); }

dt_status dt_train_ckpt_collect(struct run *r)
{
    char path[4096 + 128] = "";
    double write_s = 0;
    if (!r->writer || !dt_ckpt_writer_pending(r->writer))
        return DT_OK;
    int snap = dt_ckpt_writer_is_snap(r->writer);
    dt_watchdog_phase(r->wd, "waiting for the background checkpoint", r->bg_step);
    dt_status st = dt_ckpt_writer_wait(r->writer, path, sizeof path, &write_s);
    dt_watchdog_idle(r->wd);
    if (snap)
        return dt_train_snap_collected(r, st, write_s);
    if (st != DT_OK)
        return not_written(r, st, r->bg_step);
    DT_LOG_INFO("ckpt",
                "step %lld: checkpoint %s written (%s) in the background in %.2fs; training "
                "waited %.3fs for it (%.3fs of that for the write before it)",
                (long long)r->bg_step, path, r->bg_why, write_s, r->bg_blocked, r->bg_waited);
    written(r, r->bg_step);
    return ckpt_record(r, r->bg_step, path, 1, r->bg_blocked, r->bg_waited, write_s);
}

dt_status dt_train_ckpt_async_ready(struct run *r)
{
    dt_status st = DT_OK;
    if (!r->writer || r->bg)
        return DT_OK;
    if (!(r->bg_yaml = job_yaml(r->job)))
        st = dt_set_error(DT_ERR_NOMEM, "out of memory writing the job");
    if (st == DT_OK)
        st = dt_calloc(1, sizeof *r->bg, "checkpoint staging", (void **)&r->bg);
    if (st == DT_OK && (st = staging_open(r, r->bg, dt_optim_state_count(r->opt), 1)) != DT_OK) {
        staging_close(r->bg);
        free(r->bg);
        r->bg = NULL;
    }
    if (st == DT_OK) { /* its pages now, not at the first checkpoint's copy */
        uint64_t bytes, layout;
        void *p = dt_train_snap_buffer(r, &bytes, &layout);
        memset(p, 0, (size_t)bytes);
    }
    return dt_dist_agree(r->comm, st);
}

/* Copies the state into the snapshot and hands it to the writer. */
static dt_status snapshot(struct run *r)
{
    struct dt_ckpt_meta meta;
    dt_status st = dt_dist_agree(r->comm, dt_train_snap_take(r, &meta));
    if (st != DT_OK)
        return st;
    return dt_dist_agree(r->comm, dt_ckpt_writer_submit(r->writer, r->ckpt_dir, &meta, r->bg->t,
                                                        r->bg->n, r->bg_yaml));
}

dt_status dt_train_ckpt_save_periodic(struct run *r, const char *why)
{
    if (!r->writer)
        return dt_train_ckpt_save(r, why);
    if (r->last_ckpt_step == r->step)
        return DT_OK; /* this state is already on disk */
    double t0 = dt_now();
    dt_status st = dt_train_ckpt_collect(r); /* one write in flight at a time */
    double waited = dt_now() - t0;
    if (st != DT_OK)
        return st;
    if (waited > 0.001)
        DT_LOG_INFO("ckpt", "step %lld: the checkpoint waited %.3fs for the one before it",
                    (long long)r->step, waited);
    dt_watchdog_phase(r->wd, "checkpoint snapshot", r->step);
    st = snapshot(r);
    dt_watchdog_idle(r->wd);
    if (st != DT_OK)
        return not_written(r, st, r->step);
    r->bg_step = r->step;
    r->bg_waited = waited;
    r->bg_blocked = dt_now() - t0;
    snprintf(r->bg_why, sizeof r->bg_why, "%s", why);
    r->last_ckpt_time = dt_now();
    DT_LOG_DEBUG("ckpt", "step %lld: state copied for the checkpoint in %.3fs; written in the "
                         "background",
                 (long long)r->step, r->bg_blocked - waited);
    return DT_OK;
}

dt_status dt_train_ckpt_save(struct run *r, const char *why)
{
    char path[4096 + 128] = "";
    double t0 = dt_now();
    dt_status st = dt_train_ckpt_collect(r); /* the write in flight first */
    double waited = dt_now() - t0;
    if (st != DT_OK)
        return st;
    if (r->last_ckpt_step == r->step)
        return DT_OK; /* this state is already on disk */
    double t1 = dt_now();
    dt_watchdog_phase(r->wd, "checkpoint", r->step);
    /* a sharded optimizer's state is written by the ranks holding it */
    st = save(r, path, sizeof path);
    dt_watchdog_idle(r->wd);
    if (st != DT_OK)
        return not_written(r, st, r->step);
    r->last_ckpt_time = dt_now();
    DT_LOG_INFO("ckpt", "step %lld: checkpoint %s written (%s) in %.2fs", (long long)r->step, path,
                why, dt_now() - t1);
    written(r, r->step);
    return ckpt_record(r, r->step, path, 0, dt_now() - t0, waited, dt_now() - t1);
}

dt_status dt_train_ckpt_async_open(struct run *r)
{
    const char *mode = r->job->checkpoint.async;
    int periodic = r->job->checkpoint.every_steps > 0 || r->job->checkpoint.every_minutes > 0;
    if (r->eval_only || strcmp(mode, "off") == 0 || !periodic)
        return DT_OK;
    dt_status st = dt_comm_create_side(&r->side_comm);
    if (st == DT_ERR_UNSUPPORTED) { /* before any collective: the same on every rank */
        if (strcmp(mode, "on") == 0)
            return dt_set_error(DT_ERR_USAGE,
                                "checkpoint.async: on, but %s; set checkpoint.async: auto (or "
                                "off) to write checkpoints synchronously, or use an MPI built "
                                "with thread support",
                                dt_last_error());
        if (r->rank == 0)
            DT_LOG_INFO("ckpt", "checkpoints are written synchronously (checkpoint.async: auto): "
                                "%s", dt_last_error());
        dt_clear_error();
        return DT_OK;
    }
    if (st == DT_OK)
        st = dt_ckpt_writer_create(r->side_comm, &r->writer);
    return dt_dist_agree(r->comm, st);
}

void dt_train_ckpt_async_close(struct run *r)
{
    dt_ckpt_writer_destroy(r->writer);
    r->writer = NULL;
    dt_comm_destroy(r->side_comm);
    r->side_comm = NULL;
    if (r->bg)
        staging_close(r->bg);
    free(r->bg);
    r->bg = NULL;
    free(r->bg_yaml);
    r->bg_yaml = NULL;
}

/* ---- loading --------------------------------------------------------------- */

/* Keys a checkpoint must share with the job it resumes. */
static void compat_diff(const struct dt_job *a, const struct dt_job *b, char *out, size_t len)
{
    size_t k = 0;
    out[0] = '\0';
#define DIFF_STR(field, key)                                                                       \
    if (strcmp(a->field, b->field) != 0 && k < len)                                                \
        k += (size_t)snprintf(out + k, len - k, "%s%s: job '%s', checkpoint '%s'", k ? "; " : "",  \
                              key, a->field, b->field);
#define DIFF_INT(field, key)                                                                       \
    if (a->field != b->field && k < len)                                                           \
        k += (size_t)snprintf(out + k, len - k, "%s%s: job %lld, checkpoint %lld", k ? "; " : "",  \
                              key, (long long)a->field, (long long)b->field);
    DIFF_STR(model.type, "model.type")
    DIFF_INT(model.nhidden, "model.hidden (layers)")
    for (int i = 0; i < a->model.nhidden && i < b->model.nhidden; i++)
        DIFF_INT(model.hidden[i], "model.hidden (width)")
    DIFF_STR(model.activation, "model.activation")
    if (strcmp(a->model.type, "cnn") == 0 || strcmp(a->model.type, "resnet") == 0) {
        DIFF_INT(model.nchannels, "model.channels (stages)")
        for (int i = 0; i < a->model.nchannels && i < b->model.nchannels; i++)
            DIFF_INT(model.channels[i], "model.channels (width)")
    }
    if (strcmp(a->model.type, "resnet") == 0)
        for (int i = 0; i < a->model.nblocks && i < b->model.nblocks; i++)
            DIFF_INT(model.blocks[i], "model.blocks")
    DIFF_INT(model.nlayers, "model.layers (count)")
    for (int i = 0; i < a->model.nlayers && i < b->model.nlayers; i++) {
        DIFF_STR(model.layers[i].kind, "model.layers (kind)")
        DIFF_STR(model.layers[i].name, "model.layers (name)")
    }
    DIFF_STR(train.optimizer.name, "train.optimizer.name")
    DIFF_INT(train.global_batch, "train.global_batch")
    DIFF_INT(train.seed, "train.seed")
    DIFF_STR(data.train_split, "data.train_split")
#undef DIFF_STR
#undef DIFF_INT
}

static dt_status check_compatible(struct run *r, const char *path, const char *yaml)
{
    struct dt_job *saved = malloc(sizeof *saved);
    if (!saved)
        return dt_set_error(DT_ERR_NOMEM, "out of memory reading %s", path);
    dt_status st = dt_job_load_text(path, yaml, saved);
    if (st == DT_OK) {
        char diff[1024];
        compat_diff(r->job, saved, diff, sizeof diff);
        if (diff[0])
            st = dt_set_error(DT_ERR_USAGE, "checkpoint %s belongs to another job: %s", path,
                              diff);
    }
    if (st == DT_OK && r->rank == 0) {
        /* the rest of what shapes training may change on resume (a lower
         * learning rate, more epochs), but never unsaid */
        static const char *const shaping[] = {"model", "data", "train", NULL};
        char diff[2048];
        int n = dt_job_diff(r->job, "this job", saved, "checkpoint", shaping, diff, sizeof diff);
        if (n > 0)
            DT_LOG_WARN("ckpt",
                        "checkpoint %s was written by a job that differs from this one in %d "
                        "key%s; training continues from it with this job's values: %s",
                        path, n, n == 1 ? "" : "s", diff);
    }
    free(saved);
    return st;
}

/* The position a checkpoint resumes at must be one this job can take: a
 * damaged header, or a training split that changed since, shows here
 * rather than as a loader error later. */
static dt_status check_position(const struct run *r, const char *path, const struct dt_ckpt_meta *m)
{
    if (m->step >= 0 && m->step <= DT_JOB_MAX_STEPS && m->epoch >= 0 && m->batch >= 0 &&
        m->batch <= r->bpe && m->samples >= 0 && m->optim_t >= 0 && isfinite(m->loss_scale) &&
        m->loss_scale > 0)
        return DT_OK;
    return dt_set_error(DT_ERR_BAD_DATA,
                        "checkpoint %s: its position (step %lld, epoch %lld, batch %lld, %lld "
                        "samples, optimizer step %lld, loss scale %g) does not fit this job "
                        "(%lld batches per epoch of split '%s'): the file is damaged, or the "
                        "training split changed since it was written",
                        path, (long long)m->step, (long long)m->epoch, (long long)m->batch,
                        (long long)m->samples, (long long)m->optim_t, m->loss_scale,
                        (long long)r->bpe, r->train->name);
}

/* After the state was copied in: the position, counters and scale of meta. */
static dt_status take_position(struct run *r, const struct dt_ckpt_meta *meta)
{
    if (r->shard == 3) { /* the slots hold the parameters before the load */
        dt_status st = dt_reducer_params_changed(r->red);
        if (st != DT_OK)
            return st;
    }
    r->step = meta->step;
    r->epoch = meta->epoch;
    r->batch = meta->batch;
    r->samples = meta->samples;
    r->loaded = 1;
    r->loaded_has_time = meta->has_time;
    r->loaded_seconds = meta->train_seconds;
    r->loaded_segments = meta->segments;
    r->bad_steps = 0;
    r->last_ckpt_step = meta->step;
    dt_optim_set_steps(r->opt, meta->optim_t);
    /* fp16 resumes at the saved loss scale; a checkpoint from an fp32 run
     * stores 1, and then the scale starts afresh at 2^16. */
    if (r->scaling) {
        dt_scaler_init(&r->scaler);
        if (meta->loss_scale > 1.0)
            r->scaler.scale = meta->loss_scale;
    }
    return DT_OK;
}

/* ---- the snapshot buffer, for in-memory snapshots (train_snap.c) ---------- */

void *dt_train_snap_buffer(struct run *r, uint64_t *bytes, uint64_t *layout)
{
    const struct ckpt_staging *s = r->bg;
    *bytes = 0;
    *layout = 0;
    if (!s)
        return NULL;
    size_t floats = (size_t)(s->bufs - s->host) + dt_model_num_buffer_elems(r->model);
    *bytes = (uint64_t)floats * sizeof(float);
    uint64_t v[6 + MAX_BLOCKS] = {(uint64_t)r->world,
                                  (uint64_t)r->shard,
                                  (uint64_t)s->nbuf,
                                  (uint64_t)dt_model_num_buffer_elems(r->model),
                                  (uint64_t)dt_model_num_params(r->model),
                                  (uint64_t)dt_model_param_count(r->model)};
    for (int b = 0; b < s->nbuf && b < MAX_BLOCKS; b++)
        v[6 + b] = s->off[b];
    *layout = dt_snap_checksum(v, sizeof v);
    return s->host;
}

dt_status dt_train_snap_take(struct run *r, struct dt_ckpt_meta *meta)
{
    DT_ASSERT(r->bg);
    dt_status st = dt_train_sync_buffers(r);
    if (st == DT_OK)
        st = staging_copy(r, r->bg, 1);
    fill_meta(r, meta);
    return st;
}

dt_status dt_train_snap_restore(struct run *r, const struct dt_ckpt_meta *meta)
{
    dt_status st = staging_copy(r, r->bg, 0);
    return st == DT_OK ? take_position(r, meta) : st;
}

static dt_status load_local(struct run *r, const char *path)
{
    struct ckpt_staging s = {0};
    struct dt_ckpt_info *info = calloc(1, sizeof *info);
    struct dt_ckpt_meta meta;
    dt_status st = info ? DT_OK : dt_set_error(DT_ERR_NOMEM, "out of memory");
    DT_CHECK(st);
    DT_CHECK(dt_ckpt_verify(path, info));
    DT_CHECK(check_compatible(r, path, info->job_yaml ? info->job_yaml : ""));
    DT_CHECK(staging_open(r, &s, dt_optim_state_count(r->opt), 0));
    DT_CHECK(dt_ckpt_load(path, &meta, s.t, s.n));
    DT_CHECK(check_position(r, path, &meta));
    DT_CHECK(staging_copy(r, &s, 0));
    DT_CHECK(take_position(r, &meta));
out:
    staging_close(&s);
    if (info)
        dt_ckpt_info_free(info);
    free(info);
    return st;
}

static dt_status load_params_local(struct run *r, const char *path)
{
    struct ckpt_staging s = {0};
    struct dt_ckpt_meta meta;
    dt_status st;
    DT_CHECK(staging_open(r, &s, 0, 0));
    DT_CHECK(dt_ckpt_load(path, &meta, s.t, s.n));
    DT_CHECK(staging_copy(r, &s, 0));
    r->step = meta.step;
    DT_LOG_INFO("ckpt", "%s %s: step %lld, epoch %lld, %lld samples seen",
                r->gen_only ? "generating from" : "evaluating", path, (long long)meta.step,
                (long long)meta.epoch + 1, (long long)meta.samples);
out:
    staging_close(&s);
    return st;
}

dt_status dt_train_ckpt_load_params(struct run *r, const char *path)
{
    if (dt_weights_is_external(path)) /* a Hugging Face directory or a safetensors file */
        return dt_dist_agree(r->comm, dt_weights_load(r->model, r->job, path, "checkpoint"));
    return dt_dist_agree(r->comm, load_params_local(r, path));
}

/* Rank 0 picks the newest checkpoint that verifies; "" when none. */
static dt_status pick_latest(struct run *r, char *path, size_t len)
{
    char (*names)[256] = malloc(MAX_LISTED * sizeof *names);
    int64_t steps[MAX_LISTED];
    if (!names)
        return dt_set_error(DT_ERR_NOMEM, "out of memory listing checkpoints");
    path[0] = '\0';
    int n = dt_ckpt_list(r->ckpt_dir, names, steps, MAX_LISTED);
    for (int i = 0; i < n && i < MAX_LISTED; i++) {
        char p[4096 + 300];
        snprintf(p, sizeof p, "%s/%.255s", r->ckpt_dir, names[i]);
        dt_status st = dt_ckpt_verify(p, NULL);
        if (st == DT_OK) {
            snprintf(path, len, "%.*s", (int)len - 1, p);
            break;
        }
        if (st == DT_ERR_IO) { /* unreadable now, not known to be damaged */
            free(names);
            return dt_error_context(st, "resuming from the newest checkpoint");
        }
        DT_LOG_WARN("ckpt", "skipping checkpoint %s: %s", p, dt_last_error());
    }
    free(names);
    return DT_OK;
}

/* Every rank loads `path` (chosen by rank 0 when `pick`). */
static dt_status load_agreed(struct run *r, int pick, const char *given, int *loaded)
{
    char path[4096 + 300] = "";
    dt_status st = DT_OK;
    double t0 = dt_now();
    *loaded = 0;
    if (pick && r->rank == 0)
        st = pick_latest(r, path, sizeof path);
    else if (!pick)
        snprintf(path, sizeof path, "%s", given);
    st = dt_dist_agree(r->comm, st);
    if (st == DT_OK && pick && r->world > 1)
        st = dt_comm_broadcast(r->comm, path, sizeof path, 0);
    if (st != DT_OK || !path[0])
        return st;
    st = dt_dist_agree(r->comm, load_local(r, path));
    if (st == DT_OK) {
        *loaded = 1;
        DT_LOG_INFO("ckpt", "resumed from %s: step %lld, epoch %lld, batch %lld, %lld samples "
                            "seen; %d rank%s now; verified and read in %.2fs",
                    path, (long long)r->step, (long long)r->epoch + 1, (long long)r->batch,
                    (long long)r->samples, r->world, r->world == 1 ? "" : "s", dt_now() - t0);
        if (strcmp(r->job->model.init_from, "none") != 0)
            DT_LOG_INFO("ckpt", "model.init_from (%s) is not used: the checkpoint's parameters "
                                "replace it",
                        r->job->model.init_from);
    }
    return st;
}

/* Rank 0: whether `path` is the file this run's checkpoint directory
 * continues from: the one latest names or, without a usable latest, the
 * newest by name. */
static int continues_dir(const struct run *r, const char *path)
{
    char name[256] = "", p[4096 + 300];
    struct stat a, b;
    if (dt_ckpt_latest(r->ckpt_dir, name, sizeof name) != DT_OK) {
        dt_clear_error();
        if (dt_ckpt_list(r->ckpt_dir, &name, NULL, 1) < 1) return 0;
    }
    snprintf(p, sizeof p, "%s/%s", r->ckpt_dir, name);
    return stat(path, &a) == 0 && stat(p, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* A run that does not continue the directory's newest state (it starts
 * over, or from another checkpoint) first moves the earlier checkpoints
 * aside, so that neither a restart's resume nor retention can take them
 * for this run's. */
static dt_status set_aside(struct run *r, const char *why)
{
    char moved[4096 + 64] = "";
    dt_status st = r->rank == 0 ? dt_ckpt_set_aside(r->ckpt_dir, moved, sizeof moved) : DT_OK;
    st = dt_dist_agree(r->comm, st);
    if (st == DT_OK && moved[0])
        DT_LOG_WARN("ckpt",
                    "%s: the checkpoints of the earlier run in %s were moved to %s (kept as they "
                    "were; this run never resumes from them)",
                    why, r->ckpt_dir, moved);
    return st;
}

/* --resume PATH: continues the run when PATH is its newest state;
 * otherwise this is a new run from PATH's state, which is saved at once as
 * its first checkpoint, so that a restart resumes from there and not from
 * what the directory held before. */
static dt_status resume_from(struct run *r, const char *path)
{
    int32_t cont = r->rank == 0 ? continues_dir(r, path) : 0;
    int loaded = 0;
    dt_status st = r->world > 1 ? dt_comm_broadcast(r->comm, &cont, sizeof cont, 0) : DT_OK;
    if (st == DT_OK) st = load_agreed(r, 0, path, &loaded);
    if (st != DT_OK || cont) return st;
    st = set_aside(r, "resuming from another checkpoint");
    if (st != DT_OK) return st;
    r->last_ckpt_step = -1;
    return dt_train_ckpt_save(r, "the starting point of this run");
}

dt_status dt_train_ckpt_resume(struct run *r)
{
    const char *how = r->opts && r->opts->resume ? r->opts->resume : "auto";
    int loaded = 0;
    if (strcmp(how, "auto") != 0) /* not this run's newest state: its snapshots go */
        dt_train_snap_discard(r);
    if (strcmp(how, "never") == 0) return set_aside(r, "starting over (--resume never)");
    if (strcmp(how, "auto") != 0) return resume_from(r, how);
    /* an in-memory snapshot newer than every file checkpoint is taken
     * first; the file checkpoints are read only when none is */
    int64_t newest = -1;
    char name[256];
    if (r->rank == 0 && dt_ckpt_list(r->ckpt_dir, &name, &newest, 1) < 1)
        newest = -1;
    dt_status st = r->world > 1 ? dt_comm_broadcast(r->comm, &newest, sizeof newest, 0) : DT_OK;
    if (st == DT_OK)
        st = dt_train_snap_resume(r, newest, &loaded);
    if (st != DT_OK || loaded)
        return st;
    st = load_agreed(r, 1, NULL, &loaded);
    if (st == DT_OK && !loaded) {
        DT_LOG_INFO("ckpt", "no checkpoint in %s: starting fresh", r->ckpt_dir);
        st = set_aside(r, "no checkpoint to resume from");
    }
    return st;
}

dt_status dt_train_ckpt_rollback(struct run *r)
{
    int loaded = 0;
    int64_t rollbacks = r->rollbacks + 1;
    dt_status st = dt_train_ckpt_collect(r); /* it may be the newest checkpoint */
    if (st == DT_OK)
        st = load_agreed(r, 1, NULL, &loaded);
    if (st != DT_OK)
        return st;
    if (!loaded)
        return dt_set_error(DT_ERR_USAGE,
                            "the loss or gradients were not finite for %lld steps in a row and "
                            "there is no checkpoint to roll back to; lower train.optimizer.lr, "
                            "set train.clip_norm, or enable checkpoint.every_steps",
                            (long long)r->job->runtime.max_bad_steps);
    r->rollbacks = rollbacks;
    DT_LOG_WARN("ckpt", "rolled back to step %lld (rollback %lld of at most %lld)",
                (long long)r->step, (long long)r->rollbacks,
                (long long)r->job->runtime.max_rollbacks);
    return DT_OK;
}
