/*
 * reduce.cu - whole-buffer helpers on the GPU: sum of squares (gradient
 * norms for clipping), scale (unscaling, clipping), fill, and the finite
 * check that decides whether a step is skipped.
 *
 * sumsq is deterministic: the same input gives the same bits on every run.
 * No atomics; the grid is a pure function of n (dt_cuda_blocks), each
 * thread accumulates a fixed set of elements in double, each block sums its
 * threads in a fixed tree into one partial, and a second one-block kernel
 * sums the partials in a fixed order. The partials live in the backend's
 * scratch (shared with the GEMM operands and the column sums' partials,
 * which is safe because all are used in stream order). Its rounding differs from the CPU's, which sums in
 * another order, by far less than fp32 resolution.
 *
 * all_finite tests the exponent bits, as the CPU does, so no compiler flag
 * can fold the test away; a block that saw a non-finite value raises a flag
 * in the device scalars (every writer writes the same 1).
 *
 * sumsq and all_finite hand a value to the host, so they copy it into the
 * pinned host scalars and wait for the stream. Training waits once per
 * step, in sumsq, whose sum is also its finite check (squares of floats
 * summed in double overflow only for an Inf or NaN); all_finite stays for
 * callers that want the flag alone. These ops produce no
 * gradients (parameter gradients ACCUMULATE (+=) and activation gradients
 * are WRITTEN (=) elsewhere); scale and fill work in place.
 */
#include <cuda_runtime.h>

#include "cuda_impl.h"

/* fp32 exponent field; all ones means Inf or NaN */
#define F32_EXP_MASK 0x7f800000u

static_assert((DT_CUDA_THREADS & (DT_CUDA_THREADS - 1)) == 0,
              "the block tree sums need a power-of-two block size");

/* Sums sh[0 .. DT_CUDA_THREADS) into sh[0] in a fixed tree; every thread of
 * the block calls it. */
static __device__ void block_sum(double *sh)
{
    __syncthreads();
    for (unsigned h = DT_CUDA_THREADS / 2; h > 0; h /= 2) {
        if (threadIdx.x < h)
            sh[threadIdx.x] += sh[threadIdx.x + h];
        __syncthreads();
    }
}

/* partial[block] = sum of x_i^2 over the elements this block's threads own */
static __global__ void sumsq_partials(double *partial, const float *x, size_t n)
{
    __shared__ double sh[DT_CUDA_THREADS];
    double s = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const double v = x[i];
        s += v * v;
    }
    sh[threadIdx.x] = s;
    block_sum(sh);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = sh[0];
}

/* *out = sum of partial[0 .. count), one block */
static __global__ void sumsq_final(double *out, const double *partial, unsigned count)
{
    __shared__ double sh[DT_CUDA_THREADS];
    double s = 0.0;
    for (unsigned i = threadIdx.x; i < count; i += DT_CUDA_THREADS)
        s += partial[i];
    sh[threadIdx.x] = s;
    block_sum(sh);
    if (threadIdx.x == 0)
        *out = sh[0];
}

static __global__ void scale_kernel(float *x, size_t n, float s)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

static __global__ void fill_kernel(float *x, size_t n, float v)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = v;
}

/* *flag = 1 if any x_i is Inf or NaN; left alone otherwise */
static __global__ void find_nonfinite(int *flag, const float *x, size_t n)
{
    unsigned bad = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        bad |= (__float_as_uint(x[i]) & F32_EXP_MASK) == F32_EXP_MASK;
    if (__syncthreads_or(bad) && threadIdx.x == 0)
        *flag = 1;
}

/* Copies `bytes` of the device scalars to the host scalars and waits. */
static dt_status fetch_scalars(struct cuda_backend *cb, size_t bytes, const char *op, size_t n)
{
    cudaError_t err =
        cudaMemcpyAsync(cb->hscalars, cb->dscalars, bytes, cudaMemcpyDeviceToHost, cb->stream);
    if (err != cudaSuccess)
        return dt_cuda_status(cb, err, 0, op, "n=%zu, reading the result", n);
    return dt_cuda_sync_op(cb, op);
}

size_t dt_cuda_sumsq_scratch(size_t n) { return (size_t)dt_cuda_blocks(n) * sizeof(double); }

/* *out = sum of x^2, accumulated in double */
dt_status dt_cuda_sumsq(dt_backend_t *be, const float *x, size_t n, double *out)
{
    DT_CUDA_REQUIRE(x && out, "sumsq", "pointers must not be NULL");
    if (n == 0) {
        *out = 0.0;
        return DT_OK;
    }
    struct cuda_backend *cb = dt_cuda_of(be);
    const unsigned blocks = dt_cuda_blocks(n);
    void *partial = NULL;
    dt_status st = dt_cuda_scratch(cb, dt_cuda_sumsq_scratch(n), &partial);
    if (st != DT_OK)
        return dt_error_context(st, "cuda sumsq (n=%zu)", n);
    DT_CUDA_LAUNCH(sumsq_partials, blocks, DT_CUDA_THREADS, 0, cb->stream, (double *)partial, x, n);
    st = DT_CUDA_LAUNCHED(cb, "sumsq", "n=%zu, %u blocks", n, blocks);
    if (st != DT_OK)
        return st;
    DT_CUDA_LAUNCH(sumsq_final, 1, DT_CUDA_THREADS, 0, cb->stream, (double *)cb->dscalars, (const double *)partial, blocks);
    st = DT_CUDA_LAUNCHED(cb, "sumsq", "n=%zu, summing %u partials", n, blocks);
    if (st != DT_OK)
        return st;
    st = fetch_scalars(cb, sizeof(double), "sumsq", n);
    if (st != DT_OK)
        return st;
    *out = *(const double *)cb->hscalars;
    return DT_OK;
}

/* x *= s */
dt_status dt_cuda_scale(dt_backend_t *be, float *x, size_t n, float s)
{
    DT_CUDA_REQUIRE(x, "scale", "x must not be NULL");
    if (n == 0)
        return DT_OK;
    struct cuda_backend *cb = dt_cuda_of(be);
    DT_CUDA_LAUNCH(scale_kernel, dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream, x, n, s);
    return DT_CUDA_LAUNCHED(cb, "scale", "n=%zu", n);
}

/* x = v */
dt_status dt_cuda_fill(dt_backend_t *be, float *x, size_t n, float v)
{
    DT_CUDA_REQUIRE(x, "fill", "x must not be NULL");
    if (n == 0)
        return DT_OK;
    struct cuda_backend *cb = dt_cuda_of(be);
    DT_CUDA_LAUNCH(fill_kernel, dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream, x, n, v);
    return DT_CUDA_LAUNCHED(cb, "fill", "n=%zu", n);
}

/* *out = 1 if every x is finite, else 0 */
dt_status dt_cuda_all_finite(dt_backend_t *be, const float *x, size_t n, int *out)
{
    DT_CUDA_REQUIRE(x && out, "all_finite", "pointers must not be NULL");
    if (n == 0) {
        *out = 1;
        return DT_OK;
    }
    struct cuda_backend *cb = dt_cuda_of(be);
    int *flag = (int *)cb->dscalars;
    cudaError_t err = cudaMemsetAsync(flag, 0, sizeof *flag, cb->stream);
    if (err != cudaSuccess)
        return dt_cuda_status(cb, err, 0, "all_finite", "n=%zu, clearing the flag", n);
    DT_CUDA_LAUNCH(find_nonfinite, dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream, flag, x, n);
    dt_status st = DT_CUDA_LAUNCHED(cb, "all_finite", "n=%zu", n);
    if (st != DT_OK)
        return st;
    st = fetch_scalars(cb, sizeof *flag, "all_finite", n);
    if (st != DT_OK)
        return st;
    *out = *(const int *)cb->hscalars == 0;
    return DT_OK;
}
