/*
 * tensor.c - dtype names and sizes, and shape arithmetic (see tensor.h).
 */
#include "tensor.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
    int is_float;
} dtypes[DT_DTYPE_COUNT] = {
    [DT_F32] = {"f32", 4, 1}, [DT_BF16] = {"bf16", 2, 1}, [DT_F16] = {"f16", 2, 1},
    [DT_F64] = {"f64", 8, 1}, [DT_I32] = {"i32", 4, 0},   [DT_I64] = {"i64", 8, 0},
    [DT_U16] = {"u16", 2, 0}, [DT_U8] = {"u8", 1, 0},
};

static int valid(enum dt_dtype t) { return (int)t >= 0 && (int)t < DT_DTYPE_COUNT; }

const char *dt_dtype_name(enum dt_dtype t) { return valid(t) ? dtypes[t].name : "unknown"; }

int dt_dtype_parse(const char *name)
{
    for (int i = 0; i < DT_DTYPE_COUNT; i++)
        if (strcmp(name, dtypes[i].name) == 0)
            return i;
    return -1;
}

size_t dt_dtype_size(enum dt_dtype t) { return valid(t) ? dtypes[t].size : 0; }

int dt_dtype_is_float(enum dt_dtype t) { return valid(t) && dtypes[t].is_float; }

struct dt_shape dt_shape_make(int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    struct dt_shape s;
    memset(&s, 0, sizeof s);
    const int64_t d[4] = {d0, d1, d2, d3};
    s.ndim = ndim < 0 ? 0 : ndim > 4 ? 4 : ndim;
    for (int i = 0; i < s.ndim; i++)
        s.dim[i] = d[i];
    return s;
}

int64_t dt_shape_numel(const struct dt_shape *s)
{
    if (s->ndim < 0 || s->ndim > DT_MAX_DIMS)
        return -1;
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) {
        if (s->dim[i] < 0)
            return -1;
        if (s->dim[i] != 0 && n > INT64_MAX / s->dim[i])
            return -1;
        n *= s->dim[i];
    }
    return n;
}

int dt_shape_equal(const struct dt_shape *a, const struct dt_shape *b)
{
    if (a->ndim != b->ndim)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->dim[i] != b->dim[i])
            return 0;
    return 1;
}

char *dt_shape_format(const struct dt_shape *s, char *buf, size_t len)
{
    if (len == 0)
        return buf;
    buf[0] = '\0';
    if (s->ndim <= 0) {
        snprintf(buf, len, "scalar");
        return buf;
    }
    size_t k = 0;
    for (int i = 0; i < s->ndim && i < DT_MAX_DIMS && k < len; i++) {
        int w = snprintf(buf + k, len - k, i ? "x%lld" : "%lld", (long long)s->dim[i]);
        if (w < 0)
            break;
        k += (size_t)w;
    }
    return buf;
}
