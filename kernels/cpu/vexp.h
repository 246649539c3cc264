/*
 * vexp.h - internal to kernels/cpu/: e^x on blocks of DT_CPU_LANES floats
 * written so GCC vectorises it at -O2 (libm's expf is a call per element).
 * For attention's softmax and GELU, in files compiled with
 * -fno-trapping-math and -ffp-contract=off (CMakeLists.txt), so the
 * AVX-512, AVX2 and baseline clones of their loops give the same bits.
 */
#ifndef DT_CPU_VEXP_H
#define DT_CPU_VEXP_H

#include <stdint.h>
#include <string.h>

#include "cpu_ops.h"

/* e^x in blocks of DT_CPU_LANES that GCC vectorises at -O2 (libm's expf
 * is a call per element, which no loop around it can vectorise): x =
 * n ln2 + t with |t| <= ln2/2 (Cody-Waite: ln2 in a short high part, so
 * n*LN2_HI is exact, and a low part), e^t by its Taylor series to t^7
 * (relative error below 1e-8 on that interval, so the result is within a
 * few ulp), evaluated by Estrin's scheme (pairs of terms, then t^2 and
 * t^4 times pairs: a chain of dependent operations half as deep as
 * Horner's, so more elements' chains are in flight at once), times 2^n
 * built in the exponent bits. Below EXP_MIN_ARG the result is 0 (e^x
 * would be below the smallest normal float); above EXP_MAX_ARG it is
 * clamped (scores minus their max or their logsumexp are <= 0 up to
 * rounding); NaN stays NaN. */
#define EXP_MIN_ARG -87.0f
#define EXP_MAX_ARG 88.0f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO -2.12194440e-4f
#define EXP_ROUND 12582912.0f /* 1.5 * 2^23: x + it - it rounds x to an integer */

/* y[k] = e^(x[k] - sub) for k < DT_CPU_LANES; y may be x. One loop over
 * the lanes, its selects if-converted into vector blends: that needs
 * -fno-trapping-math, which CMakeLists.txt sets for the files that use
 * it. Inlined into each clone of its callers. */
static inline __attribute__((always_inline)) void dt_vexp_sub_lanes(float *y, const float *x,
                                                                    float sub)
{
    float e[DT_CPU_LANES];
    for (int k = 0; k < DT_CPU_LANES; k++) {
        float v = x[k] - sub;
        float c = v >= EXP_MIN_ARG ? v : EXP_MIN_ARG; /* NaN becomes a number here */
        c = c <= EXP_MAX_ARG ? c : EXP_MAX_ARG;
        float n = (c * EXP_LOG2E + EXP_ROUND) - EXP_ROUND;
        float t = (c - n * EXP_LN2_HI) - n * EXP_LN2_LO;
        float t2 = t * t, t4 = t2 * t2;
        float q = ((1.0f + t) + t2 * (0.5f + t * (1.0f / 6.0f))) +
                  t4 * ((1.0f / 24.0f + t * (1.0f / 120.0f)) +
                        t2 * (1.0f / 720.0f + t * (1.0f / 5040.0f)));
        int32_t bits = ((int32_t)n + 127) << 23;
        float p2; /* 2^n */
        memcpy(&p2, &bits, sizeof p2);
        float r = v < EXP_MIN_ARG ? 0.0f : q * p2;
        e[k] = v == v ? r : v;
    }
    memcpy(y, e, sizeof e);
}

#endif
