/*
 * memory.h - host memory a run needs, checked before it is allocated.
 *
 * A job too large for the machine would otherwise be killed by the
 * kernel's out-of-memory killer (exit 137, no message) once its pages are
 * touched. Instead each rank adds up what it is about to allocate
 * (parameters, gradients, optimizer state, the activation arena, loader
 * buffers, checkpoint staging), compares it with what it can have, and
 * refuses with the numbers:
 *   - more than runtime.memory_limit, or than the machine could ever give
 *     the rank (the node's memory or its cgroup limit, shared by the ranks
 *     of the node): DT_ERR_USAGE (exit 64): the job must change;
 *   - more than is free right now: DT_ERR_BUSY (exit 75): other processes
 *     hold the memory, and a later attempt may fit.
 */
#ifndef DT_MEMORY_H
#define DT_MEMORY_H

#include <stdint.h>

#include "core/status.h"

/* Bytes one rank needs, by what they are for. UINT64_MAX in a part means
 * "more than can be counted". */
struct dt_mem_need {
    uint64_t params, grads, optim, activations, loaders, staging, other;
    uint64_t resident; /* what the process holds already (libraries, labels) */
    int64_t rows;      /* the activation arena's rows, for the message */
    /* What comm.shard: optimizer would save this rank where the job keeps
     * the optimizer state whole but could shard it (0: nothing), so that a
     * refusal can say so */
    uint64_t shard_saving;
    /* What comm.shard: gradients would save beyond that (the gradients but
     * this rank's shard and the staging area); 0: nothing */
    uint64_t grads_saving;
    /* What comm.shard: parameters would save beyond both (the parameters
     * but this rank's shard and the gather slots); 0: nothing */
    uint64_t params_saving;
    /* What checkpoint.async: off would save (the snapshot a background
     * checkpoint write keeps, part of staging); 0: nothing */
    uint64_t async_saving;
};

/* What one rank can have, in bytes; UINT64_MAX where nothing limits. */
struct dt_mem_avail {
    uint64_t node_total;     /* MemTotal, or a smaller cgroup limit */
    uint64_t node_available; /* MemAvailable, or what the cgroup has left */
    int local_ranks;         /* ranks sharing this node */
    char host[64];
};

/* a + b, UINT64_MAX where it would overflow ("more than can be counted"). */
uint64_t dt_mem_add(uint64_t a, uint64_t b);

/* The parts still to allocate added up (resident not included),
 * saturating at UINT64_MAX. */
uint64_t dt_mem_need_total(const struct dt_mem_need *n);

/* The process's resident set now, in bytes (0 if unknown). */
uint64_t dt_mem_resident(void);

/* Reads this node's memory (/proc/meminfo, the process's cgroup v2 or v1
 * limit, RLIMIT_AS). Never fails: what cannot be read does not limit. */
void dt_mem_probe(int local_ranks, struct dt_mem_avail *out);

/* The decision above for rank `rank`; limit_gib is runtime.memory_limit
 * (0: none). */
dt_status dt_mem_check(const struct dt_mem_need *need, const struct dt_mem_avail *avail,
                       double limit_gib, int rank);

#endif
