/*
 * fault.h - a testing aid: DTRAIN_FAULT makes a chosen rank fail at a
 * chosen point, so tests can start a real multi-rank job and watch every
 * rank stop cleanly. Comma-separated entries RANK:EVENT[:STEP]:
 *   open       the dataset cannot be opened on that rank
 *   nomem      the model's memory cannot be allocated on that rank
 *   read:STEP  reading a training batch fails at optimizer step STEP
 * Unset (the normal case) it costs one getenv at start-up.
 */
#ifndef DT_FAULT_H
#define DT_FAULT_H

#include <stdint.h>

#include "status.h"

/* Parses DTRAIN_FAULT; DT_ERR_USAGE on a malformed value. */
dt_status dt_fault_init(void);

/* 1 when `event` is armed for `rank` (and `step`, for step events). */
int dt_fault_armed(const char *event, int rank, int64_t step);

#endif
