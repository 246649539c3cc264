/*
 * watchdog.c - the watchdog thread. It wakes every WATCH_PERIOD_S, reads
 * the phase, step and start time the training loop published, and ends the
 * job with 75 when the phase has run past dt_watchdog_limit (see
 * watchdog.h for why that is later than the communicator's own limit).
 */
#include "watchdog.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "core/clock.h"

#define WATCH_PERIOD_S 0.25
#define NOTE_LINE_MAX 2048
#define NOTE_PATH_MAX 4200

struct dt_watchdog {
    pthread_t thread;
    double timeout_s, limit_s;
    int rank;
    dt_comm_t *comm;
    char note[NOTE_PATH_MAX]; /* "" = none */
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
        if (!phase || ran <= wd->limit_s)
            continue;
        int abort_job = wd->comm && dt_comm_abort_from_any_thread(wd->comm);
        char what[NOTE_LINE_MAX];
        snprintf(what, sizeof what,
                 "watchdog: step %lld has been in phase '%s' for %.1fs, more than "
                 "runtime.timeout_s=%g plus a grace of %gs (no collective's own limit caught it)",
                 (long long)atomic_load(&wd->step) + 1, phase, ran, wd->timeout_s,
                 wd->limit_s - wd->timeout_s);
        fprintf(stderr, "dtrain: rank %d: %s; %s with exit %d so that the job can be restarted%s\n",
                wd->rank, what, abort_job ? "aborting the whole job" : "ending this rank",
                DT_WATCHDOG_EXIT, abort_job ? "" : " (the MPI launcher ends the other ranks)");
        fflush(NULL);
        if (wd->note[0])
            dt_watchdog_note(wd->note, wd->rank, what);
        if (abort_job)
            dt_comm_abort(wd->comm, DT_WATCHDOG_EXIT);
        _exit(DT_WATCHDOG_EXIT);
    }
    return NULL;
}

double dt_watchdog_limit(double timeout_s)
{
    if (timeout_s <= 0)
        return 0;
    double grace = DT_WATCHDOG_GRACE_SHARE * timeout_s;
    return timeout_s + (grace > DT_WATCHDOG_GRACE_MIN_S ? grace : DT_WATCHDOG_GRACE_MIN_S);
}

void dt_watchdog_note(const char *path, int rank, const char *what)
{
    char line[NOTE_LINE_MAX + 128], when[32] = "";
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm))
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    int n = snprintf(line, sizeof line, "%s rank %d: %s\n", when, rank, what);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof line) {
        n = (int)sizeof line - 1;
        line[n - 1] = '\n';
    }
    /* never blocking on, nor writing into, anything but a regular file */
    struct stat sb;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return;
    }
    ssize_t ignored = write(fd, line, (size_t)n);
    (void)ignored;
    close(fd);
}

dt_status dt_watchdog_start(double timeout_s, int rank, dt_comm_t *comm, const char *note_path,
                            struct dt_watchdog **out)
{
    *out = NULL;
    if (timeout_s <= 0)
        return DT_OK;
    struct dt_watchdog *wd = calloc(1, sizeof *wd);
    if (!wd)
        return dt_set_error(DT_ERR_NOMEM, "out of memory starting the watchdog");
    wd->timeout_s = timeout_s;
    wd->limit_s = dt_watchdog_limit(timeout_s);
    wd->rank = rank;
    wd->comm = comm;
    if (note_path && strlen(note_path) >= sizeof wd->note) {
        free(wd);
        return dt_set_error(DT_ERR_USAGE, "the watchdog's note path is too long: %s", note_path);
    }
    snprintf(wd->note, sizeof wd->note, "%s", note_path ? note_path : "");
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
