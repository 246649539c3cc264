/*
 * norm.cu - batch normalisation (NCHW, per channel), layer normalisation
 * and RMS normalisation (per row) on the GPU, with kernels of our own.
 *
 * Batch norm is split as kernels/ops.h says: batchnorm_stats sums x and x^2
 * per channel, the model may add those sums over ranks (sync_bn), and
 * batchnorm_fwd turns them into the mean and 1/std; backward likewise sums
 * dy and dy*xhat (batchnorm_bwd_reduce) before batchnorm_bwd applies the
 * (possibly global) sums. cuDNN's batch-norm calls fuse the statistics
 * with the normalisation and cannot take sums from elsewhere, so they are
 * not used.
 *
 * Every reduction is deterministic: the same input gives the same bits on
 * every run and every GPU. No atomics: a per-channel sum is one block per
 * channel whose thread t adds the channel's values t, t + DT_CUDA_THREADS,
 * ... (in (n, hw) order, the position stepped on without a division) in
 * double, and the threads then meet in a fixed tree; a per-row sum of
 * layer norm is one block per row, the same way; the column sums of layer
 * norm's dgamma and dbeta and RMS norm's dgamma are the fixed two-pass
 * column sums of colsum.cu (tiles of rows, then the tiles in order), in
 * double. The sums differ from the CPU's, which add in another order, by
 * far less than fp32 resolution. Layer norm takes the variance in two
 * passes (the mean first), so large offsets do not cancel. RMS norm is
 * layer norm without the mean and the shift, summed the same ways.
 *
 * The element-wise batch-norm kernels (apply, infer, dx) run over the
 * (n, c) planes (dt_cuda_plane_shape): a thread finds its plane's channel
 * once and steps it on as it strides over planes, so no element costs a
 * division.
 *
 * A ReLU fused in (relu, y: kernels/ops.h) is the relu op's select on
 * the result, and backward counts dy where the forward's output y > 0.
 *
 * The variance from the sums, E[x^2] - mean^2, can come out a rounding
 * error below zero for a constant channel; it is taken as 0 then.
 *
 * Gradients of parameters ACCUMULATE (+=: dgamma, dbeta); gradients of
 * activations are WRITTEN (=: dx). Per-channel statistics and parameters
 * are fp32 (C floats); the sums are double, as ops.h gives them.
 */
#include <cuda_runtime.h>
#include <math.h>

#include "cuda_impl.h"

static_assert((DT_CUDA_THREADS & (DT_CUDA_THREADS - 1)) == 0,
              "the block tree sums need a power-of-two block size");

/* What a per-channel reduction sums: (x, x^2) or (dy, dy*xhat). */
enum channel_sums { SUMS_STATS, SUMS_BWD };

/* Adds sa[] and sb[] of the block up in a fixed tree into sa[0], sb[0];
 * every thread of the block calls it. */
static __device__ void block_sum2(double *sa, double *sb)
{
    __syncthreads();
    for (unsigned h = DT_CUDA_THREADS / 2; h > 0; h /= 2) {
        if (threadIdx.x < h) {
            sa[threadIdx.x] += sa[threadIdx.x + h];
            sb[threadIdx.x] += sb[threadIdx.x + h];
        }
        __syncthreads();
    }
}

/* out[c], out[C+c]: block c sums channel c of (N,C,HW) tensors. SUMS_STATS:
 * x and x^2; SUMS_BWD: dy and dy*(x - mean)*invstd, dy taken as 0 where
 * the fused ReLU's output y (when not NULL) is not > 0. */
static __global__ void channel_sums(double *out, enum channel_sums kind, const float *x,
                                    const float *dy, const float *y, const float *mean,
                                    const float *invstd, int N, int C, int HW)
{
    __shared__ double sa[DT_CUDA_THREADS], sb[DT_CUDA_THREADS];
    const int c = blockIdx.x;
    const double m = kind == SUMS_BWD ? (double)mean[c] : 0.0;
    const double is = kind == SUMS_BWD ? (double)invstd[c] : 0.0;
    double a = 0.0, b = 0.0;
    /* value j = t + k*DT_CUDA_THREADS is (n, i) = (j / HW, j % HW); both are
     * stepped on, so only the start divides */
    const size_t hw = (size_t)HW;
    if (hw > 0) {
        const size_t dn = DT_CUDA_THREADS / hw, di = DT_CUDA_THREADS % hw;
        for (size_t n = threadIdx.x / hw, i = threadIdx.x % hw; n < (size_t)N;) {
            const size_t e = (n * C + c) * hw + i;
            const double v = x[e];
            if (kind == SUMS_STATS) {
                a += v;
                b += v * v;
            } else {
                const double g = !y || y[e] > 0.0f ? dy[e] : 0.0f;
                a += g;
                b += g * (v - m) * is;
            }
            n += dn;
            i += di;
            if (i >= hw) {
                i -= hw;
                n++;
            }
        }
    }
    sa[threadIdx.x] = a;
    sb[threadIdx.x] = b;
    block_sum2(sa, sb);
    if (threadIdx.x == 0) {
        out[c] = sa[0];
        out[C + c] = sb[0];
    }
}

/* Per channel: mean and 1/std from the sums; the running averages when
 * running_mean is not NULL (unbiased variance there). */
static __global__ void bn_params(float *mean_out, float *invstd_out, float *running_mean,
                                 float *running_var, const double *stats, double count, float eps,
                                 float momentum, int C)
{
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        const double mean = stats[c] / count;
        double var = stats[C + c] / count - mean * mean;
        if (var < 0.0)
            var = 0.0;
        mean_out[c] = (float)mean;
        invstd_out[c] = (float)(1.0 / sqrt(var + (double)eps));
        if (running_mean) {
            const double unbiased = count > 1.0 ? var * count / (count - 1.0) : var;
            running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * (float)mean;
            running_var[c] = (1.0f - momentum) * running_var[c] + momentum * (float)unbiased;
        }
    }
}

/* The fused ReLU, as the relu op selects */
static __device__ float bn_relu(float v, int relu) { return relu && v < 0.0f ? 0.0f : v; }

/* y = (x - mean[c]) * invstd[c] * gamma[c] + beta[c], max(., 0) when relu;
 * planes = N*C */
static __global__ void bn_apply(float *y, const float *x, const float *mean, const float *invstd,
                                const float *gamma, const float *beta, int relu, size_t planes,
                                size_t C, size_t HW)
{
    for (DT_CUDA_PLANES(p, c, planes, C)) {
        const float m = mean[c], is = invstd[c], g = gamma[c], b = beta[c];
        const float *xp = x + p * HW;
        float *yp = y + p * HW;
        for (DT_CUDA_PLANE_ELEMS(i, HW))
            yp[i] = bn_relu((xp[i] - m) * is * g + b, relu);
    }
}

/* y = (x - running_mean[c]) / sqrt(running_var[c] + eps) * gamma[c] + beta[c] */
static __global__ void bn_infer(float *y, const float *x, const float *rmean, const float *rvar,
                                const float *gamma, const float *beta, float eps, int relu,
                                size_t planes, size_t C, size_t HW)
{
    for (DT_CUDA_PLANES(p, c, planes, C)) {
        const float m = rmean[c], sd = sqrtf(rvar[c] + eps), g = gamma[c], b = beta[c];
        const float *xp = x + p * HW;
        float *yp = y + p * HW;
        for (DT_CUDA_PLANE_ELEMS(i, HW))
            yp[i] = bn_relu((xp[i] - m) / sd * g + b, relu);
    }
}

/* dgamma[c] += local[C+c]; dbeta[c] += local[c] (either may be NULL) */
static __global__ void bn_dparams(float *dgamma, float *dbeta, const double *local, int C)
{
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        if (dgamma)
            dgamma[c] += (float)local[C + c];
        if (dbeta)
            dbeta[c] += (float)local[c];
    }
}

/* dx = gamma*invstd*(dy - global[c]/count - xhat*global[C+c]/count), dy
 * taken as 0 where the fused ReLU's output y (when not NULL) is not > 0 */
static __global__ void bn_dx(float *dx, const float *dy, const float *x, const float *y,
                             const float *mean, const float *invstd, const float *gamma,
                             const double *global, double count, size_t planes, size_t C,
                             size_t HW)
{
    for (DT_CUDA_PLANES(p, c, planes, C)) {
        const float mdy = (float)(global[c] / count);
        const float mdyx = (float)(global[C + c] / count);
        const float m = mean[c], is = invstd[c], g = gamma[c];
        const size_t off = p * HW;
        for (DT_CUDA_PLANE_ELEMS(i, HW)) {
            const float xhat = (x[off + i] - m) * is;
            const float d = !y || y[off + i] > 0.0f ? dy[off + i] : 0.0f;
            dx[off + i] = g * is * (d - mdy - xhat * mdyx);
        }
    }
}

/* Block r normalises row r of x(rows, D): two passes (mean, then the
 * biased variance around it), both in double. */
static __global__ void ln_fwd(float *y, float *mean_out, float *rstd_out, const float *x,
                              const float *gamma, const float *beta, float eps, int D)
{
    __shared__ double sa[DT_CUDA_THREADS], sb[DT_CUDA_THREADS];
    const float *xr = x + (size_t)blockIdx.x * D;
    float *yr = y + (size_t)blockIdx.x * D;
    double s = 0.0;
    for (int d = threadIdx.x; d < D; d += DT_CUDA_THREADS)
        s += xr[d];
    sa[threadIdx.x] = s;
    sb[threadIdx.x] = 0.0;
    block_sum2(sa, sb);
    const double mean = sa[0] / D;
    __syncthreads(); /* every thread has read sa[0] before it is reused */
    double q = 0.0;
    for (int d = threadIdx.x; d < D; d += DT_CUDA_THREADS) {
        const double t = xr[d] - mean;
        q += t * t;
    }
    sa[threadIdx.x] = q;
    sb[threadIdx.x] = 0.0;
    block_sum2(sa, sb);
    const double rstd = 1.0 / sqrt(sa[0] / D + (double)eps);
    const float mf = (float)mean, rf = (float)rstd;
    if (threadIdx.x == 0) {
        mean_out[blockIdx.x] = mf;
        rstd_out[blockIdx.x] = rf;
    }
    for (int d = threadIdx.x; d < D; d += DT_CUDA_THREADS)
        yr[d] = (xr[d] - mf) * rf * gamma[d] + beta[d];
}

/* Block r: dx of row r. With g = dy*gamma and xhat = (x - mean)*rstd,
 * dx = rstd * (g - mean(g) - xhat * mean(g*xhat)). */
static __global__ void ln_dx(float *dx, const float *dy, const float *x, const float *mean,
                             const float *rstd, const float *gamma, int D)
{
    __shared__ double sa[DT_CUDA_THREADS], sb[DT_CUDA_THREADS];
    const size_t off = (size_t)blockIdx.x * D;
    const float m = mean[blockIdx.x], r = rstd[blockIdx.x];
    double a = 0.0, b = 0.0;
    for (int d = threadIdx.x; d < D; d += DT_CUDA_THREADS) {
        const double g = (double)dy[off + d] * gamma[d];
        a += g;
        b += g * (double)((x[off + d] - m) * r);
    }
    sa[threadIdx.x] = a;
    sb[threadIdx.x] = b;
    block_sum2(sa, sb);
    const float mg = (float)(sa[0] / D), mgx = (float)(sb[0] / D);
    for (int d = threadIdx.x; d < D; d += DT_CUDA_THREADS) {
        const float xhat = (x[off + d] - m) * r;
        dx[off + d] = r * (dy[off + d] * gamma[d] - mg - xhat * mgx);
    }
}

/* Block r normalises row r of x(rows, D) by its root mean square:
 * rstd = 1/sqrt(mean of x^2 + eps) (the sum in double), y = x*rstd*gamma. */
static __global__ void rms_fwd(float *y, float *rstd_out, const float *x, const float *gamma,
                               float eps, int D)
{
    __shared__ double sa[DT_CUDA_THREADS], sb[DT_CUDA_THREADS];
    const float *xr = x + (size_t)blockIdx.x * D;
    float *yr = y + (size_t)blockIdx.x * D;
    double q = 0.0;
    for (int d = threadIdx.x; d < D; d += DT_CUDA_THREADS)
        q += (double)xr[d] * xr[d];
    sa[threadIdx.x] = q;
    sb[threadIdx.x] = 0.0;
    block_sum2(sa, sb);
    const float rf = (float)(1.0 / sqrt(sa[0] / D + (double)eps));
    if (threadIdx.x == 0)
        rstd_out[blockIdx.x] = rf;
    for (int d = threadIdx.x; d < D; d += DT_CUDA_THREADS)
        yr[d] = xr[d] * rf * gamma[d];
}

/* Block r: dx of row r. With g = dy*gamma and xhat = x*rstd,
 * dx = rstd * (g - xhat * mean(g*xhat)). */
static __global__ void rms_dx(float *dx, const float *dy, const float *x, const float *rstd,
                              const float *gamma, int D)
{
    __shared__ double sa[DT_CUDA_THREADS], sb[DT_CUDA_THREADS];
    const size_t off = (size_t)blockIdx.x * D;
    const float r = rstd[blockIdx.x];
    double b = 0.0;
    for (int d = threadIdx.x; d < D; d += DT_CUDA_THREADS)
        b += (double)dy[off + d] * gamma[d] * (double)(x[off + d] * r);
    sa[threadIdx.x] = b;
    sb[threadIdx.x] = 0.0;
    block_sum2(sa, sb);
    const float mgx = (float)(sa[0] / D);
    for (int d = threadIdx.x; d < D; d += DT_CUDA_THREADS)
        dx[off + d] = r * (dy[off + d] * gamma[d] - x[off + d] * r * mgx);
}

#define BN_FMT "N=%d C=%d HW=%d"
#define REQUIRE_NCHW(op, N, C, HW)                                                                 \
    DT_CUDA_REQUIRE((N) >= 0 && (C) >= 0 && (HW) >= 0, op, "negative size (" BN_FMT ")", N, C, HW)

/* stats[c] = sum of x(N,c,HW), stats[C+c] = sum of x^2 (written) */
dt_status dt_cuda_batchnorm_stats(dt_backend_t *be, double *stats, const float *x, int N, int C,
                                  int HW)
{
    REQUIRE_NCHW("batchnorm_stats", N, C, HW);
    if (C == 0)
        return DT_OK;
    DT_CUDA_REQUIRE(stats && (x || (size_t)N * HW == 0), "batchnorm_stats",
                    "pointers must not be NULL");
    struct cuda_backend *cb = dt_cuda_of(be);
    DT_CUDA_LAUNCH(channel_sums, (unsigned)C, DT_CUDA_THREADS, 0, cb->stream, stats, SUMS_STATS, x, nullptr, nullptr, nullptr, nullptr, N, C, HW);
    return DT_CUDA_LAUNCHED(cb, "batchnorm_stats", BN_FMT, N, C, HW);
}

dt_status dt_cuda_batchnorm_fwd(dt_backend_t *be, float *y, float *mean_out, float *invstd_out,
                                float *running_mean, float *running_var, const float *x,
                                const double *stats, double count, const float *gamma,
                                const float *beta, float eps, float momentum, int N, int C, int HW,
                                int relu)
{
    REQUIRE_NCHW("batchnorm_fwd", N, C, HW);
    if (C == 0)
        return DT_OK;
    DT_CUDA_REQUIRE(count > 0.0, "batchnorm_fwd", "count must be > 0 (got %g)", count);
    DT_CUDA_REQUIRE(eps >= 0.0f, "batchnorm_fwd", "eps must be >= 0 (got %g)", (double)eps);
    DT_CUDA_REQUIRE(!running_mean == !running_var, "batchnorm_fwd",
                    "running_mean and running_var must both be given or both be NULL");
    const size_t n = (size_t)N * C * HW;
    DT_CUDA_REQUIRE(mean_out && invstd_out && stats && gamma && beta && (n == 0 || (x && y)),
                    "batchnorm_fwd", "pointers must not be NULL");
    struct cuda_backend *cb = dt_cuda_of(be);
    DT_CUDA_LAUNCH(bn_params, dt_cuda_blocks((size_t)C), DT_CUDA_THREADS, 0, cb->stream, mean_out, invstd_out, running_mean, running_var, stats, count, eps, momentum, C);
    dt_status st = DT_CUDA_LAUNCHED(cb, "batchnorm_fwd", BN_FMT ", statistics", N, C, HW);
    if (st != DT_OK || n == 0)
        return st;
    const size_t planes = (size_t)N * C;
    const struct dt_cuda_planes ps = dt_cuda_plane_shape(planes, (size_t)HW);
    DT_CUDA_LAUNCH(bn_apply, ps.grid, ps.block, 0, cb->stream, y, x, mean_out, invstd_out, gamma,
                   beta, relu, planes, (size_t)C, (size_t)HW);
    return DT_CUDA_LAUNCHED(cb, "batchnorm_fwd", BN_FMT, N, C, HW);
}

dt_status dt_cuda_batchnorm_infer(dt_backend_t *be, float *y, const float *x,
                                  const float *running_mean, const float *running_var,
                                  const float *gamma, const float *beta, float eps, int N, int C,
                                  int HW, int relu)
{
    REQUIRE_NCHW("batchnorm_infer", N, C, HW);
    const size_t n = (size_t)N * C * HW;
    if (n == 0)
        return DT_OK;
    DT_CUDA_REQUIRE(y && x && running_mean && running_var && gamma && beta, "batchnorm_infer",
                    "pointers must not be NULL");
    struct cuda_backend *cb = dt_cuda_of(be);
    const size_t planes = (size_t)N * C;
    const struct dt_cuda_planes ps = dt_cuda_plane_shape(planes, (size_t)HW);
    DT_CUDA_LAUNCH(bn_infer, ps.grid, ps.block, 0, cb->stream, y, x, running_mean, running_var,
                   gamma, beta, eps, relu, planes, (size_t)C, (size_t)HW);
    return DT_CUDA_LAUNCHED(cb, "batchnorm_infer", BN_FMT, N, C, HW);
}

/* dstats[c] = sum of dy, dstats[C+c] = sum of dy*xhat (written) */
dt_status dt_cuda_batchnorm_bwd_reduce(dt_backend_t *be, double *dstats, const float *dy,
                                       const float *x, const float *mean, const float *invstd,
                                       const float *y, int N, int C, int HW)
{
    REQUIRE_NCHW("batchnorm_bwd_reduce", N, C, HW);
    if (C == 0)
        return DT_OK;
    DT_CUDA_REQUIRE(dstats && mean && invstd && ((x && dy) || (size_t)N * HW == 0),
                    "batchnorm_bwd_reduce", "pointers must not be NULL");
    struct cuda_backend *cb = dt_cuda_of(be);
    DT_CUDA_LAUNCH(channel_sums, (unsigned)C, DT_CUDA_THREADS, 0, cb->stream, dstats, SUMS_BWD, x, dy, y, mean, invstd, N, C, HW);
    return DT_CUDA_LAUNCHED(cb, "batchnorm_bwd_reduce", BN_FMT, N, C, HW);
}

dt_status dt_cuda_batchnorm_bwd(dt_backend_t *be, float *dx, float *dgamma, float *dbeta,
                                const float *dy, const float *x, const float *mean,
                                const float *invstd, const float *gamma, const double *local,
                                const double *global, double count, const float *y, int N, int C,
                                int HW)
{
    REQUIRE_NCHW("batchnorm_bwd", N, C, HW);
    if (C == 0)
        return DT_OK;
    DT_CUDA_REQUIRE(count > 0.0, "batchnorm_bwd", "count must be > 0 (got %g)", count);
    const size_t n = (size_t)N * C * HW;
    DT_CUDA_REQUIRE(local && global && mean && invstd && gamma && (n == 0 || (dx && dy && x)),
                    "batchnorm_bwd", "pointers must not be NULL");
    struct cuda_backend *cb = dt_cuda_of(be);
    if (dgamma || dbeta) {
        DT_CUDA_LAUNCH(bn_dparams, dt_cuda_blocks((size_t)C), DT_CUDA_THREADS, 0, cb->stream, dgamma, dbeta, local, C);
        dt_status st = DT_CUDA_LAUNCHED(cb, "batchnorm_bwd", BN_FMT ", dgamma and dbeta", N, C, HW);
        if (st != DT_OK)
            return st;
    }
    if (n == 0)
        return DT_OK;
    const size_t planes = (size_t)N * C;
    const struct dt_cuda_planes ps = dt_cuda_plane_shape(planes, (size_t)HW);
    DT_CUDA_LAUNCH(bn_dx, ps.grid, ps.block, 0, cb->stream, dx, dy, x, y, mean, invstd, gamma,
                   global, count, planes, (size_t)C, (size_t)HW);
    return DT_CUDA_LAUNCHED(cb, "batchnorm_bwd", BN_FMT, N, C, HW);
}

dt_status dt_cuda_layernorm_fwd(dt_backend_t *be, float *y, float *mean_out, float *rstd_out,
                                const float *x, const float *gamma, const float *beta, float eps,
                                int rows, int D)
{
    DT_CUDA_REQUIRE(rows >= 0 && D >= 0, "layernorm_fwd", "negative size (rows=%d D=%d)", rows, D);
    DT_CUDA_REQUIRE(eps >= 0.0f, "layernorm_fwd", "eps must be >= 0 (got %g)", (double)eps);
    if (rows == 0)
        return DT_OK;
    DT_CUDA_REQUIRE(D > 0, "layernorm_fwd", "rows of D=0 values have no mean (rows=%d)", rows);
    DT_CUDA_REQUIRE(y && mean_out && rstd_out && x && gamma && beta, "layernorm_fwd",
                    "pointers must not be NULL");
    struct cuda_backend *cb = dt_cuda_of(be);
    DT_CUDA_LAUNCH(ln_fwd, (unsigned)rows, DT_CUDA_THREADS, 0, cb->stream, y, mean_out, rstd_out, x, gamma, beta, eps, D);
    return DT_CUDA_LAUNCHED(cb, "layernorm_fwd", "rows=%d D=%d", rows, D);
}

dt_status dt_cuda_layernorm_bwd(dt_backend_t *be, float *dx, float *dgamma, float *dbeta,
                                const float *dy, const float *x, const float *mean,
                                const float *rstd, const float *gamma, int rows, int D)
{
    DT_CUDA_REQUIRE(rows >= 0 && D >= 0, "layernorm_bwd", "negative size (rows=%d D=%d)", rows, D);
    if (rows == 0 || D == 0)
        return DT_OK;
    DT_CUDA_REQUIRE(dx && dy && x && mean && rstd && gamma, "layernorm_bwd",
                    "pointers must not be NULL");
    struct cuda_backend *cb = dt_cuda_of(be);
    if (dgamma || dbeta) {
        const struct dt_cuda_colsum sum = {
            "layernorm_bwd", DT_CUDA_COLSUM_LAYERNORM, dgamma, dbeta, dy, x, mean, rstd, rows, D};
        dt_status st = dt_cuda_colsum(cb, &sum);
        if (st != DT_OK)
            return st;
    }
    DT_CUDA_LAUNCH(ln_dx, (unsigned)rows, DT_CUDA_THREADS, 0, cb->stream, dx, dy, x, mean, rstd, gamma, D);
    return DT_CUDA_LAUNCHED(cb, "layernorm_bwd", "rows=%d D=%d", rows, D);
}

dt_status dt_cuda_rmsnorm_fwd(dt_backend_t *be, float *y, float *rstd_out, const float *x,
                              const float *gamma, float eps, int rows, int D)
{
    DT_CUDA_REQUIRE(rows >= 0 && D >= 0, "rmsnorm_fwd", "negative size (rows=%d D=%d)", rows, D);
    DT_CUDA_REQUIRE(eps >= 0.0f, "rmsnorm_fwd", "eps must be >= 0 (got %g)", (double)eps);
    if (rows == 0)
        return DT_OK;
    DT_CUDA_REQUIRE(D > 0, "rmsnorm_fwd", "rows of D=0 values have no mean (rows=%d)", rows);
    DT_CUDA_REQUIRE(y && rstd_out && x && gamma, "rmsnorm_fwd", "pointers must not be NULL");
    struct cuda_backend *cb = dt_cuda_of(be);
    DT_CUDA_LAUNCH(rms_fwd, (unsigned)rows, DT_CUDA_THREADS, 0, cb->stream, y, rstd_out, x, gamma, eps, D);
    return DT_CUDA_LAUNCHED(cb, "rmsnorm_fwd", "rows=%d D=%d", rows, D);
}

dt_status dt_cuda_rmsnorm_bwd(dt_backend_t *be, float *dx, float *dgamma, const float *dy,
                              const float *x, const float *rstd, const float *gamma, int rows,
                              int D)
{
    DT_CUDA_REQUIRE(rows >= 0 && D >= 0, "rmsnorm_bwd", "negative size (rows=%d D=%d)", rows, D);
    if (rows == 0 || D == 0)
        return DT_OK;
    DT_CUDA_REQUIRE(dx && dgamma && dy && x && rstd && gamma, "rmsnorm_bwd",
                    "pointers must not be NULL");
    struct cuda_backend *cb = dt_cuda_of(be);
    const struct dt_cuda_colsum sum = {
        "rmsnorm_bwd", DT_CUDA_COLSUM_RMSNORM, dgamma, NULL, dy, x, NULL, rstd, rows, D};
    dt_status st = dt_cuda_colsum(cb, &sum);
    if (st != DT_OK)
        return st;
    DT_CUDA_LAUNCH(rms_dx, (unsigned)rows, DT_CUDA_THREADS, 0, cb->stream, dx, dy, x, rstd, gamma, D);
    return DT_CUDA_LAUNCHED(cb, "rmsnorm_bwd", "rows=%d D=%d", rows, D);
}
