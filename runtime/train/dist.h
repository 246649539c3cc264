/*
 * dist.h - what the ranks of a job agree on before and while training:
 * one outcome for a step that may have failed on some rank, one job, one
 * dataset, one set of initial parameters. Every function here is
 * collective: all ranks call it in the same order. With one rank they
 * cost nothing.
 */
#ifndef DT_DIST_H
#define DT_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/comm.h"
#include "runtime/config/config.h"
#include "core/status.h"

#define DT_DIST_MSG 640

/* Every rank passes its own outcome; every rank gets the same answer: OK
 * when all succeeded, else the status of the lowest failing rank with its
 * message prefixed "rank R: " (when there is more than one rank). A failure
 * of the agreement itself is DT_ERR_COMM. */
dt_status dt_dist_agree(dt_comm_t *c, dt_status mine);

/* Rank 0's resolved job is sent to every rank; a rank whose own job
 * differs fails with the keys that differ (DT_ERR_USAGE). data.path may
 * differ (node-local copies); the dataset identity check covers it. */
dt_status dt_dist_check_job(dt_comm_t *c, const struct dt_job *job);

/* Fails with `code` on every rank whose `mine` differs from rank 0's,
 * naming `what` and both values. Agreed across ranks. */
dt_status dt_dist_check_same(dt_comm_t *c, const char *what, const char *mine, dt_status code);

/* Rank 0 prints each rank's line, in rank order. */
dt_status dt_dist_log_lines(dt_comm_t *c, const char *subsys, const char *line);

/* 64-bit FNV-1a of a byte range. */
uint64_t dt_hash64(const void *data, size_t bytes);

#endif
