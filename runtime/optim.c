/*
 * optim.c - optimizer state, the update step, LR schedules and clipping.
 * The arithmetic of each update is a fused op of the backend
 * (kernels/cpu/optim.c on the CPU), so this file only keeps state and
 * computes the per-step scalars.
 */
#include "optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

enum optim_kind { OPT_SGD, OPT_ADAMW };

struct dt_optim {
    dt_backend_t *be;
    const struct dt_ops *ops;
    enum optim_kind kind;
    size_t n;
    float *m, *v; /* sgd: m = momentum buffer */
    int64_t t;
    double momentum, weight_decay, beta1, beta2, eps;
    int nesterov;
};

dt_status dt_optim_create(const struct dt_job *job, dt_backend_t *be, size_t n, dt_optim_t **out)
{
    dt_status st;
    dt_optim_t *o = NULL;
    *out = NULL;
    DT_CHECK(dt_calloc(1, sizeof *o, "the optimizer", (void **)&o));
    o->be = be;
    o->ops = dt_backend_ops(be);
    o->n = n;
    o->momentum = job->train.optimizer.momentum;
    o->nesterov = job->train.optimizer.nesterov;
    o->weight_decay = job->train.optimizer.weight_decay;
    o->beta1 = job->train.optimizer.beta1;
    o->beta2 = job->train.optimizer.beta2;
    o->eps = job->train.optimizer.eps;
    if (strcmp(job->train.optimizer.name, "sgd") == 0) {
        o->kind = OPT_SGD;
        if (o->momentum > 0)
            DT_CHECK(dt_backend_alloc(be, n * sizeof(float), (void **)&o->m));
    } else if (strcmp(job->train.optimizer.name, "adamw") == 0) {
        o->kind = OPT_ADAMW;
        DT_CHECK(dt_backend_alloc(be, n * sizeof(float), (void **)&o->m));
        DT_CHECK(dt_backend_alloc(be, n * sizeof(float), (void **)&o->v));
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

float *dt_optim_state(dt_optim_t *o, int i, const char **name)
{
    if (o->kind == OPT_SGD) {
        *name = "momentum";
        return i == 0 ? o->m : NULL;
    }
    *name = i == 0 ? "m" : "v";
    return i == 0 ? o->m : i == 1 ? o->v : NULL;
}

dt_status dt_optim_step(dt_optim_t *o, float *params, const float *grads, double lr)
{
    dt_status st;
    if (o->kind == OPT_SGD) {
        struct dt_sgd_args a = {.lr = (float)lr,
                                .momentum = (float)o->momentum,
                                .weight_decay = (float)o->weight_decay,
                                .nesterov = o->nesterov,
                                .first_step = o->t == 0};
        st = o->ops->sgd_update(o->be, params, grads, o->m, o->n, &a);
    } else {
        struct dt_adamw_args a = {.lr = (float)lr,
                                  .beta1 = (float)o->beta1,
                                  .beta2 = (float)o->beta2,
                                  .eps = (float)o->eps,
                                  .weight_decay = (float)o->weight_decay,
                                  .t = o->t + 1};
        st = o->ops->adamw_update(o->be, params, grads, o->m, o->v, o->n, &a);
    }
    if (st == DT_OK)
        o->t++;
    return st;
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

dt_status dt_clip_grad_norm(dt_backend_t *be, float *grads, size_t n, double max_norm,
                            double *norm)
{
    const struct dt_ops *ops = dt_backend_ops(be);
    double ss = 0;
    dt_status st = ops->sumsq(be, grads, n, &ss);
    if (st != DT_OK)
        return st;
    *norm = sqrt(ss);
    if (max_norm > 0 && *norm > max_norm)
        st = ops->scale(be, grads, n, (float)(max_norm / (*norm + 1e-6)));
    return st;
}
