/*
 * alloc.c - allocation that records what failed, and checked products
 * (see alloc.h).
 */
#include "alloc.h"

#include <stdlib.h>

dt_status dt_malloc(size_t bytes, const char *what, void **out)
{
    *out = malloc(bytes ? bytes : 1);
    if (!*out)
        return dt_set_error(DT_ERR_NOMEM, "out of host memory allocating %zu bytes for %s", bytes,
                            what);
    return DT_OK;
}

dt_status dt_calloc(size_t n, size_t size, const char *what, void **out)
{
    *out = calloc(n ? n : 1, size ? size : 1);
    if (!*out)
        return dt_set_error(DT_ERR_NOMEM, "out of host memory allocating %zu x %zu bytes for %s",
                            n, size, what);
    return DT_OK;
}

int dt_mul_i64(int64_t a, int64_t b, int64_t *out)
{
    if (a < 0 || b < 0)
        return 0;
    return !__builtin_mul_overflow(a, b, out);
}

int dt_mul_size(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }
