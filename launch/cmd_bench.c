/*
 * cmd_bench.c - `dtrain bench allreduce [options]`: the communicator
 * benchmark, run under mpirun like training.
 *
 * Options are parsed before MPI starts, so a usage error needs no MPI. The
 * benchmark agrees on its own failures (wrong results, bad options, memory)
 * across ranks; a communication error may have left peers inside a
 * collective, so that one aborts the job instead of finalising.
 */
#include <ctype.h>
#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../collectives/bench.h"
#include "../collectives/comm.h"
#include "../runtime/log.h"
#include "cli.h"

static const char bench_usage[] =
    "usage: dtrain bench allreduce [--min-bytes N] [--max-bytes N] [--iters N] [--warmup N]\n"
    "                              [--backend mpi]\n"
    "Times in-place float32 sum all-reduces of power-of-two sizes between --min-bytes\n"
    "(default 8) and --max-bytes (default 256M) and checks every result on every rank.\n"
    "Sizes take K, M or G (powers of 1024). --iters 0 (default) picks about 0.2 s per\n"
    "size. Run it under mpirun, e.g. mpirun -np 4 dtrain bench allreduce.\n";

struct bench_args {
    struct dt_bench_allreduce_opts opts;
    const char *backend;
};

/* "64", "4K", "1M", "2G" (powers of 1024, optionally followed by B or iB). */
static int parse_size(const char *s, size_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!isdigit((unsigned char)s[0]) || end == s || errno) return -1;
    static const char units[] = "KMG";
    const char *u = *end ? strchr(units, toupper((unsigned char)*end)) : NULL;
    unsigned shift = u ? 10u * (unsigned)(u - units + 1) : 0;
    end += u != NULL;
    if (shift && *end == 'i') end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end || v > (SIZE_MAX >> shift)) return -1;
    *out = (size_t)v << shift;
    return 0;
}

static int parse_count(const char *s, int *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < 0 || v > 1000000000L) return -1;
    *out = (int)v;
    return 0;
}

static int parse_option(const char *opt, const char *val, struct bench_args *a)
{
    if (!strcmp(opt, "--min-bytes") || !strcmp(opt, "--max-bytes")) {
        size_t *slot = !strcmp(opt, "--min-bytes") ? &a->opts.min_bytes : &a->opts.max_bytes;
        if (parse_size(val, slot) != 0)
            return dt_cli_usage("bench allreduce: %s '%s' is not a size (e.g. 64, 4K, 256M)", opt,
                                val);
    } else if (!strcmp(opt, "--iters") || !strcmp(opt, "--warmup")) {
        int *slot = !strcmp(opt, "--iters") ? &a->opts.iters : &a->opts.warmup;
        if (parse_count(val, slot) != 0)
            return dt_cli_usage("bench allreduce: %s '%s' is not a count >= 0", opt, val);
    } else if (!strcmp(opt, "--backend")) {
        a->backend = val;
    } else {
        return dt_cli_usage("bench allreduce: unknown option '%s'", opt);
    }
    return 0;
}

static int parse_args(int argc, char **argv, struct bench_args *a)
{
    for (int i = 2; i < argc; i++) {
        if (strncmp(argv[i], "--", 2) != 0)
            return dt_cli_usage("bench allreduce: unexpected argument '%s'", argv[i]);
        if (i + 1 >= argc) return dt_cli_usage("bench allreduce: %s needs a value", argv[i]);
        int rc = parse_option(argv[i], argv[i + 1], a);
        if (rc != 0) return rc;
        i++;
    }
    if (a->opts.min_bytes && a->opts.max_bytes && a->opts.min_bytes > a->opts.max_bytes)
        return dt_cli_usage("bench allreduce: --min-bytes is larger than --max-bytes");
    return 0;
}

/* Runs the benchmark on an initialised MPI; returns the exit code. */
static int run(const struct bench_args *a)
{
    dt_comm_t *c = NULL;
    dt_status st = dt_comm_create(a->backend, &c);
    if (st != DT_OK) return dt_cli_fail(st);
    int rank = dt_comm_rank(c);
    dt_log_set_rank(rank);
    st = dt_bench_allreduce(c, &a->opts, stdout);
    int code = 0;
    if (st != DT_OK) {
        /* Agreed failures: rank 0 speaks for all; other ranks add what they saw. */
        if (rank == 0 || st == DT_ERR_INTERNAL || st == DT_ERR_COMM)
            code = dt_cli_fail(st);
        else
            code = dt_status_exit_code(st);
        if (st == DT_ERR_COMM) dt_comm_abort(c, code);
    }
    dt_comm_destroy(c);
    return code;
}

int dt_cmd_bench(int argc, char **argv)
{
    struct bench_args a = {.backend = "mpi"};
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")))
        return fputs(bench_usage, stdout), 0;
    if (argc < 2 || strcmp(argv[1], "allreduce") != 0)
        return dt_cli_usage("bench: say what to benchmark: 'dtrain bench allreduce'");
    if (argc >= 3 && (!strcmp(argv[2], "-h") || !strcmp(argv[2], "--help")))
        return fputs(bench_usage, stdout), 0;
    int rc = parse_args(argc, argv, &a);
    if (rc != 0) return rc;
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return dt_cli_fail(dt_set_error(DT_ERR_COMM, "MPI_Init_thread failed"));
    rc = run(&a);
    MPI_Finalize();
    return rc;
}
