/*
 * watchdog.c - the watchdog thread. It wakes every WATCH_PERIOD_S, reads
 * the phase, step and start time the training loop published, and exits
 * the process with 75 when the phase has run too long.
 */
#include "watchdog.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "core/util.h"

#define WATCH_PERIOD_S 0.25
#define WATCHDOG_EXIT 75

struct dt_watchdog {
    pthread_t thread;
    double timeout_s;
    int rank;
    atomic_int running;
    _Atomic(const char *) phase; /* NULL when idle */
    atomic_llong step;
    _Atomic double since;
};

static void *watch(void *arg)
{
    struct dt_watchdog *wd = arg;
    struct timespec nap = {0, (long)(WATCH_PERIOD_S * 1e9)};
    while (atomic_load(&wd->running)) {
        nanosleep(&nap, NULL);
        const char *phase = atomic_load(&wd->phase);
        double ran = dt_now() - atomic_load(&wd->since);
        if (!phase || ran <= wd->timeout_s)
            continue;
        fprintf(stderr,
                "dtrain: rank %d: watchdog: step %lld has been in phase '%s' for %.1fs, more than "
                "runtime.timeout_s=%g; ending this rank (exit %d) so that the job can be "
                "restarted\n",
                wd->rank, (long long)atomic_load(&wd->step) + 1, phase, ran, wd->timeout_s,
                WATCHDOG_EXIT);
        fflush(stderr);
        _exit(WATCHDOG_EXIT);
    }
    return NULL;
}

dt_status dt_watchdog_start(double timeout_s, int rank, struct dt_watchdog **out)
{
    *out = NULL;
    if (timeout_s <= 0)
        return DT_OK;
    struct dt_watchdog *wd = calloc(1, sizeof *wd);
    if (!wd)
        return dt_set_error(DT_ERR_NOMEM, "out of memory starting the watchdog");
    wd->timeout_s = timeout_s;
    wd->rank = rank;
    atomic_store(&wd->running, 1);
    atomic_store(&wd->phase, NULL);
    if (pthread_create(&wd->thread, NULL, watch, wd) != 0) {
        free(wd);
        return dt_set_error(DT_ERR_INTERNAL, "cannot start the watchdog thread");
    }
    *out = wd;
    return DT_OK;
}

void dt_watchdog_stop(struct dt_watchdog *wd)
{
    if (!wd)
        return;
    atomic_store(&wd->running, 0);
    pthread_join(wd->thread, NULL);
    free(wd);
}

void dt_watchdog_phase(struct dt_watchdog *wd, const char *phase, int64_t step)
{
    if (!wd)
        return;
    atomic_store(&wd->since, dt_now());
    atomic_store(&wd->step, (long long)step);
    atomic_store(&wd->phase, phase);
}

void dt_watchdog_idle(struct dt_watchdog *wd)
{
    if (wd)
        atomic_store(&wd->phase, NULL);
}
