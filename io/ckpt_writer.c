/*
 * ckpt_writer.c - the background checkpoint writer (ckpt_writer.h): one
 * thread per rank that sleeps until a checkpoint is submitted, runs
 * dt_ckpt_save on the side communicator, and leaves the outcome for the
 * training thread to collect.
 *
 * A thread rather than a helper process: the write is parallel HDF5 over
 * MPI-IO, collective over the ranks, and only a thread of the MPI process
 * can take part in MPI (a forked child cannot). The thread keeps its own
 * error message (messages are thread-local), and the collect hands it to
 * the training thread word for word.
 */
#define _GNU_SOURCE
#include "ckpt_writer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/fault.h"

#define WRITER_MSG 2048
#define WRITER_PATH (4096 + 128)

struct dt_ckpt_writer {
    dt_comm_t *side;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* guarded by mu */
    int quit;
    int submitted; /* a write is waiting for the thread */
    int busy;      /* the thread is writing */
    int done;      /* its outcome waits to be collected */
    dt_status st;
    char msg[WRITER_MSG];
    char path[WRITER_PATH];
    double write_s;
    /* the write's arguments (the thread reads them while busy) */
    char dir[WRITER_PATH];
    struct dt_ckpt_meta meta;
    struct dt_ckpt_tensor *t;
    int n, cap;
    const char *yaml;
    int snap; /* the job is job_snap, not a checkpoint */
    struct dt_snap_job job_snap;
};

/* What one rank tells its peer before the copy itself. */
struct snap_hello {
    uint64_t bytes, cap, layout_key;
    int64_t step;
    struct dt_ckpt_meta meta;
};

/* The snapshot job: own file, the exchange, the peer file, pruning. The
 * exchange runs whatever happened to the own file, so that both sides of
 * every pair make the same calls. */
static dt_status run_snap(dt_ckpt_writer_t *w)
{
    const struct dt_snap_job *j = &w->job_snap;
    char dir[DT_SNAP_PATH], msg[2048] = "";
    dt_snap_dir(j->base, j->id.run_key, j->node, dir, sizeof dir);
    dt_status st = dt_snap_write(dir, DT_SNAP_OWN, &j->id, j->step, &j->meta, j->data, j->bytes);
    if (st != DT_OK) snprintf(msg, sizeof msg, "%s", dt_last_error());
    if (j->to >= 0) {
        struct snap_hello mine = {j->bytes, j->peer_cap, j->id.layout_key, j->step, j->meta}, theirs;
        dt_status x = dt_comm_sendrecv(w->side, &mine, sizeof mine, j->to, &theirs, sizeof theirs,
                                       j->from);
        if (x != DT_OK) { /* the pair is out of step: nothing more is exchanged */
            snprintf(msg, sizeof msg, "%s", dt_last_error());
            return dt_set_error(x, "%s", msg);
        }
        /* both sides know both sizes and rooms: a copy that does not fit
         * is not sent (the same decision on both sides) */
        uint64_t give = j->bytes <= theirs.cap ? j->bytes : 0;
        uint64_t take = theirs.bytes <= j->peer_cap ? theirs.bytes : 0;
        x = dt_comm_sendrecv(w->side, j->data, give, j->to, j->peer_buf, take, j->from);
        if (x == DT_OK && take < theirs.bytes)
            x = dt_set_error(DT_ERR_INTERNAL, "rank %d's snapshot (%llu bytes) is larger than the "
                                              "room for it (%llu)",
                             j->from, (unsigned long long)theirs.bytes,
                             (unsigned long long)j->peer_cap);
        if (x == DT_OK) {
            struct dt_snap_id pid = {j->id.run_key, theirs.layout_key, j->from, j->id.world};
            x = dt_snap_write(dir, DT_SNAP_PEER, &pid, theirs.step, &theirs.meta, j->peer_buf,
                              theirs.bytes);
            if (x == DT_OK) dt_snap_prune(dir, DT_SNAP_PEER, j->from, theirs.step);
        }
        if (x != DT_OK && st == DT_OK) {
            st = x;
            snprintf(msg, sizeof msg, "%s", dt_last_error());
        }
    }
    if (st == DT_OK)
        dt_snap_prune(dir, DT_SNAP_OWN, j->id.owner, j->step);
    else
        dt_set_error(st, "%s", msg);
    return st;
}

static void run_one(dt_ckpt_writer_t *w)
{
    char path[WRITER_PATH] = "";
    double t0 = dt_now();
    int64_t ms = 0;
    if (dt_fault_value("slowckpt", dt_comm_rank(w->side), &ms)) /* testing aid */
        nanosleep(&(struct timespec){.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L},
                  NULL);
    dt_status st = w->snap ? run_snap(w)
                           : dt_ckpt_save_ex(w->side, w->dir, &w->meta, w->t, w->n, w->yaml, path,
                                             sizeof path, DT_CKPT_IO_INDEPENDENT);
    pthread_mutex_lock(&w->mu);
    w->st = st;
    snprintf(w->msg, sizeof w->msg, "%s", st == DT_OK ? "" : dt_last_error());
    snprintf(w->path, sizeof w->path, "%s", path);
    w->write_s = dt_now() - t0;
    w->busy = 0;
    w->done = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void *writer_main(void *arg)
{
    dt_ckpt_writer_t *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->submitted && !w->quit)
            pthread_cond_wait(&w->cv, &w->mu);
        if (!w->submitted) break; /* quit with nothing to write */
        w->submitted = 0;
        w->busy = 1;
        pthread_mutex_unlock(&w->mu);
        run_one(w);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

dt_status dt_ckpt_writer_create(dt_comm_t *side, dt_ckpt_writer_t **out)
{
    dt_ckpt_writer_t *w = NULL;
    *out = NULL;
    DT_ASSERT(side);
    dt_status st = dt_calloc(1, sizeof *w, "the checkpoint writer", (void **)&w);
    if (st != DT_OK) return st;
    w->side = side;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    int rc = pthread_create(&w->thread, NULL, writer_main, w);
    if (rc != 0) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return dt_set_error(DT_ERR_NOMEM, "cannot start the checkpoint writer thread: %s",
                            strerror(rc));
    }
    *out = w;
    return DT_OK;
}

void dt_ckpt_writer_destroy(dt_ckpt_writer_t *w)
{
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->quit = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w->t);
    free(w);
}

dt_status dt_ckpt_writer_submit(dt_ckpt_writer_t *w, const char *dir,
                                const struct dt_ckpt_meta *meta, const struct dt_ckpt_tensor *t,
                                int n, const char *job_yaml)
{
    if (dt_ckpt_writer_pending(w))
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "a checkpoint was submitted to the writer while another was pending");
    if (n < 0 || (size_t)snprintf(w->dir, sizeof w->dir, "%s", dir ? dir : "") >= sizeof w->dir)
        return dt_set_error(DT_ERR_INVALID_ARG, "checkpoint directory name too long: %s", dir);
    if (n > w->cap) {
        struct dt_ckpt_tensor *nt = realloc(w->t, (size_t)n * sizeof *nt);
        if (!nt) return dt_set_error(DT_ERR_NOMEM, "out of memory submitting a checkpoint");
        w->t = nt;
        w->cap = n;
    }
    if (n > 0) memcpy(w->t, t, (size_t)n * sizeof *t);
    pthread_mutex_lock(&w->mu);
    w->snap = 0;
    w->meta = *meta;
    w->n = n;
    w->yaml = job_yaml;
    w->done = 0;
    w->submitted = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return DT_OK;
}

dt_status dt_ckpt_writer_submit_snap(dt_ckpt_writer_t *w, const struct dt_snap_job *job)
{
    if (dt_ckpt_writer_pending(w))
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "a snapshot was submitted to the writer while a write was pending");
    pthread_mutex_lock(&w->mu);
    w->snap = 1;
    w->job_snap = *job;
    w->done = 0;
    w->submitted = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return DT_OK;
}

int dt_ckpt_writer_is_snap(dt_ckpt_writer_t *w)
{
    pthread_mutex_lock(&w->mu);
    int s = w->snap;
    pthread_mutex_unlock(&w->mu);
    return s;
}

int dt_ckpt_writer_pending(const dt_ckpt_writer_t *w)
{
    dt_ckpt_writer_t *m = (dt_ckpt_writer_t *)w;
    pthread_mutex_lock(&m->mu);
    int p = m->submitted || m->busy || m->done;
    pthread_mutex_unlock(&m->mu);
    return p;
}

int dt_ckpt_writer_busy(dt_ckpt_writer_t *w)
{
    pthread_mutex_lock(&w->mu);
    int b = w->submitted || w->busy;
    pthread_mutex_unlock(&w->mu);
    return b;
}

dt_status dt_ckpt_writer_wait(dt_ckpt_writer_t *w, char *path, size_t len, double *write_s)
{
    if (path && len) path[0] = '\0';
    if (write_s) *write_s = 0;
    pthread_mutex_lock(&w->mu);
    if (!w->submitted && !w->busy && !w->done) {
        pthread_mutex_unlock(&w->mu);
        return DT_OK;
    }
    while (!w->done)
        pthread_cond_wait(&w->cv, &w->mu);
    w->done = 0;
    dt_status st = w->st;
    if (path && len) snprintf(path, len, "%s", w->path);
    if (write_s) *write_s = w->write_s;
    if (st != DT_OK) dt_set_error(st, "%s", w->msg);
    pthread_mutex_unlock(&w->mu);
    return st;
}
