/*
 * threads.c - the compute thread pool (see threads.h).
 *
 * One job at a time. The caller publishes the job's function, argument
 * and task count, then the 64-bit claim word (job number << 32 | next
 * task). A thread takes a task by compare-and-swap on the claim word, so a
 * thread still looking at an old job's word can never take a task of the
 * new one; the word is closed (no task left) before the new job's fields
 * are written. The caller takes tasks too, then waits (spinning: the tasks
 * left are running) until the finished count reaches the task count.
 */
#define _GNU_SOURCE
#include "threads.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"

/* Polls of the job word before a waiting thread sleeps: 260 us on the
 * test machine's Xeon (a pause instruction is about 13 ns there), longer
 * than the gaps between the jobs of a step, short next to a step. */
#define SPIN_POLLS 20000

struct dt_threads {
    int n;
    int pinned;
    pthread_t *tid;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    _Atomic uint64_t claim;  /* job << 32 | next task */
    _Atomic uint32_t job;    /* the published job's number */
    _Atomic int finished;    /* tasks of the job done */
    _Atomic int stop;
    _Atomic(dt_task_fn) fn;
    _Atomic(void *) arg;
    _Atomic int tasks;
    struct worker *w;
};

struct worker {
    struct dt_threads *p;
    int index;
};

static _Thread_local int in_task;

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Takes and runs tasks of job `job` until none are left. */
static void work(struct dt_threads *p, uint32_t job, int thread)
{
    for (;;) {
        uint64_t v = atomic_load_explicit(&p->claim, memory_order_acquire);
        if ((uint32_t)(v >> 32) != job)
            return;
        uint32_t t = (uint32_t)v;
        if (t >= (uint32_t)atomic_load_explicit(&p->tasks, memory_order_relaxed))
            return;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &v, v + 1, memory_order_acq_rel,
                                                   memory_order_relaxed))
            continue;
        dt_task_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
        void *arg = atomic_load_explicit(&p->arg, memory_order_relaxed);
        in_task = 1;
        fn(arg, (int)t, thread);
        in_task = 0;
        atomic_fetch_add_explicit(&p->finished, 1, memory_order_release);
    }
}

static void *worker_main(void *a)
{
    struct worker *w = a;
    struct dt_threads *p = w->p;
    uint32_t seen = atomic_load_explicit(&p->job, memory_order_acquire);
    for (;;) {
        uint32_t job;
        int polls = 0;
        while ((job = atomic_load_explicit(&p->job, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&p->stop, memory_order_relaxed)) {
            if (++polls < SPIN_POLLS) {
                relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while ((job = atomic_load_explicit(&p->job, memory_order_acquire)) == seen &&
                   !atomic_load_explicit(&p->stop, memory_order_relaxed))
                pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load_explicit(&p->stop, memory_order_relaxed))
            return NULL;
        seen = job;
        work(p, job, w->index);
    }
}

/* Pins thread i to the i-th core of the caller's set when the rank is
 * bound to fewer cores than the machine has and the set holds n. */
static int pin_plan(int n, cpu_set_t *set, int *core)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (sched_getaffinity(0, sizeof *set, set) != 0)
        return 0;
    int have = CPU_COUNT(set);
    if (online <= 0 || have >= online || have < n)
        return 0;
    for (int c = 0, i = 0; c < CPU_SETSIZE && i < n; c++)
        if (CPU_ISSET(c, set))
            core[i++] = c;
    return 1;
}

dt_status dt_threads_create(int n, dt_threads_t **out)
{
    dt_status st = DT_OK;
    struct dt_threads *p = NULL;
    int *core = NULL;
    *out = NULL;
    if (n < 1 || n > 4096)
        return dt_set_error(DT_ERR_INVALID_ARG, "threads: a pool of %d threads (1 to 4096)", n);
    DT_CHECK(dt_calloc(1, sizeof *p, "the thread pool", (void **)&p));
    p->n = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    if (n > 1) {
        DT_CHECK(dt_calloc((size_t)n, sizeof *p->tid, "the thread pool", (void **)&p->tid));
        DT_CHECK(dt_calloc((size_t)n, sizeof *p->w, "the thread pool", (void **)&p->w));
        DT_CHECK(dt_calloc((size_t)n, sizeof *core, "the thread pool", (void **)&core));
    }
    cpu_set_t set;
    int pin = n > 1 && pin_plan(n, &set, core);
    for (int i = 1; i < n; i++) {
        p->w[i] = (struct worker){.p = p, .index = i};
        int e = pthread_create(&p->tid[i], NULL, worker_main, &p->w[i]);
        if (e != 0) {
            st = dt_set_error(e == EAGAIN ? DT_ERR_NOMEM : DT_ERR_IO,
                              "threads: cannot start compute thread %d of %d: %s", i, n,
                              strerror(e));
            goto out;
        }
        p->n = i + 1;
        if (pin) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(core[i], &one);
            pthread_setaffinity_np(p->tid[i], sizeof one, &one);
        }
    }
    p->pinned = pin ? n : 0;
    *out = p;
    p = NULL;
out:
    free(core);
    dt_threads_destroy(p);
    return st;
}

void dt_threads_destroy(dt_threads_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++)
        pthread_join(p->tid[i], NULL);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p->tid);
    free(p->w);
    free(p);
}

int dt_threads_count(const dt_threads_t *p) { return p ? p->n : 1; }

int dt_threads_pinned(const dt_threads_t *p) { return p ? p->pinned : 0; }

void dt_threads_run(dt_threads_t *p, int tasks, dt_task_fn fn, void *arg)
{
    if (tasks <= 0)
        return;
    if (!p || p->n == 1 || tasks == 1 || in_task) {
        int was = in_task;
        in_task = 1;
        for (int t = 0; t < tasks; t++)
            fn(arg, t, 0);
        in_task = was;
        return;
    }
    uint32_t job = atomic_load_explicit(&p->job, memory_order_relaxed) + 1;
    /* Closed first: a thread that read the last job's word before this
     * cannot take a task now, whatever the new count it reads. */
    atomic_store_explicit(&p->claim, (uint64_t)(job - 1) << 32 | UINT32_MAX, memory_order_seq_cst);
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->arg, arg, memory_order_relaxed);
    atomic_store_explicit(&p->tasks, tasks, memory_order_relaxed);
    atomic_store_explicit(&p->finished, 0, memory_order_relaxed);
    atomic_store_explicit(&p->claim, (uint64_t)job << 32, memory_order_release);
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->job, job, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    work(p, job, 0);
    while (atomic_load_explicit(&p->finished, memory_order_acquire) < tasks)
        relax();
}
