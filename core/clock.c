/*
 * clock.c - dt_now (see clock.h).
 */
#define _GNU_SOURCE
#include "clock.h"

#include <time.h>

double dt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
