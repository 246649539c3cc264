/*
 * cmd_bench.c - `dtrain bench allreduce [options]`: the communicator
 * benchmark, run under mpirun like training.
 *
 * Options are parsed before MPI starts, so a usage error needs no MPI. The
 * benchmark agrees on its own failures (wrong results, bad options, memory)
 * across ranks; a communication error may have left peers inside a
 * collective, so that one aborts the job instead of finalising.
 *
 * An mpi communicator always exists: it is the one measured with --backend
 * mpi, and the control channel with --backend nccl, where each rank first
 * opens the compute backend whose memory nccl works on (cuda, from the
 * communicator's capabilities) on GPU (local rank mod visible GPUs), the
 * ranks agree that all of them have one, and the nccl communicator, bound
 * to that backend's stream, all-reduces its memory.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/allreduce_perf.h"
#include "collectives/comm.h"
#include "kernels/backend.h"
#include "runtime/train/dist.h"
#include "core/log.h"
#include "runtime/monitor/memory.h"
#include "core/text.h"
#include "cli.h"

/* A collective that takes longer aborts the benchmark (nccl; for mpi the
 * job's own time limit applies), as runtime.timeout_s does in training. */
#define BENCH_COMM_TIMEOUT_S 600.0

static const char bench_usage[] =
    "usage: dtrain bench allreduce [--min-bytes N] [--max-bytes N] [--iters N] [--warmup N]\n"
    "                              [--backend mpi|nccl] [--mode blocking|ring|library]\n"
    "Times in-place float32 sum all-reduces of power-of-two sizes between --min-bytes\n"
    "(default 8) and --max-bytes (default 256M) and checks every result on every rank.\n"
    "Sizes take K, M or G (powers of 1024). --iters 0 (default) picks about 0.2 s per\n"
    "size. --backend mpi (default) all-reduces host memory; --backend nccl all-reduces\n"
    "GPU memory with NCCL, one GPU per rank (local rank modulo the visible GPUs).\n"
    "--mode (mpi only): blocking (default) times MPI_Allreduce; ring and library time\n"
    "the non-blocking all-reduce training uses for gradient buckets, as dtrain's ring\n"
    "or as the MPI library's (comm.mpi_allreduce).\n"
    "Run it under mpirun, e.g. mpirun -np 4 dtrain bench allreduce --backend nccl.\n";

struct bench_args {
    struct dt_bench_allreduce_opts opts;
    const char *backend;
    const char *mode; /* blocking | ring | library */
};

#define MAX_COUNT 1000000000 /* iterations, warm-up operations */

/* "64", "4K", "1M", "2G" (powers of 1024, optionally followed by B or iB):
 * 0, -1 when it is not a size, -2 when it is one past SIZE_MAX bytes. */
static int parse_size(const char *s, size_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!isdigit((unsigned char)s[0]) || end == s) return -1;
    int range = errno == ERANGE;
    static const char units[] = "KMG";
    const char *u = *end ? strchr(units, toupper((unsigned char)*end)) : NULL;
    unsigned shift = u ? 10u * (unsigned)(u - units + 1) : 0;
    end += u != NULL;
    if (shift && *end == 'i') end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return -1;
    if (range || v > (SIZE_MAX >> shift)) return -2;
    *out = (size_t)v << shift;
    return 0;
}

static int parse_option(const char *opt, const char *val, struct bench_args *a)
{
    if (!strcmp(opt, "--min-bytes") || !strcmp(opt, "--max-bytes")) {
        size_t *slot = !strcmp(opt, "--min-bytes") ? &a->opts.min_bytes : &a->opts.max_bytes;
        int got = parse_size(val, slot);
        if (got == -1)
            return dt_cli_usage("bench allreduce: %s '%s' is not a size (e.g. 64, 4K, 256M)", opt,
                                val);
        if (got == -2)
            return dt_cli_usage("bench allreduce: %s '%s' is more than %zu bytes (2^64-1), far "
                                "more than any memory",
                                opt, val, SIZE_MAX);
    } else if (!strcmp(opt, "--iters") || !strcmp(opt, "--warmup")) {
        int *slot = !strcmp(opt, "--iters") ? &a->opts.iters : &a->opts.warmup;
        char note[64];
        int64_t n;
        if (!strcmp(opt, "--iters"))
            snprintf(note, sizeof note, " (0: about %g s per size)", DT_BENCH_TARGET_S);
        else
            snprintf(note, sizeof note, " (0: the default, %d)", DT_BENCH_WARMUP);
        int rc = dt_cli_opt_int("bench allreduce", opt, val, 0, MAX_COUNT, note, &n);
        if (rc != 0) return rc;
        *slot = (int)n;
    } else if (!strcmp(opt, "--mode")) {
        if (strcmp(val, "blocking") != 0 && strcmp(val, "ring") != 0 && strcmp(val, "library") != 0)
            return dt_cli_usage("bench allreduce: --mode '%s' is not blocking, ring or library",
                                val);
        a->mode = val;
    } else if (!strcmp(opt, "--backend")) {
        if (!dt_comm_caps_named(val))
            return dt_cli_usage("bench allreduce: --backend '%s' is not mpi or nccl", val);
        a->backend = val;
    } else {
        return dt_cli_usage("bench allreduce: unknown option '%s'", opt);
    }
    return 0;
}

/* 0, -1 after printing the usage (-h, --help), or 64 after a message. */
static int parse_args(int argc, char **argv, struct bench_args *a)
{
    for (int i = 2; i < argc; i++) {
        if (dt_cli_is_help(argv[i])) return fputs(bench_usage, stdout), -1;
        if (strncmp(argv[i], "--", 2) != 0)
            return dt_cli_usage("bench allreduce: unexpected argument '%s'", argv[i]);
        if (i + 1 >= argc) return dt_cli_usage("bench allreduce: %s needs a value", argv[i]);
        int rc = parse_option(argv[i], argv[i + 1], a);
        if (rc != 0) return rc;
        i++;
    }
    if (a->opts.min_bytes && a->opts.max_bytes && a->opts.min_bytes > a->opts.max_bytes)
        return dt_cli_usage("bench allreduce: --min-bytes is larger than --max-bytes");
    if (strcmp(a->mode, "blocking") != 0 &&
        !(dt_comm_caps_named(a->backend)->collectives & DT_COMM_HAS_RING))
        return dt_cli_usage("bench allreduce: --mode %s applies to --backend mpi only", a->mode);
    return 0;
}

/* This rank's GPU, of the compute backend whose memory communicator
 * `backend` works on, agreed: every rank has one, or every rank fails
 * with the first failing rank's message. */
static dt_status open_device(const char *backend, dt_comm_t *ctl, dt_backend_t **be)
{
    int count = dt_cuda_device_count();
    struct dt_backend_opts o = {.threads = 1,
                                .device = count > 0 ? dt_comm_local_rank(ctl) % count : 0};
    const char *device_backend = dt_comm_caps_named(backend)->device_backend;
    *be = NULL;
    DT_ASSERT(device_backend != NULL); /* host buffers: measured as the control communicator */
    dt_status st = dt_backend_create(device_backend, &o, be);
    if (st != DT_OK)
        dt_error_context(st, "bench allreduce --backend %s needs a GPU on every rank", backend);
    st = dt_dist_agree(ctl, st);
    if (st != DT_OK && *be) {
        dt_backend_destroy(*be);
        *be = NULL;
    }
    return st;
}

/* The device-buffer communicator on this rank's GPU, bound to its stream. */
static dt_status open_device_comm(const char *backend, dt_comm_t *ctl, dt_backend_t **be,
                                  dt_comm_t **c)
{
    dt_status st = open_device(backend, ctl, be);
    if (st == DT_OK) st = dt_comm_create(backend, c);
    if (st == DT_OK) st = dt_comm_bind_stream(*c, dt_backend_stream(*be));
    if (st == DT_OK) dt_comm_set_timeout(*c, BENCH_COMM_TIMEOUT_S);
    return st;
}

/* Failures of the benchmark after which the ranks may disagree: the job is
 * aborted. (Set-up failures are agreed.) */
static int unagreed(dt_status st)
{
    return st == DT_ERR_COMM || st == DT_ERR_TIMEOUT || st == DT_ERR_CUDA;
}

/* The largest buffer must fit in the host memory this rank can have (it
 * is allocated, and on a GPU mirrored in host memory): otherwise a usage
 * error with the numbers, agreed by every rank. */
static dt_status check_size(dt_comm_t *ctl, const struct dt_bench_allreduce_opts *o)
{
    struct dt_mem_avail avail;
    size_t bytes = o->max_bytes ? o->max_bytes : DT_BENCH_MAX_BYTES;
    dt_status st = DT_OK;
    dt_mem_probe(dt_comm_local_size(ctl), &avail);
    uint64_t most = avail.node_total == UINT64_MAX ? UINT64_MAX
                                                   : avail.node_total / (uint64_t)avail.local_ranks;
    if ((uint64_t)bytes > most) {
        char want[32], have[32];
        dt_format_bytes(bytes, want, sizeof want);
        dt_format_bytes(most, have, sizeof have);
        st = dt_set_error(DT_ERR_USAGE,
                          "bench allreduce: --max-bytes %zu (%s) is more than rank %d on %s can "
                          "have (%s, its share of the node's memory); give a smaller --max-bytes",
                          bytes, want, dt_comm_rank(ctl), avail.host, have);
    }
    return dt_dist_agree(ctl, st);
}

/* Runs the benchmark on an initialised MPI; returns the exit code. */
static int run(const struct bench_args *a, int *argc, char ***argv)
{
    dt_comm_t *ctl = NULL, *c = NULL;
    dt_backend_t *be = NULL;
    char command[256];
    snprintf(command, sizeof command,
             "'dtrain bench allreduce --backend %s --mode %s --min-bytes %zu --max-bytes %zu "
             "--iters %d --warmup %d'",
             a->backend, a->mode, a->opts.min_bytes, a->opts.max_bytes, a->opts.iters,
             a->opts.warmup);
    int code = dt_cli_ranks_start(argc, argv, command, NULL, &ctl);
    if (code != 0) return code;
    int rank = dt_comm_rank(ctl);
    dt_status st = DT_OK;
    struct dt_bench_allreduce_opts opts = a->opts;
    struct dt_bench_device dev = {0};
    if (dt_comm_is(ctl, a->backend)) { /* measure the control communicator itself */
        c = ctl;
        opts.nonblocking = strcmp(a->mode, "blocking") != 0;
        dt_comm_set_ring_min_bytes(c, strcmp(a->mode, "ring") == 0 ? 0 : SIZE_MAX);
    } else {
        st = open_device_comm(a->backend, ctl, &be, &c);
        dev = (struct dt_bench_device){.be = be,
                                       .alloc = dt_backend_alloc,
                                       .free = dt_backend_free,
                                       .copy = dt_backend_copy,
                                       .sync = dt_backend_sync};
        opts.device = &dev;
        opts.control = ctl;
    }
    if (st == DT_OK)
        st = check_size(ctl, &opts);
    int ran = st == DT_OK;
    if (ran) st = dt_bench_allreduce(c, &opts, stdout);
    if (st != DT_OK) {
        /* Agreed failures: rank 0 speaks for all; other ranks add what they saw. */
        int abort_job = ran && unagreed(st);
        if (rank == 0 || st == DT_ERR_INTERNAL || abort_job)
            code = dt_cli_fail(st);
        else
            code = dt_status_exit_code(st);
        if (abort_job) dt_comm_abort(c, code);
    }
    if (c != ctl) dt_comm_destroy(c);
    if (be) dt_backend_destroy(be);
    dt_cli_ranks_end(ctl);
    return code;
}

int dt_cmd_bench(int argc, char **argv)
{
    struct bench_args a = {.backend = "mpi", .mode = "blocking"};
    if (argc >= 2 && dt_cli_is_help(argv[1])) return fputs(bench_usage, stdout), 0;
    if (argc < 2 || strcmp(argv[1], "allreduce") != 0)
        return dt_cli_usage("bench: say what to benchmark: 'dtrain bench allreduce'");
    int rc = parse_args(argc, argv, &a);
    if (rc != 0) return rc < 0 ? 0 : rc;
    return run(&a, &argc, &argv);
}
