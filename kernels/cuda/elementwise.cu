/*
 * elementwise.cu - the small ops convolutional and residual networks add
 * around their layers: the per-channel bias of a convolution (NCHW) and
 * its gradient, the sum of two tensors (a residual join) and the
 * accumulation of one gradient into another (a tensor used twice).
 *
 * channel_bias_bwd is deterministic: one block per channel, each thread
 * sums a fixed set of the channel's values in double, and the block adds
 * its threads up in a fixed tree, so the same input gives the same bits on
 * every run (no atomics). Its rounding differs from the CPU's, which sums
 * in another order, by far less than fp32 resolution.
 *
 * Gradients of parameters ACCUMULATE (+=: db, and dst of accumulate);
 * gradients of activations are WRITTEN (=). add may write over a or b.
 */
#include <cuda_runtime.h>

#include "cuda_impl.h"

static_assert((DT_CUDA_THREADS & (DT_CUDA_THREADS - 1)) == 0,
              "the block tree sums need a power-of-two block size");

/* x(N,C,HW) += b(C); element i is in channel (i / HW) % C */
static __global__ void channel_bias_add(float *x, const float *b, size_t n, size_t C, size_t HW)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] += b[(i / HW) % C];
}

/* db[c] += sum over N and HW of dout(N,c,HW); block c owns channel c */
static __global__ void channel_sum(float *db, const float *dout, int N, int C, int HW)
{
    __shared__ double sh[DT_CUDA_THREADS];
    const int c = blockIdx.x;
    const size_t per = (size_t)N * HW;
    double s = 0.0;
    for (size_t j = threadIdx.x; j < per; j += DT_CUDA_THREADS) {
        const size_t n = j / (size_t)HW, i = j % (size_t)HW;
        s += dout[(n * C + c) * (size_t)HW + i];
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (unsigned h = DT_CUDA_THREADS / 2; h > 0; h /= 2) {
        if (threadIdx.x < h)
            sh[threadIdx.x] += sh[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        db[c] += (float)sh[0];
}

static __global__ void add_kernel(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

static __global__ void accumulate_kernel(float *dst, const float *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] += src[i];
}

/* x(N,C,HW) += b(C), in place */
dt_status dt_cuda_channel_bias_fwd(dt_backend_t *be, float *x, const float *b, int N, int C, int HW)
{
    DT_CUDA_REQUIRE(N >= 0 && C >= 0 && HW >= 0, "channel_bias_fwd",
                    "negative size (N=%d C=%d HW=%d)", N, C, HW);
    const size_t n = (size_t)N * C * HW;
    if (n == 0)
        return DT_OK;
    DT_CUDA_REQUIRE(x && b, "channel_bias_fwd", "pointers must not be NULL");
    struct cuda_backend *cb = dt_cuda_of(be);
    DT_CUDA_LAUNCH(channel_bias_add, dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream, x, b, n, (size_t)C, (size_t)HW);
    return DT_CUDA_LAUNCHED(cb, "channel_bias_fwd", "N=%d C=%d HW=%d", N, C, HW);
}

/* db(C) += sum over N and HW of dout(N,C,HW) */
dt_status dt_cuda_channel_bias_bwd(dt_backend_t *be, float *db, const float *dout, int N, int C,
                                   int HW)
{
    DT_CUDA_REQUIRE(N >= 0 && C >= 0 && HW >= 0, "channel_bias_bwd",
                    "negative size (N=%d C=%d HW=%d)", N, C, HW);
    if (C == 0 || (size_t)N * HW == 0)
        return DT_OK;
    DT_CUDA_REQUIRE(db && dout, "channel_bias_bwd", "pointers must not be NULL");
    struct cuda_backend *cb = dt_cuda_of(be);
    DT_CUDA_LAUNCH(channel_sum, (unsigned)C, DT_CUDA_THREADS, 0, cb->stream, db, dout, N, C, HW);
    return DT_CUDA_LAUNCHED(cb, "channel_bias_bwd", "N=%d C=%d HW=%d", N, C, HW);
}

/* out(n) = a + b; out may be a or b */
dt_status dt_cuda_add(dt_backend_t *be, float *out, const float *a, const float *b, size_t n)
{
    if (n == 0)
        return DT_OK;
    DT_CUDA_REQUIRE(out && a && b, "add", "pointers must not be NULL");
    struct cuda_backend *cb = dt_cuda_of(be);
    DT_CUDA_LAUNCH(add_kernel, dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream, out, a, b, n);
    return DT_CUDA_LAUNCHED(cb, "add", "n=%zu", n);
}

/* dst(n) += src */
dt_status dt_cuda_accumulate(dt_backend_t *be, float *dst, const float *src, size_t n)
{
    if (n == 0)
        return DT_OK;
    DT_CUDA_REQUIRE(dst && src, "accumulate", "pointers must not be NULL");
    struct cuda_backend *cb = dt_cuda_of(be);
    DT_CUDA_LAUNCH(accumulate_kernel, dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream, dst, src, n);
    return DT_CUDA_LAUNCHED(cb, "accumulate", "n=%zu", n);
}
