/*
 * norm.c - normalisation layers.
 *
 * batchnorm: per channel of (C, H, W) images, or per feature of vectors,
 * as torch.nn.BatchNorm2d/1d: batch statistics while training (biased
 * variance), running statistics (unbiased variance, momentum 0.1) for
 * evaluation. With model.sync_bn the per-channel sums are summed over
 * every rank before use, in forward and in backward, so the statistics
 * are those of the global micro-batch. The sums are doubles, so the
 * result does not hinge on the order ranks add in. A relu layer that
 * alone reads a batchnorm's output is folded into it (fuses_relu):
 * forward applies the ReLU as it writes, backward masks dout, and the
 * relu layer's passes are gone.
 *
 * layernorm: over the last dimension, as torch.nn.LayerNorm(last dim).
 *
 * rmsnorm: over the last dimension by the root mean square, without
 * taking out the mean and without a shift (as T5 and LLaMA normalise):
 * y = x / sqrt(mean(x^2) + eps) * weight.
 *
 * Scales start at one, shifts at zero; both are in the norm weight-decay
 * group (train.optimizer.norm_weight_decay, 0 by default).
 */
#include <stdio.h>
#include <string.h>

#include "layer.h"

struct bn_cfg {
    int64_t C, HW;
    double eps, momentum;
    double count; /* values the last training forward's statistics summed */
};

static dt_status bn_build(struct dt_layer *l, const struct dt_layer_spec *spec,
                          const struct dt_job *job, int64_t num_classes)
{
    static const char *const known[] = {"eps", "momentum", NULL};
    struct bn_cfg *c = (struct bn_cfg *)l->cfg;
    dt_status st;
    char s[64];
    DT_CHECK(dt_layer_known(l, spec, known));
    DT_CHECK(dt_layer_float(l, spec, "eps", 1e-5, 0, 1, 0, &c->eps));
    DT_CHECK(dt_layer_float(l, spec, "momentum", 0.1, 0, 1, 0, &c->momentum));
    if (c->eps <= 0) {
        st = dt_set_error(DT_ERR_USAGE, "%s: eps: expected a number above 0", l->where);
        goto out;
    }
    if (l->in.ndim == 3) {
        c->C = l->in.dim[0];
        c->HW = l->in.dim[1] * l->in.dim[2];
    } else if (l->in.ndim == 1) {
        c->C = l->in.dim[0];
        c->HW = 1;
    } else {
        st = dt_set_error(DT_ERR_USAGE,
                          "%s: batchnorm takes images (channels, height, width) or vectors, not %s",
                          l->where, dt_shape_format(&l->in, s, sizeof s));
        goto out;
    }
    l->out = l->in;
    struct dt_shape ch = dt_shape_make(1, c->C, 0, 0, 0);
    dt_layer_param(l, "weight", ch, DT_INIT_ONES, DT_GROUP_NORM, 0, 0);
    dt_layer_param(l, "bias", ch, DT_INIT_ZEROS, DT_GROUP_NORM, 0, 0);
    dt_layer_buffer(l, "running_mean", ch, DT_INIT_ZEROS);
    dt_layer_buffer(l, "running_var", ch, DT_INIT_ONES);
    l->saved_fixed = 2 * c->C; /* mean, 1/std of the last training forward */
    l->stat_len = 1 + 2 * (size_t)c->C; /* count, then the sums of x and x^2 */
    l->has_eval_mode = 1;
out:
    return st;
}

static dt_status bn_workspace(struct dt_layer *l, dt_backend_t *be, int64_t max_rows)
{
    const struct bn_cfg *c = (const struct bn_cfg *)l->cfg;
    /* statistics, this rank's gradient sums, everyone's: 2C doubles each;
     * and an input gradient to throw away when nothing needs it */
    l->ws_fixed = 6 * (size_t)c->C * sizeof(double);
    l->ws_per_row = l->input_grad ? 0 : (size_t)(c->C * c->HW) * sizeof(float);
    return DT_OK;
}

/* Sums n doubles of device memory d, and *extra when not NULL, over every
 * rank, through the host, in one all-reduce. */
static dt_status sum_ranks(const struct dt_layer *l, const struct dt_layer_ctx *x, double *d,
                           size_t n, double *extra)
{
    dt_status st;
    size_t all = n + (extra != NULL);
    if (x->host_len < all)
        return dt_set_error(DT_ERR_INTERNAL, "%s: %zu doubles of host scratch, %zu needed",
                            l->where, x->host_len, all);
    DT_CHECK(dt_backend_copy(x->be, x->host, d, n * sizeof(double), DT_COPY_D2H));
    if (extra)
        x->host[n] = *extra;
    DT_CHECK(x->sync->sum_f64(x->sync->ctx, x->host, all));
    DT_CHECK(dt_backend_copy(x->be, d, x->host, n * sizeof(double), DT_COPY_H2D));
    if (extra)
        *extra = x->host[n];
out:
    if (st != DT_OK)
        return dt_error_context(st, "%s: summing the batch statistics over the ranks", l->where);
    return st;
}

static dt_status bn_fwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    struct bn_cfg *c = (struct bn_cfg *)l->cfg;
    int N = (int)x->rows, C = (int)c->C, HW = (int)c->HW;
    dt_status st;
    if (!x->training)
        return x->ops->batchnorm_infer(x->be, x->out, x->in, x->buf[0], x->buf[1], x->p[0], x->p[1],
                                       (float)c->eps, N, C, HW, l->fused_relu);
    double *stats = (double *)x->ws;
    double count = (double)x->rows * (double)c->HW;
    DT_CHECK(x->ops->batchnorm_stats(x->be, stats, x->in, N, C, HW));
    if (x->sync) {
        /* the count rides along: ranks may hold different row counts */
        DT_CHECK(sum_ranks(l, x, stats, 2 * (size_t)C, &count));
    }
    if (count < 2) {
        st = dt_set_error(DT_ERR_USAGE,
                          "%s: batch norm needs more than one value per channel while training "
                          "(got %g); raise train.micro_batch",
                          l->where, count);
        goto out;
    }
    c->count = count;
    int keep = !x->recompute && !x->stat_out; /* update the running statistics here */
    if (x->stat_out && !x->recompute) {
        x->stat_out[0] = count;
        DT_CHECK(dt_backend_copy(x->be, x->stat_out + 1, stats, 2 * (size_t)C * sizeof(double),
                                 DT_COPY_D2H));
    }
    DT_CHECK(x->ops->batchnorm_fwd(x->be, x->out, x->saved, x->saved + C,
                                   keep ? x->buf[0] : NULL, keep ? x->buf[1] : NULL,
                                   x->in, stats, count, x->p[0], x->p[1], (float)c->eps,
                                   (float)c->momentum, N, C, HW, l->fused_relu));
out:
    return st;
}

static dt_status bn_bwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    const struct bn_cfg *c = (const struct bn_cfg *)l->cfg;
    int N = (int)x->rows, C = (int)c->C, HW = (int)c->HW;
    double *local = (double *)x->ws + 2 * (size_t)C, *global = local + 2 * (size_t)C;
    float *dx = x->din ? x->din : (float *)(global + 2 * (size_t)C);
    const float *relu_out = l->fused_relu ? x->out : NULL; /* where dout counts */
    dt_status st;
    DT_CHECK(x->ops->batchnorm_bwd_reduce(x->be, local, x->dout, x->in, x->saved, x->saved + C,
                                          relu_out, N, C, HW));
    if (x->sync) {
        DT_CHECK(
            dt_backend_copy(x->be, global, local, 2 * (size_t)C * sizeof(double), DT_COPY_D2D));
        DT_CHECK(sum_ranks(l, x, global, 2 * (size_t)C, NULL));
    } else {
        global = local;
    }
    DT_CHECK(x->ops->batchnorm_bwd(x->be, dx, x->g[0], x->g[1], x->dout, x->in, x->saved,
                                   x->saved + C, x->p[0], local, global, c->count, relu_out, N,
                                   C, HW));
out:
    return st;
}

/* The running statistics from a reported batch: as batchnorm_fwd updates
 * them (momentum, the unbiased variance). */
static void bn_apply_stats(const struct dt_layer *l, float *const *buf, const double *stats)
{
    const struct bn_cfg *c = (const struct bn_cfg *)l->cfg;
    double count = stats[0], m = c->momentum;
    const double *sum = stats + 1, *sq = sum + c->C;
    if (count < 2) return;
    for (int64_t k = 0; k < c->C; k++) {
        double mean = sum[k] / count, var = sq[k] / count - mean * mean;
        if (var < 0) var = 0;
        buf[0][k] = (float)((1.0 - m) * buf[0][k] + m * mean);
        buf[1][k] = (float)((1.0 - m) * buf[1][k] + m * var * count / (count - 1.0));
    }
}

static void bn_describe(const struct dt_layer *l, char *buf, size_t len)
{
    const struct bn_cfg *c = (const struct bn_cfg *)l->cfg;
    snprintf(buf, len, "eps=%g momentum=%g", c->eps, c->momentum);
}

const struct dt_layer_kind dt_layer_batchnorm = {
    .name = "batchnorm",
    .doc = "batch normalisation per channel (model.sync_bn: statistics over every rank); a relu "
           "that alone reads its output is folded into it",
    .settings = "eps: 1e-5, momentum: 0.1",
    .build = bn_build,
    .fwd = bn_fwd,
    .bwd = bn_bwd,
    .describe = bn_describe,
    .workspace = bn_workspace,
    .apply_stats = bn_apply_stats,
    .fuses_relu = 1,
    .ops = {DT_OP_batchnorm_stats, DT_OP_batchnorm_fwd, DT_OP_batchnorm_infer,
            DT_OP_batchnorm_bwd_reduce, DT_OP_batchnorm_bwd, DT_OP_COUNT},
};

/* ---- layer norm ---------------------------------------------------------- */

struct ln_cfg {
    int64_t D, per_sample; /* normalised width; rows of it per sample */
    double eps;
};

/* What layer and RMS norm share: eps, the normalised width (the last
 * dimension) and the rows of it per sample; the output has the input's
 * shape. */
static dt_status last_dim_norm(struct dt_layer *l, const struct dt_layer_spec *spec,
                               const char *kind, struct ln_cfg *c)
{
    static const char *const known[] = {"eps", NULL};
    dt_status st;
    DT_CHECK(dt_layer_known(l, spec, known));
    DT_CHECK(dt_layer_float(l, spec, "eps", 1e-5, 0, 1, 0, &c->eps));
    if (c->eps <= 0 || l->in.ndim < 1) {
        st = dt_set_error(DT_ERR_USAGE,
                          "%s: %s needs eps above 0 and an input with a last dimension", l->where,
                          kind);
        goto out;
    }
    c->D = l->in.dim[l->in.ndim - 1];
    c->per_sample = dt_shape_numel(&l->in) / c->D;
    l->out = l->in;
out:
    return st;
}

static dt_status ln_build(struct dt_layer *l, const struct dt_layer_spec *spec,
                          const struct dt_job *job, int64_t num_classes)
{
    struct ln_cfg *c = (struct ln_cfg *)l->cfg;
    dt_status st;
    DT_CHECK(last_dim_norm(l, spec, "layernorm", c));
    struct dt_shape d = dt_shape_make(1, c->D, 0, 0, 0);
    dt_layer_param(l, "weight", d, DT_INIT_ONES, DT_GROUP_NORM, 0, 0);
    dt_layer_param(l, "bias", d, DT_INIT_ZEROS, DT_GROUP_NORM, 0, 0);
    l->saved_per_row = 2 * c->per_sample; /* mean and 1/std of each normalised row */
out:
    return st;
}

static dt_status ln_fwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    const struct ln_cfg *c = (const struct ln_cfg *)l->cfg;
    int rows = (int)(x->rows * c->per_sample);
    return x->ops->layernorm_fwd(x->be, x->out, x->saved, x->saved + rows, x->in, x->p[0], x->p[1],
                                 (float)c->eps, rows, (int)c->D);
}

static dt_status ln_decode(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    const struct ln_cfg *c = (const struct ln_cfg *)l->cfg;
    int rows = (int)(dt_layer_decode_numel(&l->in, x->positions) / (size_t)c->D);
    return x->ops->layernorm_fwd(x->be, x->out, x->saved, x->saved + rows, x->in, x->p[0], x->p[1],
                                 (float)c->eps, rows, (int)c->D);
}

static dt_status ln_bwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    const struct ln_cfg *c = (const struct ln_cfg *)l->cfg;
    int rows = (int)(x->rows * c->per_sample);
    float *dx = x->din ? x->din : (float *)x->ws;
    return x->ops->layernorm_bwd(x->be, dx, x->g[0], x->g[1], x->dout, x->in, x->saved,
                                 x->saved + rows, x->p[0], rows, (int)c->D);
}

/* Both norms: a dx buffer when the input needs no gradient, and the
 * backend's scratch for the weight gradients' column sums. */
static dt_status last_dim_workspace(struct dt_layer *l, dt_backend_t *be, int64_t max_rows,
                                    enum dt_op_id bwd)
{
    const struct ln_cfg *c = (const struct ln_cfg *)l->cfg;
    l->ws_fixed = 0;
    l->ws_per_row = l->input_grad ? 0 : (size_t)dt_shape_numel(&l->in) * sizeof(float);
    dt_status st = dt_backend_reserve(be, bwd, max_rows * c->per_sample, c->D, 0);
    return st != DT_OK ? dt_error_context(st, "%s", l->where) : DT_OK;
}

static dt_status ln_workspace(struct dt_layer *l, dt_backend_t *be, int64_t max_rows)
{
    return last_dim_workspace(l, be, max_rows, DT_OP_layernorm_bwd);
}

const struct dt_layer_kind dt_layer_layernorm = {
    .name = "layernorm",
    .doc = "layer normalisation over the last dimension (torch.nn.LayerNorm)",
    .settings = "eps: 1e-5",
    .build = ln_build,
    .fwd = ln_fwd,
    .bwd = ln_bwd,
    .decode = ln_decode,
    .workspace = ln_workspace,
    .ops = {DT_OP_layernorm_fwd, DT_OP_layernorm_bwd, DT_OP_COUNT},
};

/* ---- RMS norm ------------------------------------------------------------ */

/* The same settings and shapes as layer norm (struct ln_cfg), one scale
 * and no shift, one rstd kept per normalised row. */
static dt_status rms_build(struct dt_layer *l, const struct dt_layer_spec *spec,
                           const struct dt_job *job, int64_t num_classes)
{
    struct ln_cfg *c = (struct ln_cfg *)l->cfg;
    dt_status st;
    DT_CHECK(last_dim_norm(l, spec, "rmsnorm", c));
    dt_layer_param(l, "weight", dt_shape_make(1, c->D, 0, 0, 0), DT_INIT_ONES, DT_GROUP_NORM, 0, 0);
    l->saved_per_row = c->per_sample; /* 1/rms of each normalised row */
out:
    return st;
}

static dt_status rms_workspace(struct dt_layer *l, dt_backend_t *be, int64_t max_rows)
{
    return last_dim_workspace(l, be, max_rows, DT_OP_rmsnorm_bwd);
}

static dt_status rms_fwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    const struct ln_cfg *c = (const struct ln_cfg *)l->cfg;
    int rows = (int)(x->rows * c->per_sample);
    return x->ops->rmsnorm_fwd(x->be, x->out, x->saved, x->in, x->p[0], (float)c->eps, rows,
                               (int)c->D);
}

static dt_status rms_decode(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    const struct ln_cfg *c = (const struct ln_cfg *)l->cfg;
    int rows = (int)(dt_layer_decode_numel(&l->in, x->positions) / (size_t)c->D);
    return x->ops->rmsnorm_fwd(x->be, x->out, x->saved, x->in, x->p[0], (float)c->eps, rows,
                               (int)c->D);
}

static dt_status rms_bwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    const struct ln_cfg *c = (const struct ln_cfg *)l->cfg;
    int rows = (int)(x->rows * c->per_sample);
    float *dx = x->din ? x->din : (float *)x->ws;
    return x->ops->rmsnorm_bwd(x->be, dx, x->g[0], x->dout, x->in, x->saved, x->p[0], rows,
                               (int)c->D);
}

const struct dt_layer_kind dt_layer_rmsnorm = {
    .name = "rmsnorm",
    .doc = "RMS normalisation over the last dimension: x / sqrt(mean(x^2) + eps) * weight, no "
           "shift",
    .settings = "eps: 1e-5",
    .build = rms_build,
    .fwd = rms_fwd,
    .bwd = rms_bwd,
    .decode = rms_decode,
    .workspace = rms_workspace,
    .ops = {DT_OP_rmsnorm_fwd, DT_OP_rmsnorm_bwd, DT_OP_COUNT},
};
