/*
 * watchdog.h - a thread per rank that ends the rank when one phase of the
 * work (a step, a collective, a checkpoint) runs past runtime.timeout_s.
 *
 * A hung collective cannot be interrupted from inside; the only way out
 * that lets the job be restarted is to leave: the watchdog prints which
 * rank, step and phase hung and exits the process with 75, and the MPI
 * launcher then ends the other ranks (their own watchdogs do the same if
 * the launcher does not). The training loop marks phases; marking is two
 * atomic stores.
 */
#ifndef DT_WATCHDOG_H
#define DT_WATCHDOG_H

#include <stdint.h>

#include "core/status.h"

struct dt_watchdog;

/* timeout_s <= 0: no thread, every call below is a no-op. */
dt_status dt_watchdog_start(double timeout_s, int rank, struct dt_watchdog **out);
void dt_watchdog_stop(struct dt_watchdog *wd);

/* Enters `phase` (a string literal) of step `step`; the clock restarts. */
void dt_watchdog_phase(struct dt_watchdog *wd, const char *phase, int64_t step);
/* Leaves any phase: nothing is timed until the next dt_watchdog_phase. */
void dt_watchdog_idle(struct dt_watchdog *wd);

#endif
