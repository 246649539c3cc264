/*
 * memory.c - adding up a run's host memory and comparing it with what
 * the node gives each rank (see memory.h).
 *
 * The node's figures come from /proc/meminfo; a cgroup memory limit (a
 * Slurm job's --mem, a container's) is found through /proc/self/cgroup,
 * v2 (memory.max and memory.current, the smallest limit on the way up the
 * hierarchy) or v1 (memory.limit_in_bytes, memory.usage_in_bytes); a
 * finite RLIMIT_AS caps it too.
 */
#define _GNU_SOURCE
#include "memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/log.h"
#include "core/text.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define CGROUP_PATH 4096

uint64_t dt_mem_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }
static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

uint64_t dt_mem_need_total(const struct dt_mem_need *n)
{
    uint64_t t = 0;
    const uint64_t parts[] = {n->params,  n->grads,   n->optim, n->activations,
                              n->loaders, n->staging, n->other};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        t = dt_mem_add(t, parts[i]);
    return t;
}

/* ---- the node -------------------------------------------------------------- */

/* A "Key:   N kB" line of /proc/meminfo, in bytes; UINT64_MAX if absent. */
static uint64_t meminfo(const char *key)
{
    char line[256];
    uint64_t v = UINT64_MAX;
    size_t n = strlen(key);
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return v;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && line[n] == ':') {
            v = strtoull(line + n + 1, NULL, 10) * 1024u;
            break;
        }
    fclose(f);
    return v;
}

/* A number file of a cgroup ("max" and unreadable files: UINT64_MAX). */
static uint64_t read_number(const char *path)
{
    char text[64];
    FILE *f = fopen(path, "r");
    if (!f)
        return UINT64_MAX;
    int ok = fgets(text, sizeof text, f) != NULL;
    fclose(f);
    if (!ok || strncmp(text, "max", 3) == 0)
        return UINT64_MAX;
    char *end;
    unsigned long long v = strtoull(text, &end, 10);
    return end == text ? UINT64_MAX : (uint64_t)v;
}

/* The process's cgroup path for a v1 controller, or for v2 (controller
 * NULL): the part after the second ':' of its /proc/self/cgroup line. */
static int cgroup_of(const char *controller, char *out, size_t len)
{
    char line[CGROUP_PATH];
    int found = 0;
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f)
        return 0;
    while (!found && fgets(line, sizeof line, f)) {
        char *a = strchr(line, ':'), *b = a ? strchr(a + 1, ':') : NULL;
        if (!b)
            continue;
        *b = '\0';
        int match = controller ? strstr(a + 1, controller) != NULL
                               : strncmp(line, "0", 1) == 0 && a[1] == '\0';
        if (match) {
            b[1 + strcspn(b + 1, "\n")] = '\0';
            snprintf(out, len, "%s", b + 1);
            found = 1;
        }
    }
    fclose(f);
    return found;
}

/* Limit and use of the process's cgroup; UINT64_MAX when unlimited. */
static void cgroup_memory(uint64_t *limit, uint64_t *used)
{
    char cg[CGROUP_PATH], path[2 * CGROUP_PATH];
    *limit = *used = UINT64_MAX;
    if (cgroup_of(NULL, cg, sizeof cg)) {
        /* v2: the tightest memory.max from the process's group up to the root */
        for (;;) {
            snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", cg);
            uint64_t l = read_number(path);
            if (l < *limit) {
                *limit = l;
                snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.current", cg);
                *used = read_number(path);
            }
            char *slash = strrchr(cg, '/');
            if (!slash || slash == cg)
                break;
            *slash = '\0';
        }
        return;
    }
    if (cgroup_of("memory", cg, sizeof cg)) {
        snprintf(path, sizeof path, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", cg);
        *limit = read_number(path);
        snprintf(path, sizeof path, "/sys/fs/cgroup/memory%s/memory.usage_in_bytes", cg);
        *used = read_number(path);
    }
}

uint64_t dt_mem_resident(void)
{
    unsigned long long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return 0;
    int ok = fscanf(f, "%llu %llu", &pages, &rss) == 2;
    fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    return ok && page > 0 ? (uint64_t)rss * (uint64_t)page : 0;
}

void dt_mem_probe(int local_ranks, struct dt_mem_avail *out)
{
    uint64_t limit, used;
    memset(out, 0, sizeof *out);
    out->local_ranks = local_ranks > 0 ? local_ranks : 1;
    if (gethostname(out->host, sizeof out->host) != 0)
        snprintf(out->host, sizeof out->host, "this host");
    out->host[sizeof out->host - 1] = '\0';
    out->node_total = meminfo("MemTotal");
    out->node_available = meminfo("MemAvailable");
    cgroup_memory(&limit, &used);
    if (limit != UINT64_MAX) {
        out->node_total = min_u64(out->node_total, limit);
        if (used != UINT64_MAX)
            out->node_available = min_u64(out->node_available, used < limit ? limit - used : 0);
    }
    struct rlimit rl; /* per process, so it caps this rank's share */
    uint64_t ranks = (uint64_t)out->local_ranks;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        (uint64_t)rl.rlim_cur < out->node_total / ranks) {
        out->node_total = (uint64_t)rl.rlim_cur * ranks;
        out->node_available = min_u64(out->node_available, out->node_total);
    }
}

/* ---- the decision --------------------------------------------------------- */

static void describe_need(const struct dt_mem_need *n, char *buf, size_t len)
{
    char p[32], g[32], o[32], a[32], l[32], s[32], t[32], h[32];
    dt_format_bytes(dt_mem_add(dt_mem_need_total(n), n->resident), t, sizeof t);
    dt_format_bytes(n->resident, h, sizeof h);
    dt_format_bytes(n->params, p, sizeof p);
    dt_format_bytes(n->grads, g, sizeof g);
    dt_format_bytes(n->optim, o, sizeof o);
    dt_format_bytes(n->activations, a, sizeof a);
    dt_format_bytes(dt_mem_add(n->loaders, n->other), l, sizeof l);
    dt_format_bytes(n->staging, s, sizeof s);
    snprintf(buf, len,
             "about %s of host memory on each rank (parameters %s, gradients %s, optimizer state "
             "%s, activations for %lld rows %s, data loading and the rest %s, checkpoint staging "
             "%s, the process as it stands %s)",
             t, p, g, o, (long long)n->rows, a, l, s, h);
}

static const char *const advice =
    "lower train.micro_batch (activations grow with it; train.global_batch can stay), "
    "model.hidden or data.prefetch, or run fewer ranks per node";

/* The advice of a refusal: the first stage of comm.shard whose saving
 * (with the earlier stages') would bring the job within `most` bytes:
 * the optimizer state, then the gradients too, then the parameters too. */
static const char *advise(const struct dt_mem_need *need, uint64_t total, uint64_t most,
                          char *buf, size_t len)
{
    char save[32];
    static const struct {
        const char *stage, *keeps;
    } stages[] = {
        {"optimizer", "the optimizer state"},
        {"gradients", "the optimizer state and of the gradients"},
        {"parameters", "the optimizer state, of the gradients and of the parameters"},
    };
    const uint64_t saving[] = {need->shard_saving, need->grads_saving, need->params_saving};
    uint64_t sum = 0; /* what each stage saves, with the ones before it */
    for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++) {
        sum = dt_mem_add(sum, saving[i]);
        if (!saving[i] || sum >= total || total - sum > most) continue;
        dt_format_bytes(sum, save, sizeof save);
        snprintf(buf, len,
                 "set comm.shard: %s (each rank then keeps its 1/N of %s, %s less, which is "
                 "enough), or %s",
                 stages[i].stage, stages[i].keeps, save, advice);
        return buf;
    }
    if (need->async_saving && need->async_saving < total && total - need->async_saving <= most) {
        dt_format_bytes(need->async_saving, save, sizeof save);
        snprintf(buf, len,
                 "set checkpoint.async: off (checkpoints are then written while training waits, "
                 "without the %s snapshot a background write keeps, which is enough), or %s",
                 save, advice);
        return buf;
    }
    return advice;
}

dt_status dt_mem_check(const struct dt_mem_need *need, const struct dt_mem_avail *avail,
                       double limit_gib, int rank)
{
    char what[512], have[32], node[32], adv[512];
    uint64_t more = dt_mem_need_total(need), total = dt_mem_add(more, need->resident);
    uint64_t ranks = (uint64_t)(avail->local_ranks > 0 ? avail->local_ranks : 1);
    describe_need(need, what, sizeof what);
    if (limit_gib > 0 && (double)total > limit_gib * GIB)
        return dt_set_error(DT_ERR_USAGE,
                            "this job needs %s, more than runtime.memory_limit=%g GiB: raise the "
                            "limit, or %s",
                            what, limit_gib,
                            advise(need, total, (uint64_t)(limit_gib * GIB), adv, sizeof adv));
    uint64_t most = avail->node_total == UINT64_MAX ? UINT64_MAX : avail->node_total / ranks;
    if (total > most) {
        dt_format_bytes(most, have, sizeof have);
        dt_format_bytes(avail->node_total, node, sizeof node);
        return dt_set_error(DT_ERR_USAGE,
                            "this job needs %s, but rank %d on %s can have at most %s (%s on the "
                            "node, shared by %d rank%s): %s",
                            what, rank, avail->host, have, node, avail->local_ranks,
                            avail->local_ranks == 1 ? "" : "s",
                            advise(need, total, most, adv, sizeof adv));
    }
    uint64_t now = avail->node_available == UINT64_MAX ? UINT64_MAX : avail->node_available / ranks;
    if (more > now) { /* what the process holds is no longer free */
        dt_format_bytes(now, have, sizeof have);
        dt_format_bytes(avail->node_available, node, sizeof node);
        return dt_set_error(DT_ERR_BUSY,
                            "this job needs %s, but only %s is free for rank %d on %s now (%s "
                            "free on the node, for %d rank%s; other processes hold the rest): "
                            "run it again when memory is free (exit 75), or %s",
                            what, have, rank, avail->host, node, avail->local_ranks,
                            avail->local_ranks == 1 ? "" : "s",
                            advise(need, more, now, adv, sizeof adv));
    }
    dt_format_bytes(now, have, sizeof have);
    DT_LOG_DEBUG("memory", "rank %d needs %s; %s is free for it", rank, what, have);
    return DT_OK;
}
