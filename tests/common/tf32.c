/*
 * tf32.c - fp32 to TF32 by rounding and by truncation (tf32.h), on the
 * bits: the 13 low mantissa bits are cleared, after adding half of their
 * weight (less one when the kept part is even) for round to nearest even.
 * A carry out of the mantissa steps the exponent up, which is the right
 * answer there too, and reaches the infinity pattern past the largest value.
 */
#include "tests/common/tf32.h"

#include <stdint.h>
#include <string.h>

#define DROPPED_MASK ((UINT32_C(1) << DT_TEST_TF32_DROPPED_BITS) - 1)
#define EXP_MASK UINT32_C(0x7f800000)

uint32_t dt_test_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

float dt_test_f32_from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static int is_inf_or_nan(uint32_t u)
{
    return (u & EXP_MASK) == EXP_MASK;
}

float dt_test_tf32_round(float x)
{
    uint32_t u = dt_test_f32_bits(x);
    if (is_inf_or_nan(u)) return x;
    uint32_t lsb = (u >> DT_TEST_TF32_DROPPED_BITS) & 1u; /* of the kept part */
    u += (DROPPED_MASK >> 1) + lsb;
    return dt_test_f32_from_bits(u & ~DROPPED_MASK);
}

float dt_test_tf32_trunc(float x)
{
    uint32_t u = dt_test_f32_bits(x);
    if (is_inf_or_nan(u)) return x;
    return dt_test_f32_from_bits(u & ~DROPPED_MASK);
}

void dt_test_tf32_reduce(float *dst, const float *src, size_t n, int round)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = round ? dt_test_tf32_round(src[i]) : dt_test_tf32_trunc(src[i]);
}
