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

/* out(n) = in(n) */
dt_status dt_cpu_flatten_fwd_ref(dt_backend_t *be, float *out, const float *in, size_t n)
{
    dt_status st = check_copy("flatten_fwd", out, in);
    if (st != DT_OK)
        return st;
    for (size_t i = 0; i < n; i++)
        out[i] = in[i];
    return DT_OK;
}

/* din(n) = dout(n) */
dt_status dt_cpu_flatten_bwd_ref(dt_backend_t *be, float *din, const float *dout, size_t n)
{
    dt_status st = check_copy("flatten_bwd", din, dout);
    if (st != DT_OK)
        return st;
    for (size_t i = 0; i < n; i++)
        din[i] = dout[i];
    return DT_OK;
}

dt_status dt_cpu_flatten_fwd(dt_backend_t *be, float *out, const float *in, size_t n)
{
    dt_status st = check_copy("flatten_fwd", out, in);
    if (st != DT_OK)
        return st;
    if (out != in && n > 0)
        memmove(out, in, n * sizeof *out);
    return DT_OK;
}

dt_status dt_cpu_flatten_bwd(dt_backend_t *be, float *din, const float *dout, size_t n)
{
    dt_status st = check_copy("flatten_bwd", din, dout);
    if (st != DT_OK)
        return st;
    if (din != dout && n > 0)
        memmove(din, dout, n * sizeof *din);
    return DT_OK;
}
