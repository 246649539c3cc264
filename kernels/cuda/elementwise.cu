/*
 * elementwise.cu - the small ops convolutional and residual networks add
 * around their layers: the per-channel bias of a convolution (NCHW) and
 * its gradient, the sum of two tensors (a residual join), the
 * accumulation of one gradient into another (a tensor used twice) and the
 * product of two (an activation's backward from the gradient it kept).
 *
 * channel_bias_bwd is deterministic: one block per channel, thread t sums
 * the channel's values t, t + DT_CUDA_THREADS, ... in (n, hw) order in
 * double (the position stepped on without a division), and the block adds
 * its threads up in a fixed tree, so the same input gives the same bits on
 * every run and every GPU (no atomics). Its rounding differs from the
 * CPU's, which sums in another order, by far less than fp32 resolution.
 * channel_bias_fwd runs over the (n, c) planes (dt_cuda_plane_shape), so
 * a thread finds a plane's channel once and no element costs a division.
 *
 * Gradients of parameters ACCUMULATE (+=: db, and dst of accumulate);
 * gradients of activations are WRITTEN (=). add and mul may write over a
 * or b.
 */
#include <cuda_runtime.h>

#include "cuda_impl.h"

static_assert((DT_CUDA_THREADS & (DT_CUDA_THREADS - 1)) == 0,
              "the block tree sums need a power-of-two block size");

/* x(N,C,HW) += b(C); plane p = n*C + c of x gets b[c] (planes = N*C) */
static __global__ void channel_bias_add(float *x, const float *b, size_t planes, size_t C,
                                        size_t HW)
{
    for (DT_CUDA_PLANES(p, c, planes, C)) {
        const float bc = b[c];
        float *xp = x + p * HW;
        for (DT_CUDA_PLANE_ELEMS(i, HW))
            xp[i] += bc;
    }
}

/* db[c] += sum over N and HW of dout(N,c,HW); block c owns channel c;
 * HW > 0 (the launcher skips empty channels) */
static __global__ void channel_sum(float *db, const float *dout, int N, int C, int HW)
{
    __shared__ double sh[DT_CUDA_THREADS];
    const int c = blockIdx.x;
    /* value j = t + k*DT_CUDA_THREADS is (n, i) = (j / HW, j % HW); both are
     * stepped on, so only the start divides */
    const size_t hw = (size_t)HW, dn = DT_CUDA_THREADS / hw, di = DT_CUDA_THREADS % hw;
    double s = 0.0;
    for (size_t n = threadIdx.x / hw, i = threadIdx.x % hw; n < (size_t)N;) {
        s += dout[(n * C + c) * hw + i];
        n += dn;
        i += di;
        if (i >= hw) {
            i -= hw;
            n++;
        }
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

static __global__ void mul_kernel(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] * b[i];
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
    const size_t planes = (size_t)N * C;
    const struct dt_cuda_planes ps = dt_cuda_plane_shape(planes, (size_t)HW);
    DT_CUDA_LAUNCH(channel_bias_add, ps.grid, ps.block, 0, cb->stream, x, b, planes, (size_t)C,
                   (size_t)HW);
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

/* out(n) = a * b; out may be a or b */
dt_status dt_cuda_mul(dt_backend_t *be, float *out, const float *a, const float *b, size_t n)
{
    if (n == 0)
        return DT_OK;
    DT_CUDA_REQUIRE(out && a && b, "mul", "pointers must not be NULL");
    struct cuda_backend *cb = dt_cuda_of(be);
    DT_CUDA_LAUNCH(mul_kernel, dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream, out, a, b, n);
    return DT_CUDA_LAUNCHED(cb, "mul", "n=%zu", n);
}
