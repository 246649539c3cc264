/*
 * activation.c - elementwise activations on the CPU: ReLU, exact (erf)
 * GELU and tanh, with their backward passes.
 *
 * ReLU has a fast version that works on fixed blocks of DT_CPU_LANES
 * elements so GCC vectorises it at -O2; it gives the same bits as the
 * reference. GELU and tanh are bound by libm's erff/expf/tanhf, which the
 * compiler does not vectorise without -ffast-math, so the fast table uses
 * the reference for them. ReLU lets NaN through (as torch does) so that a
 * non-finite activation still reaches the loss and the finite check.
 *
 * These ops have no parameters; the activation gradient (din) is WRITTEN
 * (=). out == in (and din == dout) may be the same buffer.
 */
#include <math.h>

#include "cpu_ops.h"

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
        out[i] = 0.5f * x * (1.0f + erff(x * INV_SQRT2));
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
        float cdf = 0.5f * (1.0f + erff(x * INV_SQRT2));
        float pdf = INV_SQRT_2PI * expf(-0.5f * x * x);
        din[i] = dout[i] * (cdf + x * pdf);
    }
    return DT_OK;
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
