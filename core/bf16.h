/*
 * bf16.h - bfloat16 as raw bits: rounding a float to the nearest bf16
 * (ties to even, overflow to infinity, NaN to a quiet NaN) and widening it
 * back, exactly. Shared by the CPU backend's ops and the MPI
 * communicator's bf16 sum, so both round the same way.
 */
#ifndef DT_BF16_H
#define DT_BF16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define DT_BF16_QUIET 0x0040u /* the quiet bit of a bf16 NaN */

static inline uint16_t dt_bf16_from_float(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and payload top, make it quiet */
        return (uint16_t)((u >> 16) | DT_BF16_QUIET);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float dt_bf16_to_float(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Whole buffers: dst(n) = bf16 bits of src(n), and back. */
static inline void dt_bf16_pack(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = dt_bf16_from_float(src[i]);
}

static inline void dt_bf16_unpack(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = dt_bf16_to_float(src[i]);
}

#endif
