/*
 * cast.cu - gradients to and from bf16 for the wire (comm.grad_dtype: bf16
 * halves the bytes each all-reduce moves), the GPU side of kernels/cpu/
 * cast.c. The two must agree bit for bit, because ranks on either backend
 * may meet in one all-reduce and the MPI bf16 sum rounds the CPU's way.
 *
 * to_bf16 rounds with __float2bfloat16_rn (nearest, ties to even, overflow
 * to infinity, subnormals kept: cvt.rn.bf16.f32 has no .ftz). NaN is the
 * exception: cvt gives the canonical NaN 0x7fff whatever went in, and the
 * pre-sm_80 path of cuda_bf16.hpp does the same, while the CPU reference
 * (core/bf16.h) keeps the NaN's sign and the top of its payload and sets
 * the quiet bit. So a NaN is handled here on its bits, the CPU's way,
 * tested on the exponent and mantissa fields so no math flag can fold it.
 *
 * from_bf16 moves the bits to the top half of a float, as the CPU does,
 * which is exact for every input. __bfloat162float is not used: on sm_90
 * it is cvt.f32.bf16, and PTX does not promise that a NaN's sign and
 * payload come through it unchanged.
 *
 * Element-wise, grid-stride, queued on the backend's stream without
 * waiting. These ops produce no gradients of their own: dst is WRITTEN (=).
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/bf16.h"
#include "cuda_impl.h"

#define F32_ABS_MASK 0x7fffffffu /* all but the sign */
#define F32_INF_BITS 0x7f800000u /* above it (sign cleared): NaN */
#define BF16_SHIFT 16            /* a bf16 is the top half of a float */

/* The CPU's bf16 of the float with bits u, a NaN: sign and payload top
 * kept, quiet bit set. */
static __device__ __forceinline__ uint16_t nan_to_bf16(uint32_t u)
{
    return (uint16_t)((u >> BF16_SHIFT) | DT_BF16_QUIET);
}

/* dst(n) = bf16 bits of src(n) */
static __global__ void to_bf16_kernel(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float x = src[i];
        const uint32_t u = __float_as_uint(x);
        dst[i] = (u & F32_ABS_MASK) > F32_INF_BITS ? nan_to_bf16(u)
                                                   : __bfloat16_as_ushort(__float2bfloat16_rn(x));
    }
}

/* dst(n) = src(n) widened to fp32 (exact, NaN included) */
static __global__ void from_bf16_kernel(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __uint_as_float((uint32_t)src[i] << BF16_SHIFT);
}

/* dst(n) = bf16 bits of src(n), rounded to nearest, ties to even */
dt_status dt_cuda_to_bf16(dt_backend_t *be, uint16_t *dst, const float *src, size_t n)
{
    DT_CUDA_REQUIRE((dst && src) || n == 0, "to_bf16", "pointers must not be NULL");
    if (n == 0)
        return DT_OK;
    struct cuda_backend *cb = dt_cuda_of(be);
    const unsigned blocks = dt_cuda_blocks(n);
    DT_CUDA_LAUNCH(to_bf16_kernel, blocks, DT_CUDA_THREADS, 0, cb->stream, dst, src, n);
    return DT_CUDA_LAUNCHED(cb, "to_bf16", "n=%zu, %u blocks", n, blocks);
}

/* dst(n) = src(n) widened to fp32 (exact) */
dt_status dt_cuda_from_bf16(dt_backend_t *be, float *dst, const uint16_t *src, size_t n)
{
    DT_CUDA_REQUIRE((dst && src) || n == 0, "from_bf16", "pointers must not be NULL");
    if (n == 0)
        return DT_OK;
    struct cuda_backend *cb = dt_cuda_of(be);
    const unsigned blocks = dt_cuda_blocks(n);
    DT_CUDA_LAUNCH(from_bf16_kernel, blocks, DT_CUDA_THREADS, 0, cb->stream, dst, src, n);
    return DT_CUDA_LAUNCHED(cb, "from_bf16", "n=%zu, %u blocks", n, blocks);
}
