/*
 * optim.c - optimizer state, the update step and LR schedules.
 * The arithmetic of each update is a fused op of the backend
 * (kernels/cpu/optim.c on the CPU), so this file only keeps state and
 * computes the per-step scalars. Sharded (comm.shard), a rank keeps the
 * state of its own ranges of the parameters only, packed one range after
 * another, and updates those ranges only.
 */
#include "optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

enum optim_kind { OPT_SGD, OPT_ADAMW };

struct dt_optim {
    dt_backend_t *be;
    const struct dt_ops *ops;
    enum optim_kind kind;
    size_t n;
    float *m, *v; /* sgd: m = momentum buffer; nstate elements each */
    /* Sharded state: the state holds the elements of the ranges [lo[k],
     * hi[k]) only, packed in order from base[k]; nshard 0: all n. */
    size_t nstate, nshard;
    size_t *lo, *hi, *base;
    int64_t t;
    double momentum, weight_decay, beta1, beta2, eps;
    int nesterov;
    int gated; /* the update being queued follows the backend's step gate */
    float *clear; /* the gradients the update being queued zeroes (the args' clear), or NULL */
    int packed; /* 1: the gradients being read are packed as the state is; 2: the
                   parameters too */
    /* Runs of elements with one weight decay, in offset order (merged
     * where neighbours agree); none: one run over everything. */
    struct dt_optim_range *runs;
    int nruns;
};

/* The shard's ranges, checked and copied, and the state's size. */
static dt_status set_shard(dt_optim_t *o, const size_t *lo, const size_t *hi, size_t count)
{
    dt_status st;
    o->nstate = o->n;
    if (!count)
        return DT_OK;
    DT_CHECK(dt_calloc(count, sizeof *o->lo, "the optimizer's shard", (void **)&o->lo));
    DT_CHECK(dt_calloc(count, sizeof *o->hi, "the optimizer's shard", (void **)&o->hi));
    DT_CHECK(dt_calloc(count, sizeof *o->base, "the optimizer's shard", (void **)&o->base));
    o->nstate = 0;
    for (size_t k = 0; k < count; k++) {
        if (lo[k] > hi[k] || hi[k] > o->n || (k > 0 && lo[k] < hi[k - 1])) {
            st = dt_set_error(DT_ERR_INVALID_ARG,
                              "optimizer shard: range %zu [%zu, %zu) of %zu elements is not "
                              "after the one before it",
                              k, lo[k], hi[k], o->n);
            goto out;
        }
        o->lo[k] = lo[k];
        o->hi[k] = hi[k];
        o->base[k] = o->nstate;
        o->nstate += hi[k] - lo[k];
    }
    o->nshard = count;
out:
    return st;
}

dt_status dt_optim_create(const struct dt_job *job, dt_backend_t *be, size_t n, dt_optim_t **out)
{
    return dt_optim_create_sharded(job, be, n, NULL, NULL, 0, out);
}

dt_status dt_optim_create_sharded(const struct dt_job *job, dt_backend_t *be, size_t n,
                                  const size_t *lo, const size_t *hi, size_t count,
                                  dt_optim_t **out)
{
    dt_status st;
    dt_optim_t *o = NULL;
    *out = NULL;
    DT_CHECK(dt_calloc(1, sizeof *o, "the optimizer", (void **)&o));
    o->be = be;
    o->ops = dt_backend_ops(be);
    o->n = n;
    DT_CHECK(set_shard(o, lo, hi, count));
    o->momentum = job->train.optimizer.momentum;
    o->nesterov = job->train.optimizer.nesterov;
    o->weight_decay = job->train.optimizer.weight_decay;
    o->beta1 = job->train.optimizer.beta1;
    o->beta2 = job->train.optimizer.beta2;
    o->eps = job->train.optimizer.eps;
    if (strcmp(job->train.optimizer.name, "sgd") == 0) {
        o->kind = OPT_SGD;
        if (o->momentum > 0)
            DT_CHECK(dt_backend_alloc(be, o->nstate * sizeof(float), (void **)&o->m));
    } else if (strcmp(job->train.optimizer.name, "adamw") == 0) {
        o->kind = OPT_ADAMW;
        DT_CHECK(dt_backend_alloc(be, o->nstate * sizeof(float), (void **)&o->m));
        DT_CHECK(dt_backend_alloc(be, o->nstate * sizeof(float), (void **)&o->v));
    } else {
        st = dt_set_error(DT_ERR_USAGE, "train.optimizer.name: unknown optimizer '%s'",
                          job->train.optimizer.name);
        goto out;
    }
    *out = o;
    o = NULL;
out:
    dt_optim_destroy(o);
    return st;
}

void dt_optim_destroy(dt_optim_t *o)
{
    if (!o)
        return;
    dt_backend_free(o->be, o->m);
    dt_backend_free(o->be, o->v);
    free(o->runs);
    free(o->lo);
    free(o->hi);
    free(o->base);
    free(o);
}

int64_t dt_optim_steps(const dt_optim_t *o) { return o->t; }
void dt_optim_set_steps(dt_optim_t *o, int64_t t) { o->t = t; }

int dt_optim_state_count_for(const struct dt_job *job)
{
    if (strcmp(job->train.optimizer.name, "adamw") == 0)
        return 2;
    return job->train.optimizer.momentum > 0 ? 1 : 0;
}

int dt_optim_state_count(const dt_optim_t *o) { return (o->m != NULL) + (o->v != NULL); }

size_t dt_optim_state_numel(const dt_optim_t *o) { return o->nstate; }

size_t dt_optim_shard(const dt_optim_t *o, const size_t **lo, const size_t **hi,
                      const size_t **base)
{
    *lo = o->lo;
    *hi = o->hi;
    *base = o->base;
    return o->nshard;
}

float *dt_optim_state(dt_optim_t *o, int i, const char **name)
{
    if (o->kind == OPT_SGD) {
        *name = "momentum";
        return i == 0 ? o->m : NULL;
    }
    *name = i == 0 ? "m" : "v";
    return i == 0 ? o->m : i == 1 ? o->v : NULL;
}

static int by_offset(const void *a, const void *b)
{
    size_t x = ((const struct dt_optim_range *)a)->offset, y = ((const struct dt_optim_range *)b)->offset;
    return x < y ? -1 : x > y;
}

dt_status dt_optim_set_groups(dt_optim_t *o, const struct dt_optim_range *r, int count)
{
    struct dt_optim_range *runs = NULL, *sorted = NULL;
    dt_status st = DT_OK;
    /* the gaps between ranges become runs without decay: at most 2 count + 1 runs */
    DT_CHECK(dt_calloc((size_t)count * 2 + 1, sizeof *runs, "parameter groups", (void **)&runs));
    DT_CHECK(dt_calloc((size_t)count + 1, sizeof *sorted, "parameter groups", (void **)&sorted));
    memcpy(sorted, r, (size_t)count * sizeof *r);
    qsort(sorted, (size_t)count, sizeof *sorted, by_offset);
    int n = 0;
    size_t at = 0;
    for (int i = 0; i < count; i++) {
        if (sorted[i].offset < at || sorted[i].numel > o->n - sorted[i].offset) {
            st = dt_set_error(DT_ERR_INVALID_ARG,
                              "optimizer groups: range [%zu, +%zu) overlaps another or leaves "
                              "the %zu parameters",
                              sorted[i].offset, sorted[i].numel, o->n);
            goto out;
        }
        struct dt_optim_range g = sorted[i];
        if (g.offset > at) /* a gap: no weight decay */
            g = (struct dt_optim_range){.offset = at, .numel = sorted[i].offset - at}, i--;
        if (n > 0 && runs[n - 1].weight_decay == g.weight_decay &&
            runs[n - 1].offset + runs[n - 1].numel == g.offset)
            runs[n - 1].numel += g.numel;
        else
            runs[n++] = g;
        at = g.offset + g.numel;
    }
    if (at < o->n) {
        if (n > 0 && runs[n - 1].weight_decay == 0)
            runs[n - 1].numel += o->n - at;
        else
            runs[n++] = (struct dt_optim_range){.offset = at, .numel = o->n - at};
    }
    free(o->runs);
    o->runs = runs;
    o->nruns = n;
    runs = NULL;
out:
    free(runs);
    free(sorted);
    return st;
}

dt_status dt_optim_groups_from_model(dt_optim_t *o, const struct dt_job *job, const dt_model_t *m)
{
    int n = dt_model_param_count(m);
    struct dt_optim_range *r = NULL;
    dt_status st = dt_calloc((size_t)n + 1, sizeof *r, "parameter groups", (void **)&r);
    if (st != DT_OK)
        return st;
    for (int i = 0; i < n; i++) {
        const struct dt_param_info *p = dt_model_param(m, i);
        r[i].offset = p->offset;
        r[i].numel = p->numel;
        r[i].weight_decay = p->group == DT_GROUP_BIAS   ? job->train.optimizer.bias_weight_decay
                            : p->group == DT_GROUP_NORM ? job->train.optimizer.norm_weight_decay
                                                        : job->train.optimizer.weight_decay;
    }
    st = dt_optim_set_groups(o, r, n);
    free(r);
    return st;
}

/* The update of elements [off, off + n) of params and grads, whose state
 * starts at element soff of the state buffers. */
static dt_status update(dt_optim_t *o, float *params, const float *grads, size_t off, size_t soff,
                        size_t n, double lr, double wd)
{
    if (o->kind == OPT_SGD) {
        struct dt_sgd_args a = {.lr = (float)lr,
                                .momentum = (float)o->momentum,
                                .weight_decay = (float)wd,
                                .nesterov = o->nesterov,
                                .first_step = o->t == 0,
                                .gated = o->gated,
                                .clear = o->clear ? o->clear + off : NULL};
        return o->ops->sgd_update(o->be, params + (o->packed == 2 ? soff : off),
                                  grads + (o->packed ? soff : off),
                                  o->m ? o->m + soff : NULL, n, &a);
    }
    struct dt_adamw_args a = {.lr = (float)lr,
                              .beta1 = (float)o->beta1,
                              .beta2 = (float)o->beta2,
                              .eps = (float)o->eps,
                              .weight_decay = (float)wd,
                              .t = o->t + 1,
                              .gated = o->gated,
                              .clear = o->clear ? o->clear + off : NULL};
    return o->ops->adamw_update(o->be, params + (o->packed == 2 ? soff : off),
                                grads + (o->packed ? soff : off), o->m + soff, o->v + soff, n, &a);
}

/* The update of elements [lo, hi) only, run by run; element lo's state is
 * at slo. */
static dt_status update_within(dt_optim_t *o, float *params, const float *grads, double lr,
                               size_t lo, size_t hi, size_t slo)
{
    dt_status st = DT_OK;
    if (!o->runs)
        return lo < hi ? update(o, params, grads, lo, slo, hi - lo, lr, o->weight_decay) : DT_OK;
    for (int i = 0; i < o->nruns && st == DT_OK; i++) {
        size_t a = o->runs[i].offset, b = a + o->runs[i].numel;
        a = a > lo ? a : lo;
        b = b < hi ? b : hi;
        if (a < b)
            st = update(o, params, grads, a, slo + (a - lo), b - a, lr, o->runs[i].weight_decay);
    }
    return st;
}

/* Where element lo's state is: the shard range holding [lo, hi), or
 * DT_ERR_INVALID_ARG when none holds all of it. */
static dt_status state_at(const dt_optim_t *o, size_t lo, size_t hi, size_t *slo)
{
    if (!o->nshard) {
        *slo = lo;
        return DT_OK;
    }
    for (size_t k = 0; k < o->nshard; k++)
        if (o->lo[k] <= lo && hi <= o->hi[k]) {
            *slo = o->base[k] + (lo - o->lo[k]);
            return DT_OK;
        }
    if (lo == hi) {
        *slo = 0;
        return DT_OK;
    }
    return dt_set_error(DT_ERR_INVALID_ARG,
                        "optimizer: elements [%zu, %zu) are outside this rank's shard of the "
                        "optimizer state",
                        lo, hi);
}

dt_status dt_optim_step(dt_optim_t *o, float *params, const float *grads, double lr)
{
    if (o->nshard)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "optimizer: a sharded optimizer updates its own ranges only "
                            "(dt_optim_step_ranges)");
    dt_status st = update_within(o, params, grads, lr, 0, o->n, 0);
    if (st == DT_OK)
        o->t++;
    return st;
}

dt_status dt_optim_step_gated(dt_optim_t *o, float *params, const float *grads, double lr)
{
    o->gated = 1;
    dt_status st = dt_optim_step(o, params, grads, lr);
    o->gated = 0;
    return st;
}

dt_status dt_optim_step_gated_clear(dt_optim_t *o, float *params, float *grads, double lr)
{
    o->clear = grads; /* update_within's runs cover all n elements */
    dt_status st = dt_optim_step_gated(o, params, grads, lr);
    o->clear = NULL;
    return st;
}

void dt_optim_unstep(dt_optim_t *o)
{
    if (o->t > 0) o->t--;
}

dt_status dt_optim_step_ranges(dt_optim_t *o, float *params, const float *grads, double lr,
                               const size_t *lo, const size_t *hi, size_t count)
{
    dt_status st = DT_OK;
    for (size_t k = 0; k < count && st == DT_OK; k++) {
        if (lo[k] > hi[k] || hi[k] > o->n)
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "dt_optim_step_ranges: range %zu is [%zu, %zu) of %zu elements", k,
                                lo[k], hi[k], o->n);
        size_t slo = 0;
        st = state_at(o, lo[k], hi[k], &slo);
        if (st == DT_OK)
            st = update_within(o, params, grads, lr, lo[k], hi[k], slo);
    }
    if (st == DT_OK)
        o->t++;
    return st;
}

static dt_status step_packed(dt_optim_t *o, float *params, const float *grads, double lr,
                             int packed)
{
    dt_status st = DT_OK;
    if (!o->nshard)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "optimizer: packed gradients take a sharded optimizer");
    o->packed = packed;
    for (size_t k = 0; k < o->nshard && st == DT_OK; k++)
        st = update_within(o, params, grads, lr, o->lo[k], o->hi[k], o->base[k]);
    o->packed = 0;
    if (st == DT_OK) o->t++;
    return st;
}

dt_status dt_optim_step_packed(dt_optim_t *o, float *params, const float *grads, double lr)
{
    return step_packed(o, params, grads, lr, 1);
}

dt_status dt_optim_step_shard(dt_optim_t *o, float *params, const float *grads, double lr)
{
    return step_packed(o, params, grads, lr, 2);
}

double dt_schedule_lr(const struct dt_job *job, int64_t step, int64_t total)
{
    const double lr = job->train.optimizer.lr;
    const int64_t warm = job->train.schedule.warmup_steps;
    if (step < warm)
        return lr * (double)(step + 1) / (double)warm;
    int64_t s = step - warm;
    const char *name = job->train.schedule.name;
    if (strcmp(name, "step") == 0)
        return lr * pow(job->train.schedule.gamma, (double)(s / job->train.schedule.step_size));
    if (strcmp(name, "cosine") == 0) {
        int64_t span = total - warm - 1;
        double frac = span > 0 ? (double)s / (double)span : 1.0;
        if (frac > 1.0)
            frac = 1.0;
        double lo = job->train.schedule.min_lr;
        return lo + (lr - lo) * 0.5 * (1.0 + cos(M_PI * frac));
    }
    return lr;
}
