/*
 * dropout.cu - inverted dropout on the GPU, with the CPU's mask bit for bit.
 *
 * The mask is a pure function of (key, global element index), as in
 * kernels/cpu/dropout.c: for a (rows, cols) block whose first row is global
 * row row0, element e = (row0 + r) * cols + c is kept when
 *     u = dt_rng_u32_to_unit(word e % 4 of dt_rng_block(key, e / 4, 0)) >= p
 * and kept values are multiplied by 1 / (1 - p); p == 0 is a plain copy.
 * The host mixes the key once (dt_rng_stream_init, core/rng.c) and
 * computes the scale with the CPU's expression; the kernel gets both by
 * value. Each thread draws one Philox block and applies its four words to
 * four consecutive elements (philox.cuh, which a CPU test checks against
 * core/rng.h and the CPU op), so the generator runs once per four
 * elements and no mask is stored: backward recomputes it.
 *
 * No parameters; the activation gradient (din) is WRITTEN (=):
 * din = dout * mask / (1 - p), which is the forward applied to dout.
 * out == in is allowed.
 */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_impl.h"
#include "philox.cuh"

static dt_status check_dropout(const char *op, const float *out, const float *in, int rows,
                               int cols, float p, const struct dt_rng_key *key)
{
    if (!out || !in)
        return dt_set_error(DT_ERR_INVALID_ARG, "cuda %s: pointers must not be NULL", op);
    if (rows < 0 || cols < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "cuda %s: sizes must be >= 0 (rows=%d, cols=%d)",
                            op, rows, cols);
    if (!(p >= 0.0f && p < 1.0f)) /* also rejects NaN */
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cuda %s: dropout probability %g is outside [0, 1)", op, (double)p);
    if (!key && p > 0.0f)
        return dt_set_error(DT_ERR_INVALID_ARG, "cuda %s: the rng key must not be NULL", op);
    return DT_OK;
}

/* out(n) = in(n) * mask / (1 - p) for global elements [e0, e0 + n):
 * thread by thread over the Philox blocks first .. first + nblocks - 1. */
static __global__ void dropout_kernel(float *out, const float *in, uint64_t e0, uint64_t n,
                                      uint64_t first, uint64_t nblocks, struct dt_rng_stream s,
                                      float p, float scale)
{
    for (uint64_t j = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; j < nblocks;
         j += (uint64_t)blockDim.x * gridDim.x)
        dt_dropout_block(&s, first + j, e0, n, p, scale, out, in);
}

/* Forward and backward are the same masked scaling (of in, or of dout). */
static dt_status dropout_apply(dt_backend_t *be, const char *op, float *out, const float *in,
                               int rows, int cols, float p, const struct dt_rng_key *key,
                               uint64_t row0)
{
    dt_status st = check_dropout(op, out, in, rows, cols, p, key);
    if (st != DT_OK)
        return st;
    struct cuda_backend *cb = dt_cuda_of(be);
    const uint64_t n = (uint64_t)rows * (uint64_t)cols;
    if (n == 0)
        return DT_OK;
    if (p == 0.0f) {
        if (out == in)
            return DT_OK;
        cudaError_t err = cudaMemcpyAsync(out, in, n * sizeof *out, cudaMemcpyDeviceToDevice,
                                          cb->stream);
        return dt_cuda_status(cb, err, 0, op, "copy for p=0 (rows=%d, cols=%d)", rows, cols);
    }
    struct dt_rng_stream s;
    dt_rng_stream_init(key, 0, &s);
    const uint64_t e0 = row0 * (uint64_t)cols;
    const uint64_t first = dt_dropout_first_block(e0);
    const uint64_t nblocks = dt_dropout_block_count(e0, n);
    DT_CUDA_LAUNCH(dropout_kernel, dt_cuda_blocks((size_t)nblocks), DT_CUDA_THREADS, 0, cb->stream, out, in, e0, n, first, nblocks, s, p, dt_dropout_scale(p));
    return DT_CUDA_LAUNCHED(cb, op, "rows=%d, cols=%d, p=%g, row0=%llu", rows, cols, (double)p,
                            (unsigned long long)row0);
}

dt_status dt_cuda_dropout_fwd(dt_backend_t *be, float *out, const float *in, int rows, int cols,
                              float p, const struct dt_rng_key *key, uint64_t row0)
{
    return dropout_apply(be, "dropout_fwd", out, in, rows, cols, p, key, row0);
}

dt_status dt_cuda_dropout_bwd(dt_backend_t *be, float *din, const float *dout, int rows,
                              int cols, float p, const struct dt_rng_key *key, uint64_t row0)
{
    return dropout_apply(be, "dropout_bwd", din, dout, rows, cols, p, key, row0);
}
