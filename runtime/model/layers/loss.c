/*
 * loss.c - loss layers. softmax_xent: softmax over the last dimension and
 * cross-entropy against the labels; its output is the class probabilities,
 * its forward adds the loss and the number of correct predictions, its
 * backward starts the gradient.
 *
 * An input of shape (C) takes one label per sample. An input of shape
 * (T, C) - a language model's next-token scores - takes T labels per
 * sample, and a sample's loss is the mean over its T positions, so the
 * loss the trainer averages over samples is the mean over tokens (as
 * PyTorch's cross_entropy over the flattened positions gives) and the
 * correct count counts tokens.
 */
#include <limits.h>
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
    if ((l->in.ndim != 1 && l->in.ndim != 2) || l->in.dim[l->in.ndim - 1] != num_classes)
        return dt_set_error(DT_ERR_USAGE,
                            "%s: the softmax cross-entropy loss needs one score per class (%lld "
                            "values per sample, or per position of a sequence), but its input "
                            "is %s; end the model with a linear layer of out: classes",
                            l->where, (long long)num_classes, dt_shape_format(&l->in, s, sizeof s));
    l->out = l->in;
    l->loss = 1;
    l->labels_per_row = l->in.ndim == 2 ? l->in.dim[0] : 1;
    return DT_OK;
}

static dt_status fwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    int C = (int)l->in.dim[l->in.ndim - 1];
    /* a sequence's loss is the mean over its positions */
    return x->ops->softmax_xent_fwd(x->be, x->out, x->in, x->labels,
                                    (int)(x->rows * l->labels_per_row), C, (int)l->labels_per_row,
                                    x->loss_sum, x->correct);
}

/* The probabilities of the positions decoded (labels: the model's zeros). */
static dt_status decode(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    int C = (int)l->in.dim[l->in.ndim - 1];
    int n = (int)x->positions;
    return x->ops->softmax_xent_fwd(x->be, x->out, x->in, x->labels, n, C, n, x->loss_sum,
                                    x->correct);
}

static dt_status bwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    int C = (int)l->in.dim[l->in.ndim - 1];
    if (!x->din)
        return DT_OK;
    return x->ops->softmax_xent_bwd(x->be, x->din, x->out, x->labels,
                                    (int)(x->rows * l->labels_per_row), C,
                                    (float)((double)x->scale / (double)l->labels_per_row));
}

/* The ops index scores with 32-bit integers: rows x positions x classes
 * must stay below 2^31. */
static dt_status workspace(struct dt_layer *l, dt_backend_t *be, int64_t max_rows)
{
    int64_t n = max_rows * dt_shape_numel(&l->in);
    if (n > INT_MAX)
        return dt_set_error(DT_ERR_USAGE,
                            "%s: %lld rows of %lld scores each are %lld values, more than the "
                            "loss takes at once (2^31); lower train.micro_batch (or "
                            "train.eval_batch) to at most %lld",
                            l->where, (long long)max_rows, (long long)dt_shape_numel(&l->in),
                            (long long)n, (long long)(INT_MAX / dt_shape_numel(&l->in)));
    /* the backend's scratch for the per-row results */
    dt_status st =
        dt_backend_reserve(be, DT_OP_softmax_xent_fwd, max_rows * l->labels_per_row, 0, 0);
    return st != DT_OK ? dt_error_context(st, "%s", l->where) : DT_OK;
}

const struct dt_layer_kind dt_layer_softmax_xent = {
    .name = "softmax_xent",
    .doc = "softmax and cross-entropy against the labels (the default loss); over (T, C) "
           "scores, one label per position and the mean over positions (language models)",
    .settings = "none",
    .build = build,
    .fwd = fwd,
    .bwd = bwd,
    .decode = decode,
    .workspace = workspace,
    .ops = {DT_OP_softmax_xent_fwd, DT_OP_softmax_xent_bwd, DT_OP_COUNT},
};
