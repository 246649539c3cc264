/*
 * linear.c - the fully connected layer: y = x W^T + b over the last
 * dimension of its input (every leading dimension is a batch dimension),
 * as torch.nn.Linear.
 *
 * Settings: out (features, or `classes` for the dataset's class count),
 * bias (default true), init_std (normal initialisation with that standard
 * deviation instead of model.init), tie (an earlier layer whose weight of
 * the same (out, in) shape this layer uses as its own: a language model's
 * output head and its token embedding).
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "layer.h"

struct linear_cfg {
    int64_t in, out, rows_per_sample; /* rows_per_sample: leading dims of the input */
    int bias;
};

static dt_status build(struct dt_layer *l, const struct dt_layer_spec *spec,
                       const struct dt_job *job, int64_t num_classes)
{
    static const char *const known[] = {"out", "bias", "init_std", "tie", NULL};
    struct linear_cfg *c = (struct linear_cfg *)l->cfg;
    dt_status st;
    DT_CHECK(dt_layer_known(l, spec, known));
    const char *out = NULL;
    for (int i = 0; i < spec->nargs; i++)
        if (strcmp(spec->args[i].key, "out") == 0)
            out = spec->args[i].value;
    if (!out) {
        st = dt_set_error(DT_ERR_USAGE, "%s: linear needs out (its output features, or classes)",
                          l->where);
        goto out;
    }
    if (strcmp(out, "classes") == 0)
        c->out = num_classes;
    else
        DT_CHECK(dt_layer_int(l, spec, "out", 0, 1, DT_JOB_MAX_WIDTH, &c->out));
    DT_CHECK(dt_layer_bool(l, spec, "bias", 1, &c->bias));
    if (l->in.ndim < 1) {
        st = dt_set_error(DT_ERR_USAGE, "%s: linear needs an input with at least one dimension",
                          l->where);
        goto out;
    }
    c->in = l->in.dim[l->in.ndim - 1];
    c->rows_per_sample = dt_shape_numel(&l->in) / c->in;
    if (c->in > INT_MAX || c->in * c->out > (int64_t)1 << 40) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "%s: a linear layer of %lld inputs and %lld outputs is more than "
                          "dtrain takes (at most %d inputs, 2^40 weights)",
                          l->where, (long long)c->in, (long long)c->out, INT_MAX);
        goto out;
    }
    l->out = l->in;
    l->out.dim[l->out.ndim - 1] = c->out;
    dt_layer_param(l, "weight", dt_shape_make(2, c->out, c->in, 0, 0), DT_INIT_FAN_IN,
                   DT_GROUP_WEIGHT, c->in, c->out);
    DT_CHECK(dt_layer_init_std(l, spec, 0));
    for (int i = 0; i < spec->nargs; i++)
        if (strcmp(spec->args[i].key, "tie") == 0)
            snprintf(l->params[0].tie, sizeof l->params[0].tie, "%.50s.weight",
                     spec->args[i].value);
    if (c->bias)
        dt_layer_param(l, "bias", dt_shape_make(1, c->out, 0, 0, 0), DT_INIT_ZEROS, DT_GROUP_BIAS,
                       c->in, c->out);
    l->flops = 2.0 * (double)c->in * (double)c->out * (double)c->rows_per_sample;
out:
    return st;
}

/* The input as the GEMMs read it, kept from forward for backward where the
 * backend rounds it (workspace), else NULL. */
static void *kept(const struct dt_layer *l, const struct dt_layer_ctx *x)
{
    return l->saved_per_row ? x->saved : NULL;
}

static dt_status fwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    const struct linear_cfg *c = (const struct linear_cfg *)l->cfg;
    int B = (int)(x->rows * c->rows_per_sample);
    return x->ops->linear_fwd(x->be, x->out, x->in, x->p[0], c->bias ? x->p[1] : NULL, B,
                              (int)c->in, (int)c->out, kept(l, x));
}

/* A (T, in) sequence's first positions; the rounded input is not kept. */
static dt_status decode(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    const struct linear_cfg *c = (const struct linear_cfg *)l->cfg;
    int B = (int)(dt_layer_decode_numel(&l->in, x->positions) / (size_t)c->in);
    return x->ops->linear_fwd(x->be, x->out, x->in, x->p[0], c->bias ? x->p[1] : NULL, B,
                              (int)c->in, (int)c->out, kept(l, x));
}

static dt_status bwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    const struct linear_cfg *c = (const struct linear_cfg *)l->cfg;
    int B = (int)(x->rows * c->rows_per_sample);
    dt_status st = DT_OK;
    if (c->bias)
        st = x->ops->bias_bwd(x->be, x->g[1], x->dout, B, (int)c->out);
    if (st == DT_OK)
        st = x->ops->linear_bwd(x->be, x->din, x->g[0], x->dout, x->in, x->p[0], B, (int)c->in,
                                (int)c->out, kept(l, x));
    return st;
}

/* The backend's scratch for the GEMMs (bf16/fp16 operands) and the bias
 * gradient's column sums at the largest micro-batch; and, where the
 * backend rounds the GEMMs' operands, the rounded input kept from forward
 * for backward (unless forward runs again before backward anyway). */
static dt_status workspace(struct dt_layer *l, dt_backend_t *be, int64_t max_rows)
{
    const struct linear_cfg *c = (const struct linear_cfg *)l->cfg;
    int64_t B = max_rows * c->rows_per_sample;
    size_t keep = l->recomputed ? 0 : dt_backend_kept_operand_bytes(be);
    size_t keep_bytes = keep * (size_t)(c->rows_per_sample * c->in);
    l->saved_per_row = (int64_t)((keep_bytes + sizeof(float) - 1) / sizeof(float));
    dt_status st = dt_backend_reserve(be, DT_OP_linear_bwd, B, c->in, c->out);
    if (st == DT_OK && c->bias) st = dt_backend_reserve(be, DT_OP_bias_bwd, B, c->out, 0);
    return st != DT_OK ? dt_error_context(st, "%s", l->where) : DT_OK;
}

const struct dt_layer_kind dt_layer_linear = {
    .name = "linear",
    .doc = "fully connected layer over the last dimension (torch.nn.Linear)",
    .settings = "out (features, or classes), bias: true, init_std: 0 (model.init), tie: none",
    .build = build,
    .fwd = fwd,
    .bwd = bwd,
    .decode = decode,
    .workspace = workspace,
    .ops = {DT_OP_linear_fwd, DT_OP_linear_bwd, DT_OP_bias_bwd, DT_OP_COUNT},
    .output_free = 1,
};
