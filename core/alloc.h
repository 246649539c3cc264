/*
 * alloc.h - host memory: allocation that says what failed, and the
 * checked products that size it.
 *
 * Every size a file or a job declares is multiplied with a checked
 * product before anything is allocated from it, and a failed allocation
 * records what it was for, so running out of memory is a message naming
 * the allocation, not a crash.
 */
#ifndef DT_ALLOC_H
#define DT_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* malloc/calloc that record "out of memory allocating N bytes for what". */
dt_status dt_malloc(size_t bytes, const char *what, void **out);
dt_status dt_calloc(size_t n, size_t size, const char *what, void **out);

/* Checked products: *out = a * b and 1, or 0 when the product does not
 * fit (or, for int64, when either factor is negative). */
int dt_mul_i64(int64_t a, int64_t b, int64_t *out);
int dt_mul_size(size_t a, size_t b, size_t *out);

#endif
