/*
 * activation.cu - elementwise activations on the GPU: ReLU, exact (erf)
 * GELU and tanh, with their backward passes; the same math as
 * kernels/cpu/activation.c, one grid-stride kernel per op.
 *
 * ReLU lets NaN through (x < 0 ? 0 : x), as the CPU reference does, so a
 * non-finite activation still reaches the loss and the finite check. GELU
 * and tanh use CUDA's erff/expf/tanhf, which differ from glibc's by an ulp
 * or two; the GPU tests compare them with the CPU reference within a
 * tolerance, not bit for bit.
 *
 * These ops have no parameters; the activation gradient (din) is WRITTEN
 * (=). out == in (and din == dout) may be the same buffer: each element is
 * read and written by one thread.
 */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_impl.h"

#define INV_SQRT2 0.70710678118654752440f
#define INV_SQRT_2PI 0.39894228040143267794f

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

/* ---- kernels ---------------------------------------------------------- */

/* out = max(in, 0), NaN passes through */
static __global__ void relu_fwd_kernel(float *out, const float *in, size_t n)
{
    FOR_EACH(i, n)
    {
        float x = in[i];
        out[i] = x < 0.0f ? 0.0f : x;
    }
}

/* din = dout * (in > 0) */
static __global__ void relu_bwd_kernel(float *din, const float *dout, const float *in, size_t n)
{
    FOR_EACH(i, n) din[i] = in[i] > 0.0f ? dout[i] : 0.0f;
}

/* out = x * Phi(x),  Phi(x) = 0.5 (1 + erf(x / sqrt 2)) */
static __global__ void gelu_fwd_kernel(float *out, const float *in, size_t n)
{
    FOR_EACH(i, n)
    {
        float x = in[i];
        out[i] = 0.5f * x * (1.0f + erff(x * INV_SQRT2));
    }
}

/* din = dout * (Phi(x) + x phi(x)),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi) */
static __global__ void gelu_bwd_kernel(float *din, const float *dout, const float *in, size_t n)
{
    FOR_EACH(i, n)
    {
        float x = in[i];
        float cdf = 0.5f * (1.0f + erff(x * INV_SQRT2));
        float pdf = INV_SQRT_2PI * expf(-0.5f * x * x);
        din[i] = dout[i] * (cdf + x * pdf);
    }
}

static __global__ void tanh_fwd_kernel(float *out, const float *in, size_t n)
{
    FOR_EACH(i, n) out[i] = tanhf(in[i]);
}

/* takes the forward OUTPUT y = tanh(x):  din = dout * (1 - y^2) */
static __global__ void tanh_bwd_kernel(float *din, const float *dout, const float *out, size_t n)
{
    FOR_EACH(i, n)
    {
        float y = out[i];
        din[i] = dout[i] * (1.0f - y * y);
    }
}

/* ---- launchers -------------------------------------------------------- */

dt_status dt_cuda_relu_fwd(dt_backend_t *be, float *out, const float *in, size_t n)
{
    dt_status st = check_unary("relu_fwd", out, in);
    if (st != DT_OK || n == 0)
        return st;
    struct cuda_backend *cb = dt_cuda_of(be);
    relu_fwd_kernel<<<dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream>>>(out, in, n);
    return DT_CUDA_LAUNCHED(cb, "relu_fwd", "n=%zu", n);
}

dt_status dt_cuda_relu_bwd(dt_backend_t *be, float *din, const float *dout, const float *in,
                           size_t n)
{
    dt_status st = check_binary("relu_bwd", din, dout, in);
    if (st != DT_OK || n == 0)
        return st;
    struct cuda_backend *cb = dt_cuda_of(be);
    relu_bwd_kernel<<<dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream>>>(din, dout, in, n);
    return DT_CUDA_LAUNCHED(cb, "relu_bwd", "n=%zu", n);
}

dt_status dt_cuda_gelu_fwd(dt_backend_t *be, float *out, const float *in, size_t n)
{
    dt_status st = check_unary("gelu_fwd", out, in);
    if (st != DT_OK || n == 0)
        return st;
    struct cuda_backend *cb = dt_cuda_of(be);
    gelu_fwd_kernel<<<dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream>>>(out, in, n);
    return DT_CUDA_LAUNCHED(cb, "gelu_fwd", "n=%zu", n);
}

dt_status dt_cuda_gelu_bwd(dt_backend_t *be, float *din, const float *dout, const float *in,
                           size_t n)
{
    dt_status st = check_binary("gelu_bwd", din, dout, in);
    if (st != DT_OK || n == 0)
        return st;
    struct cuda_backend *cb = dt_cuda_of(be);
    gelu_bwd_kernel<<<dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream>>>(din, dout, in, n);
    return DT_CUDA_LAUNCHED(cb, "gelu_bwd", "n=%zu", n);
}

dt_status dt_cuda_tanh_fwd(dt_backend_t *be, float *out, const float *in, size_t n)
{
    dt_status st = check_unary("tanh_fwd", out, in);
    if (st != DT_OK || n == 0)
        return st;
    struct cuda_backend *cb = dt_cuda_of(be);
    tanh_fwd_kernel<<<dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream>>>(out, in, n);
    return DT_CUDA_LAUNCHED(cb, "tanh_fwd", "n=%zu", n);
}

dt_status dt_cuda_tanh_bwd(dt_backend_t *be, float *din, const float *dout, const float *out,
                           size_t n)
{
    dt_status st = check_binary("tanh_bwd", din, dout, out);
    if (st != DT_OK || n == 0)
        return st;
    struct cuda_backend *cb = dt_cuda_of(be);
    tanh_bwd_kernel<<<dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream>>>(din, dout, out, n);
    return DT_CUDA_LAUNCHED(cb, "tanh_bwd", "n=%zu", n);
}
