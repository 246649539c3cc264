/*
 * train.h - the training run: opens the dataset, builds the model and the
 * optimizer on the chosen backend, runs the step loop with gradient
 * accumulation, evaluates each epoch, and writes the run directory
 * (config.yaml, train.log, metrics.jsonl).
 */
#ifndef DT_TRAIN_H
#define DT_TRAIN_H

#include <stdint.h>

#include "config.h"
#include "status.h"

struct dt_train_result {
    int64_t steps;          /* optimizer steps taken */
    int64_t samples;        /* training samples consumed */
    int64_t epochs;         /* epochs started */
    double seconds;         /* wall time of the training loop */
    double samples_per_s;   /* training throughput (evaluation excluded) */
    double train_loss;      /* mean loss over the last logging window */
    double test_loss, test_acc; /* last evaluation (acc in [0, 1]) */
    double gflops;          /* achieved model GFLOP/s during training */
};

/* Runs job to completion. The run directory is output.dir. */
dt_status dt_train_run(const struct dt_job *job, struct dt_train_result *res);

#endif
