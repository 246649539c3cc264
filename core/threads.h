/*
 * threads.h - a rank's pool of compute threads: created once with the
 * backend (runtime.threads of them, the caller counted as one), used by
 * every CPU op with enough work to share.
 *
 * A job is a number of tasks; dt_threads_run runs fn(arg, task, thread)
 * for every task in [0, tasks) on the pool's threads and the caller, and
 * returns when all have finished. Tasks are claimed in order by whichever
 * thread is free; `thread` (0 = the caller) only picks per-thread scratch.
 * Ops make each task's result independent of which thread runs it and of
 * how many threads there are: tasks write disjoint outputs, and a sum over
 * tasks is combined by the caller in task order. So an op cut into a fixed
 * number of tasks gives the same bits on 1 thread and on 64.
 *
 * Threads wait for work spinning briefly, then sleeping on a condition
 * variable, so an idle pool costs nothing while the loader or the
 * communicator runs. A run from inside a task (an op called by an op) runs
 * inline on that thread. The pool is not for concurrent callers: one
 * thread (the rank's training thread) submits jobs.
 *
 * Pinning: where the rank is bound to a set of cores (mpirun --bind-to,
 * srun --cpu-bind) with at least as many cores as threads, thread i is
 * pinned to the i-th core of the set (the caller stays where it was
 * bound); an unbound rank's threads are left to the scheduler, since
 * pinning them could put two ranks on one core.
 */
#ifndef DT_THREADS_H
#define DT_THREADS_H

#include "status.h"

typedef struct dt_threads dt_threads_t;

typedef void (*dt_task_fn)(void *arg, int task, int thread);

/* A pool of n threads (n >= 1; the caller is one of them, so n - 1 are
 * started). DT_ERR_INVALID_ARG for n < 1, DT_ERR_NOMEM/DT_ERR_IO when the
 * system cannot start them. */
dt_status dt_threads_create(int n, dt_threads_t **out);
void dt_threads_destroy(dt_threads_t *p);

/* The pool's thread count; 1 for NULL. */
int dt_threads_count(const dt_threads_t *p);

/* Runs fn(arg, t, thread) for t in [0, tasks) and waits for all. A NULL
 * pool, one thread, one task or a call from inside a task run inline. */
void dt_threads_run(dt_threads_t *p, int tasks, dt_task_fn fn, void *arg);

/* The cores the pool's threads were pinned to (0 when it did not pin). */
int dt_threads_pinned(const dt_threads_t *p);

#endif
