/*
 * clock.h - the clock dtrain measures time with: monotonic, so steps,
 * timeouts, progress and throughput stay right when the wall clock is
 * set.
 */
#ifndef DT_CLOCK_H
#define DT_CLOCK_H

/* Seconds on a monotonic clock. */
double dt_now(void);

#endif
