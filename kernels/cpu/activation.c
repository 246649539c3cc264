/*
 * activation.c - the element-wise ops of DT_UNARY_LIST (kernels/ops.h) on
 * the CPU: relu, exact (erf) GELU, tanh, ..., forward and backward.
 *
 * Each row of the list becomes, through CPU_UNARY below, a reference loop
 * (dt_cpu_<name>_fwd_ref/_bwd_ref) and, for rows marked BLOCKED, a fast
 * version that evaluates the same expression on fixed blocks of
 * DT_CPU_LANES elements, which GCC vectorises at -O2 where the expression
 * allows (relu; calls to libm, tanhf or expf, do not vectorise).
 * Both evaluate the same float expression per element, so they give the
 * same bits. The list writes GELU as x Phi(x) with Phi(x) = erfc(-x /
 * sqrt 2) / 2 (the form that keeps the negative tail's relative
 * precision); its fast version (OWN in the list) is written out here:
 * erfc as e^(-z^2) times a fitted polynomial (see gelu_lanes), with the
 * vectorised exp of vexp.h, whose e^(-x^2/2) serves the backward's
 * density too; it agrees with the reference (libm's erfcf) to 1e-6
 * relative in every element, so it cannot be a plain row. tanh, GELU's
 * tanh approximation and SiLU are OWN rows too: libm's tanhf and expf
 * are calls per element that do not vectorise, so their fast versions
 * take tanh from tanh_lanes below (an odd polynomial near 0, the
 * vectorised exp beyond) and SiLU's sigmoid from the vectorised exp,
 * within 1e-6 relative of libm in every element (of the terms' scale
 * where the list's formulas cancel).
 *
 * <name>_fwd_keep computes the forward and writes the row's gradient at
 * dy = 1 over the input, each version with the expression its backward
 * uses, so that dout times what it kept is its backward's value (the same
 * bits where the gradient is dy times one expression).
 *
 * These ops have no parameters; the activation gradient (din) is WRITTEN
 * (=). out == in (and din == dout) may be the same buffer, except in
 * <name>_fwd_keep.
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

static dt_status check_keep(const char *op, const float *out, const float *x)
{
    if (!out || !x)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu %s: pointers must not be NULL", op);
    if (out == x)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu %s: out and x must be distinct", op);
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
    }                                                                                              \
    dt_status dt_cpu_##name##_fwd_keep_ref(dt_backend_t *be, float *out, float *xs, size_t n)      \
    {                                                                                              \
        dt_status st = check_keep(#name "_fwd_keep", out, xs);                                     \
        for (size_t i = 0; st == DT_OK && i < n; i++) {                                            \
            const float x = xs[i];                                                                 \
            const float y = (forward);                                                             \
            const float dy = 1.0f;                                                                 \
            out[i] = y;                                                                            \
            xs[i] = (gradient);                                                                    \
        }                                                                                          \
        return st;                                                                                 \
    }

/* One pass over [lo, hi) of the elements (dt_cpu_for's blocks: each
 * element computed as on one thread). */
struct unary_job {
    float *out;
    const float *in, *saved;
    float *x; /* _fwd_keep's input, replaced by the gradient */
};

/* The two public ops of a fast row, over its name##_fwd_range and
 * name##_bwd_range, cut into blocks by dt_cpu_for. */
#define CPU_UNARY_PUBLIC(name)                                                                     \
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
    }                                                                                              \
    dt_status dt_cpu_##name##_fwd_keep(dt_backend_t *be, float *out, float *x, size_t n)           \
    {                                                                                              \
        dt_status st = check_keep(#name "_fwd_keep", out, x);                                      \
        struct unary_job j = {.out = out, .x = x};                                                 \
        if (st == DT_OK)                                                                           \
            dt_cpu_for(be, n, DT_CPU_GRAIN, name##_keep_range, &j);                                \
        return st;                                                                                 \
    }

/* The fast version of a BLOCKED row: each block is computed into a local
 * array, then stored, so the loads cannot alias the stores (the compiler
 * vectorises without runtime checks) and out == in stays correct. */
#define CPU_UNARY_FAST_BLOCKED(name, s, forward, gradient)                                         \
    DT_CPU_CLONES static void name##_fwd_range(void *a, size_t lo, size_t n)                       \
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
    DT_CPU_CLONES static void name##_bwd_range(void *a, size_t lo, size_t n)                       \
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
    DT_CPU_CLONES static void name##_keep_range(void *a, size_t lo, size_t n)                      \
    {                                                                                              \
        const struct unary_job *j = a;                                                             \
        float *out = j->out, *xs = j->x;                                                           \
        size_t i = lo;                                                                             \
        for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES) {                                         \
            float t[DT_CPU_LANES], g[DT_CPU_LANES];                                                \
            for (int k = 0; k < DT_CPU_LANES; k++) {                                               \
                const float x = xs[i + k];                                                         \
                const float y = (forward);                                                         \
                const float dy = 1.0f;                                                             \
                t[k] = y;                                                                          \
                g[k] = (gradient);                                                                 \
            }                                                                                      \
            memcpy(out + i, t, sizeof t);                                                          \
            memcpy(xs + i, g, sizeof g);                                                           \
        }                                                                                          \
        for (; i < n; i++) {                                                                       \
            const float x = xs[i];                                                                 \
            const float y = (forward);                                                             \
            const float dy = 1.0f;                                                                 \
            out[i] = y;                                                                            \
            xs[i] = (gradient);                                                                    \
        }                                                                                          \
    }                                                                                              \
    CPU_UNARY_PUBLIC(name)

/* An OWN row's fast version is written out below. */
#define CPU_UNARY_FAST_OWN(name, s, forward, gradient)

#define CPU_UNARY(a, name, s, forward, gradient, cpu, doc)                                         \
    CPU_UNARY_REF(name, s, forward, gradient)                                                      \
    CPU_UNARY_FAST_##cpu(name, s, forward, gradient)

DT_UNARY_LIST(CPU_UNARY, _)

/* ---- GELU's own fast version ------------------------------------------- */

/* Elements per step of the loops below: four vectors of DT_CPU_LANES, so
 * that four independent chains of the polynomial and the exponentials are
 * in flight at once (one chain leaves the core waiting on each multiply's
 * latency). */
#define GELU_GROUP (4 * DT_CPU_LANES)

/* |x| / sqrt 2 beyond which e^(-z^2) is 0 (below the exponential's
 * range): z is clamped there, which changes no value and keeps z^2 finite
 * for huge and infinite x. */
#define GELU_Z_MAX 16.0f

/* For k < GELU_GROUP: cdf[k] = Phi(x[k]) and e[k] = e^(-x[k]^2 / 2).
 * With z = |x| / sqrt 2 and t = 1 / (1 + z/2), erfc(z) = t e^(-z^2) q(t),
 * q a degree-9 polynomial fitted to erfc(z) e^(z^2) / t over z in [0,
 * 9.5] (relative error below 5e-8 with its float coefficients; beyond,
 * e^(-z^2) is below the smallest normal float), so the tail of Phi keeps
 * its relative precision where 1 + erf(x) would cancel, with one
 * exponential per element, which the backward's density shares. z^2 = h
 * + l exactly (Dekker's product), and e^(-z^2) = e^(-h) (1 - l), so the
 * rounding of z^2 does not reach the exponential. q is evaluated by
 * Estrin's scheme (pairs of coefficients, then u^2, u^4 and u^8 times
 * pairs: a chain of dependent operations half as deep as Horner's). */
static inline __attribute__((always_inline)) void gelu_lanes(const float *x, float *cdf, float *e)
{
    float nh[GELU_GROUP], l[GELU_GROUP], q[GELU_GROUP], t[GELU_GROUP];
    for (int k = 0; k < GELU_GROUP; k++) {
        float z = fabsf(x[k]) * DT_INV_SQRT2;
        z = z < GELU_Z_MAX ? z : GELU_Z_MAX; /* NaN too: its cdf is x itself below */
        float h = z * z;
        nh[k] = -h;
        /* z^2 - h exactly, Dekker's product of z's 12-bit halves: an fmaf
         * would be a call that stops the vectorisation wherever the clone
         * has no FMA (the AVX2 and baseline builds); 1 - l is the same
         * float as with fmaf for every z in [0, GELU_Z_MAX] */
        float c = 4097.0f * z;
        float zh = c - (c - z), zl = z - zh;
        l[k] = (((zh * zh - h) + zh * zl) + zl * zh) + zl * zl;
        float u = 1.0f / (1.0f + 0.5f * z);
        t[k] = u;
        float u2 = u * u, u4 = u2 * u2, u8 = u4 * u4;
        q[k] = ((2.820606037e-01f + u * 2.829378218e-01f) +
                u2 * (2.379348734e-01f + u * 2.290180775e-01f)) +
               u4 * ((-1.087939187e-01f + u * 4.414835719e-01f) +
                     u2 * (-6.950507279e-01f + u * 4.481742328e-01f)) +
               u8 * (-1.316165990e-01f + u * 1.385204702e-02f);
    }
    for (int v = 0; v < GELU_GROUP; v += DT_CPU_LANES)
        dt_vexp_sub_lanes(e + v, nh + v, 0.0f);
    for (int k = 0; k < GELU_GROUP; k++) {
        e[k] = e[k] * (1.0f - l[k]);
        float half_erfc = 0.5f * t[k] * e[k] * q[k]; /* Phi(-|x|) */
        cdf[k] = x[k] >= 0.0f ? 1.0f - half_erfc : x[k] < 0.0f ? half_erfc : x[k];
    }
}

/* The loops over whole groups: name##_fwd_rows runs name##_fwd_group(x,
 * y) and name##_bwd_rows runs name##_bwd_group(x, d) (d: dout in, din
 * out) on GELU_GROUP elements at a time, the last group padded with
 * zeros. */
#define CPU_UNARY_FWD_ROWS(name)                                                                   \
    DT_CPU_CLONES static void name##_fwd_rows(float *out, const float *in, size_t n)               \
    {                                                                                              \
        float x[GELU_GROUP], y[GELU_GROUP];                                                        \
        for (size_t i = 0; i < n; i += GELU_GROUP) {                                               \
            size_t m = n - i < GELU_GROUP ? n - i : GELU_GROUP;                                    \
            group_load(x, in + i, m);                                                              \
            name##_fwd_group(x, y);                                                                \
            group_store(out + i, y, m);                                                            \
        }                                                                                          \
    }
#define CPU_UNARY_BWD_ROWS(name)                                                                   \
    DT_CPU_CLONES static void name##_bwd_rows(float *din, const float *dout, const float *in,      \
                                              size_t n)                                            \
    {                                                                                              \
        float x[GELU_GROUP], d[GELU_GROUP];                                                        \
        for (size_t i = 0; i < n; i += GELU_GROUP) {                                               \
            size_t m = n - i < GELU_GROUP ? n - i : GELU_GROUP;                                    \
            group_load(x, in + i, m);                                                              \
            group_load(d, dout + i, m);                                                            \
            name##_bwd_group(x, d);                                                                \
            group_store(din + i, d, m);                                                            \
        }                                                                                          \
    }

#define CPU_UNARY_KEEP_ROWS(name)                                                                  \
    DT_CPU_CLONES static void name##_keep_rows(float *out, float *xs, size_t n)                    \
    {                                                                                              \
        float x[GELU_GROUP], y[GELU_GROUP];                                                        \
        for (size_t i = 0; i < n; i += GELU_GROUP) {                                               \
            size_t m = n - i < GELU_GROUP ? n - i : GELU_GROUP;                                    \
            group_load(x, xs + i, m);                                                              \
            name##_keep_group(x, y);                                                               \
            group_store(out + i, y, m);                                                            \
            group_store(xs + i, x, m);                                                             \
        }                                                                                          \
    }

/* A whole group copied one vector of DT_CPU_LANES at a time: GCC turns a
 * single copy of GELU_GROUP floats into `rep movsq`, whose start-up costs
 * more than the copy. */
static inline __attribute__((always_inline)) void group_copy(float *dst, const float *src)
{
    for (int v = 0; v < GELU_GROUP; v += DT_CPU_LANES)
        memcpy(dst + v, src + v, DT_CPU_LANES * sizeof *dst);
}

/* Loads GELU_GROUP elements from src (zeros past m), or stores m of them. */
static inline __attribute__((always_inline)) void group_load(float *dst, const float *src,
                                                             size_t m)
{
    if (m == GELU_GROUP) {
        group_copy(dst, src);
    } else {
        memset(dst, 0, GELU_GROUP * sizeof *dst);
        memcpy(dst, src, m * sizeof *dst);
    }
}

static inline __attribute__((always_inline)) void group_store(float *dst, const float *src,
                                                              size_t m)
{
    if (m == GELU_GROUP)
        group_copy(dst, src);
    else
        memcpy(dst, src, m * sizeof *dst);
}

static inline __attribute__((always_inline)) void gelu_fwd_group(const float *x, float *y)
{
    float cdf[GELU_GROUP], e[GELU_GROUP];
    gelu_lanes(x, cdf, e);
    for (int k = 0; k < GELU_GROUP; k++)
        y[k] = x[k] * cdf[k];
}

/* GELU's derivative Phi(x) + x phi(x), the factor its backward multiplies
 * dy by; the backward and the forward that keeps it share it, so dy times
 * the kept factor is the backward's value bit for bit. */
static inline __attribute__((always_inline)) float gelu_factor(float x, float cdf, float e)
{
    return cdf + x * (DT_INV_SQRT_2PI * e);
}

static inline __attribute__((always_inline)) void gelu_bwd_group(const float *x, float *d)
{
    float cdf[GELU_GROUP], e[GELU_GROUP];
    gelu_lanes(x, cdf, e);
    for (int k = 0; k < GELU_GROUP; k++)
        d[k] = d[k] * gelu_factor(x[k], cdf[k], e[k]);
}

/* y = GELU(x), and x replaced by the backward's factor. */
static inline __attribute__((always_inline)) void gelu_keep_group(float *x, float *y)
{
    float cdf[GELU_GROUP], e[GELU_GROUP];
    gelu_lanes(x, cdf, e);
    for (int k = 0; k < GELU_GROUP; k++) {
        float g = gelu_factor(x[k], cdf[k], e[k]);
        y[k] = x[k] * cdf[k];
        x[k] = g;
    }
}

CPU_UNARY_FWD_ROWS(gelu)
CPU_UNARY_BWD_ROWS(gelu)
CPU_UNARY_KEEP_ROWS(gelu)

/* ---- tanh, GELU's tanh approximation and SiLU -------------------------- */

/* For k < GELU_GROUP: y[k] = tanh(x[k]). |x| < 0.625: x + x^3 p(x^2), p
 * the degree-4 fit of Cephes' tanhf (relative error about 1e-7 there);
 * up to 9: 1 - 2 / (e^(2|x|) + 1) with x's sign; from 9 on, +-1 (tanh
 * rounds to 1 in float from 9.01 on); NaN stays NaN. */
static inline __attribute__((always_inline)) void tanh_lanes(const float *x, float *y)
{
    float a2[GELU_GROUP], e[GELU_GROUP];
    for (int k = 0; k < GELU_GROUP; k++) {
        float a = fabsf(x[k]);
        a2[k] = a < 9.0f ? a + a : 18.0f;
    }
    for (int v = 0; v < GELU_GROUP; v += DT_CPU_LANES)
        dt_vexp_sub_lanes(e + v, a2 + v, 0.0f);
    for (int k = 0; k < GELU_GROUP; k++) {
        float z = x[k] * x[k];
        float p = -5.70498872745e-3f;
        p = p * z + 2.06390887954e-2f;
        p = p * z - 5.37397155531e-2f;
        p = p * z + 1.33314422036e-1f;
        p = p * z - 3.33332819422e-1f;
        float small = x[k] + x[k] * z * p;
        float big = 1.0f - 2.0f / (e[k] + 1.0f);
        big = x[k] < 0.0f ? -big : big;
        big = a2[k] < 18.0f ? big : x[k] < 0.0f ? -1.0f : 1.0f;
        float r = fabsf(x[k]) < 0.625f ? small : big;
        y[k] = x[k] == x[k] ? r : x[k];
    }
}

static inline __attribute__((always_inline)) void tanh_fwd_group(const float *x, float *y)
{
    tanh_lanes(x, y);
}

static inline __attribute__((always_inline)) void tanh_keep_group(float *x, float *y)
{
    tanh_lanes(x, y);
    for (int k = 0; k < GELU_GROUP; k++)
        x[k] = 1.0f - y[k] * y[k];
}

CPU_UNARY_FWD_ROWS(tanh)
CPU_UNARY_KEEP_ROWS(tanh)

/* The list's gradient, dy (1 - y^2) from the saved output: the same bits
 * as the reference. */
static void tanh_bwd_rows(float *din, const float *dout, const float *y, size_t n)
{
    size_t i = 0;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES) {
        float t[DT_CPU_LANES];
        for (int k = 0; k < DT_CPU_LANES; k++)
            t[k] = dout[i + k] * (1.0f - y[i + k] * y[i + k]);
        memcpy(din + i, t, sizeof t);
    }
    for (; i < n; i++)
        din[i] = dout[i] * (1.0f - y[i] * y[i]);
}

/* th[k] = tanh(sqrt(2/pi) (x + 0.044715 x^3)), the list's inner term. */
static inline __attribute__((always_inline)) void gelu_tanh_inner(const float *x, float *th)
{
    float u[GELU_GROUP];
    for (int k = 0; k < GELU_GROUP; k++)
        u[k] = DT_SQRT_2_OVER_PI * (x[k] + 0.044715f * x[k] * x[k] * x[k]);
    tanh_lanes(u, th);
}

static inline __attribute__((always_inline)) void gelu_tanh_fwd_group(const float *x, float *y)
{
    float th[GELU_GROUP];
    gelu_tanh_inner(x, th);
    for (int k = 0; k < GELU_GROUP; k++)
        y[k] = 0.5f * x[k] * (1.0f + th[k]);
}

/* The list's derivative of the tanh GELU, from th = its inner tanh: the
 * factor the backward multiplies dy by, shared as gelu_factor is. */
static inline __attribute__((always_inline)) float gelu_tanh_factor(float x, float th)
{
    return 0.5f * (1.0f + th) +
           0.5f * x * (1.0f - th * th) * DT_SQRT_2_OVER_PI * (1.0f + 3.0f * 0.044715f * x * x);
}

static inline __attribute__((always_inline)) void gelu_tanh_bwd_group(const float *x, float *d)
{
    float th[GELU_GROUP];
    gelu_tanh_inner(x, th);
    for (int k = 0; k < GELU_GROUP; k++)
        d[k] = d[k] * gelu_tanh_factor(x[k], th[k]);
}

static inline __attribute__((always_inline)) void gelu_tanh_keep_group(float *x, float *y)
{
    float th[GELU_GROUP];
    gelu_tanh_inner(x, th);
    for (int k = 0; k < GELU_GROUP; k++) {
        float g = gelu_tanh_factor(x[k], th[k]);
        y[k] = 0.5f * x[k] * (1.0f + th[k]);
        x[k] = g;
    }
}

CPU_UNARY_FWD_ROWS(gelu_tanh)
CPU_UNARY_BWD_ROWS(gelu_tanh)
CPU_UNARY_KEEP_ROWS(gelu_tanh)

/* sig[k] = 1 / (1 + e^(-x[k])). The exponential stops at e^88, so below
 * x = -88 the sigmoid is 0 (libm's expf overflows there too, a little
 * further on, at -88.72): left at 1 / (1 + e^88), it would make SiLU of
 * -1e30 -6e-9 instead of -0. */
static inline __attribute__((always_inline)) void sigmoid_lanes(const float *x, float *sig)
{
    float nx[GELU_GROUP], e[GELU_GROUP];
    for (int k = 0; k < GELU_GROUP; k++)
        nx[k] = -x[k];
    for (int v = 0; v < GELU_GROUP; v += DT_CPU_LANES)
        dt_vexp_sub_lanes(e + v, nx + v, 0.0f);
    for (int k = 0; k < GELU_GROUP; k++)
        sig[k] = x[k] < -EXP_MAX_ARG ? 0.0f : 1.0f / (1.0f + e[k]);
}

static inline __attribute__((always_inline)) void silu_fwd_group(const float *x, float *y)
{
    float sig[GELU_GROUP];
    sigmoid_lanes(x, sig);
    for (int k = 0; k < GELU_GROUP; k++)
        y[k] = x[k] * sig[k];
}

static inline __attribute__((always_inline)) void silu_bwd_group(const float *x, float *d)
{
    float sig[GELU_GROUP];
    sigmoid_lanes(x, sig);
    for (int k = 0; k < GELU_GROUP; k++)
        d[k] = d[k] * sig[k] * (1.0f + x[k] * (1.0f - sig[k]));
}

static inline __attribute__((always_inline)) void silu_keep_group(float *x, float *y)
{
    float sig[GELU_GROUP];
    sigmoid_lanes(x, sig);
    for (int k = 0; k < GELU_GROUP; k++) {
        float g = sig[k] * (1.0f + x[k] * (1.0f - sig[k]));
        y[k] = x[k] * sig[k];
        x[k] = g;
    }
}

CPU_UNARY_FWD_ROWS(silu)
CPU_UNARY_BWD_ROWS(silu)
CPU_UNARY_KEEP_ROWS(silu)

/* The public ops of an OWN row whose rows functions are written above. */
#define CPU_UNARY_OWN_OPS(name)                                                                    \
    static void name##_fwd_range(void *a, size_t lo, size_t hi)                                    \
    {                                                                                              \
        const struct unary_job *j = a;                                                             \
        name##_fwd_rows(j->out + lo, j->in + lo, hi - lo);                                         \
    }                                                                                              \
    static void name##_bwd_range(void *a, size_t lo, size_t hi)                                    \
    {                                                                                              \
        const struct unary_job *j = a;                                                             \
        name##_bwd_rows(j->out + lo, j->in + lo, j->saved + lo, hi - lo);                          \
    }                                                                                              \
    static void name##_keep_range(void *a, size_t lo, size_t hi)                                   \
    {                                                                                              \
        const struct unary_job *j = a;                                                             \
        name##_keep_rows(j->out + lo, j->x + lo, hi - lo);                                         \
    }                                                                                              \
    CPU_UNARY_PUBLIC(name)

CPU_UNARY_OWN_OPS(gelu)
CPU_UNARY_OWN_OPS(tanh)
CPU_UNARY_OWN_OPS(gelu_tanh)
CPU_UNARY_OWN_OPS(silu)
