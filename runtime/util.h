/*
 * util.h - small helpers shared by every module: monotonic time, CPU
 * count, directory creation, checked allocation, edit distance.
 */
#ifndef DT_UTIL_H
#define DT_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* Seconds on a monotonic clock. */
double dt_now(void);

/* CPUs this process may run on (sched affinity), at least 1. */
int dt_cpu_count(void);

/* mkdir -p with mode 0777 & ~umask. Errors name the path. */
dt_status dt_mkdir_p(const char *path);

/* malloc/calloc that record "out of memory allocating N bytes for what". */
dt_status dt_malloc(size_t bytes, const char *what, void **out);
dt_status dt_calloc(size_t n, size_t size, const char *what, void **out);

/* Levenshtein distance between two strings (for "did you mean"). */
int dt_edit_distance(const char *a, const char *b);

/* Formats seconds as "1h02m03s" / "2m05s" / "12.3s". */
void dt_format_duration(double seconds, char *buf, size_t len);

#endif
