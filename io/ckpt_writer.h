/*
 * ckpt_writer.h - a checkpoint written in the background: a thread of each
 * rank runs dt_ckpt_save (the same file, the same commit, the same checks
 * and messages) on a communicator of its own while the rank's training
 * thread goes on.
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
