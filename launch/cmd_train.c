/*
 * cmd_train.c - `dtrain train JOB [--set k=v ...] [--print-config]`.
 *
 * Loads the job, applies overrides in order, validates, then starts MPI
 * (one rank per process; multi-rank data parallelism is not in this
 * version, so more than one rank is refused) and runs the training.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/config.h"
#include "../runtime/log.h"
#include "../runtime/train.h"
#include "cli.h"

static int parse_job(int argc, char **argv, struct dt_job *job, int *print_only)
{
    const char *path = NULL;
    dt_status st;
    *print_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--print-config"))
            *print_only = 1;
        else if (!strcmp(argv[i], "--set") || !strncmp(argv[i], "--set=", 6)) {
            /* applied after the file is loaded, below */
            if (!strcmp(argv[i], "--set") && ++i >= argc)
                return dt_cli_usage("--set needs key=value");
        } else if (argv[i][0] == '-')
            return dt_cli_usage("train: unknown option '%s'", argv[i]);
        else if (path)
            return dt_cli_usage("train: more than one job file ('%s' and '%s')", path, argv[i]);
        else
            path = argv[i];
    }
    if (!path)
        return dt_cli_usage("train: no job file given (e.g. configs/fashion-mnist-mlp.yaml)");
    if ((st = dt_job_load(path, job)) != DT_OK)
        return dt_cli_fail(st);
    for (int i = 1; i < argc; i++) {
        const char *kv = NULL;
        if (!strcmp(argv[i], "--set"))
            kv = argv[++i];
        else if (!strncmp(argv[i], "--set=", 6))
            kv = argv[i] + 6;
        if (kv && (st = dt_job_set(job, kv)) != DT_OK)
            return dt_cli_fail(st);
    }
    if ((st = dt_job_validate(job)) != DT_OK)
        return dt_cli_fail(st);
    return 0;
}

int dt_cmd_train(int argc, char **argv)
{
    static struct dt_job job;
    int print_only;
    int rc = parse_job(argc, argv, &job, &print_only);
    if (rc != 0)
        return rc;
    if (print_only) {
        dt_job_write_yaml(&job, stdout);
        return 0;
    }
    if (getenv("DTRAIN_LOG") == NULL) {
        int lv = dt_log_parse_level(job.runtime.log_level);
        dt_log_set_level((enum dt_log_level)lv);
    }
    int provided = 0, rank = 0, world = 1;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "dtrain: MPI could not start\n");
        return 70;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    dt_log_set_rank(rank);
    if (world > 1) {
        if (rank == 0)
            fprintf(stderr, "dtrain: this job was started with %d ranks, but multi-rank data "
                            "parallel training is not implemented in this version; run one rank\n",
                    world);
        MPI_Finalize();
        return 64;
    }
    struct dt_train_result res;
    dt_status st = dt_train_run(&job, &res);
    rc = st == DT_OK ? 0 : dt_cli_fail(st);
    MPI_Finalize();
    return rc;
}
