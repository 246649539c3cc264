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
 * callers that want the flag alone.
 *
 * step_gate does not wait: each range is summed as sumsq sums it (its
 * partials reuse one piece of the scratch, in stream order) into a range
 * total, one thread adds the totals in order and decides (kernels/gate.h)
 * into the gate record of the device scalars, a grid-stride pass
 * multiplies the gradients by what it decided, and the record is copied
 * to the host scalars, with an event after the copy. The gated updates
 * (optim.cu) read the record, so the whole update is queued before the
 * host has seen it; the host reads it at its next wait
 * (dt_backend_settle: the event, not the update after it). These ops produce no
 * gradients (parameter gradients ACCUMULATE (+=) and activation gradients
 * are WRITTEN (=) elsewhere); scale and fill work in place.
 */
#include <cuda_runtime.h>

#include "cuda_impl.h"
#include "kernels/gate.h"

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
    dt_cuda_params_written(cb, x, n * sizeof *x);
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
    dt_cuda_params_written(cb, x, n * sizeof *x);
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

/* ---- the step gate ------------------------------------------------------ */

/* Sums the range totals in order into the record; with decide, decides. */
static __global__ void gate_decide_kernel(struct dt_cuda_gate *gate, const double *totals,
                                          unsigned count, int decide, float unscale, double clip)
{
    if (threadIdx.x != 0)
        return;
    double s = 0.0;
    for (unsigned k = 0; k < count; k++)
        s += totals[k];
    gate->sumsq = s;
    if (decide) {
        float f = 1.0f;
        gate->skip = dt_gate_decide(s, unscale, clip, &f);
        gate->factor = f;
    }
}

/* x *= unscale, then x *= factor, unless the gate skips; two roundings,
 * as two calls of scale give. */
static __global__ void gate_scale_kernel(float *x, size_t n, float unscale,
                                         const struct dt_cuda_gate *gate)
{
    if (gate->skip)
        return;
    const float f = gate->factor;
    if (unscale == 1.0f && f == 1.0f)
        return;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = x[i];
        if (unscale != 1.0f)
            v = __fmul_rn(v, unscale);
        if (f != 1.0f)
            v = __fmul_rn(v, f);
        x[i] = v;
    }
}

size_t dt_cuda_gate_scratch(size_t n, size_t count)
{
    return (count + (n ? dt_cuda_blocks(n) : 1)) * sizeof(double);
}

void dt_cuda_gate_result(struct cuda_backend *cb)
{
    if (!cb->gate_pending)
        return;
    cb->gate_pending = 0;
    const struct dt_cuda_gate g = *dt_cuda_gate_of(cb->hscalars);
    *cb->gate_out = (struct dt_gate){.sumsq = g.sumsq,
                                     .skip = cb->gate_decided ? g.skip : 0,
                                     .factor = cb->gate_decided ? g.factor : 1.0f};
}

dt_status dt_cuda_step_gate(dt_backend_t *be, float *g, const struct dt_gate_args *a,
                            struct dt_gate *out)
{
    DT_CUDA_REQUIRE(g && a && out, "step_gate", "pointers must not be NULL");
    DT_CUDA_REQUIRE(a->count == 0 || (a->lo && a->hi), "step_gate",
                    "the ranges must not be NULL (count=%zu)", a->count);
    size_t most = 0;
    for (size_t k = 0; k < a->count; k++) {
        DT_CUDA_REQUIRE(a->lo[k] <= a->hi[k], "step_gate", "range %zu is [%zu, %zu)", k,
                        a->lo[k], a->hi[k]);
        if (a->hi[k] - a->lo[k] > most)
            most = a->hi[k] - a->lo[k];
    }
    DT_CUDA_REQUIRE(!a->decide || (a->unscale > 0.0f && isfinite(a->unscale) &&
                                   a->clip_norm >= 0),
                    "step_gate", "need unscale > 0 and clip_norm >= 0 (unscale=%g, clip_norm=%g)",
                    (double)a->unscale, a->clip_norm);
    struct cuda_backend *cb = dt_cuda_of(be);
    dt_status st = DT_OK;
    for (size_t k = 0; k < a->count && a->decide; k++)
        dt_cuda_params_written(cb, g + a->lo[k], (a->hi[k] - a->lo[k]) * sizeof *g);
    if (cb->gate_pending && cb->gate_out != out)
        st = dt_cuda_sync_op(cb, "step_gate"); /* the pending record goes elsewhere */
    void *scratch = NULL;
    if (st == DT_OK)
        st = dt_cuda_scratch(cb, dt_cuda_gate_scratch(most, a->count), &scratch);
    if (st != DT_OK)
        return dt_error_context(st, "cuda step_gate (%zu ranges)", a->count);
    double *totals = (double *)scratch, *partial = totals + a->count;
    for (size_t k = 0; k < a->count; k++) {
        const size_t n = a->hi[k] - a->lo[k];
        const unsigned blocks = n ? dt_cuda_blocks(n) : 0;
        if (blocks) {
            DT_CUDA_LAUNCH(sumsq_partials, blocks, DT_CUDA_THREADS, 0, cb->stream, partial, g + a->lo[k], n);
            st = DT_CUDA_LAUNCHED(cb, "step_gate", "range %zu, n=%zu, %u blocks", k, n, blocks);
            if (st != DT_OK)
                return st;
        }
        DT_CUDA_LAUNCH(sumsq_final, 1, DT_CUDA_THREADS, 0, cb->stream, totals + k, (const double *)partial, blocks);
        st = DT_CUDA_LAUNCHED(cb, "step_gate", "range %zu, summing %u partials", k, blocks);
        if (st != DT_OK)
            return st;
    }
    struct dt_cuda_gate *gate = dt_cuda_gate_of(cb->dscalars);
    DT_CUDA_LAUNCH(gate_decide_kernel, 1, 32, 0, cb->stream, gate, (const double *)totals, (unsigned)a->count, a->decide, a->unscale, a->clip_norm);
    st = DT_CUDA_LAUNCHED(cb, "step_gate", "deciding over %zu ranges", a->count);
    for (size_t k = 0; k < a->count && a->decide && st == DT_OK; k++) {
        const size_t n = a->hi[k] - a->lo[k];
        if (n == 0)
            continue;
        DT_CUDA_LAUNCH(gate_scale_kernel, dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream, g + a->lo[k], n, a->unscale, (const struct dt_cuda_gate *)gate);
        st = DT_CUDA_LAUNCHED(cb, "step_gate", "range %zu, multiplying n=%zu", k, n);
    }
    if (st != DT_OK)
        return st;
    cudaError_t err = cudaMemcpyAsync(dt_cuda_gate_of(cb->hscalars), gate, sizeof *gate,
                                      cudaMemcpyDeviceToHost, cb->stream);
    if (err == cudaSuccess)
        err = cudaEventRecord(cb->results_done, cb->stream);
    if (err != cudaSuccess)
        return dt_cuda_status(cb, err, 0, "step_gate", "copying the gate (%zu ranges)", a->count);
    cb->gate_pending = 1;
    cb->gate_decided = a->decide;
    cb->gate_out = out;
    cb->results_marked = 1;
    return DT_OK;
}
