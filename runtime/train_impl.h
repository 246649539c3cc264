/*
 * train_impl.h - the state of one training run, shared by train.c (the
 * step loop) and train_setup.c (everything before the first step).
 */
#ifndef DT_TRAIN_IMPL_H
#define DT_TRAIN_IMPL_H

#include <stdio.h>

#include "../collectives/comm.h"
#include "../collectives/reducer.h"
#include "../io/dataset.h"
#include "../io/loader.h"
#include "backend.h"
#include "config.h"
#include "metrics.h"
#include "model.h"
#include "optim.h"

struct run {
    const struct dt_job *job;
    dt_comm_t *comm;
    int rank, world;
    dt_dataset_t *ds;
    const struct dt_split_info *train, *test;
    dt_backend_t *be;
    int threads;
    dt_model_t *model;
    dt_optim_t *opt;
    dt_loader_t *train_ld, *test_ld;
    dt_reducer_t *red; /* NULL with one rank */
    dt_metrics_t *metrics;
    FILE *logf;
    int64_t micro, per_rank, bpe, total_steps, epochs;
    int bar;   /* live progress bar instead of lines */
    int quiet; /* no progress on the terminal */
    double flops_per_sample;
};

/* Each a collective step of start-up; every rank gets the same outcome. */
dt_status dt_train_open_run_dir(struct run *r);
dt_status dt_train_open_data(struct run *r);
dt_status dt_train_choose_backend(struct run *r);
dt_status dt_train_build(struct run *r);
/* Rank 0 writes the final parameters to <run>/model.h5 (collective). */
dt_status dt_train_save_model(struct run *r);
void dt_train_close(struct run *r, dt_status st);

#endif
