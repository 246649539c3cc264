/*
 * test_threads.c - the compute pool (core/threads.h): every task runs
 * exactly once, on a valid thread index, for pools of 1 to 8 threads and
 * task counts from 1 to 1000; thousands of jobs back to back (a thread
 * late to one job must not take a task of the next); a run from inside a
 * task runs inline; a job after the threads have slept still runs; bad
 * sizes are refused.
 */
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "core/threads.h"
#include "cu_util.h"

#define MAX_TASKS 1000

struct count_job {
    _Atomic int runs[MAX_TASKS];
    _Atomic int bad_thread;
    int threads;
    int job; /* which job of a sequence this is */
    _Atomic int wrong_job;
    int *current; /* the job the caller is on */
};

static void count_task(void *a, int t, int thread)
{
    struct count_job *j = a;
    atomic_fetch_add(&j->runs[t], 1);
    if (thread < 0 || thread >= j->threads)
        atomic_store(&j->bad_thread, 1);
    if (j->current && *j->current != j->job)
        atomic_store(&j->wrong_job, 1);
}

static void test_every_task_once(void)
{
    static const int sizes[] = {1, 2, 3, 7, 64, 1000};
    for (int n = 1; n <= 8; n++) {
        dt_threads_t *p = NULL;
        CU_ASSERT_FATAL(dt_threads_create(n, &p) == DT_OK);
        CU_ASSERT_EQUAL(dt_threads_count(p), n);
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            static struct count_job j;
            memset(&j, 0, sizeof j);
            j.threads = n;
            dt_threads_run(p, sizes[k], count_task, &j);
            int once = 0;
            for (int t = 0; t < sizes[k]; t++)
                once += atomic_load(&j.runs[t]) == 1;
            CU_ASSERT_EQUAL(once, sizes[k]);
            CU_ASSERT_EQUAL(atomic_load(&j.bad_thread), 0);
        }
        dt_threads_destroy(p);
    }
}

/* Jobs of 1 to 5 tasks, 20000 of them: each task sees the job the
 * caller is on, and each job's tasks all ran once before the next. */
static void test_back_to_back(void)
{
    dt_threads_t *p = NULL;
    CU_ASSERT_FATAL(dt_threads_create(4, &p) == DT_OK);
    static struct count_job j[2];
    int current = 0, missed = 0;
    for (int i = 0; i < 20000; i++) {
        struct count_job *x = &j[i & 1];
        memset(x, 0, sizeof *x);
        x->threads = 4;
        x->job = i;
        x->current = &current;
        current = i;
        int tasks = 1 + i % 5;
        dt_threads_run(p, tasks, count_task, x);
        for (int t = 0; t < tasks; t++)
            missed += atomic_load(&x->runs[t]) != 1;
        missed += atomic_load(&x->wrong_job) != 0;
        if (i % 5000 == 4999)
            usleep(2000); /* the threads go to sleep; the next job wakes them */
    }
    CU_ASSERT_EQUAL(missed, 0);
    dt_threads_destroy(p);
}

struct nest_job {
    dt_threads_t *p;
    struct count_job inner[8];
};

static void nest_task(void *a, int t, int thread)
{
    struct nest_job *j = a;
    j->inner[t].threads = 1; /* inline: every inner task on thread 0 */
    dt_threads_run(j->p, 10, count_task, &j->inner[t]);
}

static void test_nested_runs_inline(void)
{
    dt_threads_t *p = NULL;
    CU_ASSERT_FATAL(dt_threads_create(3, &p) == DT_OK);
    static struct nest_job j;
    memset(&j, 0, sizeof j);
    j.p = p;
    dt_threads_run(p, 8, nest_task, &j);
    int ok = 0;
    for (int t = 0; t < 8; t++)
        for (int i = 0; i < 10; i++)
            ok += atomic_load(&j.inner[t].runs[i]) == 1;
    CU_ASSERT_EQUAL(ok, 80);
    for (int t = 0; t < 8; t++)
        CU_ASSERT_EQUAL(atomic_load(&j.inner[t].bad_thread), 0);
    dt_threads_destroy(p);
}

static void test_refusals(void)
{
    dt_threads_t *p = (dt_threads_t *)1;
    CU_ASSERT_EQUAL(dt_threads_create(0, &p), DT_ERR_INVALID_ARG);
    CU_ASSERT(p == NULL);
    CU_ASSERT_EQUAL(dt_threads_count(NULL), 1);
    static struct count_job j;
    memset(&j, 0, sizeof j);
    j.threads = 1;
    dt_threads_run(NULL, 3, count_task, &j); /* no pool: inline */
    CU_ASSERT(atomic_load(&j.runs[0]) == 1 && atomic_load(&j.runs[2]) == 1);
    dt_threads_destroy(NULL);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("threads", NULL, NULL);
    CU_ADD(s, test_every_task_once);
    CU_ADD(s, test_back_to_back);
    CU_ADD(s, test_nested_runs_inline);
    CU_ADD(s, test_refusals);
    return cu_run_all();
}
