/*
 * train.h - the training run: opens the dataset, builds the model and the
 * optimizer on the chosen backend, runs the step loop with gradient
 * accumulation, evaluates each epoch, and writes the run directory
 * (config.yaml, train.log, metrics.jsonl), on one rank or many.
 */
#ifndef DT_TRAIN_H
#define DT_TRAIN_H

#include <signal.h>
#include <stdint.h>

#include "collectives/comm.h"
#include "runtime/config/config.h"
#include "core/status.h"

struct dt_backend_mem; /* kernels/backend.h */

struct dt_train_result {
    int64_t steps;          /* optimizer steps taken */
    int64_t samples;        /* training samples consumed */
    int64_t epochs;         /* epochs started */
    double seconds;         /* wall time of the training loop */
    double samples_per_s;   /* training throughput (evaluation excluded) */
    double train_loss;      /* mean loss over the last logging window */
    double test_loss, test_acc; /* last evaluation (acc in [0, 1]) */
    double gflops;          /* achieved model GFLOP/s during training */
    int comm_failed;        /* the ranks fell out of step: abort the job */
    int lm;                 /* a language model: test_loss is per token (perplexity
                               exp(test_loss)), test_acc next-token accuracy */
};

struct dt_train_opts {
    const char *resume;                /* auto | never | PATH of a checkpoint */
    volatile sig_atomic_t *stop_flag;  /* a signal handler stores its signal number here:
                                          checkpoint and stop */
    /* Out of memory for the micro-batch at start-up fails instead of
     * halving train.micro_batch (dtrain find-batch measures each size). */
    int fixed_micro_batch;
    /* When not NULL: the backend's memory figures, read just before the
     * run's backend is destroyed (dtrain find-batch's trials). */
    struct dt_backend_mem *mem;
    /* > 1 (dtrain find-batch's one-rank trial of a job that will run on
     * this many ranks): the start-up memory check counts each rank's share
     * of the state comm.shard would split there (host memory, the mpi
     * ring), and *plan_saving (when not NULL) gets the bytes one such rank
     * holds less than this trial. */
    int64_t plan_world;
    uint64_t *plan_saving;
};

/* Runs job to completion on every rank of comm (collective). Rank 0
 * writes the run directory, output.dir. A failure on any rank is returned
 * on every rank with the failing rank's message, unless res->comm_failed:
 * then the ranks are out of step and the caller must abort the job. */
dt_status dt_train_run(const struct dt_job *job, dt_comm_t *comm, const struct dt_train_opts *opts,
                       struct dt_train_result *res);

/* Evaluates the parameters of the checkpoint at `checkpoint` on the job's
 * test split, on every rank of comm (collective); writes no files.
 * res->test_loss and res->test_acc get the result. */
dt_status dt_eval_run(const struct dt_job *job, dt_comm_t *comm, const char *checkpoint,
                      struct dt_train_result *res);

#endif
