/*
 * cmd_train.c - `dtrain train JOB [--set k=v ...] [--print-config]`.
 *
 * Loads the job, applies overrides in order, validates, then starts MPI
 * (one rank per process: `mpirun -np N dtrain train JOB`, or srun) and
 * runs the training on every rank. Errors the ranks agreed on are printed
 * once, by rank 0; when the ranks fell out of step, the failing rank
 * prints its error and aborts the job so that no rank hangs.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../collectives/comm.h"
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
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "dtrain: MPI could not start\n");
        return 70;
    }
    dt_comm_t *comm = NULL;
    dt_status st = dt_comm_create(job.comm.backend, &comm);
    if (st != DT_OK) {
        rc = dt_cli_fail(st);
        MPI_Abort(MPI_COMM_WORLD, rc);
        return rc;
    }
    int rank = dt_comm_rank(comm);
    dt_log_set_rank(rank);
    struct dt_train_result res;
    st = dt_train_run(&job, comm, &res);
    rc = dt_status_exit_code(st);
    if (st != DT_OK && res.comm_failed) {
        /* the ranks are out of step: say why here and end the whole job */
        fprintf(stderr, "dtrain: rank %d: %s\n", rank, dt_last_error());
        dt_comm_abort(comm, rc);
    }
    if (st != DT_OK && rank == 0) /* agreed: every rank has the same message */
        dt_cli_fail(st);
    dt_comm_destroy(comm);
    MPI_Finalize();
    return rc;
}
