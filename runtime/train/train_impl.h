/*
 * train_impl.h - the state of one training run, shared by train.c (the
 * step loop) and train_setup.c (everything before the first step).
 */
#ifndef DT_TRAIN_IMPL_H
#define DT_TRAIN_IMPL_H

#include <signal.h>
#include <stdio.h>

#include "collectives/comm.h"
#include "collectives/reducer.h"
#include "collectives/tree.h"
#include "io/ckpt_writer.h"
#include "io/dataset.h"
#include "io/loader.h"
#include "kernels/backend.h"
#include "runtime/config/config.h"
#include "runtime/monitor/metrics.h"
#include "runtime/model/model.h"
#include "runtime/monitor/nvml.h"
#include "optim.h"
#include "runtime/monitor/rundir.h"
#include "scaler.h"
#include "runtime/monitor/tbevents.h"
#include "train.h"

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
    /* comm.shard optimizer: this rank's chunks [own_lo[k], own_hi[k]) of
     * the flat buffers, one per gradient bucket (nown of them; 0: not
     * sharded, every rank keeps and updates everything) */
    size_t *own_lo, *own_hi, nown;
    /* What this run shards (comm.shard): 0 nothing, 1 the optimizer
     * state, 2 the gradients too, 3 the parameters too. From 2 the
     * gradients are the reducer's packed shard (dt_reducer_shard_grads),
     * chunk k at [pk_lo[k], pk_hi[k]), and the model has no gradient
     * buffer; with 3 the parameters are packed alike
     * (dt_reducer_shard_params) and the model reads them through the
     * reducer's gather slots. */
    int shard;
    size_t *pk_lo, *pk_hi;
    /* Model state bytes of the rank holding the most (dt_train_build):
     * parameters, gradients and optimizer state, and the last alone */
    uint64_t state_bytes, optim_bytes;
    /* Gradients travel over grad_comm: r->comm (mpi) or own_comm (nccl).
     * With a device backend and a host communicator (a shared GPU) they
     * are staged through host_grads. */
    dt_comm_t *grad_comm, *own_comm;
    int stage_grads;
    float *host_grads;
    /* comm.grad_dtype=bf16: the bf16 copy the reducer sends, in the
     * backend's memory beside the gradients (in host memory beside
     * host_grads when they are staged) */
    struct dt_reducer_wire wire;
    /* fp16: dynamic loss scaling */
    int scaling;
    struct dt_scaler scaler;
    dt_rundir_t *rundir; /* rank 0: the claimed (locked) run directory */
    dt_metrics_t *metrics;
    FILE *logf;
    int64_t micro, per_rank, bpe, total_steps, epochs;
    /* train.reproducible (repro 0: off; train_repro.c): shards of
     * shard_rows rows, nshards of them per global batch; the tree that
     * sums this rank's shard gradients; each shard's loss and batch
     * statistics record in a step (shard_vals, shard_stride doubles each,
     * by global shard index); each evaluation piece's loss */
    int repro;
    int64_t shard_rows, nshards;
    struct dt_tree *tree;
    float *grads; /* the model's own gradient buffer (leaves are computed in the tree's) */
    double *shard_vals;
    size_t shard_stride;
    double *eval_loss;
    int64_t eval_pieces, eval_global;
    int bar;   /* live progress bar instead of lines */
    int quiet; /* no progress on the terminal */
    double flops_per_sample;
    int lm;                 /* a language model: evaluation reports perplexity */
    double labels_per_row;  /* labels per sample (tokens for a language model), as a divisor */

    /* position: the next step's number, epoch and global batch index */
    int64_t step, epoch, batch, samples;
    int64_t bad_steps, rollbacks;
    char stop_why[128]; /* the signals that asked for the stop, by rank count */
    int nan_injected; /* DTRAIN_FAULT nan fires once */
    int nan_now;      /* ... and did in this step: its loss is NaN too */
    int eval_only;    /* dtrain eval: no training loader, optimizer or reducer */
    int gen_only;     /* dtrain generate (with eval_only): one row, no loaders at all */
    const struct dt_train_opts *opts;
    char ckpt_dir[4096 + 32];
    double last_ckpt_time; /* dt_now() of the last checkpoint or the start */
    int64_t last_ckpt_step; /* step of the last checkpoint written or loaded; -1: none */
    int buffers_synced;     /* the model's buffers are the same on every rank (no training
                               forward since dt_train_sync_buffers) */
    int grads_zero;         /* the last step's update left the gradients zero (replicated:
                               dt_optim_step_gated_clear), so the next needs no fill */
    struct dt_watchdog *wd;
    /* Periodic checkpoints in the background (checkpoint.async): the
     * writer and its communicator (NULL: written synchronously), the host
     * snapshot it writes from, and the write in flight. */
    dt_comm_t *side_comm;
    dt_ckpt_writer_t *writer;
    struct ckpt_staging *bg;
    char *bg_yaml;
    int64_t bg_step;    /* the step of the write in flight */
    double bg_blocked;  /* seconds the training thread spent on its snapshot */
    double bg_waited;   /* of which, waiting for the write before it */
    char bg_why[64];
    int bg_done;        /* the last step's agreement: no rank's writer is writing */
    /* In-memory snapshots (checkpoint.memory_every_steps; snap_every 0: off) */
    int64_t snap_every;
    int snap_node, snap_to, snap_from; /* this rank's node; the peer exchange (-1: none) */
    uint64_t snap_run_key, snap_layout;
    int64_t snap_last;                 /* step of the newest snapshot taken; -1: none */
    void *snap_peer_buf;
    uint64_t snap_peer_cap;
    int *snap_to_of;                   /* every rank's `to` (the holder of its copy) */
    uint64_t *snap_layout_of;          /* every rank's layout key */

    /* Monitoring (train.c). Time over this segment (one process lifetime,
     * up to a stop and resume), summed from the logged windows. */
    struct {
        double data_s, compute_s, comm_s, optim_s, ckpt_s, eval_s;
    } spent;
    double seg_start;      /* dt_now() when the step loop began; 0 before */
    double prior_seconds;  /* training time of earlier segments (from the checkpoint resumed) */
    int64_t prior_segments;
    int prior_unknown;     /* resumed from a checkpoint that predates the stored time */
    /* set by a checkpoint load: its stored time (has_time 0: none stored) */
    double loaded_seconds;
    int64_t loaded_segments;
    int loaded_has_time, loaded;
    int64_t windows;       /* logged windows this segment */
    int starved_windows;   /* consecutive windows the loader starved the device */
    int starve_warned;
    dt_tb_t *tb;           /* rank 0, output.tensorboard: the event file; else NULL */
    dt_nvml_t *nvml;       /* a GPU run with NVML present; else NULL */
    double gpu_mem_peak, gpu_power_peak; /* NVML samples; -1: none */
};

/* Checkpoints (train_ckpt.c), all collective. */
/* Writes a checkpoint of the current state; `why` goes into the log. A
 * failed write stops the run or only warns, as checkpoint.on_error says. */
dt_status dt_train_ckpt_save(struct run *r, const char *why);
/* A periodic checkpoint: in the background when the run has a writer
 * (waiting first for the write before it, which is then collected),
 * otherwise as dt_train_ckpt_save. */
dt_status dt_train_ckpt_save_periodic(struct run *r, const char *why);
/* Collects the background write in flight, waiting for it: logs it,
 * prunes, and returns its failure as dt_train_ckpt_save would (a failed
 * write stops the run unless checkpoint.on_error=continue). DT_OK when
 * none is in flight. Every rank calls it at the same point. */
dt_status dt_train_ckpt_collect(struct run *r);
/* 1 while this rank's writer is still writing. */
int dt_train_ckpt_writing(struct run *r);
/* In-memory snapshots (train_snap.c). The snapshot buffer's memory and
 * size, and a key of its layout (NULL before dt_train_ckpt_async_ready);
 * the state copied into it with meta filled; the state copied back from
 * it and meta's position taken. */
void *dt_train_snap_buffer(struct run *r, uint64_t *bytes, uint64_t *layout);
dt_status dt_train_snap_take(struct run *r, struct dt_ckpt_meta *meta);
dt_status dt_train_snap_restore(struct run *r, const struct dt_ckpt_meta *meta);
/* Set-up after the snapshot buffer exists: the nodes, the peer, the free
 * space (collective). */
dt_status dt_train_snap_open(struct run *r);
/* A snapshot of this step for the writer, when one is due (collective). */
dt_status dt_train_snap_save(struct run *r);
/* The writer finished a snapshot: its outcome (a failure only warns,
 * unless the communicator failed). */
dt_status dt_train_snap_collected(struct run *r, dt_status st, double write_s);
/* At a resume: the newest snapshot every rank has, when it is newer than
 * step `after` (the newest file checkpoint's; -1: none): *taken = 1 and
 * the state is the snapshot's. Otherwise (none, or one that cannot be
 * used, said in the log) *taken = 0 and nothing changed (collective). */
dt_status dt_train_snap_resume(struct run *r, int64_t after, int *taken);
/* Removes this run's snapshots on this node (a run that completes or
 * starts over; collective). */
void dt_train_snap_discard(struct run *r);

/* Starts the background writer when checkpoint.async allows it (set-up,
 * collective), and ends it (waiting for any write in flight). */
dt_status dt_train_ckpt_async_open(struct run *r);
/* Allocates the snapshot's memory (and touches it) once the model and
 * the optimizer exist, so the first checkpoint pays only for its copy. */
dt_status dt_train_ckpt_async_ready(struct run *r);
void dt_train_ckpt_async_close(struct run *r);
/* Collective: every rank takes the mean over ranks of the model's buffers
 * (batch norm's running statistics). */
dt_status dt_train_sync_buffers(struct run *r);
/* Applies opts->resume: "auto" loads the newest checkpoint in the run's
 * checkpoints/ that verifies (reporting skipped ones), "never" starts
 * fresh, anything else is a checkpoint path to load. */
dt_status dt_train_ckpt_resume(struct run *r);
/* Loads only the parameters of the checkpoint at path (evaluation). */
dt_status dt_train_ckpt_load_params(struct run *r, const char *path);
/* Reloads the newest good checkpoint after repeated non-finite steps. */
dt_status dt_train_ckpt_rollback(struct run *r);

/* train.reproducible (train_repro.c). Plans the shards and refuses what
 * the mode cannot honour (set-up, after the batch plan); allocates its
 * state once the model exists; frees it. */
dt_status dt_repro_plan(struct run *r);
dt_status dt_repro_check_backend(struct run *r);
dt_status dt_repro_open(struct run *r);
void dt_repro_close(struct run *r);
/* A step starts: the shards' records are cleared. */
void dt_repro_begin_step(struct run *r);
/* Forward and backward of each shard of micro-batch b, each shard's
 * gradient a leaf of the tree. */
dt_status dt_repro_micro(struct run *r, const struct dt_batch *b, int64_t step, double loss_scale,
                         int64_t *correct);
/* The step's gradients: this rank's leaves summed, then the ranks' sums,
 * in the tree, into the model's gradient buffer (collective). */
dt_status dt_repro_reduce(struct run *r);
/* After the step's agreement: every shard's record on every rank; the
 * loss summed in shard order into *loss (unless it is NaN already), the
 * running statistics updated shard by shard (collective). */
dt_status dt_repro_settle(struct run *r, double *loss);
/* Evaluation: the slot of the piece at row `row` of global batch `batch`
 * for its loss (the pieces are shard_rows rows, aligned), and the sum of
 * every piece's loss in piece order (collective). */
double *dt_repro_eval_slot(struct run *r, int64_t batch, int64_t row);
void dt_repro_eval_begin(struct run *r);
dt_status dt_repro_eval_loss(struct run *r, double *loss);

/* Each a collective step of start-up; every rank gets the same outcome. */
dt_status dt_train_open_run_dir(struct run *r);
dt_status dt_train_open_data(struct run *r);
dt_status dt_train_choose_backend(struct run *r);
dt_status dt_train_build(struct run *r);
/* Rank 0 writes the final parameters to <run>/model.h5 (collective). */
dt_status dt_train_save_model(struct run *r);
/* comm.shard's name for r->shard (0 none ... 3 parameters). */
const char *dt_train_shard_name(int shard);
void dt_train_close(struct run *r, dt_status st);

#endif
