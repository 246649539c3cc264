/*
 * activation.c - the element-wise ops of DT_UNARY_LIST (kernels/ops.h) on
 * the CPU: relu, exact (erf) GELU, tanh, ..., forward and backward.
 *
 * Each row of the list becomes, through CPU_UNARY below, a reference loop
 * (dt_cpu_<name>_fwd_ref/_bwd_ref) and, for rows marked BLOCKED, a fast
 * version that evaluates the same expression on fixed blocks of
 * DT_CPU_LANES elements, which GCC vectorises at -O2 where the expression
 * allows (relu; tanh stays bound by libm's tanhf without -ffast-math).
 * Both evaluate the same float expression per element, so they give the
 * same bits. The list writes GELU as x Phi(x) with Phi(x) = erfc(-x /
 * sqrt 2) / 2 (the form that keeps the negative tail's relative
 * precision); its fast version (OWN in the list) is written out here:
 * erfc from a Chebyshev fit (see gelu_lanes) and the vectorised exp of
 * vexp.h, whose e^(-x^2/2) serves the backward's density too; it agrees
 * with the reference (libm's erfcf) to 1e-6 relative in every element, so
 * it cannot be a plain row.
 *
 * These ops have no parameters; the activation gradient (din) is WRITTEN
 * (=). out == in (and din == dout) may be the same buffer.
 */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"
#include "vexp.h"

static dt_status check_unary(const char *op, const float *out, const float *in)
{
    if (!out || !in)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu %s: pointers must not be NULL", op);
    return DT_OK;
}

static dt_status check_binary(const char *op, const float *din, const float *dout, const float *x)
{
    if (!din || !dout || !x)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu %s: pointers must not be NULL", op);
    return DT_OK;
}

/* ---- the rows of DT_UNARY_LIST ----------------------------------------- */

/* The reference: one element at a time. */
#define CPU_UNARY_REF(name, s, forward, gradient)                                                  \
    dt_status dt_cpu_##name##_fwd_ref(dt_backend_t *be, float *out, const float *in, size_t n)     \
    {                                                                                              \
        dt_status st = check_unary(#name "_fwd", out, in);                                         \
        for (size_t i = 0; st == DT_OK && i < n; i++) {                                            \
            const float x = in[i];                                                                 \
            out[i] = (forward);                                                                    \
        }                                                                                          \
        return st;                                                                                 \
    }                                                                                              \
    dt_status dt_cpu_##name##_bwd_ref(dt_backend_t *be, float *din, const float *dout,             \
                                      const float *saved, size_t n)                                \
    {                                                                                              \
        dt_status st = check_binary(#name "_bwd", din, dout, saved);                               \
        for (size_t i = 0; st == DT_OK && i < n; i++) {                                            \
            const float dy = dout[i], s = saved[i];                                                \
            din[i] = (gradient);                                                                   \
        }                                                                                          \
        return st;                                                                                 \
    }

/* One pass over [lo, hi) of the elements (dt_cpu_for's blocks: each
 * element computed as on one thread). */
struct unary_job {
    float *out;
    const float *in, *saved;
};

/* The fast version of a BLOCKED row: each block is computed into a local
 * array, then stored, so the loads cannot alias the stores (the compiler
 * vectorises without runtime checks) and out == in stays correct. */
#define CPU_UNARY_FAST_BLOCKED(name, s, forward, gradient)                                         \
    static void name##_fwd_range(void *a, size_t lo, size_t n)                                     \
    {                                                                                              \
        const struct unary_job *j = a;                                                             \
        float *out = j->out;                                                                       \
        const float *in = j->in;                                                                   \
        size_t i = lo;                                                                             \
        for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES) {                                         \
            float t[DT_CPU_LANES];                                                                 \
            for (int k = 0; k < DT_CPU_LANES; k++) {                                               \
                const float x = in[i + k];                                                         \
                t[k] = (forward);                                                                  \
            }                                                                                      \
            memcpy(out + i, t, sizeof t);                                                          \
        }                                                                                          \
        for (; i < n; i++) {                                                                       \
            const float x = in[i];                                                                 \
            out[i] = (forward);                                                                    \
        }                                                                                          \
    }                                                                                              \
    static void name##_bwd_range(void *a, size_t lo, size_t n)                                     \
    {                                                                                              \
        const struct unary_job *j = a;                                                             \
        float *din = j->out;                                                                       \
        const float *dout = j->in, *saved = j->saved;                                              \
        size_t i = lo;                                                                             \
        for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES) {                                         \
            float t[DT_CPU_LANES];                                                                 \
            for (int k = 0; k < DT_CPU_LANES; k++) {                                               \
                const float dy = dout[i + k], s = saved[i + k];                                    \
                t[k] = (gradient);                                                                 \
            }                                                                                      \
            memcpy(din + i, t, sizeof t);                                                          \
        }                                                                                          \
        for (; i < n; i++) {                                                                       \
            const float dy = dout[i], s = saved[i];                                                \
            din[i] = (gradient);                                                                   \
        }                                                                                          \
    }                                                                                              \
    dt_status dt_cpu_##name##_fwd(dt_backend_t *be, float *out, const float *in, size_t n)         \
    {                                                                                              \
        dt_status st = check_unary(#name "_fwd", out, in);                                         \
        struct unary_job j = {.out = out, .in = in};                                               \
        if (st == DT_OK)                                                                           \
            dt_cpu_for(be, n, DT_CPU_GRAIN, name##_fwd_range, &j);                                 \
        return st;                                                                                 \
    }                                                                                              \
    dt_status dt_cpu_##name##_bwd(dt_backend_t *be, float *din, const float *dout,                 \
                                  const float *saved, size_t n)                                    \
    {                                                                                              \
        dt_status st = check_binary(#name "_bwd", din, dout, saved);                               \
        struct unary_job j = {.out = din, .in = dout, .saved = saved};                             \
        if (st == DT_OK)                                                                           \
            dt_cpu_for(be, n, DT_CPU_GRAIN, name##_bwd_range, &j);                                 \
        return st;                                                                                 \
    }

/* An OWN row's fast version is written out below. */
#define CPU_UNARY_FAST_OWN(name, s, forward, gradient)

#define CPU_UNARY(a, name, s, forward, gradient, cpu, doc)                                         \
    CPU_UNARY_REF(name, s, forward, gradient)                                                      \
    CPU_UNARY_FAST_##cpu(name, s, forward, gradient)

DT_UNARY_LIST(CPU_UNARY, _)

/* ---- GELU's own fast version ------------------------------------------- */

/* For k < DT_CPU_LANES: cdf[k] = Phi(x[k]) and e[k] = e^(-x[k]^2 / 2).
 * With z = |x| / sqrt 2 and t = 1 / (1 + z/2), erfc(z) = t e^(-z^2 + c(t))
 * (c a degree-9 polynomial; relative error below 1.2e-7 for every z >= 0),
 * so the tail of Phi keeps its relative precision where 1 + erf(x) would
 * cancel. z^2 = h + l exactly (l from an fma), and the two exponentials
 * are taken apart, so no sum of large and small exponents rounds away
 * digits: e^(-z^2) = e^(-h) (1 - l). */
static inline __attribute__((always_inline)) void gelu_lanes(const float *x, float *cdf, float *e)
{
    float nh[DT_CPU_LANES], l[DT_CPU_LANES], c[DT_CPU_LANES], t[DT_CPU_LANES], ec[DT_CPU_LANES];
    for (int k = 0; k < DT_CPU_LANES; k++) {
        float z = fabsf(x[k]) * DT_INV_SQRT2;
        float h = z * z;
        nh[k] = -h;
        l[k] = fmaf(z, z, -h);
        float u = 1.0f / (1.0f + 0.5f * z);
        t[k] = u;
        c[k] = -1.26551223f +
               u * (1.00002368f +
                    u * (0.37409196f +
                         u * (0.09678418f +
                              u * (-0.18628806f +
                                   u * (0.27886807f +
                                        u * (-1.13520398f +
                                             u * (1.48851587f +
                                                  u * (-0.82215223f + u * 0.17087277f))))))));
    }
    dt_vexp_sub_lanes(e, nh, 0.0f);
    dt_vexp_sub_lanes(ec, c, 0.0f);
    for (int k = 0; k < DT_CPU_LANES; k++) {
        e[k] = e[k] * (1.0f - l[k]);
        float half_erfc = 0.5f * t[k] * e[k] * ec[k]; /* Phi(-|x|) */
        cdf[k] = x[k] >= 0.0f ? 1.0f - half_erfc : x[k] < 0.0f ? half_erfc : x[k];
    }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) static void
gelu_fwd_rows(float *out, const float *in, size_t n)
{
    float x[DT_CPU_LANES], cdf[DT_CPU_LANES], e[DT_CPU_LANES];
    for (size_t i = 0; i < n; i += DT_CPU_LANES) {
        size_t m = n - i < DT_CPU_LANES ? n - i : DT_CPU_LANES;
        memset(x, 0, sizeof x);
        memcpy(x, in + i, m * sizeof *x);
        gelu_lanes(x, cdf, e);
        for (int k = 0; k < DT_CPU_LANES; k++)
            x[k] = x[k] * cdf[k];
        memcpy(out + i, x, m * sizeof *x);
    }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) static void
gelu_bwd_rows(float *din, const float *dout, const float *in, size_t n)
{
    float x[DT_CPU_LANES], d[DT_CPU_LANES], cdf[DT_CPU_LANES], e[DT_CPU_LANES];
    for (size_t i = 0; i < n; i += DT_CPU_LANES) {
        size_t m = n - i < DT_CPU_LANES ? n - i : DT_CPU_LANES;
        memset(x, 0, sizeof x);
        memset(d, 0, sizeof d);
        memcpy(x, in + i, m * sizeof *x);
        memcpy(d, dout + i, m * sizeof *d);
        gelu_lanes(x, cdf, e);
        for (int k = 0; k < DT_CPU_LANES; k++)
            d[k] = d[k] * (cdf[k] + x[k] * (DT_INV_SQRT_2PI * e[k]));
        memcpy(din + i, d, m * sizeof *d);
    }
}

static void gelu_fwd_range(void *a, size_t lo, size_t hi)
{
    const struct unary_job *j = a;
    gelu_fwd_rows(j->out + lo, j->in + lo, hi - lo);
}

static void gelu_bwd_range(void *a, size_t lo, size_t hi)
{
    const struct unary_job *j = a;
    gelu_bwd_rows(j->out + lo, j->in + lo, j->saved + lo, hi - lo);
}

dt_status dt_cpu_gelu_fwd(dt_backend_t *be, float *out, const float *in, size_t n)
{
    dt_status st = check_unary("gelu_fwd", out, in);
    struct unary_job j = {.out = out, .in = in};
    if (st == DT_OK)
        dt_cpu_for(be, n, DT_CPU_GRAIN, gelu_fwd_range, &j);
    return st;
}

dt_status dt_cpu_gelu_bwd(dt_backend_t *be, float *din, const float *dout, const float *in,
                          size_t n)
{
    dt_status st = check_binary("gelu_bwd", din, dout, in);
    struct unary_job j = {.out = din, .in = dout, .saved = in};
    if (st == DT_OK)
        dt_cpu_for(be, n, DT_CPU_GRAIN, gelu_bwd_range, &j);
    return st;
}
