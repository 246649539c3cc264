/*
 * activation.c - elementwise activations on the CPU: ReLU, exact (erf)
 * GELU and tanh, with their backward passes.
 *
 * ReLU has a fast version that works on fixed blocks of DT_CPU_LANES
 * elements so GCC vectorises it at -O2; it gives the same bits as the
 * reference. GELU is x Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2 (the
 * form that keeps the negative tail's relative precision); its fast
 * version works on such blocks too, with erfc from a Chebyshev fit (see
 * gelu_lanes) and the vectorised exp of vexp.h, whose e^(-x^2/2) serves
 * the backward's density too; it agrees with the reference (libm's erfcf)
 * to 1e-6 relative in every element. tanh is bound by libm's tanhf, which the compiler does not
 * vectorise without -ffast-math, so the fast table uses the reference for
 * it. ReLU and GELU let NaN through (as torch does) so that a non-finite
 * activation still reaches the loss and the finite check.
 *
 * These ops have no parameters; the activation gradient (din) is WRITTEN
 * (=). out == in (and din == dout) may be the same buffer.
 */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"
#include "vexp.h"

#define INV_SQRT2 0.70710678118654752440f
#define INV_SQRT_2PI 0.39894228040143267794f

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

/* ---- ReLU ------------------------------------------------------------- */

/* out = max(in, 0), NaN passes through */
static inline float relu(float x) { return x < 0.0f ? 0.0f : x; }

/* din = dout * (in > 0) */
static inline float relu_grad(float dy, float x) { return x > 0.0f ? dy : 0.0f; }

dt_status dt_cpu_relu_fwd_ref(dt_backend_t *be, float *out, const float *in, size_t n)
{
    dt_status st = check_unary("relu_fwd", out, in);
    if (st != DT_OK)
        return st;
    for (size_t i = 0; i < n; i++)
        out[i] = relu(in[i]);
    return DT_OK;
}

dt_status dt_cpu_relu_bwd_ref(dt_backend_t *be, float *din, const float *dout, const float *in,
                              size_t n)
{
    dt_status st = check_binary("relu_bwd", din, dout, in);
    if (st != DT_OK)
        return st;
    for (size_t i = 0; i < n; i++)
        din[i] = relu_grad(dout[i], in[i]);
    return DT_OK;
}

/* Each block is computed into a local array, then stored: the loads cannot
 * alias the stores, so the compiler vectorises without runtime checks and
 * out == in stays correct. */
dt_status dt_cpu_relu_fwd(dt_backend_t *be, float *out, const float *in, size_t n)
{
    dt_status st = check_unary("relu_fwd", out, in);
    if (st != DT_OK)
        return st;
    size_t i = 0;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES) {
        float t[DT_CPU_LANES];
        for (int k = 0; k < DT_CPU_LANES; k++)
            t[k] = relu(in[i + k]);
        for (int k = 0; k < DT_CPU_LANES; k++)
            out[i + k] = t[k];
    }
    for (; i < n; i++)
        out[i] = relu(in[i]);
    return DT_OK;
}

dt_status dt_cpu_relu_bwd(dt_backend_t *be, float *din, const float *dout, const float *in,
                          size_t n)
{
    dt_status st = check_binary("relu_bwd", din, dout, in);
    if (st != DT_OK)
        return st;
    size_t i = 0;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES) {
        float t[DT_CPU_LANES];
        for (int k = 0; k < DT_CPU_LANES; k++)
            t[k] = relu_grad(dout[i + k], in[i + k]);
        for (int k = 0; k < DT_CPU_LANES; k++)
            din[i + k] = t[k];
    }
    for (; i < n; i++)
        din[i] = relu_grad(dout[i], in[i]);
    return DT_OK;
}

/* ---- GELU (exact) ----------------------------------------------------- */

/* out = x * Phi(x),  Phi(x) = 0.5 (1 + erf(x / sqrt 2)) */
dt_status dt_cpu_gelu_fwd_ref(dt_backend_t *be, float *out, const float *in, size_t n)
{
    dt_status st = check_unary("gelu_fwd", out, in);
    if (st != DT_OK)
        return st;
    for (size_t i = 0; i < n; i++) {
        float x = in[i];
        out[i] = 0.5f * x * erfcf(-x * INV_SQRT2);
    }
    return DT_OK;
}

/* d/dx [x Phi(x)] = Phi(x) + x phi(x),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi) */
dt_status dt_cpu_gelu_bwd_ref(dt_backend_t *be, float *din, const float *dout, const float *in,
                              size_t n)
{
    dt_status st = check_binary("gelu_bwd", din, dout, in);
    if (st != DT_OK)
        return st;
    for (size_t i = 0; i < n; i++) {
        float x = in[i];
        float cdf = 0.5f * erfcf(-x * INV_SQRT2);
        float pdf = INV_SQRT_2PI * expf(-0.5f * x * x);
        din[i] = dout[i] * (cdf + x * pdf);
    }
    return DT_OK;
}

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
        float z = fabsf(x[k]) * INV_SQRT2;
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
            d[k] = d[k] * (cdf[k] + x[k] * (INV_SQRT_2PI * e[k]));
        memcpy(din + i, d, m * sizeof *d);
    }
}

dt_status dt_cpu_gelu_fwd(dt_backend_t *be, float *out, const float *in, size_t n)
{
    dt_status st = check_unary("gelu_fwd", out, in);
    if (st == DT_OK)
        gelu_fwd_rows(out, in, n);
    return st;
}

dt_status dt_cpu_gelu_bwd(dt_backend_t *be, float *din, const float *dout, const float *in,
                          size_t n)
{
    dt_status st = check_binary("gelu_bwd", din, dout, in);
    if (st == DT_OK)
        gelu_bwd_rows(din, dout, in, n);
    return st;
}

/* ---- tanh ------------------------------------------------------------- */

dt_status dt_cpu_tanh_fwd_ref(dt_backend_t *be, float *out, const float *in, size_t n)
{
    dt_status st = check_unary("tanh_fwd", out, in);
    if (st != DT_OK)
        return st;
    for (size_t i = 0; i < n; i++)
        out[i] = tanhf(in[i]);
    return DT_OK;
}

/* takes the forward OUTPUT y = tanh(x):  din = dout * (1 - y^2) */
dt_status dt_cpu_tanh_bwd_ref(dt_backend_t *be, float *din, const float *dout, const float *out,
                              size_t n)
{
    dt_status st = check_binary("tanh_bwd", din, dout, out);
    if (st != DT_OK)
        return st;
    for (size_t i = 0; i < n; i++) {
        float y = out[i];
        din[i] = dout[i] * (1.0f - y * y);
    }
    return DT_OK;
}
