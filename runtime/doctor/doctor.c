/*
 * doctor.c - `dtrain doctor`: what each rank runs on, live checks, and the
 * problems found, each with its cause and fix (see doctor.h).
 *
 * Every rank fills one fixed-size record (struct facts) with what it sees
 * and what its own checks gave, and the records are gathered to every
 * rank, so that decisions that need all of them (run the NCCL all-reduce
 * or not) are taken alike everywhere without more messages. Then comes
 * the run directory: each rank writes an HDF5 file named by its host and
 * rank there and reads it back; after a barrier, each rank looks for the
 * file of one rank on every other host. A file system that is not shared
 * shows as a missing file. A second, smaller record per rank carries
 * those results. Rank 0 alone reads the records and prints
 * (doctor_report.c); a failed local check is a finding, never an early
 * return, so that no rank leaves the others waiting in a collective.
 */
#include "doctor.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "collectives/allreduce_perf.h"
#include "io/h5probe.h"
#include "kernels/backend.h"
#include "runtime/train/dist.h"
#include "doctor_impl.h"
#include "core/fault.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/host.h"

#define GEMM_B 64
#define GEMM_IN 96
#define GEMM_OUT 80
#define GEMM_TOL 1e-4 /* largest |fast - reference| / sum |in * w| for fp32 */
#define KERNEL_N 4096
#define ALLREDUCE_BYTES ((size_t)4 << 20)
#define ALLREDUCE_ITERS 10
#define NCCL_TIMEOUT_S 120.0
#define PROBE_PREFIX ".dtrain-doctor-"

/* ---- facts -------------------------------------------------------------- */

static void env_text(const char *name, char *buf, size_t len)
{
    const char *v = getenv(name);
    snprintf(buf, len, "%s", v && *v ? v : "");
}

/* The task count a launcher announced in the environment, if any. */
static void launcher_tasks(struct facts *f)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS",
                                       "SLURM_NTASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        char *end = NULL;
        long n = v ? strtol(v, &end, 10) : 0;
        if (v && end != v && *end == '\0' && n > 0) {
            f->expected_tasks = (int)n;
            snprintf(f->expected_from, sizeof f->expected_from, "%s=%ld", vars[i], n);
            return;
        }
    }
}

/* The NVIDIA kernel module's version, which the driver reports without
 * CUDA: "550.54.15", or "" when no driver is loaded. */
static void nvidia_module(char *buf, size_t len)
{
    char line[256] = "";
    FILE *fp = fopen("/proc/driver/nvidia/version", "r");
    buf[0] = '\0';
    if (!fp)
        return;
    if (fgets(line, sizeof line, fp)) {
        const char *p = strstr(line, "Kernel Module");
        if (p) {
            p += strlen("Kernel Module");
            while (*p == ' ' || *p == '\t' || *p == ':')
                p++;
            snprintf(buf, len, "%.*s", (int)strcspn(p, " \t\n"), p);
        }
    }
    fclose(fp);
}

static void gather_facts(dt_comm_t *c, const struct dt_doctor_opts *o, struct facts *f)
{
    memset(f, 0, sizeof *f);
    f->rank = dt_comm_rank(c);
    f->local_rank = dt_comm_local_rank(c);
    f->local_size = dt_comm_local_size(c);
    f->other_host = dt_fault_armed("otherhost", f->rank, -1);
    snprintf(f->host, sizeof f->host, "%s%s", dt_comm_host(c), f->other_host ? "-otherhost" : "");
    f->threads = dt_rank_threads(o->threads, f->local_size);
    env_text("SLURM_JOB_ID", f->slurm_job, sizeof f->slurm_job);
    env_text("SLURM_PROCID", f->slurm_procid, sizeof f->slurm_procid);
    env_text("SLURM_LOCALID", f->slurm_localid, sizeof f->slurm_localid);
    launcher_tasks(f);
    nvidia_module(f->nvidia_module, sizeof f->nvidia_module);
    f->gpu_count = dt_cuda_device_count();
    f->device = f->gpu_count > 0 ? f->local_rank % f->gpu_count : 0;
    f->gpu_described = dt_cuda_device_info(f->device, &f->gpu, f->gpu_why, sizeof f->gpu_why);
    if (f->gpu_described)
        f->gpu_usable = dt_cuda_usable_device(f->device, f->gpu_why, sizeof f->gpu_why);
    f->cuda_built = dt_backend_caps_named("cuda") != NULL;
    dt_comm_library_version("mpi", f->mpi, sizeof f->mpi);
    dt_comm_library_version("nccl", f->nccl, sizeof f->nccl);
    dt_h5_library_version(f->hdf5, sizeof f->hdf5, &f->hdf5_parallel);
    dt_blas_info(f->blas, sizeof f->blas);
}

/* ---- compute checks ------------------------------------------------------- */

static void fill_pattern(float *x, size_t n, unsigned salt)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((int)((i * 37u + salt * 11u) % 101u) - 50) / 50.0f;
}

/* Largest |got - want| over sum_k |in_bk * w_ok|, the size of the
 * rounding a correct fp32 GEMM can make. */
static double gemm_error(const float *got, const float *want, const float *in, const float *w)
{
    double worst = 0;
    for (int b = 0; b < GEMM_B; b++)
        for (int j = 0; j < GEMM_OUT; j++) {
            double scale = 1e-30;
            for (int k = 0; k < GEMM_IN; k++)
                scale += fabsf(in[b * GEMM_IN + k] * w[j * GEMM_IN + k]);
            double e = fabs((double)got[b * GEMM_OUT + j] - want[b * GEMM_OUT + j]) / scale;
            if (!(e <= worst))
                worst = e; /* NaN becomes the worst */
        }
    return worst;
}

struct gemm_data {
    float in[GEMM_B * GEMM_IN], w[GEMM_OUT * GEMM_IN], want[GEMM_B * GEMM_OUT];
    float got[GEMM_B * GEMM_OUT];
};

/* The reference result, from the plain C kernels. */
static dt_status gemm_reference(struct gemm_data *g)
{
    struct dt_backend_opts ro = {.threads = 1, .reference_kernels = 1};
    dt_backend_t *ref = NULL;
    fill_pattern(g->in, GEMM_B * GEMM_IN, 1);
    fill_pattern(g->w, GEMM_OUT * GEMM_IN, 2);
    dt_status st = dt_backend_create("cpu", &ro, &ref);
    if (st == DT_OK)
        st = dt_backend_ops(ref)->linear_fwd(ref, g->want, g->in, g->w, NULL, GEMM_B, GEMM_IN,
                                             GEMM_OUT, NULL);
    dt_backend_destroy(ref);
    return st;
}

static void check_cpu_gemm(struct facts *f, struct gemm_data *g)
{
    struct dt_backend_opts fo = {.threads = f->threads};
    dt_backend_t *fast = NULL;
    dt_status st = dt_backend_create("cpu", &fo, &fast);
    if (st == DT_OK)
        st = dt_backend_ops(fast)->linear_fwd(fast, g->got, g->in, g->w, NULL, GEMM_B, GEMM_IN,
                                              GEMM_OUT, NULL);
    dt_backend_destroy(fast);
    if (st != DT_OK) {
        snprintf(f->cpu_gemm_msg, sizeof f->cpu_gemm_msg, "%s", dt_last_error());
        return;
    }
    f->cpu_gemm_err = gemm_error(g->got, g->want, g->in, g->w);
    f->cpu_gemm_ok = f->cpu_gemm_err <= GEMM_TOL;
}

/* A small kernel (ReLU) on the GPU, compared exactly with the C result. */
static dt_status gpu_kernel(dt_backend_t *be, struct facts *f)
{
    float *host = NULL, *dev = NULL;
    dt_status st;
    size_t bytes = KERNEL_N * sizeof(float);
    DT_CHECK(dt_malloc(2 * bytes, "the GPU check's host buffer", (void **)&host));
    DT_CHECK(dt_backend_alloc(be, bytes, (void **)&dev));
    fill_pattern(host, KERNEL_N, 3);
    DT_CHECK(dt_backend_copy(be, dev, host, bytes, DT_COPY_H2D));
    DT_CHECK(dt_backend_ops(be)->relu_fwd(be, dev, dev, KERNEL_N));
    DT_CHECK(dt_backend_copy(be, host + KERNEL_N, dev, bytes, DT_COPY_D2H));
    DT_CHECK(dt_backend_sync(be));
    int wrong = 0;
    for (size_t i = 0; i < KERNEL_N; i++)
        wrong += host[KERNEL_N + i] != (host[i] > 0 ? host[i] : 0.0f);
    f->gpu_kernel_ok = wrong == 0;
    if (wrong)
        snprintf(f->gpu_msg, sizeof f->gpu_msg, "the ReLU kernel gave %d wrong values of %d", wrong,
                 KERNEL_N);
out:
    dt_backend_free(be, dev);
    free(host);
    return st;
}

/* A GEMM (cuBLAS, full fp32) on the GPU against the C reference. */
static dt_status gpu_gemm(dt_backend_t *be, struct facts *f, struct gemm_data *g)
{
    float *din = NULL, *dw = NULL, *dout = NULL;
    dt_status st;
    DT_CHECK(dt_backend_alloc(be, sizeof g->in, (void **)&din));
    DT_CHECK(dt_backend_alloc(be, sizeof g->w, (void **)&dw));
    DT_CHECK(dt_backend_alloc(be, sizeof g->got, (void **)&dout));
    DT_CHECK(dt_backend_copy(be, din, g->in, sizeof g->in, DT_COPY_H2D));
    DT_CHECK(dt_backend_copy(be, dw, g->w, sizeof g->w, DT_COPY_H2D));
    DT_CHECK(
        dt_backend_ops(be)->linear_fwd(be, dout, din, dw, NULL, GEMM_B, GEMM_IN, GEMM_OUT, NULL));
    DT_CHECK(dt_backend_copy(be, g->got, dout, sizeof g->got, DT_COPY_D2H));
    DT_CHECK(dt_backend_sync(be));
    f->gpu_gemm_err = gemm_error(g->got, g->want, g->in, g->w);
    f->gpu_gemm_ok = f->gpu_gemm_err <= GEMM_TOL;
out:
    dt_backend_free(be, dout);
    dt_backend_free(be, dw);
    dt_backend_free(be, din);
    return st;
}

/* Opens this rank's GPU (kept for the NCCL all-reduce) and checks it. */
static void check_gpu(struct facts *f, struct gemm_data *g, dt_backend_t **be)
{
    struct dt_backend_opts o = {.threads = 1, .device = f->device};
    *be = NULL;
    if (!f->gpu_usable)
        return;
    f->gpu_checked = 1;
    dt_status st = dt_backend_create("cuda", &o, be);
    if (st == DT_OK)
        st = gpu_kernel(*be, f);
    if (st == DT_OK)
        st = gpu_gemm(*be, f, g);
    if (st != DT_OK)
        snprintf(f->gpu_msg, sizeof f->gpu_msg, "%s", dt_last_error());
}

/* ---- all-reduce --------------------------------------------------------- */

static int all_have_gpus(const struct facts *all, int n)
{
    for (int r = 0; r < n; r++)
        if (!all[r].gpu_usable || !all[r].gpu_kernel_ok || !all[r].gpu_gemm_ok)
            return 0;
    return 1;
}

static int gpus_shared(const struct facts *all, int n)
{
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (!strcmp(all[i].host, all[j].host) && !strcmp(all[i].gpu.uuid, all[j].gpu.uuid))
                return 1;
    return 0;
}

/* The benchmark's measurement at one size; its failures are agreed, a
 * communication error is returned for the caller to abort on. */
static dt_status run_allreduce(dt_comm_t *c, const struct dt_bench_allreduce_opts *base,
                               struct allreduce_result *res)
{
    struct dt_bench_allreduce_opts o = *base;
    o.min_bytes = o.max_bytes = ALLREDUCE_BYTES;
    o.iters = ALLREDUCE_ITERS;
    o.busbw_gbs = &res->busbw;
    double t0 = dt_now();
    dt_status st = dt_bench_allreduce(c, &o, NULL);
    res->seconds = dt_now() - t0;
    res->ran = 1;
    res->ok = st == DT_OK;
    if (st != DT_OK)
        snprintf(res->msg, sizeof res->msg, "%s", dt_last_error());
    return st == DT_ERR_COMM || st == DT_ERR_TIMEOUT ? st : DT_OK;
}

static dt_status nccl_allreduce(dt_comm_t *ctl, dt_backend_t *be, struct allreduce_result *res)
{
    dt_comm_t *nc = NULL;
    dt_status st = dt_comm_create("nccl", &nc);
    if (st == DT_OK)
        st = dt_comm_bind_stream(nc, dt_backend_stream(be));
    st = dt_dist_agree(ctl, st);
    if (st != DT_OK) {
        res->ran = 1;
        snprintf(res->msg, sizeof res->msg, "%s", dt_last_error());
        dt_comm_destroy(nc);
        return st == DT_ERR_COMM || st == DT_ERR_TIMEOUT ? st : DT_OK;
    }
    dt_comm_set_timeout(nc, NCCL_TIMEOUT_S);
    struct dt_bench_device dev = {.be = be,
                                  .alloc = dt_backend_alloc,
                                  .free = dt_backend_free,
                                  .copy = dt_backend_copy,
                                  .sync = dt_backend_sync};
    struct dt_bench_allreduce_opts o = {.device = &dev, .control = ctl};
    st = run_allreduce(nc, &o, res);
    if (st != DT_OK)
        return st; /* peers may be inside NCCL: the caller aborts the job, no clean destroy */
    dt_comm_destroy(nc);
    return DT_OK;
}

/* ---- run directory -------------------------------------------------------- */

static int is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int exists_not_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && !S_ISDIR(sb.st_mode);
}

/* The directory as every rank can name it in the report. */
static void absolute(const char *path, char *buf, size_t len)
{
    char *real = realpath(path, NULL);
    snprintf(buf, len, "%s", real ? real : path);
    free(real);
}

/* The directory to check: --dir itself, or output.dir or its nearest
 * existing parent. 0 and a message when there is none. */
static int resolve_dir(const struct dt_doctor_opts *o, struct dirfacts *d)
{
    struct stat sb;
    char path[DOCTOR_PATH];
    snprintf(path, sizeof path, "%s", o->dir);
    if (o->dir_explicit || stat(path, &sb) == 0) {
        if (is_dir(path)) {
            absolute(path, d->dir, sizeof d->dir);
            return 1;
        }
        snprintf(d->msg, sizeof d->msg, "%s %.600s %s", o->dir_origin, path,
                 stat(path, &sb) == 0 ? "is not a directory" : "does not exist");
        return 0;
    }
    while (!is_dir(path)) {
        char *slash = strrchr(path, '/');
        if (exists_not_dir(path)) {
            snprintf(d->msg, sizeof d->msg, "%s %.300s cannot be made: %.300s is not a directory",
                     o->dir_origin, o->dir, path);
            return 0;
        }
        if (!slash)
            snprintf(path, sizeof path, ".");
        else if (slash == path)
            path[1] = '\0';
        else
            *slash = '\0';
    }
    absolute(path, d->dir, sizeof d->dir);
    snprintf(d->note, sizeof d->note, "the nearest existing parent of %s %s", o->dir_origin,
             o->dir);
    return 1;
}

static void probe_name(char *buf, size_t len, const char *dir, const char *token,
                       const struct facts *f)
{
    char host[sizeof f->host];
    size_t i = 0;
    for (; f->host[i]; i++) {
        char ch = f->host[i];
        int keep = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                   (ch >= '0' && ch <= '9') || ch == '-' || ch == '.';
        host[i] = keep ? ch : '_';
    }
    host[i] = '\0';
    snprintf(buf, len, "%s/%s%s-%s-r%d.h5", dir, PROBE_PREFIX, token, host, f->rank);
}

/* MPI-IO's reasons can be vague ("MPI_ERR_OTHER"): after a failed create,
 * the operating system's own reason for the same path is appended. */
static void plain_create(const char *path, char *msg, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    size_t used = strlen(msg);
    if (fd >= 0) {
        close(fd);
        unlink(path);
        return;
    }
    if (used < len)
        snprintf(msg + used, len - used, " (creating the file directly: %s)", strerror(errno));
}

/* Writes and reads back this rank's probe file (in a private directory
 * when the otherhost fault makes it act as another node). */
static void write_probe(const struct facts *f, const char *token, uint64_t key, struct dirfacts *d,
                        char *mine, size_t len, char *private_dir)
{
    const char *where = d->dir;
    if (f->other_host) {
        const char *tmp = getenv("TMPDIR");
        snprintf(private_dir, DOCTOR_PATH, "%s/dtrain-doctor-private-XXXXXX",
                 tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(private_dir)) {
            snprintf(d->msg, sizeof d->msg, "cannot make the private directory %.600s: %s", private_dir,
                     strerror(errno));
            private_dir[0] = '\0';
            return;
        }
        where = private_dir;
    }
    probe_name(mine, len, where, token, f);
    dt_status st = dt_h5_probe_write(mine, key + (uint64_t)f->rank);
    if (st == DT_OK) {
        d->written = 1;
        st = dt_h5_probe_read(mine, key + (uint64_t)f->rank);
    }
    if (st == DT_OK) {
        d->ok = 1;
        return;
    }
    snprintf(d->msg, sizeof d->msg, "%s", dt_last_error());
    if (!d->written)
        plain_create(mine, d->msg, sizeof d->msg);
}

/* After every rank wrote: the file of the first rank on each other host
 * must be visible in `view` (the run directory as this rank sees it: its
 * private directory under the otherhost fault) and read back right. */
static void look_for_others(const struct facts *all, int n, const struct facts *f, const char *view,
                            const char *token, uint64_t key, struct dirfacts *d)
{
    for (int q = 0; q < n; q++) {
        int first = 1;
        for (int p = 0; p < q && first; p++)
            first = strcmp(all[p].host, all[q].host) != 0;
        if (!first || !strcmp(all[q].host, f->host))
            continue;
        char path[DOCTOR_PATH + 128];
        probe_name(path, sizeof path, view, token, &all[q]);
        d->looked++;
        if (access(path, F_OK) != 0) {
            if (!d->missing_n++)
                d->missing_rank = q;
            continue;
        }
        if (dt_h5_probe_read(path, key + (uint64_t)q) != DT_OK && !d->unreadable_n++) {
            d->unreadable_rank = q;
            snprintf(d->unreadable_msg, sizeof d->unreadable_msg, "%s", dt_last_error());
        }
    }
}

/* The run directory part; collective. Each rank removes what it made. */
static dt_status check_dir(dt_comm_t *c, const struct dt_doctor_opts *o, const struct facts *all,
                           const struct facts *f, struct dirfacts *d)
{
    struct {
        char token[40];
        uint64_t key;
    } shared = {{0}, 0};
    char mine[DOCTOR_PATH + 128] = "", private_dir[DOCTOR_PATH] = "";
    dt_status st;
    if (f->rank == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        shared.key =
            (uint64_t)ts.tv_sec * 1000000007u ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 20);
        snprintf(shared.token, sizeof shared.token, "%ld-%016llx", (long)getpid(),
                 (unsigned long long)shared.key);
    }
    DT_CHECK(dt_comm_broadcast(c, &shared, sizeof shared, 0));
    if (resolve_dir(o, d))
        write_probe(f, shared.token, shared.key, d, mine, sizeof mine, private_dir);
    DT_CHECK(dt_comm_barrier(c));
    if (d->dir[0])
        look_for_others(all, dt_comm_size(c), f, private_dir[0] ? private_dir : d->dir,
                        shared.token, shared.key, d);
    DT_CHECK(dt_comm_barrier(c));
out:
    if (d->written && unlink(mine) != 0 && st == DT_OK)
        snprintf(d->msg, sizeof d->msg, "cannot remove the test file %.600s: %s", mine,
                 strerror(errno));
    if (private_dir[0])
        rmdir(private_dir);
    return st;
}

/* ---- driver ----------------------------------------------------------------- */

dt_status dt_doctor_run(dt_comm_t *c, const struct dt_doctor_opts *o, FILE *out, int *problems)
{
    int n = dt_comm_size(c);
    struct facts *mine = NULL, *all = NULL;
    struct dirfacts *dmine = NULL, *dall = NULL;
    struct gemm_data *g = NULL;
    struct doctor_run run = {.world = n};
    dt_backend_t *be = NULL;
    dt_status st;
    *problems = 0;
    DT_CHECK(dt_calloc(1, sizeof *mine, "the doctor's record", (void **)&mine));
    DT_CHECK(dt_calloc((size_t)n, sizeof *all, "the doctor's records", (void **)&all));
    DT_CHECK(dt_calloc(1, sizeof *dmine, "the doctor's record", (void **)&dmine));
    DT_CHECK(dt_calloc((size_t)n, sizeof *dall, "the doctor's records", (void **)&dall));
    DT_CHECK(dt_calloc(1, sizeof *g, "the GEMM check's buffers", (void **)&g));
    gather_facts(c, o, mine);
    if (gemm_reference(g) == DT_OK) {
        check_cpu_gemm(mine, g);
        check_gpu(mine, g, &be);
    } else {
        snprintf(mine->cpu_gemm_msg, sizeof mine->cpu_gemm_msg, "%s", dt_last_error());
    }
    DT_CHECK(dt_comm_allgather(c, mine, all, sizeof *mine));

    struct dt_bench_allreduce_opts mpi_opts = {0};
    DT_CHECK(run_allreduce(c, &mpi_opts, &run.mpi));
    if (all_have_gpus(all, n) && !gpus_shared(all, n))
        DT_CHECK(nccl_allreduce(c, be, &run.nccl));

    DT_CHECK(check_dir(c, o, all, mine, dmine));
    DT_CHECK(dt_comm_allgather(c, dmine, dall, sizeof *dmine));
    run.facts = all;
    run.dirs = dall;
    run.opts = o;
    *problems = doctor_report(&run, dt_comm_rank(c) == 0 ? out : NULL);
    int32_t count = *problems;
    DT_CHECK(dt_comm_broadcast(c, &count, sizeof count, 0));
    *problems = count;
out:
    dt_backend_destroy(be);
    free(g);
    free(dall);
    free(dmine);
    free(all);
    free(mine);
    return st;
}
