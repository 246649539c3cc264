/*
 * gate.h - the step gate's decision (kernels/ops.h, step_gate), one
 * function for the host and the device, so every backend and the training
 * loop decide alike from the same sum of squares.
 */
#ifndef DT_GATE_H
#define DT_GATE_H

#include <math.h>

#ifdef __CUDACC__
#define DT_GATE_HD __host__ __device__
#else
#define DT_GATE_HD
#endif

/* The norm of the gradients times unscale, from their sum of squares. */
static inline DT_GATE_HD double dt_gate_norm(double sumsq, float unscale)
{
    const double u = unscale;
    return sqrt(sumsq * (u * u));
}

/* 1 (skip the update) when sumsq is not finite; otherwise 0, and *factor
 * the clip factor of the unscaled norm (1 when clip_norm is 0 or the norm
 * is within it). */
static inline DT_GATE_HD int dt_gate_decide(double sumsq, float unscale, double clip_norm,
                                            float *factor)
{
    *factor = 1.0f;
    if (!isfinite(sumsq)) return 1;
    const double norm = dt_gate_norm(sumsq, unscale);
    if (clip_norm > 0 && norm > clip_norm) *factor = (float)(clip_norm / (norm + 1e-6));
    return 0;
}

#endif
