/*
 * test_tf32.c - the TF32 reductions of tests/common/tf32.c against values
 * worked out by hand on the bits: dropped bits above, at and below half of
 * the last kept bit, ties to an even and to an odd kept part, negatives
 * (rounding is symmetric, truncation goes toward zero), a carry into the
 * exponent, the largest finite value, subnormals, zeros, and infinities
 * and NaNs, which pass through with their payloads. These are what the GPU
 * suite's TF32 GEMM references rest on, so they run on every machine.
 */
#include <stdint.h>
#include <string.h>

#include "tests/common/tf32.h"
#include "tests/unit/cu_util.h"

/* in: fp32 bits; rnd, trc: the bits rounding and truncation must give */
static const struct {
    const char *what;
    uint32_t in, rnd, trc;
} cases[] = {
    /* 1 + 2^-11 + 2^-23: more than half dropped, up to 1 + 2^-10 */
    {"above half", 0x3f801001, 0x3f802000, 0x3f800000},
    /* 1 + 2^-11: exactly half, the kept part (1.0) even: stays */
    {"half, even", 0x3f801000, 0x3f800000, 0x3f800000},
    /* 1 + 2^-10 + 2^-11: exactly half, kept part odd: up to 1 + 2^-9 */
    {"half, odd", 0x3f803000, 0x3f804000, 0x3f802000},
    /* 1 + 2^-11 - 2^-23: just below half: down to 1.0 */
    {"below half", 0x3f800fff, 0x3f800000, 0x3f800000},
    /* -(1 + 2^-11 + 2^-23): round away to -(1 + 2^-10), truncate to -1 */
    {"negative above half", 0xbf801001, 0xbf802000, 0xbf800000},
    /* -(1 + 2^-10 + 2^-11): a negative tie to even, -(1 + 2^-9) */
    {"negative half, odd", 0xbf803000, 0xbf804000, 0xbf802000},
    /* 2 - 2^-23: rounds up into the next binade, 2.0; truncates to 2 - 2^-10 */
    {"carry into the exponent", 0x3fffffff, 0x40000000, 0x3fffe000},
    /* FLT_MAX: rounds past the largest TF32 value to +inf */
    {"largest finite", 0x7f7fffff, 0x7f800000, 0x7f7fe000},
    /* subnormals: the same rule on the mantissa */
    {"subnormal above half", 0x00001fff, 0x00002000, 0x00000000},
    {"subnormal half, even", 0x00001000, 0x00000000, 0x00000000},
    /* already TF32: unchanged */
    {"1.5", 0x3fc00000, 0x3fc00000, 0x3fc00000},
    {"-3", 0xc0400000, 0xc0400000, 0xc0400000},
    {"+0", 0x00000000, 0x00000000, 0x00000000},
    {"-0", 0x80000000, 0x80000000, 0x80000000},
    /* infinities and NaNs pass through, payload and sign kept */
    {"+inf", 0x7f800000, 0x7f800000, 0x7f800000},
    {"-inf", 0xff800000, 0xff800000, 0xff800000},
    {"quiet NaN, low payload", 0x7fc00001, 0x7fc00001, 0x7fc00001},
    {"signalling NaN, low payload", 0x7f800001, 0x7f800001, 0x7f800001},
    {"negative NaN, all payload bits", 0xffffffff, 0xffffffff, 0xffffffff},
};

static void check_bits(const char *what, const char *how, float got, uint32_t want)
{
    if (dt_test_f32_bits(got) != want)
        printf("\n  %s (%s): 0x%08x, want 0x%08x\n", what, how, (unsigned)dt_test_f32_bits(got),
               (unsigned)want);
    CU_ASSERT_EQUAL(dt_test_f32_bits(got), want);
}

static void test_known_bits(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        check_bits(cases[i].what, "round", dt_test_tf32_round(dt_test_f32_from_bits(cases[i].in)),
                   cases[i].rnd);
        check_bits(cases[i].what, "trunc", dt_test_tf32_trunc(dt_test_f32_from_bits(cases[i].in)),
                   cases[i].trc);
    }
}

/* The same as decimal arithmetic says: 1 + 2^-11 + 2^-23 is nearer to
 * 1 + 2^-10 than to 1, and the results are TF32 (13 low bits clear) and
 * within half (rounding) or one (truncation) unit of the last kept place. */
static void test_values(void)
{
    CU_ASSERT_EQUAL(dt_test_tf32_round(1.0f + 0x1p-11f + 0x1p-23f), 1.0f + 0x1p-10f);
    CU_ASSERT_EQUAL(dt_test_tf32_trunc(-(1.0f + 0x1p-11f + 0x1p-23f)), -1.0f);
    CU_ASSERT_EQUAL(dt_test_tf32_round(3.0f + 0x1p-10f),
                    3.0f); /* a tie (unit 2^-9), kept part even */
    for (uint32_t k = 0; k < 4096; k++) {
        float x = dt_test_f32_from_bits(0x3f800000u + k * 2047u); /* [1, 2): the unit is 2^-10 */
        float r = dt_test_tf32_round(x), t = dt_test_tf32_trunc(x);
        CU_ASSERT_EQUAL(dt_test_f32_bits(r) & 0x1fffu, 0);
        CU_ASSERT_EQUAL(dt_test_f32_bits(t) & 0x1fffu, 0);
        CU_ASSERT(fabs((double)r - x) <= 0x1p-11);
        CU_ASSERT(t <= x && x - t < 0x1p-10);
    }
}

static void test_reduce_array(void)
{
    float v[4] = {dt_test_f32_from_bits(0x3f801001), dt_test_f32_from_bits(0xbf803000),
                  dt_test_f32_from_bits(0x7fc00001), 2.0f};
    float out[4];
    dt_test_tf32_reduce(out, v, 4, 1);
    CU_ASSERT_EQUAL(dt_test_f32_bits(out[0]), 0x3f802000);
    CU_ASSERT_EQUAL(dt_test_f32_bits(out[1]), 0xbf804000);
    CU_ASSERT_EQUAL(dt_test_f32_bits(out[2]), 0x7fc00001);
    CU_ASSERT_EQUAL(out[3], 2.0f);
    dt_test_tf32_reduce(v, v, 4, 0); /* in place */
    CU_ASSERT_EQUAL(dt_test_f32_bits(v[0]), 0x3f800000);
    CU_ASSERT_EQUAL(dt_test_f32_bits(v[1]), 0xbf802000);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("tf32", NULL, NULL);
    CU_ADD(s, test_known_bits);
    CU_ADD(s, test_values);
    CU_ADD(s, test_reduce_array);
    return cu_run_all();
}
