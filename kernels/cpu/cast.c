/*
 * cast.c - gradients to and from bf16 for the wire (comm.grad_dtype: bf16
 * halves the bytes each all-reduce moves). Rounding is core/bf16.h's:
 * nearest, ties to even, overflow to infinity, NaN to a quiet NaN, so the
 * CUDA kernels and the MPI bf16 sum agree with it bit for bit. The loops
 * are plain integer work the compiler vectorises; one version serves both
 * op tables.
 */
#include "cpu_ops.h"

/* dst(n) = bf16 bits of src(n) */
dt_status dt_cpu_to_bf16(dt_backend_t *be, uint16_t *dst, const float *src, size_t n)
{
    DT_CPU_REQUIRE((dst && src) || n == 0, "to_bf16", "pointers must not be NULL");
    dt_bf16_pack(dst, src, n);
    return DT_OK;
}

/* dst(n) = src(n) widened to fp32 (exact) */
dt_status dt_cpu_from_bf16(dt_backend_t *be, float *dst, const uint16_t *src, size_t n)
{
    DT_CPU_REQUIRE((dst && src) || n == 0, "from_bf16", "pointers must not be NULL");
    dt_bf16_unpack(dst, src, n);
    return DT_OK;
}
