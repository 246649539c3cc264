/*
 * train_snap.c - in-memory snapshots (checkpoint.memory_every_steps): every
 * K steps each rank copies its state into the snapshot buffer (the one a
 * background checkpoint writes from) and the writer thread keeps it as a
 * file in node-local shared memory and sends a copy to a rank of another
 * node (io/snapshot.h, io/ckpt_writer.h). A restart of the same run
 * resumes from the newest snapshot every rank has, its own or its peer's
 * copy, when it is newer than the file checkpoint loaded; anything missing
 * or damaged falls back to the file checkpoint, with a line saying why.
 *
 * Nodes: the ranks that share a host (by host name), or, when
 * DTRAIN_RANKS_PER_NODE=N is set, ranks [kN, (k+1)N) as node k, so that
 * losing a node can be tried on one machine. With nodes of equal size, the
 * rank of local index i on node k sends its copy to the rank of local
 * index i on node k+1 (cyclically); with one node, or nodes of unequal
 * size, there are no copies (a lost process is survived, not a lost node).
 *
 * The run: a key of the run directory (its real path, and the device and
 * inode of its marker, which a directory made again does not keep), so a
 * snapshot of an earlier run in the same place is never taken for this
 * one's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/text.h"
#include "dist.h"
#include "io/snapshot.h"
#include "runtime/monitor/rundir.h"
#include "train_impl.h"

#define SNAP_LISTED 4 /* the newest snapshots each rank offers at a restart */
#define HOST_KEY 64

/* ---- nodes and peers ------------------------------------------------------ */

/* node[r] for every rank: DTRAIN_RANKS_PER_NODE, or by host name. */
static dt_status find_nodes(struct run *r, int *node)
{
    const char *env = getenv("DTRAIN_RANKS_PER_NODE");
    if (env && *env) {
        char *end;
        long n = strtol(env, &end, 10);
        if (*end || n < 1 || n > INT_MAX)
            return dt_set_error(DT_ERR_USAGE, "DTRAIN_RANKS_PER_NODE=%s: expected a whole number "
                                              "of ranks, at least 1",
                                env);
        for (int q = 0; q < r->world; q++)
            node[q] = q / (int)n;
        return DT_OK;
    }
    char *hosts = NULL, mine[HOST_KEY] = "";
    snprintf(mine, sizeof mine, "%s", dt_comm_host(r->comm));
    dt_status st = dt_calloc((size_t)r->world, HOST_KEY, "the node table", (void **)&hosts);
    if (st == DT_OK)
        st = r->world > 1 ? dt_comm_allgather(r->comm, mine, hosts, HOST_KEY) : DT_OK;
    if (r->world == 1)
        memcpy(hosts, mine, HOST_KEY);
    for (int q = 0, nodes = 0; q < r->world && st == DT_OK; q++) {
        node[q] = -1;
        for (int p = 0; p < q && node[q] < 0; p++)
            if (strncmp(hosts + (size_t)p * HOST_KEY, hosts + (size_t)q * HOST_KEY, HOST_KEY) == 0)
                node[q] = node[p];
        if (node[q] < 0)
            node[q] = nodes++;
    }
    free(hosts);
    return st;
}

/* to_of[q] for every rank (-1: no copy); this rank's own to and from. */
static void find_peers(struct run *r, const int *node, int *to_of)
{
    int nodes = 0, size = -1, equal = 1;
    for (int q = 0; q < r->world; q++)
        nodes = node[q] + 1 > nodes ? node[q] + 1 : nodes;
    for (int k = 0; k < nodes; k++) {
        int n = 0;
        for (int q = 0; q < r->world; q++)
            n += node[q] == k;
        if (size < 0) size = n;
        equal = equal && n == size;
    }
    r->snap_to = r->snap_from = -1;
    for (int q = 0; q < r->world; q++) {
        to_of[q] = -1;
        if (nodes < 2 || !equal) continue;
        int local = 0, k = (node[q] + 1) % nodes, seen = 0;
        for (int p = 0; p < q; p++)
            local += node[p] == node[q];
        for (int p = 0; p < r->world; p++)
            if (node[p] == k && seen++ == local) to_of[q] = p;
    }
    for (int q = 0; q < r->world; q++) {
        if (q == r->rank) r->snap_to = to_of[q];
        if (to_of[q] == r->rank) r->snap_from = q;
    }
}

/* The run's key (rank 0's, shared). */
static dt_status run_key(struct run *r)
{
    char real[PATH_MAX], marker[PATH_MAX + 64];
    struct stat sb = {0};
    uint64_t key = 0;
    if (r->rank == 0) {
        if (!realpath(r->job->output.dir, real))
            snprintf(real, sizeof real, "%s", r->job->output.dir);
        snprintf(marker, sizeof marker, "%s/%s", real, DT_RUNDIR_MARKER);
        (void)stat(marker, &sb);
        uint64_t v[2] = {(uint64_t)sb.st_dev, (uint64_t)sb.st_ino};
        key = dt_snap_checksum(real, strlen(real)) ^ dt_snap_checksum(v, sizeof v);
    }
    r->snap_run_key = key;
    return r->world > 1 ? dt_comm_broadcast(r->comm, &r->snap_run_key, sizeof key, 0) : DT_OK;
}

/* ---- set-up ------------------------------------------------------------------- */

/* Room on this machine's memory_dir file system for every rank on it: its
 * own snapshot and the copy it holds, two of each while one is written. */
static dt_status check_room(struct run *r, uint64_t own)
{
    const char *base = r->job->checkpoint.memory_dir;
    struct stat sb;
    if (stat(base, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return dt_set_error(DT_ERR_USAGE, "checkpoint.memory_dir %s: %s", base,
                            errno == ENOENT ? "no such directory" : "not a directory");
    uint64_t each = 2 * (own + r->snap_peer_cap), need = each * (uint64_t)dt_comm_local_size(r->comm);
    uint64_t have = dt_snap_free_bytes(base);
    if (have != UINT64_MAX) /* what a restart finds of the run's is replaced, not added to */
        have += dt_snap_run_bytes(base, r->snap_run_key);
    if (have == UINT64_MAX || have >= need)
        return DT_OK;
    char n[32], h[32], e[32];
    dt_format_bytes(need, n, sizeof n);
    dt_format_bytes(have, h, sizeof h);
    dt_format_bytes(each, e, sizeof e);
    return dt_set_error(DT_ERR_USAGE,
                        "checkpoint.memory_dir %s has %s free, but the in-memory snapshots of "
                        "the %d rank%s on this node need about %s (%s each: its own state and the "
                        "copy it keeps for a rank of another node, two of each while one is "
                        "written): give the file system more room (for /dev/shm, the shm size of "
                        "the container or the node), name another checkpoint.memory_dir, or set "
                        "checkpoint.memory_every_steps: 0",
                        base, h, dt_comm_local_size(r->comm),
                        dt_comm_local_size(r->comm) == 1 ? "" : "s", n, e);
}

static dt_status open_local(struct run *r, int *node)
{
    uint64_t own = 0, *bytes_of = NULL;
    if (!r->writer)
        return dt_set_error(DT_ERR_USAGE,
                            "checkpoint.memory_every_steps needs the background writer, which "
                            "checkpoint.async: off (or an MPI without MPI_THREAD_MULTIPLE) leaves "
                            "out: set checkpoint.async: auto, or checkpoint.memory_every_steps: 0");
    (void)dt_train_snap_buffer(r, &own, &r->snap_layout);
    dt_status st = find_nodes(r, node);
    if (st == DT_OK)
        st = dt_calloc((size_t)r->world, sizeof *r->snap_to_of, "the snapshot peers",
                       (void **)&r->snap_to_of);
    if (st == DT_OK)
        st = dt_calloc((size_t)r->world, sizeof *r->snap_layout_of, "the snapshot peers",
                       (void **)&r->snap_layout_of);
    if (st == DT_OK)
        st = dt_calloc((size_t)r->world, sizeof *bytes_of, "the snapshot peers", (void **)&bytes_of);
    if (st == DT_OK)
        st = r->world > 1 ? dt_comm_allgather(r->comm, &r->snap_layout, r->snap_layout_of,
                                              sizeof r->snap_layout)
                          : DT_OK;
    if (st == DT_OK)
        st = r->world > 1 ? dt_comm_allgather(r->comm, &own, bytes_of, sizeof own) : DT_OK;
    if (st == DT_OK) {
        r->snap_layout_of[r->rank] = r->snap_layout;
        r->snap_node = node[r->rank];
        find_peers(r, node, r->snap_to_of);
        r->snap_peer_cap = r->snap_from >= 0 ? bytes_of[r->snap_from] : 0;
        st = run_key(r);
    }
    if (st == DT_OK)
        st = check_room(r, own);
    if (st == DT_OK && r->snap_peer_cap)
        st = dt_malloc(r->snap_peer_cap, "the room for a peer's in-memory snapshot",
                       &r->snap_peer_buf);
    free(bytes_of);
    return st;
}

dt_status dt_train_snap_open(struct run *r)
{
    int *node = NULL;
    r->snap_last = -1;
    if (r->eval_only || r->job->checkpoint.memory_every_steps <= 0)
        return DT_OK;
    dt_status st = dt_calloc((size_t)r->world, sizeof *node, "the node table", (void **)&node);
    if (st == DT_OK)
        st = open_local(r, node);
    free(node);
    st = dt_dist_agree(r->comm, st);
    if (st != DT_OK)
        return st;
    r->snap_every = r->job->checkpoint.memory_every_steps;
    char dir[DT_SNAP_PATH];
    dt_snap_dir(r->job->checkpoint.memory_dir, r->snap_run_key, r->snap_node, dir, sizeof dir);
    if (r->rank == 0)
        DT_LOG_INFO("ckpt", "in-memory snapshots every %lld steps in %s (rank 0's node; %s)",
                    (long long)r->snap_every, dir,
                    r->snap_to >= 0 ? "each rank's copy on a rank of the next node"
                                    : "one node, or nodes of unequal size: no copies on another "
                                      "node");
    return DT_OK;
}

/* ---- taking snapshots ------------------------------------------------------- */

dt_status dt_train_snap_save(struct run *r)
{
    if (!r->snap_every || r->step % r->snap_every != 0 || r->step == r->snap_last ||
        r->step == r->last_ckpt_step)
        return DT_OK;
    /* a write still in flight on some rank (the agreement says so alike on
     * every rank): this snapshot is left out rather than waited for */
    if (!r->bg_done || dt_ckpt_writer_pending(r->writer))
        return DT_OK;
    struct dt_snap_job job = {.node = r->snap_node,
                              .to = r->snap_to,
                              .from = r->snap_from,
                              .step = r->step,
                              .peer_buf = r->snap_peer_buf,
                              .peer_cap = r->snap_peer_cap};
    double t0 = dt_now();
    snprintf(job.base, sizeof job.base, "%s", r->job->checkpoint.memory_dir);
    uint64_t layout; /* r->snap_layout, from the same buffer */
    job.id = (struct dt_snap_id){r->snap_run_key, r->snap_layout, r->rank, r->world};
    job.data = dt_train_snap_buffer(r, &job.bytes, &layout);
    dt_status st = dt_train_snap_take(r, &job.meta);
    if (st == DT_OK)
        st = dt_ckpt_writer_submit_snap(r->writer, &job);
    st = dt_dist_agree(r->comm, st);
    if (st != DT_OK)
        return st;
    r->bg_step = r->step;
    r->bg_blocked = dt_now() - t0;
    r->bg_waited = 0;
    r->snap_last = r->step;
    return DT_OK;
}

dt_status dt_train_snap_collected(struct run *r, dt_status st, double write_s)
{
    if (st == DT_ERR_COMM || st == DT_ERR_TIMEOUT)
        return dt_error_context(st, "in-memory snapshot of step %lld", (long long)r->bg_step);
    if (st != DT_OK) {
        DT_LOG_WARN("ckpt", "step %lld: in-memory snapshot not kept, training continues: %s",
                    (long long)r->bg_step, dt_last_error());
        return DT_OK;
    }
    DT_LOG_DEBUG("ckpt", "step %lld: in-memory snapshot kept in %.3fs (training waited %.3fs)",
                 (long long)r->bg_step, write_s, r->bg_blocked);
    return DT_OK;
}

/* ---- resuming from one ---------------------------------------------------------- */

/* What each rank offers: its own snapshots' steps and those of the copy
 * it holds (of rank snap_from), newest first, -1 where none. */
struct offer {
    int64_t own[SNAP_LISTED], held[SNAP_LISTED];
};

static int offers(const int64_t *list, int64_t step)
{
    for (int i = 0; i < SNAP_LISTED; i++)
        if (list[i] == step) return 1;
    return 0;
}

/* The newest step above `after` every rank has, its own or held by the
 * rank its copy goes to; -1 when none. */
static int64_t newest_common(const struct run *r, const struct offer *all, int64_t after)
{
    int64_t best = -1;
    for (int q = 0; q < r->world; q++)
        for (int i = 0; i < SNAP_LISTED; i++) {
            int64_t s = all[q].own[i];
            int every = s > after && s > best;
            for (int p = 0; p < r->world && every; p++) {
                int h = r->snap_to_of[p];
                every = offers(all[p].own, s) || (h >= 0 && offers(all[h].held, s));
            }
            if (every) best = s;
        }
    return best;
}

static void snap_dirs(const struct run *r, char *dir, size_t len)
{
    dt_snap_dir(r->job->checkpoint.memory_dir, r->snap_run_key, r->snap_node, dir, len);
}

/* Rank `holder` reads the copy of rank q's snapshot of step s it keeps
 * and sends it to q, which takes it into its buffer and meta. */
static dt_status hand_over(struct run *r, int q, int holder, int64_t s, void *buf, uint64_t bytes,
                           struct dt_ckpt_meta *meta)
{
    char dir[DT_SNAP_PATH], path[DT_SNAP_PATH + 64];
    struct {
        int32_t st;
        struct dt_ckpt_meta meta;
    } head = {0};
    dt_status st = DT_OK;
    if (r->rank == holder) {
        snap_dirs(r, dir, sizeof dir);
        dt_snap_path(dir, DT_SNAP_PEER, q, s, path, sizeof path);
        struct dt_snap_id id = {r->snap_run_key, r->snap_layout_of[q], q, r->world};
        head.st = dt_snap_read(path, &id, s, r->snap_peer_buf, r->snap_peer_cap, &head.meta);
        if (head.st != DT_OK)
            DT_LOG_WARN("ckpt", "the copy of rank %d's in-memory snapshot cannot be used: %s", q,
                        dt_last_error());
        st = dt_comm_sendrecv(r->side_comm, &head, sizeof head, q, NULL, 0, q);
        if (st == DT_OK && head.st == DT_OK)
            st = dt_comm_sendrecv(r->side_comm, r->snap_peer_buf, r->snap_peer_cap, q, NULL, 0, q);
        return st != DT_OK ? st : head.st != DT_OK ? dt_set_error(head.st, "%s", dt_last_error())
                                                   : DT_OK;
    }
    st = dt_comm_sendrecv(r->side_comm, NULL, 0, holder, &head, sizeof head, holder);
    if (st == DT_OK && head.st == DT_OK)
        st = dt_comm_sendrecv(r->side_comm, NULL, 0, holder, buf, bytes, holder);
    if (st == DT_OK && head.st != DT_OK)
        st = dt_set_error(DT_ERR_BAD_DATA, "its copy on rank %d is damaged or missing", holder);
    *meta = head.meta;
    return st;
}

/* Reads snapshot s into the buffer: this rank's own, or for those whose
 * own is missing, the copy their peer holds (pairs in rank order, the same
 * on every rank). *peer: this rank took its copy. */
static dt_status gather_state(struct run *r, const struct offer *all, int64_t s,
                              struct dt_ckpt_meta *meta, int *peer)
{
    char dir[DT_SNAP_PATH], path[DT_SNAP_PATH + 64];
    uint64_t bytes, layout;
    void *buf = dt_train_snap_buffer(r, &bytes, &layout);
    dt_status st = DT_OK, mine = DT_OK;
    *peer = !offers(all[r->rank].own, s);
    if (!*peer) {
        snap_dirs(r, dir, sizeof dir);
        dt_snap_path(dir, DT_SNAP_OWN, r->rank, s, path, sizeof path);
        struct dt_snap_id id = {r->snap_run_key, r->snap_layout, r->rank, r->world};
        mine = dt_snap_read(path, &id, s, buf, bytes, meta);
    }
    for (int q = 0; q < r->world && st == DT_OK; q++) {
        int h = r->snap_to_of[q];
        if (offers(all[q].own, s) || h < 0 || (r->rank != q && r->rank != h)) continue;
        st = hand_over(r, q, h, s, buf, bytes, meta);
        if (r->rank == q) /* the owner reports what went wrong; the holder too */
            mine = st;
        if (st != DT_ERR_COMM) /* only a broken exchange ends the loop */
            st = DT_OK;
    }
    return st != DT_OK ? st : mine;
}

static void list_offer(const struct run *r, struct offer *o)
{
    char dir[DT_SNAP_PATH];
    snap_dirs(r, dir, sizeof dir);
    for (int i = 0; i < SNAP_LISTED; i++)
        o->own[i] = o->held[i] = -1;
    dt_snap_list(dir, DT_SNAP_OWN, r->rank, o->own, SNAP_LISTED);
    if (r->snap_from >= 0)
        dt_snap_list(dir, DT_SNAP_PEER, r->snap_from, o->held, SNAP_LISTED);
}

dt_status dt_train_snap_resume(struct run *r, int64_t after, int *taken)
{
    struct offer mine, *all = NULL;
    struct dt_ckpt_meta meta;
    int peer = 0;
    *taken = 0;
    if (!r->snap_every)
        return DT_OK;
    double t0 = dt_now();
    int64_t from_step = after;
    list_offer(r, &mine);
    dt_status st = dt_calloc((size_t)r->world, sizeof *all, "the snapshot offers", (void **)&all);
    st = dt_dist_agree(r->comm, st);
    if (st == DT_OK)
        st = r->world > 1 ? dt_comm_allgather(r->comm, &mine, all, sizeof mine) : DT_OK;
    if (st == DT_OK && r->world == 1)
        all[0] = mine;
    int64_t s = st == DT_OK ? newest_common(r, all, from_step) : -1;
    if (st != DT_OK || s < 0) {
        free(all);
        return st;
    }
    st = gather_state(r, all, s, &meta, &peer);
    free(all);
    if (st == DT_ERR_COMM)
        return st;
    dt_status agreed = dt_dist_agree(r->comm, st);
    if (agreed != DT_OK) {
        if (r->rank == 0)
            DT_LOG_WARN("ckpt", "the in-memory snapshot of step %lld cannot be used (%s): %s; "
                                "the run's snapshots are removed",
                        (long long)s, dt_last_error(),
                        after >= 0 ? "resuming from the file checkpoint" : "starting fresh");
        if (agreed == DT_ERR_COMM)
            return agreed;
        /* none of them is taken for a later restart of the state resumed now */
        dt_train_snap_discard(r);
        return DT_OK;
    }
    int32_t peers = peer;
    st = r->world > 1 ? dt_comm_allreduce(r->comm, &peers, 1, DT_I32, DT_COMM_SUM) : DT_OK;
    if (st == DT_OK)
        st = dt_dist_agree(r->comm, dt_train_snap_restore(r, &meta));
    if (st != DT_OK)
        return st;
    r->snap_last = s;
    r->last_ckpt_step = -1; /* the file checkpoint is older than this state */
    *taken = 1;
    DT_LOG_INFO("ckpt",
                "resumed from the in-memory snapshot of step %lld in %.2fs (%d rank%s took the "
                "copy kept on another node): %lld step%s after %s; epoch %lld, batch %lld, "
                "%lld samples seen",
                (long long)s, dt_now() - t0, (int)peers, peers == 1 ? "" : "s",
                (long long)(s - (from_step < 0 ? 0 : from_step)), s - from_step == 1 ? "" : "s",
                from_step < 0 ? "the start (no file checkpoint)" : "the file checkpoint",
                (long long)r->epoch + 1, (long long)r->batch, (long long)r->samples);
    return DT_OK;
}

void dt_train_snap_discard(struct run *r)
{
    if (!r->snap_every)
        return;
    /* every rank is done with its files before they go */
    if (r->world > 1 && dt_comm_barrier(r->comm) != DT_OK)
        return;
    if (dt_comm_local_rank(r->comm) == 0)
        dt_snap_remove_run(r->job->checkpoint.memory_dir, r->snap_run_key);
}
