/*
 * optim.c - fused optimizer updates on the CPU: SGD with momentum and
 * AdamW, each exactly as torch.optim writes them (see the arg structs in
 * kernels/ops.h), in one pass over the parameters.
 *
 * One pass matters: the parameters, gradients and optimizer state of even
 * a small model do not fit in cache, so an update that makes one trip
 * through memory instead of torch's several is the main win here. The fast
 * versions work on fixed blocks of DT_CPU_LANES elements, computed into
 * local arrays and then stored, so GCC vectorises them at -O2. AdamW's
 * bias corrections are computed once per call, in double.
 *
 * A gated update (args' gated) changes nothing when the backend's step
 * gate says skip (step_gate, reduce.c).
 *
 * These ops read the parameter gradients (which ACCUMULATE (+=) elsewhere)
 * and write parameters and state in place; they produce no gradients.
 * With args' clear they also zero each gradient once read, in the same
 * pass, so the next step's backward needs no fill of its own first.
 */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"

static dt_status check_sgd(const float *p, const float *g, const float *buf,
                           const struct dt_sgd_args *a)
{
    DT_CPU_REQUIRE(p && g && a, "sgd_update", "p, g and args must not be NULL");
    DT_CPU_REQUIRE(a->lr >= 0.0f && a->momentum >= 0.0f && a->weight_decay >= 0.0f, "sgd_update",
                   "lr, momentum and weight_decay must be >= 0 (lr=%g, momentum=%g, wd=%g)",
                   (double)a->lr, (double)a->momentum, (double)a->weight_decay);
    DT_CPU_REQUIRE(a->momentum == 0.0f || buf, "sgd_update",
                   "the momentum buffer must not be NULL when momentum is %g", (double)a->momentum);
    DT_CPU_REQUIRE(!a->nesterov || a->momentum > 0.0f, "sgd_update",
                   "Nesterov momentum needs momentum > 0");
    DT_CPU_REQUIRE(!a->clear || a->clear == g, "sgd_update",
                   "clear must be NULL or the gradients g themselves");
    return DT_OK;
}

static dt_status check_adamw(const float *p, const float *g, const float *m, const float *v,
                             const struct dt_adamw_args *a)
{
    DT_CPU_REQUIRE(p && g && m && v && a, "adamw_update", "p, g, m, v and args must not be NULL");
    DT_CPU_REQUIRE(a->t >= 1, "adamw_update", "the step count t is 1-based (got %lld)",
                   (long long)a->t);
    DT_CPU_REQUIRE(a->lr >= 0.0f && a->eps >= 0.0f && a->weight_decay >= 0.0f, "adamw_update",
                   "lr, eps and weight_decay must be >= 0 (lr=%g, eps=%g, wd=%g)", (double)a->lr,
                   (double)a->eps, (double)a->weight_decay);
    DT_CPU_REQUIRE(a->beta1 >= 0.0f && a->beta1 < 1.0f && a->beta2 >= 0.0f && a->beta2 < 1.0f,
                   "adamw_update", "betas must be in [0, 1) (beta1=%g, beta2=%g)",
                   (double)a->beta1, (double)a->beta2);
    DT_CPU_REQUIRE(!a->clear || a->clear == g, "adamw_update",
                   "clear must be NULL or the gradients g themselves");
    return DT_OK;
}

/* Per-call AdamW constants, from the bias corrections in double. */
struct adamw_consts {
    float decay;     /* 1 - lr*wd */
    float step;      /* lr / (1 - beta1^t) */
    float bc2_sqrt;  /* sqrt(1 - beta2^t) */
    float one_m_b1;  /* 1 - beta1 */
    float one_m_b2;  /* 1 - beta2 */
};

static struct adamw_consts adamw_consts(const struct dt_adamw_args *a)
{
    double bc1 = 1.0 - pow((double)a->beta1, (double)a->t);
    double bc2 = 1.0 - pow((double)a->beta2, (double)a->t);
    struct adamw_consts k = {
        .decay = (float)(1.0 - (double)a->lr * a->weight_decay),
        .step = (float)(a->lr / bc1),
        .bc2_sqrt = (float)sqrt(bc2),
        .one_m_b1 = 1.0f - a->beta1,
        .one_m_b2 = 1.0f - a->beta2,
    };
    return k;
}

/* A gated update the gate skipped: nothing changes but the gradients,
 * which are still zeroed when the args ask for it (clear). */
static dt_status skipped(float *clear, size_t n)
{
    if (clear) memset(clear, 0, n * sizeof *clear); /* +0.0f */
    return DT_OK;
}

/* ---- reference ------------------------------------------------------- */

/* g' = g + wd*p;  buf = first ? g' : momentum*buf + g';
 * d = nesterov ? g' + momentum*buf : buf  (d = g' without momentum);
 * p -= lr * d */
dt_status dt_cpu_sgd_update_ref(dt_backend_t *be, float *p, const float *g, float *buf, size_t n,
                                const struct dt_sgd_args *a)
{
    dt_status st = check_sgd(p, g, buf, a);
    if (st != DT_OK)
        return st;
    if (a->gated && dt_cpu_gate_skips(be)) return skipped(a->clear, n);
    const float mu = a->momentum;
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] + a->weight_decay * p[i];
        if (a->clear) a->clear[i] = 0.0f;
        float d = gi;
        if (mu != 0.0f) {
            buf[i] = a->first_step ? gi : mu * buf[i] + gi;
            d = a->nesterov ? gi + mu * buf[i] : buf[i];
        }
        p[i] -= a->lr * d;
    }
    return DT_OK;
}

/* p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
 * p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps) */
dt_status dt_cpu_adamw_update_ref(dt_backend_t *be, float *p, const float *g, float *m, float *v,
                                  size_t n, const struct dt_adamw_args *a)
{
    dt_status st = check_adamw(p, g, m, v, a);
    if (st != DT_OK)
        return st;
    if (a->gated && dt_cpu_gate_skips(be)) return skipped(a->clear, n);
    const struct adamw_consts k = adamw_consts(a);
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        if (a->clear) a->clear[i] = 0.0f;
        p[i] *= k.decay;
        m[i] = a->beta1 * m[i] + k.one_m_b1 * gi;
        v[i] = a->beta2 * v[i] + k.one_m_b2 * gi * gi;
        float denom = sqrtf(v[i]) / k.bc2_sqrt + a->eps;
        p[i] -= k.step * m[i] / denom;
    }
    return DT_OK;
}

/* ---- fast ------------------------------------------------------------ */

/* Zeroes a block of gradients the block's update has read (args' clear:
 * NULL, or g itself). */
static inline void clear_block(float *clear, size_t i)
{
    if (clear)
        for (int k = 0; k < DT_CPU_LANES; k++)
            clear[i + k] = 0.0f;
}

/* No momentum: p -= lr * (g + wd*p) */
static size_t sgd_plain_blocks(float *p, const float *g, float *clear, size_t n, float lr,
                               float wd)
{
    size_t i = 0;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES) {
        float tp[DT_CPU_LANES];
        for (int k = 0; k < DT_CPU_LANES; k++) {
            float gi = g[i + k] + wd * p[i + k];
            tp[k] = p[i + k] - lr * gi;
        }
        for (int k = 0; k < DT_CPU_LANES; k++)
            p[i + k] = tp[k];
        clear_block(clear, i);
    }
    return i;
}

/* Momentum: the reference's formula for one (first, nesterov) pair, passed
 * as constants so each inlined copy has no selects: GCC does not vectorise
 * a select on a runtime flag (it will not speculate the float arithmetic
 * of the unused side), and on the first step buf, which may hold anything,
 * is then not read at all. */
static inline __attribute__((always_inline)) size_t
sgd_momentum_blocks(float *p, const float *g, float *clear, float *buf, size_t n, float lr,
                    float mu, float wd, const int first, const int nesterov)
{
    size_t i = 0;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES) {
        float tp[DT_CPU_LANES], tb[DT_CPU_LANES];
        for (int k = 0; k < DT_CPU_LANES; k++) {
            float gi = g[i + k] + wd * p[i + k];
            float bi = first ? gi : mu * buf[i + k] + gi;
            float d = nesterov ? gi + mu * bi : bi;
            tb[k] = bi;
            tp[k] = p[i + k] - lr * d;
        }
        for (int k = 0; k < DT_CPU_LANES; k++)
            buf[i + k] = tb[k];
        for (int k = 0; k < DT_CPU_LANES; k++)
            p[i + k] = tp[k];
        clear_block(clear, i);
    }
    return i;
}

static size_t sgd_blocks(float *p, const float *g, float *clear, float *buf, size_t n,
                         const struct dt_sgd_args *a)
{
    const float lr = a->lr, mu = a->momentum, wd = a->weight_decay;
    if (mu == 0.0f)
        return sgd_plain_blocks(p, g, clear, n, lr, wd);
    if (a->first_step)
        return a->nesterov ? sgd_momentum_blocks(p, g, clear, buf, n, lr, mu, wd, 1, 1)
                           : sgd_momentum_blocks(p, g, clear, buf, n, lr, mu, wd, 1, 0);
    return a->nesterov ? sgd_momentum_blocks(p, g, clear, buf, n, lr, mu, wd, 0, 1)
                       : sgd_momentum_blocks(p, g, clear, buf, n, lr, mu, wd, 0, 0);
}

/* The threads' share of an update: a range of the parameters (dt_cpu_for's
 * blocks, multiples of DT_CPU_LANES), the same bits as on one thread. */
struct optim_job {
    float *p, *m, *v;
    const float *g;
    const struct dt_sgd_args *sgd;
    const struct dt_adamw_args *adamw;
    const struct adamw_consts *c;
    dt_status st; /* the reference on the tails never fails after the checks */
};

static void sgd_range(void *arg, size_t lo, size_t hi)
{
    struct optim_job *j = arg;
    float *buf = j->m ? j->m + lo : NULL, *clear = j->sgd->clear ? j->sgd->clear + lo : NULL;
    size_t done = sgd_blocks(j->p + lo, j->g + lo, clear, buf, hi - lo, j->sgd);
    /* the tail (< DT_CPU_LANES elements) through the reference */
    if (done < hi - lo) {
        struct dt_sgd_args tail = *j->sgd;
        tail.clear = clear ? clear + done : NULL;
        j->st = dt_cpu_sgd_update_ref(NULL, j->p + lo + done, j->g + lo + done,
                                      buf ? buf + done : NULL, hi - lo - done, &tail);
    }
}

dt_status dt_cpu_sgd_update(dt_backend_t *be, float *p, const float *g, float *buf, size_t n,
                            const struct dt_sgd_args *a)
{
    dt_status st = check_sgd(p, g, buf, a);
    if (st != DT_OK)
        return st;
    if (a->gated && dt_cpu_gate_skips(be)) return skipped(a->clear, n);
    struct optim_job j = {.p = p, .g = g, .m = buf, .sgd = a};
    dt_cpu_for(be, n, DT_CPU_GRAIN, sgd_range, &j);
    return j.st;
}

/* Whole blocks of an AdamW update, in the reference's operation order.
 * Built for AVX-512, AVX2 and the baseline and picked at load time; this
 * file is compiled without errno from sqrtf (v >= 0, so it never sets it)
 * and without FMA contraction, so the square roots vectorise and every
 * clone gives the reference's bits. Returns the elements done. */
DT_CPU_CLONES static size_t
adamw_blocks(float *restrict p, const float *g, float *clear, float *restrict m,
             float *restrict v, size_t n, const struct adamw_consts *c, float b1, float b2,
             float eps)
{
    const float decay = c->decay, omb1 = c->one_m_b1, omb2 = c->one_m_b2;
    const float bc2 = c->bc2_sqrt, step = c->step;
    size_t i = 0;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES) {
        float tp[DT_CPU_LANES], tm[DT_CPU_LANES], tv[DT_CPU_LANES];
        for (int k = 0; k < DT_CPU_LANES; k++) {
            float gi = g[i + k];
            tp[k] = p[i + k] * decay;
            tm[k] = b1 * m[i + k] + omb1 * gi;
            tv[k] = b2 * v[i + k] + omb2 * gi * gi;
            float denom = sqrtf(tv[k]) / bc2 + eps;
            tp[k] -= step * tm[k] / denom;
        }
        for (int k = 0; k < DT_CPU_LANES; k++) {
            p[i + k] = tp[k];
            m[i + k] = tm[k];
            v[i + k] = tv[k];
        }
        clear_block(clear, i);
    }
    return i;
}

static void adamw_range(void *arg, size_t lo, size_t hi)
{
    struct optim_job *j = arg;
    const struct dt_adamw_args *a = j->adamw;
    size_t i = lo + adamw_blocks(j->p + lo, j->g + lo, a->clear ? a->clear + lo : NULL, j->m + lo,
                                 j->v + lo, hi - lo, j->c, a->beta1, a->beta2, a->eps);
    if (i < hi) {
        struct dt_adamw_args tail = *a;
        tail.clear = a->clear ? a->clear + i : NULL;
        j->st = dt_cpu_adamw_update_ref(NULL, j->p + i, j->g + i, j->m + i, j->v + i, hi - i,
                                        &tail);
    }
}

dt_status dt_cpu_adamw_update(dt_backend_t *be, float *p, const float *g, float *m, float *v,
                              size_t n, const struct dt_adamw_args *a)
{
    dt_status st = check_adamw(p, g, m, v, a);
    if (st != DT_OK)
        return st;
    if (a->gated && dt_cpu_gate_skips(be)) return skipped(a->clear, n);
    const struct adamw_consts c = adamw_consts(a);
    struct optim_job j = {.p = p, .g = g, .m = m, .v = v, .adamw = a, .c = &c};
    dt_cpu_for(be, n, DT_CPU_GRAIN, adamw_range, &j);
    return j.st;
}
