/*
 * activation.cu - the element-wise ops of DT_UNARY_LIST (kernels/ops.h) on
 * the GPU: the same rows as kernels/cpu/activation.c, each expanded by
 * CUDA_UNARY below into one grid-stride kernel per direction and one host
 * launcher per op that checks its arguments, sizes the grid, launches and
 * checks the launch.
 *
 * The expressions are the CPU's, evaluated with CUDA's erfcf/expf/tanhf,
 * which differ from glibc's by an ulp or two; the GPU tests compare them
 * with the CPU reference within a tolerance, not bit for bit. ReLU lets
 * NaN through (x < 0 ? 0 : x), as the CPU reference does.
 *
 * <name>_fwd_keep writes the forward's output and, over its input, the
 * row's gradient at dy = 1 (the backward's expression, so mul(dout, kept)
 * is the backward's value where it is dy times one expression).
 *
 * These ops have no parameters; the activation gradient (din) is WRITTEN
 * (=). out == in (and din == dout) may be the same buffer: each element is
 * read and written by one thread (not in <name>_fwd_keep, whose out and x
 * are distinct).
 */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_impl.h"

/* Grid-stride loop over i in [0, n). */
#define FOR_EACH(i, n)                                                                             \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)blockDim.x * gridDim.x)

static dt_status check_unary(const char *op, const float *out, const float *in)
{
    if (!out || !in)
        return dt_set_error(DT_ERR_INVALID_ARG, "cuda %s: pointers must not be NULL", op);
    return DT_OK;
}

static dt_status check_binary(const char *op, const float *din, const float *dout, const float *x)
{
    if (!din || !dout || !x)
        return dt_set_error(DT_ERR_INVALID_ARG, "cuda %s: pointers must not be NULL", op);
    return DT_OK;
}

/* One row: out[i] = forward(x = in[i]); din[i] = gradient(dy = dout[i],
 * s = saved[i]) with s the input (x) or the output (y). */
#define CUDA_UNARY(a, name, s, forward, gradient, cpu, doc)                                        \
    static __global__ void name##_fwd_kernel(float *out, const float *in, size_t n)                \
    {                                                                                              \
        FOR_EACH(i, n)                                                                             \
        {                                                                                          \
            const float x = in[i];                                                                 \
            out[i] = (forward);                                                                    \
        }                                                                                          \
    }                                                                                              \
    static __global__ void name##_bwd_kernel(float *din, const float *dout, const float *saved,    \
                                             size_t n)                                             \
    {                                                                                              \
        FOR_EACH(i, n)                                                                             \
        {                                                                                          \
            const float dy = dout[i], s = saved[i];                                                \
            din[i] = (gradient);                                                                   \
        }                                                                                          \
    }                                                                                              \
    static __global__ void name##_keep_kernel(float *out, float *xs, size_t n)                     \
    {                                                                                              \
        FOR_EACH(i, n)                                                                             \
        {                                                                                          \
            const float x = xs[i];                                                                 \
            const float y = (forward);                                                             \
            const float dy = 1.0f;                                                                 \
            out[i] = y;                                                                            \
            xs[i] = (gradient);                                                                    \
        }                                                                                          \
    }                                                                                              \
    dt_status dt_cuda_##name##_fwd_keep(dt_backend_t *be, float *out, float *x, size_t n)          \
    {                                                                                              \
        dt_status st = check_unary(#name "_fwd_keep", out, x);                                     \
        if (st == DT_OK && out == x)                                                               \
            st = dt_set_error(DT_ERR_INVALID_ARG, "cuda %s: out and x must be distinct",           \
                              #name "_fwd_keep");                                                  \
        if (st != DT_OK || n == 0)                                                                 \
            return st;                                                                             \
        struct cuda_backend *cb = dt_cuda_of(be);                                                  \
        DT_CUDA_LAUNCH(name##_keep_kernel, dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream, out, x, n); \
        return DT_CUDA_LAUNCHED(cb, #name "_fwd_keep", "n=%zu", n);                                \
    }                                                                                              \
    dt_status dt_cuda_##name##_fwd(dt_backend_t *be, float *out, const float *in, size_t n)        \
    {                                                                                              \
        dt_status st = check_unary(#name "_fwd", out, in);                                         \
        if (st != DT_OK || n == 0)                                                                 \
            return st;                                                                             \
        struct cuda_backend *cb = dt_cuda_of(be);                                                  \
        DT_CUDA_LAUNCH(name##_fwd_kernel, dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream, out, in, n);      \
        return DT_CUDA_LAUNCHED(cb, #name "_fwd", "n=%zu", n);                                     \
    }                                                                                              \
    dt_status dt_cuda_##name##_bwd(dt_backend_t *be, float *din, const float *dout,                \
                                   const float *saved, size_t n)                                   \
    {                                                                                              \
        dt_status st = check_binary(#name "_bwd", din, dout, saved);                               \
        if (st != DT_OK || n == 0)                                                                 \
            return st;                                                                             \
        struct cuda_backend *cb = dt_cuda_of(be);                                                  \
        DT_CUDA_LAUNCH(name##_bwd_kernel, dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream, din, dout, saved, n);        \
        return DT_CUDA_LAUNCHED(cb, #name "_bwd", "n=%zu", n);                                     \
    }

DT_UNARY_LIST(CUDA_UNARY, _)
