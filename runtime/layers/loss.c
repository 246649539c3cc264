/*
 * loss.c - loss layers. softmax_xent: softmax over the last dimension and
 * cross-entropy against the sample's label; its output is the class
 * probabilities, its forward adds the summed loss and the number of
 * correct predictions, its backward starts the gradient.
 */
#include <stdio.h>

#include "layer.h"

static dt_status build(struct dt_layer *l, const struct dt_layer_spec *spec,
                       const struct dt_job *job, int64_t num_classes)
{
    static const char *const known[] = {NULL};
    char s[64];
    dt_status st = dt_layer_known(l, spec, known);
    if (st != DT_OK)
        return st;
    if (l->in.ndim != 1 || l->in.dim[0] != num_classes)
        return dt_set_error(DT_ERR_USAGE,
                            "%s: the softmax cross-entropy loss needs one score per class (%lld "
                            "values per sample), but its input is %s; end the model with a linear "
                            "layer of out: classes",
                            l->where, (long long)num_classes, dt_shape_format(&l->in, s, sizeof s));
    l->out = l->in;
    l->loss = 1;
    return DT_OK;
}

static dt_status fwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    int C = (int)l->in.dim[0];
    return x->ops->softmax_xent_fwd(x->be, x->out, x->in, x->labels, (int)x->rows, C, x->loss_sum,
                                    x->correct);
}

static dt_status bwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    int C = (int)l->in.dim[0];
    if (!x->din)
        return DT_OK;
    return x->ops->softmax_xent_bwd(x->be, x->din, x->out, x->labels, (int)x->rows, C, x->scale);
}

const struct dt_layer_kind dt_layer_softmax_xent = {
    .name = "softmax_xent",
    .doc = "softmax and cross-entropy against the labels (the default loss)",
    .settings = "none",
    .build = build,
    .fwd = fwd,
    .bwd = bwd,
    .ops = {DT_OP_softmax_xent_fwd, DT_OP_softmax_xent_bwd, DT_OP_COUNT},
};
