/*
 * shape.c - layers that only move values: flatten (any shape to a vector)
 * and add (the sum of its inputs, which the model forms; a named join
 * point for residual connections).
 */
#include "layer.h"

static dt_status flatten_build(struct dt_layer *l, const struct dt_layer_spec *spec,
                               const struct dt_job *job, int64_t num_classes)
{
    static const char *const known[] = {NULL};
    l->out = dt_shape_make(1, dt_shape_numel(&l->in), 0, 0, 0);
    return dt_layer_known(l, spec, known);
}

static dt_status add_build(struct dt_layer *l, const struct dt_layer_spec *spec,
                           const struct dt_job *job, int64_t num_classes)
{
    static const char *const known[] = {NULL};
    l->out = l->in;
    return dt_layer_known(l, spec, known);
}

static dt_status copy_fwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    return x->ops->flatten_fwd(x->be, x->out, x->in, (size_t)(x->rows * dt_shape_numel(&l->in)));
}

static dt_status copy_bwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    if (!x->din)
        return DT_OK;
    return x->ops->flatten_bwd(x->be, x->din, x->dout, (size_t)(x->rows * dt_shape_numel(&l->in)));
}

static dt_status copy_decode(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    return x->ops->flatten_fwd(x->be, x->out, x->in, dt_layer_decode_numel(&l->in, x->positions));
}

const struct dt_layer_kind dt_layer_flatten = {
    .name = "flatten",
    .doc = "reshape each sample to a vector",
    .settings = "none",
    .build = flatten_build,
    .fwd = copy_fwd,
    .bwd = copy_bwd,
    .ops = {DT_OP_flatten_fwd, DT_OP_flatten_bwd, DT_OP_COUNT},
    .view = 1,
};

const struct dt_layer_kind dt_layer_add = {
    .name = "add",
    .doc = "the sum of its inputs (give it several: a residual connection)",
    .settings = "none",
    .build = add_build,
    .fwd = copy_fwd,
    .bwd = copy_bwd,
    .decode = copy_decode,
    .ops = {DT_OP_flatten_fwd, DT_OP_flatten_bwd, DT_OP_add, DT_OP_accumulate, DT_OP_COUNT},
    .view = 1,
};
