/*
 * flatten.cu - (B, d1, d2, ...) -> (B, d1*d2*...) on the GPU.
 *
 * Tensors are dense and row-major, so flattening changes only the shape a
 * layer reports. As on the CPU (kernels/cpu/flatten.c) the op still
 * copies, forward and backward, so a layer owns its output buffer; the
 * copy is a device-to-device cudaMemcpyAsync on the backend's stream (the
 * copy engine needs no kernel of ours). out == in copies nothing.
 *
 * No parameters; the activation gradient (din) is WRITTEN (=): din = dout.
 */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_impl.h"

/* dst(n) = src(n): forward (out = in) and backward (din = dout). */
static dt_status copy_apply(dt_backend_t *be, const char *op, float *dst, const float *src,
                            size_t n)
{
    if (!dst || !src)
        return dt_set_error(DT_ERR_INVALID_ARG, "cuda %s: pointers must not be NULL", op);
    if (dst == src || n == 0)
        return DT_OK;
    struct cuda_backend *cb = dt_cuda_of(be);
    cudaError_t err =
        cudaMemcpyAsync(dst, src, n * sizeof *dst, cudaMemcpyDeviceToDevice, cb->stream);
    return dt_cuda_status(cb, err, 0, op, "n=%zu", n);
}

dt_status dt_cuda_flatten_fwd(dt_backend_t *be, float *out, const float *in, size_t n)
{
    return copy_apply(be, "flatten_fwd", out, in, n);
}

dt_status dt_cuda_flatten_bwd(dt_backend_t *be, float *din, const float *dout, size_t n)
{
    return copy_apply(be, "flatten_bwd", din, dout, n);
}
