/*
 * ckpt_writer.h - a checkpoint written in the background: a thread of each
 * rank runs dt_ckpt_save_ex (the same file, the same commit, the same
 * checks and messages; each rank's slices written with independent I/O)
 * on a communicator of its own while the rank's training thread goes on;
 * and in-memory snapshots (snapshot.h) the same way.
 *
 * The caller snapshots its state into host memory of its own (the tensors
 * point into it), submits it, and keeps that memory untouched until the
 * write is done. One write is in flight at a time. The writer's
 * collectives run on a communicator made with dt_comm_create_side, so
 * they never match the training thread's, and parallel HDF5 is entered
 * through io/'s HDF5 lock a call at a time, so the loader's reads go on
 * between the writer's calls.
 *
 * Not thread-safe itself: one thread (the training thread) calls all of
 * these. Every rank submits the same writes in the same order.
 */
#ifndef DT_CKPT_WRITER_H
#define DT_CKPT_WRITER_H

#include <stddef.h>

#include "collectives/comm.h"
#include "io/checkpoint.h"
#include "io/snapshot.h"

typedef struct dt_ckpt_writer dt_ckpt_writer_t;

/* Starts the writer thread, which writes over `side` (every rank of the
 * job; the writer does not own it). Local (no collective). */
dt_status dt_ckpt_writer_create(dt_comm_t *side, dt_ckpt_writer_t **out);

/* Waits for the write in flight, if any, then ends the thread. Its
 * outcome, not collected, is dropped. NULL is a no-op. */
void dt_ckpt_writer_destroy(dt_ckpt_writer_t *w);

/* Hands a checkpoint to the writer: the arguments are dt_ckpt_save's; meta
 * and the tensor list are copied, the tensors' data and job_yaml are the
 * caller's and must stay as they are until dt_ckpt_writer_wait returns.
 * DT_ERR_INVALID_ARG when a write is still in flight or uncollected. */
dt_status dt_ckpt_writer_submit(dt_ckpt_writer_t *w, const char *dir,
                                const struct dt_ckpt_meta *meta, const struct dt_ckpt_tensor *t,
                                int n, const char *job_yaml);

/* An in-memory snapshot (snapshot.h) for the writer: this rank's own
 * file in its node's directory, and, when `to` >= 0, its data sent to rank
 * `to` (on another node) while the copy of rank `from` is received and kept
 * as a peer file. Every rank submits its snapshot at the same step. */
struct dt_snap_job {
    char base[DT_SNAP_PATH];   /* checkpoint.memory_dir */
    int node;                  /* this rank's node */
    int to, from;              /* the peer exchange; -1: none */
    struct dt_snap_id id;      /* this rank's (owner = its rank) */
    int64_t step;
    struct dt_ckpt_meta meta;
    const void *data;          /* the caller's, untouched until collected */
    uint64_t bytes;
    void *peer_buf;            /* room for the copy received (the caller's) */
    uint64_t peer_cap;
};

/* Hands an in-memory snapshot to the writer, as dt_ckpt_writer_submit
 * does a checkpoint (job is copied). Its outcome, collected by
 * dt_ckpt_writer_wait, is the first failure of its files or its exchange. */
dt_status dt_ckpt_writer_submit_snap(dt_ckpt_writer_t *w, const struct dt_snap_job *job);

/* 1 when the write in flight (or done, uncollected) is a snapshot. */
int dt_ckpt_writer_is_snap(dt_ckpt_writer_t *w);

/* 1 while a submitted write has not been collected by dt_ckpt_writer_wait. */
int dt_ckpt_writer_pending(const dt_ckpt_writer_t *w);

/* 1 while the thread is still writing (0 once it is done, collected or
 * not). */
int dt_ckpt_writer_busy(dt_ckpt_writer_t *w);

/* Waits until the write in flight is done and collects its outcome:
 * dt_ckpt_save's status and message (agreed over the ranks, as from
 * dt_ckpt_save), the committed file's path, and how long the thread took
 * (*write_s; may be NULL). DT_OK when nothing was pending. */
dt_status dt_ckpt_writer_wait(dt_ckpt_writer_t *w, char *path, size_t len, double *write_s);

#endif
