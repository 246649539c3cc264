/*
 * norm.c - batch normalisation over (N, HW) per channel of x(N, C, HW),
 * and layer and RMS normalisation over the last dimension of x(rows, D),
 * on the CPU, forward and backward.
 *
 * Batch norm is split as kernels/ops.h documents so that the model can sum
 * the per-channel sums over ranks between the steps (model.sync_bn):
 * batchnorm_stats (sum, sum of squares) -> batchnorm_fwd, and
 * batchnorm_bwd_reduce (sum dy, sum dy*xhat) -> batchnorm_bwd, the sums in
 * double. Without sync the caller passes its own sums straight through.
 *
 * The reference versions follow the formulas term by term, in double. The
 * fast versions fold the normalisation into one subtract and one
 * multiply-add per element (y = (x - mean)*a + beta, a per channel) and
 * sum each (n, c) plane with one double accumulator per lane of
 * DT_CPU_LANES, so the loops vectorise at -O2 without reassociating sums.
 * RMS norm has the reference only (both tables take it): each sum runs in
 * double in a fixed order, so it is deterministic.
 *
 * A ReLU fused into batch norm (relu, y: kernels/ops.h) is the same select
 * as the relu op's (x < 0 ? 0 : x) on the result, and backward counts dy
 * where the forward's output is > 0, the relu op's gradient.
 *
 * Parameter gradients (dgamma, dbeta) ACCUMULATE (+=); the input gradient
 * (dx) and the outputs are WRITTEN (=). Sums (stats, dstats) are written.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "cpu_ops.h"

static dt_status check_nchw(const char *op, int N, int C, int HW)
{
    if (N < 1 || C < 1 || HW < 1)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu %s: sizes must be >= 1 (N=%d, C=%d, HW=%d)",
                            op, N, C, HW);
    return DT_OK;
}

static dt_status check_count(const char *op, double count, int N, int HW)
{
    if (!(count >= (double)N * HW))
        return dt_set_error(
            DT_ERR_INVALID_ARG,
            "cpu %s: count %g is less than this rank's N*HW = %lld values (count is "
            "the number of values the statistics summed)",
            op, count, (long long)N * HW);
    return DT_OK;
}

static dt_status check_stats(double *stats, const float *x, int N, int C, int HW)
{
    DT_CPU_REQUIRE(stats && x, "batchnorm_stats", "stats and x must not be NULL");
    return check_nchw("batchnorm_stats", N, C, HW);
}

static dt_status check_fwd(float *y, float *mean_out, float *invstd_out, float *rm, float *rv,
                           const float *x, const double *stats, double count, const float *gamma,
                           const float *beta, float eps, int N, int C, int HW)
{
    DT_CPU_REQUIRE(y && mean_out && invstd_out && x && stats && gamma && beta, "batchnorm_fwd",
                   "y, mean_out, invstd_out, x, stats, gamma and beta must not be NULL");
    DT_CPU_REQUIRE(!rm == !rv, "batchnorm_fwd",
                   "running_mean and running_var must both be given or both be NULL");
    DT_CPU_REQUIRE(eps >= 0.0f, "batchnorm_fwd", "eps must be >= 0 (got %g)", (double)eps);
    DT_CPU_REQUIRE(!rm || count > 1.0, "batchnorm_fwd",
                   "the running variance needs more than one value per channel (count %g)", count);
    dt_status st = check_nchw("batchnorm_fwd", N, C, HW);
    return st != DT_OK ? st : check_count("batchnorm_fwd", count, N, HW);
}

static dt_status check_infer(float *y, const float *x, const float *rm, const float *rv,
                             const float *gamma, const float *beta, float eps, int N, int C, int HW)
{
    DT_CPU_REQUIRE(y && x && rm && rv && gamma && beta, "batchnorm_infer",
                   "y, x, running_mean, running_var, gamma and beta must not be NULL");
    DT_CPU_REQUIRE(eps >= 0.0f, "batchnorm_infer", "eps must be >= 0 (got %g)", (double)eps);
    return check_nchw("batchnorm_infer", N, C, HW);
}

static dt_status check_bwd_reduce(double *dstats, const float *dy, const float *x,
                                  const float *mean, const float *invstd, int N, int C, int HW)
{
    DT_CPU_REQUIRE(dstats && dy && x && mean && invstd, "batchnorm_bwd_reduce",
                   "dstats, dy, x, mean and invstd must not be NULL");
    return check_nchw("batchnorm_bwd_reduce", N, C, HW);
}

static dt_status check_bwd(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                           const float *mean, const float *invstd, const float *gamma,
                           const double *local, const double *global, double count, int N, int C,
                           int HW)
{
    DT_CPU_REQUIRE(dx && dgamma && dbeta && dy && x && mean && invstd && gamma && local && global,
                   "batchnorm_bwd", "tensors must not be NULL");
    dt_status st = check_nchw("batchnorm_bwd", N, C, HW);
    return st != DT_OK ? st : check_count("batchnorm_bwd", count, N, HW);
}

static dt_status check_ln(const char *op, int rows, int D)
{
    if (rows < 1 || D < 1)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu %s: sizes must be >= 1 (rows=%d, D=%d)", op,
                            rows, D);
    return DT_OK;
}

static dt_status check_ln_fwd(float *y, float *mean_out, float *rstd_out, const float *x,
                              const float *gamma, const float *beta, float eps, int rows, int D)
{
    DT_CPU_REQUIRE(y && mean_out && rstd_out && x && gamma && beta, "layernorm_fwd",
                   "y, mean_out, rstd_out, x, gamma and beta must not be NULL");
    DT_CPU_REQUIRE(eps >= 0.0f, "layernorm_fwd", "eps must be >= 0 (got %g)", (double)eps);
    return check_ln("layernorm_fwd", rows, D);
}

static dt_status check_ln_bwd(float *dx, float *dgamma, float *dbeta, const float *dy,
                              const float *x, const float *mean, const float *rstd,
                              const float *gamma, int rows, int D)
{
    DT_CPU_REQUIRE(dx && dgamma && dbeta && dy && x && mean && rstd && gamma, "layernorm_bwd",
                   "tensors must not be NULL");
    return check_ln("layernorm_bwd", rows, D);
}

/* Batch mean and 1/sqrt(biased var + eps) of channel c from the sums
 * (a variance below 0 from cancellation counts as 0). */
static void bn_moments(const double *stats, int C, int c, double count, float eps, double *mean,
                       double *var, double *invstd)
{
    *mean = stats[c] / count;
    *var = stats[C + c] / count - *mean * *mean;
    if (*var < 0.0)
        *var = 0.0;
    *invstd = 1.0 / sqrt(*var + eps);
}

/* The running statistics update, the same in both versions. */
static void bn_running(float *rm, float *rv, int c, double mean, double var, double count,
                       float momentum)
{
    rm[c] = (float)((1.0 - momentum) * rm[c] + momentum * mean);
    rv[c] = (float)((1.0 - momentum) * rv[c] + momentum * var * count / (count - 1.0));
}

/* v, or the fused ReLU of v (the relu op's select) when relu */
static inline __attribute__((always_inline)) float relu_if(float v, int relu)
{
    return relu && v < 0.0f ? 0.0f : v;
}

/* ---- reference ------------------------------------------------------- */

/* stats[c] = sum_{n,i} x(n,c,i);  stats[C+c] = sum_{n,i} x(n,c,i)^2 */
dt_status dt_cpu_batchnorm_stats_ref(dt_backend_t *be, double *stats, const float *x, int N, int C,
                                     int HW)
{
    dt_status st = check_stats(stats, x, N, C, HW);
    if (st != DT_OK)
        return st;
    for (int c = 0; c < C; c++) {
        double s = 0.0, s2 = 0.0;
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++) {
                double v = x[((size_t)n * C + c) * HW + i];
                s += v;
                s2 += v * v;
            }
        stats[c] = s;
        stats[C + c] = s2;
    }
    return DT_OK;
}

/* y(n,c,i) = (x - mean_c) * invstd_c * gamma_c + beta_c */
dt_status dt_cpu_batchnorm_fwd_ref(dt_backend_t *be, float *y, float *mean_out, float *invstd_out,
                                   float *running_mean, float *running_var, const float *x,
                                   const double *stats, double count, const float *gamma,
                                   const float *beta, float eps, float momentum, int N, int C,
                                   int HW, int relu)
{
    dt_status st = check_fwd(y, mean_out, invstd_out, running_mean, running_var, x, stats, count,
                             gamma, beta, eps, N, C, HW);
    if (st != DT_OK)
        return st;
    for (int c = 0; c < C; c++) {
        double mean, var, invstd;
        bn_moments(stats, C, c, count, eps, &mean, &var, &invstd);
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++) {
                size_t e = ((size_t)n * C + c) * HW + i;
                y[e] = relu_if((float)((x[e] - mean) * invstd * gamma[c] + beta[c]), relu);
            }
        mean_out[c] = (float)mean;
        invstd_out[c] = (float)invstd;
        if (running_mean)
            bn_running(running_mean, running_var, c, mean, var, count, momentum);
    }
    return DT_OK;
}

/* y(n,c,i) = (x - running_mean_c) / sqrt(running_var_c + eps) * gamma_c + beta_c */
dt_status dt_cpu_batchnorm_infer_ref(dt_backend_t *be, float *y, const float *x,
                                     const float *running_mean, const float *running_var,
                                     const float *gamma, const float *beta, float eps, int N, int C,
                                     int HW, int relu)
{
    dt_status st = check_infer(y, x, running_mean, running_var, gamma, beta, eps, N, C, HW);
    if (st != DT_OK)
        return st;
    for (int c = 0; c < C; c++) {
        double invstd = 1.0 / sqrt((double)running_var[c] + eps);
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++) {
                size_t e = ((size_t)n * C + c) * HW + i;
                y[e] = relu_if(
                    (float)(((double)x[e] - running_mean[c]) * invstd * gamma[c] + beta[c]), relu);
            }
    }
    return DT_OK;
}

/* dy where the fused ReLU's output y is > 0 (all of it without one) */
static float masked(const float *dy, const float *y, size_t e)
{
    return !y || y[e] > 0.0f ? dy[e] : 0.0f;
}

/* dstats[c] = sum dy(n,c,i);  dstats[C+c] = sum dy * (x - mean_c) * invstd_c */
dt_status dt_cpu_batchnorm_bwd_reduce_ref(dt_backend_t *be, double *dstats, const float *dy,
                                          const float *x, const float *mean, const float *invstd,
                                          const float *y, int N, int C, int HW)
{
    dt_status st = check_bwd_reduce(dstats, dy, x, mean, invstd, N, C, HW);
    if (st != DT_OK)
        return st;
    for (int c = 0; c < C; c++) {
        double s = 0.0, sx = 0.0;
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++) {
                size_t e = ((size_t)n * C + c) * HW + i;
                double g = masked(dy, y, e);
                s += g;
                sx += g * (((double)x[e] - mean[c]) * invstd[c]);
            }
        dstats[c] = s;
        dstats[C + c] = sx;
    }
    return DT_OK;
}

/* dgamma_c += local[C+c];  dbeta_c += local[c];
 * dx = gamma_c * invstd_c * (dy - global[c]/count - xhat * global[C+c]/count) */
dt_status dt_cpu_batchnorm_bwd_ref(dt_backend_t *be, float *dx, float *dgamma, float *dbeta,
                                   const float *dy, const float *x, const float *mean,
                                   const float *invstd, const float *gamma, const double *local,
                                   const double *global, double count, const float *y, int N,
                                   int C, int HW)
{
    dt_status st =
        check_bwd(dx, dgamma, dbeta, dy, x, mean, invstd, gamma, local, global, count, N, C, HW);
    if (st != DT_OK)
        return st;
    for (int c = 0; c < C; c++) {
        double mdy = global[c] / count, mdyx = global[C + c] / count;
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++) {
                size_t e = ((size_t)n * C + c) * HW + i;
                double xhat = ((double)x[e] - mean[c]) * invstd[c];
                dx[e] = (float)((double)gamma[c] * invstd[c] *
                                (masked(dy, y, e) - mdy - xhat * mdyx));
            }
        dgamma[c] += (float)local[C + c];
        dbeta[c] += (float)local[c];
    }
    return DT_OK;
}

/* Per row r of x(rows, D): mean_r, rstd_r = 1/sqrt(mean of (x - mean_r)^2 + eps);
 * y = (x - mean_r) * rstd_r * gamma + beta */
dt_status dt_cpu_layernorm_fwd_ref(dt_backend_t *be, float *y, float *mean_out, float *rstd_out,
                                   const float *x, const float *gamma, const float *beta, float eps,
                                   int rows, int D)
{
    dt_status st = check_ln_fwd(y, mean_out, rstd_out, x, gamma, beta, eps, rows, D);
    if (st != DT_OK)
        return st;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * D;
        double mean = 0.0, var = 0.0;
        for (int d = 0; d < D; d++)
            mean += xr[d];
        mean /= D;
        for (int d = 0; d < D; d++)
            var += (xr[d] - mean) * (xr[d] - mean);
        var /= D;
        double rstd = 1.0 / sqrt(var + eps);
        for (int d = 0; d < D; d++)
            y[(size_t)r * D + d] = (float)((xr[d] - mean) * rstd * gamma[d] + beta[d]);
        mean_out[r] = (float)mean;
        rstd_out[r] = (float)rstd;
    }
    return DT_OK;
}

/* With xhat = (x - mean) * rstd and g = dy * gamma, per row:
 *   dx = rstd * (g - mean_d(g) - xhat * mean_d(g * xhat));
 *   dgamma += sum over rows of dy * xhat;  dbeta += sum over rows of dy */
dt_status dt_cpu_layernorm_bwd_ref(dt_backend_t *be, float *dx, float *dgamma, float *dbeta,
                                   const float *dy, const float *x, const float *mean,
                                   const float *rstd, const float *gamma, int rows, int D)
{
    dt_status st = check_ln_bwd(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, D);
    if (st != DT_OK)
        return st;
    for (int d = 0; d < D; d++) {
        double sg = 0.0, sb = 0.0;
        for (int r = 0; r < rows; r++) {
            size_t e = (size_t)r * D + d;
            sg += (double)dy[e] * (((double)x[e] - mean[r]) * rstd[r]);
            sb += dy[e];
        }
        dgamma[d] += (float)sg;
        dbeta[d] += (float)sb;
    }
    for (int r = 0; r < rows; r++) {
        double mg = 0.0, mgx = 0.0;
        for (int d = 0; d < D; d++) {
            size_t e = (size_t)r * D + d;
            double xhat = ((double)x[e] - mean[r]) * rstd[r];
            mg += (double)dy[e] * gamma[d];
            mgx += (double)dy[e] * gamma[d] * xhat;
        }
        mg /= D;
        mgx /= D;
        for (int d = 0; d < D; d++) {
            size_t e = (size_t)r * D + d;
            double xhat = ((double)x[e] - mean[r]) * rstd[r];
            dx[e] = (float)(rstd[r] * ((double)dy[e] * gamma[d] - mg - xhat * mgx));
        }
    }
    return DT_OK;
}

/* ---- RMS norm ---------------------------------------------------------- */

static dt_status check_rms(const char *op, int rows, int D)
{
    return rows < 1 || D < 1
               ? dt_set_error(DT_ERR_INVALID_ARG, "cpu %s: sizes must be >= 1 (rows=%d, D=%d)", op,
                              rows, D)
               : DT_OK;
}

static dt_status check_rms_fwd(float *y, float *rstd_out, const float *x, const float *gamma,
                               float eps, int rows, int D)
{
    DT_CPU_REQUIRE(y && rstd_out && x && gamma, "rmsnorm_fwd",
                   "y, rstd_out, x and gamma must not be NULL");
    DT_CPU_REQUIRE(eps >= 0.0f, "rmsnorm_fwd", "eps must be >= 0 (got %g)", (double)eps);
    return check_rms("rmsnorm_fwd", rows, D);
}

static dt_status check_rms_bwd(float *dx, float *dgamma, const float *dy, const float *x,
                               const float *rstd, const float *gamma, int rows, int D)
{
    DT_CPU_REQUIRE(dx && dgamma && dy && x && rstd && gamma, "rmsnorm_bwd",
                   "tensors must not be NULL");
    return check_rms("rmsnorm_bwd", rows, D);
}

/* Per row r of x(rows, D): rstd_r = 1/sqrt(sum_d x[r,d]^2 / D + eps);
 * y(rows, D) = x * rstd_r * gamma(D); rstd_out(rows) kept for backward. */
dt_status dt_cpu_rmsnorm_fwd_ref(dt_backend_t *be, float *y, float *rstd_out, const float *x,
                                 const float *gamma, float eps, int rows, int D)
{
    dt_status st = check_rms_fwd(y, rstd_out, x, gamma, eps, rows, D);
    if (st != DT_OK) return st;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * D;
        double ss = 0.0;
        for (int d = 0; d < D; d++)
            ss += (double)xr[d] * xr[d];
        double rstd = 1.0 / sqrt(ss / D + eps);
        for (int d = 0; d < D; d++)
            y[(size_t)r * D + d] = (float)(xr[d] * rstd * gamma[d]);
        rstd_out[r] = (float)rstd;
    }
    return DT_OK;
}

/* With xhat = x * rstd_r and g = dy * gamma, per row r of (rows, D):
 *   dx = rstd_r * (g - xhat * mean_d(g * xhat))      (written)
 *   dgamma(D) += sum over rows of dy * xhat          (rows in order)
 * (y = gamma * x * rstd with rstd = (mean(x^2) + eps)^(-1/2), whose
 * derivative in x_j is -rstd^3 x_j / D.) */
dt_status dt_cpu_rmsnorm_bwd_ref(dt_backend_t *be, float *dx, float *dgamma, const float *dy,
                                 const float *x, const float *rstd, const float *gamma, int rows,
                                 int D)
{
    dt_status st = check_rms_bwd(dx, dgamma, dy, x, rstd, gamma, rows, D);
    if (st != DT_OK) return st;
    for (int d = 0; d < D; d++) {
        double sg = 0.0;
        for (int r = 0; r < rows; r++) {
            size_t e = (size_t)r * D + d;
            sg += (double)dy[e] * ((double)x[e] * rstd[r]);
        }
        dgamma[d] += (float)sg;
    }
    for (int r = 0; r < rows; r++) {
        double mgx = 0.0;
        for (int d = 0; d < D; d++) {
            size_t e = (size_t)r * D + d;
            mgx += (double)dy[e] * gamma[d] * ((double)x[e] * rstd[r]);
        }
        mgx /= D;
        for (int d = 0; d < D; d++) {
            size_t e = (size_t)r * D + d;
            double xhat = (double)x[e] * rstd[r];
            dx[e] = (float)(rstd[r] * ((double)dy[e] * gamma[d] - xhat * mgx));
        }
    }
    return DT_OK;
}

/* ---- fast ------------------------------------------------------------ */

/* Sum of n floats, one double accumulator per lane (the lanes vectorise;
 * one running sum would wait on each add). */
static inline __attribute__((always_inline)) double sum_lanes(const float *v, size_t n)
{
    double a[DT_CPU_LANES] = {0};
    size_t i = 0;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES)
        for (int k = 0; k < DT_CPU_LANES; k++)
            a[k] += v[i + k];
    double s = 0.0;
    for (; i < n; i++)
        s += v[i];
    for (int k = 0; k < DT_CPU_LANES; k++)
        s += a[k];
    return s;
}

/* One channel's running sums over its planes: a per-lane partial sum of
 * every plane's whole blocks of DT_CPU_LANES floats, and a scalar sum of
 * the planes' remainders, added up only once all planes are in
 * (chan_total), so a small plane costs no reduction of the lanes and the
 * thread writes the channel's result once. */
struct chan_sums {
    double a[DT_CPU_LANES], b[DT_CPU_LANES], s, t;
};

static inline __attribute__((always_inline)) void chan_total(const struct chan_sums *c,
                                                             double *sum, double *second)
{
    double s = c->s, t = c->t;
    for (int k = 0; k < DT_CPU_LANES; k++) {
        s += c->a[k];
        t += c->b[k];
    }
    *sum = s;
    *second = t;
}

/* The lanes as GCC vectors of four, so that the accumulators stay in
 * registers (as arrays of doubles GCC kept them in memory: a load and a
 * store per add; as one vector of DT_CPU_LANES doubles it spilled them).
 * Lane 4q + r is element r of quad q: each lane takes the same elements
 * as one accumulator per lane would. */
typedef float quad_f __attribute__((vector_size(4 * sizeof(float))));
typedef int quad_i __attribute__((vector_size(4 * sizeof(int))));
typedef double quad_d __attribute__((vector_size(4 * sizeof(double))));
#define QUADS (DT_CPU_LANES / 4)

/* Adds v and v*v over n floats to the channel's sums. */
static inline __attribute__((always_inline)) void sum_sq(const float *v, size_t n,
                                                         struct chan_sums *cs)
{
    quad_d a[QUADS], b[QUADS];
    memcpy(a, cs->a, sizeof a);
    memcpy(b, cs->b, sizeof b);
    size_t i = 0;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES) {
#pragma GCC unroll 16
        for (int q = 0; q < QUADS; q++) {
            quad_f x;
            memcpy(&x, v + i + 4 * q, sizeof x);
            quad_d t = __builtin_convertvector(x, quad_d);
            a[q] += t;
            b[q] += t * t;
        }
    }
    double s = cs->s, s2 = cs->t;
    for (; i < n; i++) {
        s += v[i];
        s2 += (double)v[i] * v[i];
    }
    memcpy(cs->a, a, sizeof a);
    memcpy(cs->b, b, sizeof b);
    cs->s = s;
    cs->t = s2;
}

/* g[i], or 0 where the mask y (read only when `masked`, a constant at
 * every call, so each loop is specialised) is not > 0 */
static inline __attribute__((always_inline)) float keep(const float *g, const float *y, int masked,
                                                        size_t i)
{
    float v = g[i]; /* loaded unconditionally, so the select vectorises */
    return masked && !(y[i] > 0.0f) ? 0.0f : v;
}

/* Adds g and g*(v - m) over n floats to the channel's sums; g masked by
 * y as keep() says. */
static inline __attribute__((always_inline)) void
sum_dot_centered(const float *g, const float *y, int masked, const float *v, float m, size_t n,
                 struct chan_sums *cs)
{
    quad_d a[QUADS], b[QUADS];
    memcpy(a, cs->a, sizeof a);
    memcpy(b, cs->b, sizeof b);
    size_t i = 0;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES) {
#pragma GCC unroll 16
        for (int q = 0; q < QUADS; q++) {
            size_t e = i + 4 * (size_t)q;
            quad_f gv, xv;
            memcpy(&gv, g + e, sizeof gv);
            memcpy(&xv, v + e, sizeof xv);
            if (masked) { /* keep(): g where y > 0, else 0 (NaN y too) */
                quad_f yv;
                memcpy(&yv, y + e, sizeof yv);
                gv = (quad_f)((quad_i)gv & (yv > 0.0f));
            }
            quad_d t = __builtin_convertvector(gv, quad_d);
            a[q] += t;
            b[q] += t * __builtin_convertvector(xv - m, quad_d);
        }
    }
    double s = cs->s, d = cs->t;
    for (; i < n; i++) {
        double t = keep(g, y, masked, i);
        s += t;
        d += t * (double)(v[i] - m);
    }
    memcpy(cs->a, a, sizeof a);
    memcpy(cs->b, b, sizeof b);
    cs->s = s;
    cs->t = d;
}

/* Sum of (v - m)^2 over n floats, one double accumulator per lane. */
static inline __attribute__((always_inline)) void sum_sq_centered(const float *v, float m, size_t n, double *out)
{
    double a[DT_CPU_LANES] = {0};
    size_t i = 0;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES)
        for (int k = 0; k < DT_CPU_LANES; k++) {
            double t = v[i + k] - m;
            a[k] += t * t;
        }
    double s = 0.0;
    for (; i < n; i++)
        s += (double)(v[i] - m) * (v[i] - m);
    for (int k = 0; k < DT_CPU_LANES; k++)
        s += a[k];
    *out += s;
}

/* (in - m) * a + b, then the ReLU's select when relu (a constant at
 * every call) */
static inline __attribute__((always_inline)) float affine_at(const float *in, float m, float a,
                                                             float b, int relu, size_t i)
{
    return relu_if((in[i] - m) * a + b, relu);
}

/* out(n) = affine_at(in, ...), in blocks of DT_CPU_LANES (a stack block
 * lets the compiler vectorise without proving that out and in do not
 * overlap). Centring first keeps a large mean from cancelling. */
static inline __attribute__((always_inline)) void affine(float *out, const float *in, float m,
                                                         float a, float b, int relu, size_t n)
{
    size_t i = 0;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES) {
        float t[DT_CPU_LANES];
        for (int k = 0; k < DT_CPU_LANES; k++)
            t[k] = affine_at(in, m, a, b, relu, i + k);
        for (int k = 0; k < DT_CPU_LANES; k++)
            out[i + k] = t[k];
    }
    for (; i < n; i++)
        out[i] = affine_at(in, m, a, b, relu, i);
}

/* out(n) = dy * a + (x - m) * b + c, dy masked by y as keep() says; in
 * blocks as affine */
static inline __attribute__((always_inline)) void affine2(float *out, const float *dy,
                                                          const float *y, int masked,
                                                          const float *x, float m, float a,
                                                          float b, float c, size_t n)
{
    size_t i = 0;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES) {
        float t[DT_CPU_LANES];
        for (int k = 0; k < DT_CPU_LANES; k++)
            t[k] = keep(dy, y, masked, i + k) * a + (x[i + k] - m) * b + c;
        for (int k = 0; k < DT_CPU_LANES; k++)
            out[i + k] = t[k];
    }
    for (; i < n; i++)
        out[i] = keep(dy, y, masked, i) * a + (x[i] - m) * b + c;
}

/* The threaded passes. Per-channel sums take a block of channels, each
 * channel's planes in sample order (the one-thread order); per-plane
 * passes take blocks of planes; layer norm takes blocks of rows, and its
 * parameter gradients are summed per block of LN_ROWS rows (a fixed
 * partition), the blocks then added in order. So each output is computed
 * as on one thread, whatever the thread count. */
#define LN_ROWS 64

struct bn_job {
    float *y, *a_out, *b_out;
    double *stats;
    const float *x, *dy, *mean, *invstd, *gamma, *beta;
    const float *mask; /* backward: the fused ReLU's output, NULL without one */
    const double *global;
    double count;
    float eps;
    int N, C, HW;
    int relu; /* forward: a ReLU fused in */
    float *part; /* layer norm backward: dgamma, dbeta of each block of rows */
};

static size_t plane_grain(int HW) { return 1 + DT_CPU_GRAIN / ((size_t)HW + 1); }

/* Channels whose sums a task holds at once (chan_sums: 17 KiB for 64). */
#define BN_CHUNK 64

/* The per-channel sums visit the planes in memory order (sample by
 * sample, the chunk's channels within each), so each channel's sums take
 * its planes in sample order whatever the thread count. */
DT_CPU_CLONES static void bn_stats_channels(void *a, size_t lo, size_t hi)
{
    const struct bn_job *j = a;
    for (size_t c0 = lo; c0 < hi; c0 += BN_CHUNK) {
        size_t nc = hi - c0 < BN_CHUNK ? hi - c0 : BN_CHUNK;
        struct chan_sums cs[BN_CHUNK];
        memset(cs, 0, nc * sizeof cs[0]);
        for (int n = 0; n < j->N; n++)
            for (size_t c = 0; c < nc; c++)
                sum_sq(j->x + ((size_t)n * j->C + c0 + c) * j->HW, (size_t)j->HW, &cs[c]);
        for (size_t c = 0; c < nc; c++)
            chan_total(&cs[c], &j->stats[c0 + c], &j->stats[j->C + c0 + c]);
    }
}

dt_status dt_cpu_batchnorm_stats(dt_backend_t *be, double *stats, const float *x, int N, int C,
                                 int HW)
{
    dt_status st = check_stats(stats, x, N, C, HW);
    if (st != DT_OK)
        return st;
    /* every channel's two sums are written (not added to) by its task */
    struct bn_job j = {.stats = stats, .x = x, .N = N, .C = C, .HW = HW};
    dt_cpu_for(be, (size_t)C, dt_cpu_channel_grain(be, N, C, HW), bn_stats_channels, &j);
    return DT_OK;
}

DT_CPU_CLONES static void bn_fwd_planes(void *a, size_t lo, size_t hi)
{
    const struct bn_job *j = a;
    for (size_t p = lo; p < hi; p++) {
        size_t c = p % (size_t)j->C, e = p * j->HW;
        float k = j->gamma[c] * j->invstd[c];
        if (j->relu)
            affine(j->y + e, j->x + e, j->mean[c], k, j->beta[c], 1, (size_t)j->HW);
        else
            affine(j->y + e, j->x + e, j->mean[c], k, j->beta[c], 0, (size_t)j->HW);
    }
}

dt_status dt_cpu_batchnorm_fwd(dt_backend_t *be, float *y, float *mean_out, float *invstd_out,
                               float *running_mean, float *running_var, const float *x,
                               const double *stats, double count, const float *gamma,
                               const float *beta, float eps, float momentum, int N, int C, int HW,
                               int relu)
{
    dt_status st = check_fwd(y, mean_out, invstd_out, running_mean, running_var, x, stats, count,
                             gamma, beta, eps, N, C, HW);
    if (st != DT_OK)
        return st;
    for (int c = 0; c < C; c++) {
        double mean, var, invstd;
        bn_moments(stats, C, c, count, eps, &mean, &var, &invstd);
        mean_out[c] = (float)mean;
        invstd_out[c] = (float)invstd;
        if (running_mean)
            bn_running(running_mean, running_var, c, mean, var, count, momentum);
    }
    struct bn_job j = {.y = y, .x = x, .mean = mean_out, .invstd = invstd_out, .gamma = gamma,
                       .beta = beta, .N = N, .C = C, .HW = HW, .relu = relu};
    dt_cpu_for(be, (size_t)N * C, plane_grain(HW), bn_fwd_planes, &j);
    return DT_OK;
}

/* mean and invstd hold the running mean and variance here */
DT_CPU_CLONES static void bn_infer_planes(void *a, size_t lo, size_t hi)
{
    const struct bn_job *j = a;
    for (size_t p = lo; p < hi; p++) {
        size_t c = p % (size_t)j->C, e = p * j->HW;
        float k = (float)(j->gamma[c] / sqrt((double)j->invstd[c] + j->eps));
        if (j->relu)
            affine(j->y + e, j->x + e, j->mean[c], k, j->beta[c], 1, (size_t)j->HW);
        else
            affine(j->y + e, j->x + e, j->mean[c], k, j->beta[c], 0, (size_t)j->HW);
    }
}

dt_status dt_cpu_batchnorm_infer(dt_backend_t *be, float *y, const float *x,
                                 const float *running_mean, const float *running_var,
                                 const float *gamma, const float *beta, float eps, int N, int C,
                                 int HW, int relu)
{
    dt_status st = check_infer(y, x, running_mean, running_var, gamma, beta, eps, N, C, HW);
    if (st != DT_OK)
        return st;
    struct bn_job j = {.y = y, .x = x, .mean = running_mean, .invstd = running_var,
                       .gamma = gamma, .beta = beta, .eps = eps, .N = N, .C = C, .HW = HW,
                       .relu = relu};
    dt_cpu_for(be, (size_t)N * C, plane_grain(HW), bn_infer_planes, &j);
    return DT_OK;
}

DT_CPU_CLONES static void bn_reduce_channels(void *a, size_t lo, size_t hi)
{
    const struct bn_job *j = a;
    for (size_t c0 = lo; c0 < hi; c0 += BN_CHUNK) {
        size_t nc = hi - c0 < BN_CHUNK ? hi - c0 : BN_CHUNK;
        struct chan_sums cs[BN_CHUNK];
        memset(cs, 0, nc * sizeof cs[0]);
        for (int n = 0; n < j->N; n++)
            for (size_t c = 0; c < nc; c++) {
                size_t e = ((size_t)n * j->C + c0 + c) * j->HW;
                float m = j->mean[c0 + c];
                if (j->mask)
                    sum_dot_centered(j->dy + e, j->mask + e, 1, j->x + e, m, (size_t)j->HW,
                                     &cs[c]);
                else
                    sum_dot_centered(j->dy + e, NULL, 0, j->x + e, m, (size_t)j->HW, &cs[c]);
            }
        for (size_t c = 0; c < nc; c++) {
            double s, d;
            chan_total(&cs[c], &s, &d);
            j->stats[c0 + c] = s;
            j->stats[j->C + c0 + c] = d * j->invstd[c0 + c]; /* sum dy * (x - mean) * invstd */
        }
    }
}

dt_status dt_cpu_batchnorm_bwd_reduce(dt_backend_t *be, double *dstats, const float *dy,
                                      const float *x, const float *mean, const float *invstd,
                                      const float *y, int N, int C, int HW)
{
    dt_status st = check_bwd_reduce(dstats, dy, x, mean, invstd, N, C, HW);
    if (st != DT_OK)
        return st;
    /* every channel's two sums are written (not added to) by its task */
    struct bn_job j = {.stats = dstats, .dy = dy, .x = x, .mean = mean, .invstd = invstd,
                       .mask = y, .N = N, .C = C, .HW = HW};
    dt_cpu_for(be, (size_t)C, dt_cpu_channel_grain(be, N, C, HW), bn_reduce_channels, &j);
    return DT_OK;
}

/* dx = k*dy + kx*(x - mean) + k0 with, per channel, k = gamma*invstd,
 * kx = -k*invstd*mdyx, k0 = -k*mdy */
DT_CPU_CLONES static void bn_bwd_planes(void *a, size_t lo, size_t hi)
{
    const struct bn_job *j = a;
    const int C = j->C;
    for (size_t p = lo; p < hi; p++) {
        size_t c = p % (size_t)C, e = p * j->HW;
        double k = (double)j->gamma[c] * j->invstd[c], mdy = j->global[c] / j->count,
               mdyx = j->global[C + c] / j->count;
        float kd = (float)k, kx = (float)(-k * j->invstd[c] * mdyx), k0 = (float)(-k * mdy);
        if (j->mask)
            affine2(j->y + e, j->dy + e, j->mask + e, 1, j->x + e, j->mean[c], kd, kx, k0,
                    (size_t)j->HW);
        else
            affine2(j->y + e, j->dy + e, NULL, 0, j->x + e, j->mean[c], kd, kx, k0,
                    (size_t)j->HW);
    }
}

dt_status dt_cpu_batchnorm_bwd(dt_backend_t *be, float *dx, float *dgamma, float *dbeta,
                               const float *dy, const float *x, const float *mean,
                               const float *invstd, const float *gamma, const double *local,
                               const double *global, double count, const float *y, int N, int C,
                               int HW)
{
    dt_status st =
        check_bwd(dx, dgamma, dbeta, dy, x, mean, invstd, gamma, local, global, count, N, C, HW);
    if (st != DT_OK)
        return st;
    for (int c = 0; c < C; c++) {
        dgamma[c] += (float)local[C + c];
        dbeta[c] += (float)local[c];
    }
    struct bn_job j = {.y = dx, .dy = dy, .x = x, .mean = mean, .invstd = invstd, .gamma = gamma,
                       .mask = y, .global = global, .count = count, .N = N, .C = C, .HW = HW};
    dt_cpu_for(be, (size_t)N * C, plane_grain(HW), bn_bwd_planes, &j);
    return DT_OK;
}

/* rows [lo, hi) of layer norm's forward; a_out, b_out: mean and rstd */
DT_CPU_CLONES static void ln_fwd_rows(void *a, size_t lo, size_t hi)
{
    const struct bn_job *j = a;
    const float *gamma = j->gamma, *beta = j->beta;
    const int D = j->HW;
    for (size_t r = lo; r < hi; r++) {
        const float *xr = j->x + r * D;
        float *yr = j->y + r * D;
        double var = 0.0;
        float m = (float)(sum_lanes(xr, (size_t)D) / D);
        sum_sq_centered(xr, m, (size_t)D, &var); /* second pass: no cancellation */
        var /= D;
        float rstd = (float)(1.0 / sqrt((var > 0.0 ? var : 0.0) + j->eps));
        int d = 0;
        for (; d + DT_CPU_LANES <= D; d += DT_CPU_LANES) {
            float t[DT_CPU_LANES]; /* a local block: no store can alias a load */
            for (int k = 0; k < DT_CPU_LANES; k++)
                t[k] = (xr[d + k] - m) * rstd * gamma[d + k] + beta[d + k];
            memcpy(yr + d, t, sizeof t);
        }
        for (; d < D; d++)
            yr[d] = (xr[d] - m) * rstd * gamma[d] + beta[d];
        j->a_out[r] = m;
        j->b_out[r] = rstd;
    }
}

dt_status dt_cpu_layernorm_fwd(dt_backend_t *be, float *y, float *mean_out, float *rstd_out,
                               const float *x, const float *gamma, const float *beta, float eps,
                               int rows, int D)
{
    dt_status st = check_ln_fwd(y, mean_out, rstd_out, x, gamma, beta, eps, rows, D);
    if (st != DT_OK)
        return st;
    struct bn_job j = {.y = y, .a_out = mean_out, .b_out = rstd_out, .x = x, .gamma = gamma,
                       .beta = beta, .eps = eps, .HW = D};
    dt_cpu_for(be, (size_t)rows, plane_grain(D), ln_fwd_rows, &j);
    return DT_OK;
}

/* Block b of LN_ROWS rows: dx, and the block's dgamma and dbeta sums
 * (part + 2 * D * b), the rows in order. */
DT_CPU_CLONES static void ln_bwd_block(void *a, size_t lo, size_t hi)
{
    const struct bn_job *j = a;
    const int D = j->HW, rows = j->N;
    const float *gamma = j->gamma;
    for (size_t b = lo; b < hi; b++) {
        float *dgamma = j->part + 2 * (size_t)D * b, *dbeta = dgamma + D;
        memset(dgamma, 0, 2 * (size_t)D * sizeof *dgamma);
        int r1 = (int)(b + 1) * LN_ROWS < rows ? (int)(b + 1) * LN_ROWS : rows;
        for (int r = (int)b * LN_ROWS; r < r1; r++) {
            const float *xr = j->x + (size_t)r * D, *dyr = j->dy + (size_t)r * D;
            float *dxr = j->y + (size_t)r * D;
            const float m = j->mean[r], rs = j->invstd[r];
            /* dgamma, dbeta and the two row means, in one pass over the
             * row; the means' sums one per lane, then in lane order. The
             * new sums go to local blocks first, so that no store can
             * alias a later load and the lanes vectorise. */
            float pg[DT_CPU_LANES] = {0}, pgx[DT_CPU_LANES] = {0};
            int d = 0;
            for (; d + DT_CPU_LANES <= D; d += DT_CPU_LANES) {
                float sg[DT_CPU_LANES], sb[DT_CPU_LANES];
                for (int k = 0; k < DT_CPU_LANES; k++) {
                    float xhat = (xr[d + k] - m) * rs, g = dyr[d + k] * gamma[d + k];
                    sg[k] = dgamma[d + k] + dyr[d + k] * xhat;
                    sb[k] = dbeta[d + k] + dyr[d + k];
                    pg[k] += g;
                    pgx[k] += g * xhat;
                }
                memcpy(dgamma + d, sg, sizeof sg);
                memcpy(dbeta + d, sb, sizeof sb);
            }
            float mg = 0.0f, mgx = 0.0f;
            for (; d < D; d++) {
                float xhat = (xr[d] - m) * rs, g = dyr[d] * gamma[d];
                dgamma[d] += dyr[d] * xhat;
                dbeta[d] += dyr[d];
                mg += g;
                mgx += g * xhat;
            }
            for (int k = 0; k < DT_CPU_LANES; k++) {
                mg += pg[k];
                mgx += pgx[k];
            }
            mg /= D;
            mgx /= D;
            for (d = 0; d + DT_CPU_LANES <= D; d += DT_CPU_LANES) {
                float t[DT_CPU_LANES];
                for (int k = 0; k < DT_CPU_LANES; k++)
                    t[k] = rs * (dyr[d + k] * gamma[d + k] - mg - (xr[d + k] - m) * rs * mgx);
                memcpy(dxr + d, t, sizeof t);
            }
            for (; d < D; d++)
                dxr[d] = rs * (dyr[d] * gamma[d] - mg - (xr[d] - m) * rs * mgx);
        }
    }
}

dt_status dt_cpu_layernorm_bwd(dt_backend_t *be, float *dx, float *dgamma, float *dbeta,
                               const float *dy, const float *x, const float *mean,
                               const float *rstd, const float *gamma, int rows, int D)
{
    dt_status st = check_ln_bwd(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, D);
    if (st != DT_OK)
        return st;
    size_t blocks = ((size_t)rows + LN_ROWS - 1) / LN_ROWS;
    struct bn_job j = {.y = dx, .dy = dy, .x = x, .mean = mean, .invstd = rstd, .gamma = gamma,
                       .N = rows, .HW = D};
    st = dt_malloc(blocks * 2 * (size_t)D * sizeof *j.part, "layernorm_bwd's sums per block",
                   (void **)&j.part);
    if (st != DT_OK)
        return st;
    dt_cpu_for(be, blocks, 1 + (size_t)DT_CPU_GRAIN / ((size_t)LN_ROWS * D + 1), ln_bwd_block,
               &j);
    for (size_t b = 0; b < blocks; b++) {
        const float *pg = j.part + 2 * (size_t)D * b, *pb = pg + D;
        for (int d = 0; d < D; d++) {
            dgamma[d] += pg[d];
            dbeta[d] += pb[d];
        }
    }
    free(j.part);
    return DT_OK;
}

/* ---- RMS norm, fast ----------------------------------------------------
 * Rows on the pool's threads; each row's sum of squares in double lanes;
 * the element-wise parts in double, as the reference computes them; the
 * gamma gradient summed in double per block of LN_ROWS rows, the blocks
 * added in order (fixed blocks, as layer norm's). */
struct rms_job {
    float *y, *rstd_out, *dx;
    const float *x, *dy, *rstd, *gamma;
    double *part; /* backward: each block's dgamma sums */
    float eps;
    int rows, D;
};

DT_CPU_CLONES static void rms_fwd_rows(void *a, size_t lo, size_t hi)
{
    const struct rms_job *j = a;
    const int D = j->D;
    for (size_t r = lo; r < hi; r++) {
        const float *xr = j->x + r * D;
        float *yr = j->y + r * D;
        double ss = 0.0;
        sum_sq_centered(xr, 0.0f, (size_t)D, &ss); /* the squares alone */
        double rstd = 1.0 / sqrt(ss / D + j->eps);
        for (int d = 0; d < D; d++)
            yr[d] = (float)(xr[d] * rstd * j->gamma[d]);
        j->rstd_out[r] = (float)rstd;
    }
}

dt_status dt_cpu_rmsnorm_fwd(dt_backend_t *be, float *y, float *rstd_out, const float *x,
                             const float *gamma, float eps, int rows, int D)
{
    dt_status st = check_rms_fwd(y, rstd_out, x, gamma, eps, rows, D);
    if (st != DT_OK) return st;
    struct rms_job j = {.y = y, .rstd_out = rstd_out, .x = x, .gamma = gamma, .eps = eps,
                        .rows = rows, .D = D};
    dt_cpu_for(be, (size_t)rows, plane_grain(D), rms_fwd_rows, &j);
    return DT_OK;
}

/* Block b of LN_ROWS rows: dx, and the block's dgamma sums (part + D * b),
 * the rows in order. */
DT_CPU_CLONES static void rms_bwd_block(void *a, size_t lo, size_t hi)
{
    const struct rms_job *j = a;
    const int D = j->D;
    const float *gamma = j->gamma;
    for (size_t b = lo; b < hi; b++) {
        double *dg = j->part + (size_t)D * b;
        memset(dg, 0, (size_t)D * sizeof *dg);
        int r1 = (int)(b + 1) * LN_ROWS < j->rows ? (int)(b + 1) * LN_ROWS : j->rows;
        for (int r = (int)b * LN_ROWS; r < r1; r++) {
            const float *xr = j->x + (size_t)r * D, *dyr = j->dy + (size_t)r * D;
            float *dxr = j->dx + (size_t)r * D;
            const double rs = j->rstd[r];
            /* dgamma and mean(g * xhat) in one pass; the mean's sum in lanes */
            double lane[DT_CPU_LANES] = {0};
            int d = 0;
            for (; d + DT_CPU_LANES <= D; d += DT_CPU_LANES)
                for (int k = 0; k < DT_CPU_LANES; k++) {
                    double xhat = (double)xr[d + k] * rs;
                    dg[d + k] += (double)dyr[d + k] * xhat;
                    lane[k] += (double)dyr[d + k] * gamma[d + k] * xhat;
                }
            double mgx = 0.0;
            for (; d < D; d++) {
                double xhat = (double)xr[d] * rs;
                dg[d] += (double)dyr[d] * xhat;
                mgx += (double)dyr[d] * gamma[d] * xhat;
            }
            for (int k = 0; k < DT_CPU_LANES; k++)
                mgx += lane[k];
            mgx /= D;
            for (d = 0; d < D; d++) {
                double xhat = (double)xr[d] * rs;
                dxr[d] = (float)(rs * ((double)dyr[d] * gamma[d] - xhat * mgx));
            }
        }
    }
}

dt_status dt_cpu_rmsnorm_bwd(dt_backend_t *be, float *dx, float *dgamma, const float *dy,
                             const float *x, const float *rstd, const float *gamma, int rows,
                             int D)
{
    dt_status st = check_rms_bwd(dx, dgamma, dy, x, rstd, gamma, rows, D);
    if (st != DT_OK) return st;
    size_t blocks = ((size_t)rows + LN_ROWS - 1) / LN_ROWS;
    struct rms_job j = {.dx = dx, .x = x, .dy = dy, .rstd = rstd, .gamma = gamma, .rows = rows,
                        .D = D};
    st = dt_malloc(blocks * (size_t)D * sizeof *j.part, "rmsnorm_bwd's sums per block",
                   (void **)&j.part);
    if (st != DT_OK)
        return st;
    dt_cpu_for(be, blocks, 1 + (size_t)DT_CPU_GRAIN / ((size_t)LN_ROWS * D + 1), rms_bwd_block,
               &j);
    for (int d = 0; d < D; d++) {
        double s = 0.0;
        for (size_t b = 0; b < blocks; b++)
            s += j.part[(size_t)D * b + d];
        dgamma[d] += (float)s;
    }
    free(j.part);
    return DT_OK;
}
