/*
 * tf32.h - fp32 values reduced to TF32 the ways a GPU's tensor cores may do
 * it, for the CPU references of the GPU suites' TF32 GEMMs.
 *
 * TF32 keeps fp32's sign and 8-bit exponent and 10 of its 23 explicit
 * mantissa bits: the 13 low bits go. cuBLAS documents TF32 inputs as
 * rounded, but a tensor core may truncate them instead, so a reference
 * needs both: rounding to nearest, ties to even, and truncation toward
 * zero. Infinities and NaNs pass through unchanged; a finite value that
 * rounds past the largest TF32 value becomes an infinity, as fp32 rounding
 * does. Pure functions, safe from any thread.
 */
#ifndef DT_TEST_TF32_H
#define DT_TEST_TF32_H

#include <stddef.h>
#include <stdint.h>

/* The mantissa bits an fp32 value loses as TF32 (23 - 10). */
#define DT_TEST_TF32_DROPPED_BITS 13

/* The bits of an fp32 value, and the value of fp32 bits. */
uint32_t dt_test_f32_bits(float x);
float dt_test_f32_from_bits(uint32_t u);

/* x rounded to TF32, to nearest, ties to even. */
float dt_test_tf32_round(float x);

/* x truncated to TF32, toward zero. */
float dt_test_tf32_trunc(float x);

/* dst[i] = dt_test_tf32_round(src[i]) (round != 0) or
 * dt_test_tf32_trunc(src[i]), for i < n; dst may be src. */
void dt_test_tf32_reduce(float *dst, const float *src, size_t n, int round);

#endif
