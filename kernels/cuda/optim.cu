/*
 * optim.cu - fused optimizer updates on the GPU: SGD with momentum and
 * AdamW, each exactly as torch.optim writes them (see the arg structs in
 * kernels/ops.h), one grid-stride kernel per update, one pass over memory.
 *
 * The kernels follow the CPU code (kernels/cpu/optim.c) operation by
 * operation, in fp32, and spell each product and sum with the _rn
 * intrinsics so nvcc cannot fuse them into FMAs (the CPU file is built
 * without contraction); square root and division are IEEE-rounded too. So
 * the GPU gives the CPU's bits. As on the CPU, AdamW's bias corrections are
 * computed once per call on the host, in double, and passed in.
 *
 * A gated update (args' gated) reads the step gate's record on the device
 * (reduce.cu) and changes nothing when it says skip.
 *
 * These ops read the parameter gradients (which ACCUMULATE (+=) elsewhere)
 * and write parameters and state in place; they produce no gradients.
 * With args' clear they also zero each gradient once read (and every one
 * when the gate skips), as the CPU's do.
 */
#include <math.h>

#include <cuda_runtime.h>

#include "cuda_impl.h"

/* Per-call AdamW constants, from the bias corrections in double (as the
 * CPU's adamw_consts). */
struct adamw_consts {
    float decay;    /* 1 - lr*wd */
    float step;     /* lr / (1 - beta1^t) */
    float bc2_sqrt; /* sqrt(1 - beta2^t) */
    float one_m_b1; /* 1 - beta1 */
    float one_m_b2; /* 1 - beta2 */
    float beta1, beta2, eps;
};

/* A skipped gated update: the gradients are still zeroed when the args
 * ask for it (clear: NULL, or g itself). */
static __device__ void clear_all(float *clear, size_t n)
{
    if (!clear) return;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        clear[i] = 0.0f;
}

/* g' = g + wd*p;  buf = first ? g' : momentum*buf + g';
 * d = nesterov ? g' + momentum*buf : buf  (d = g' without momentum);
 * p -= lr * d */
static __global__ void sgd_kernel(float *p, const float *g, float *buf, size_t n,
                                  struct dt_sgd_args a, const struct dt_cuda_gate *gate)
{
    if (gate && gate->skip) {
        clear_all(a.clear, n);
        return;
    }
    const float mu = a.momentum;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float pi = p[i];
        const float gi = __fadd_rn(g[i], __fmul_rn(a.weight_decay, pi));
        if (a.clear) a.clear[i] = 0.0f;
        float d = gi;
        if (mu != 0.0f) {
            const float bi = a.first_step ? gi : __fadd_rn(__fmul_rn(mu, buf[i]), gi);
            buf[i] = bi;
            d = a.nesterov ? __fadd_rn(gi, __fmul_rn(mu, bi)) : bi;
        }
        p[i] = __fsub_rn(pi, __fmul_rn(a.lr, d));
    }
}

/* p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
 * p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps) */
static __global__ void adamw_kernel(float *p, const float *g, float *clear, float *m, float *v,
                                    size_t n, struct adamw_consts k,
                                    const struct dt_cuda_gate *gate)
{
    if (gate && gate->skip) {
        clear_all(clear, n);
        return;
    }
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float gi = g[i];
        if (clear) clear[i] = 0.0f;
        float pi = __fmul_rn(p[i], k.decay);
        const float mi = __fadd_rn(__fmul_rn(k.beta1, m[i]), __fmul_rn(k.one_m_b1, gi));
        const float vi =
            __fadd_rn(__fmul_rn(k.beta2, v[i]), __fmul_rn(__fmul_rn(k.one_m_b2, gi), gi));
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bc2_sqrt), k.eps);
        pi = __fsub_rn(pi, __fdiv_rn(__fmul_rn(k.step, mi), denom));
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
    }
}

/* The step gate a gated update reads (reduce.cu), or none. */
static const struct dt_cuda_gate *gate_of(struct cuda_backend *cb, int gated)
{
    return gated ? dt_cuda_gate_of(cb->dscalars) : NULL;
}

static dt_status check_sgd(const float *p, const float *g, const float *buf,
                           const struct dt_sgd_args *a)
{
    DT_CUDA_REQUIRE(p && g && a, "sgd_update", "p, g and args must not be NULL");
    DT_CUDA_REQUIRE(a->lr >= 0.0f && a->momentum >= 0.0f && a->weight_decay >= 0.0f,
                    "sgd_update",
                    "lr, momentum and weight_decay must be >= 0 (lr=%g, momentum=%g, wd=%g)",
                    (double)a->lr, (double)a->momentum, (double)a->weight_decay);
    DT_CUDA_REQUIRE(a->momentum == 0.0f || buf, "sgd_update",
                    "the momentum buffer must not be NULL when momentum is %g",
                    (double)a->momentum);
    DT_CUDA_REQUIRE(!a->nesterov || a->momentum > 0.0f, "sgd_update",
                    "Nesterov momentum needs momentum > 0");
    DT_CUDA_REQUIRE(!a->clear || a->clear == g, "sgd_update",
                    "clear must be NULL or the gradients g themselves");
    return DT_OK;
}

static dt_status check_adamw(const float *p, const float *g, const float *m, const float *v,
                             const struct dt_adamw_args *a)
{
    DT_CUDA_REQUIRE(p && g && m && v && a, "adamw_update",
                    "p, g, m, v and args must not be NULL");
    DT_CUDA_REQUIRE(a->t >= 1, "adamw_update", "the step count t is 1-based (got %lld)",
                    (long long)a->t);
    DT_CUDA_REQUIRE(a->lr >= 0.0f && a->eps >= 0.0f && a->weight_decay >= 0.0f, "adamw_update",
                    "lr, eps and weight_decay must be >= 0 (lr=%g, eps=%g, wd=%g)", (double)a->lr,
                    (double)a->eps, (double)a->weight_decay);
    DT_CUDA_REQUIRE(a->beta1 >= 0.0f && a->beta1 < 1.0f && a->beta2 >= 0.0f && a->beta2 < 1.0f,
                    "adamw_update", "betas must be in [0, 1) (beta1=%g, beta2=%g)",
                    (double)a->beta1, (double)a->beta2);
    DT_CUDA_REQUIRE(!a->clear || a->clear == g, "adamw_update",
                    "clear must be NULL or the gradients g themselves");
    return DT_OK;
}

static struct adamw_consts adamw_constants(const struct dt_adamw_args *a)
{
    const double bc1 = 1.0 - pow((double)a->beta1, (double)a->t);
    const double bc2 = 1.0 - pow((double)a->beta2, (double)a->t);
    struct adamw_consts k;
    k.decay = (float)(1.0 - (double)a->lr * a->weight_decay);
    k.step = (float)(a->lr / bc1);
    k.bc2_sqrt = (float)sqrt(bc2);
    k.one_m_b1 = 1.0f - a->beta1;
    k.one_m_b2 = 1.0f - a->beta2;
    k.beta1 = a->beta1;
    k.beta2 = a->beta2;
    k.eps = a->eps;
    return k;
}

dt_status dt_cuda_sgd_update(dt_backend_t *be, float *p, const float *g, float *buf, size_t n,
                             const struct dt_sgd_args *a)
{
    dt_status st = check_sgd(p, g, buf, a);
    if (st != DT_OK || n == 0)
        return st;
    struct cuda_backend *cb = dt_cuda_of(be);
    dt_cuda_params_written(cb, p, n * sizeof *p);
    DT_CUDA_LAUNCH(sgd_kernel, dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream, p, g, buf, n, *a, gate_of(cb, a->gated));
    return DT_CUDA_LAUNCHED(cb, "sgd_update", "n=%zu", n);
}

dt_status dt_cuda_adamw_update(dt_backend_t *be, float *p, const float *g, float *m, float *v,
                               size_t n, const struct dt_adamw_args *a)
{
    dt_status st = check_adamw(p, g, m, v, a);
    if (st != DT_OK || n == 0)
        return st;
    struct cuda_backend *cb = dt_cuda_of(be);
    dt_cuda_params_written(cb, p, n * sizeof *p);
    DT_CUDA_LAUNCH(adamw_kernel, dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream, p, g, a->clear, m, v, n, adamw_constants(a), gate_of(cb, a->gated));
    return DT_CUDA_LAUNCHED(cb, "adamw_update", "n=%zu (t=%lld)", n, (long long)a->t);
}
