/*
 * flatten.c - (B, d1, d2, ...) -> (B, d1*d2*...) on the CPU.
 *
 * Tensors are dense and row-major, so flattening changes only the shape a
 * layer reports; the data is the same. The op still copies, forward and
 * backward, so that a layer owns its output buffer like every other layer
 * (a model may later alias the buffers instead and skip the op). out == in
 * is allowed and copies nothing.
 *
 * No parameters; the activation gradient (din) is WRITTEN (=): din = dout.
 */
#include <string.h>

#include "cpu_ops.h"

static dt_status check_copy(const char *op, const float *dst, const float *src)
{
    if (!dst || !src)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu %s: pointers must not be NULL", op);
    return DT_OK;
}

/* dst(n) = src(n): forward (out = in) and backward (din = dout) are the
 * same copy; the reference copies element by element, the fast path with
 * memmove (dst == src copies nothing). */
struct copy_job {
    float *dst;
    const float *src;
};

static void copy_range(void *a, size_t lo, size_t hi)
{
    const struct copy_job *j = a;
    memcpy(j->dst + lo, j->src + lo, (hi - lo) * sizeof *j->dst);
}

static dt_status copy_apply(dt_backend_t *be, const char *op, float *dst, const float *src,
                            size_t n, int fast)
{
    dt_status st = check_copy(op, dst, src);
    if (st != DT_OK)
        return st;
    if (fast) {
        if (dst == src || n == 0)
            return DT_OK;
        if (dst + n <= src || src + n <= dst) { /* apart: blocks on the pool's threads */
            struct copy_job j = {.dst = dst, .src = src};
            dt_cpu_for(be, n, 4 * DT_CPU_GRAIN, copy_range, &j);
        } else {
            memmove(dst, src, n * sizeof *dst);
        }
        return DT_OK;
    }
    for (size_t i = 0; i < n; i++)
        dst[i] = src[i];
    return DT_OK;
}

dt_status dt_cpu_flatten_fwd_ref(dt_backend_t *be, float *out, const float *in, size_t n)
{
    return copy_apply(be, "flatten_fwd", out, in, n, 0);
}

dt_status dt_cpu_flatten_bwd_ref(dt_backend_t *be, float *din, const float *dout, size_t n)
{
    return copy_apply(be, "flatten_bwd", din, dout, n, 0);
}

dt_status dt_cpu_flatten_fwd(dt_backend_t *be, float *out, const float *in, size_t n)
{
    return copy_apply(be, "flatten_fwd", out, in, n, 1);
}

dt_status dt_cpu_flatten_bwd(dt_backend_t *be, float *din, const float *dout, size_t n)
{
    return copy_apply(be, "flatten_bwd", din, dout, n, 1);
}
