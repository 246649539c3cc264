/*
 * activation.c - the element-wise activations, one layer kind per row of
 * DT_UNARY_LIST (kernels/ops.h: relu, gelu, tanh, ...), and dropout, on
 * inputs of any shape. The activations have no settings; dropout has p.
 * The kinds come from the op list, so a new activation op is a new layer
 * kind (and a value of model.activation) with nothing written here.
 */
#include <stdio.h>

#include "layer.h"

static dt_status build_plain(struct dt_layer *l, const struct dt_layer_spec *spec,
                             const struct dt_job *job, int64_t num_classes)
{
    static const char *const known[] = {NULL};
    l->out = l->in;
    return dt_layer_known(l, spec, known);
}

static size_t n_of(const struct dt_layer *l, const struct dt_layer_ctx *x)
{
    return (size_t)(x->rows * dt_shape_numel(&l->in));
}

/* What a row's backward takes: the layer's input (x) or its output (y). */
#define SAVED_x in
#define SAVED_y out
#define SAVED_OF(s) SAVED_##s

/* Whether a row's layer may keep its gradient over its input (keeps_grad,
 * layer.h): the rows whose gradient is dy times one expression, so that
 * mul(dout, kept) gives the backward's bits. A new row says here whether
 * it is one. */
#define KEEPS_relu 0      /* dy or 0 by a comparison: dy * 0 would give -0 and NaN */
#define KEEPS_gelu 1
#define KEEPS_gelu_tanh 1
#define KEEPS_tanh 0      /* its backward reads the output, and is a multiply already */
#define KEEPS_silu 0      /* (dy * sigmoid) * (...): another rounding */

/* With keep_grad the model has handed over the input, which no other
 * layer reads, to be written over (model.c). */
#define ACTIVATION(a, NAME, s, forward, gradient, cpu, DOC)                                        \
    static dt_status NAME##_fwd(struct dt_layer *l, const struct dt_layer_ctx *x)                  \
    {                                                                                              \
        return l->keep_grad ? x->ops->NAME##_fwd_keep(x->be, x->out, (float *)x->in, n_of(l, x))   \
                            : x->ops->NAME##_fwd(x->be, x->out, x->in, n_of(l, x));                \
    }                                                                                              \
    static dt_status NAME##_decode(struct dt_layer *l, const struct dt_layer_ctx *x)               \
    {                                                                                              \
        return x->ops->NAME##_fwd(x->be, x->out, x->in, dt_layer_decode_numel(&l->in, x->positions)); \
    }                                                                                              \
    static dt_status NAME##_bwd(struct dt_layer *l, const struct dt_layer_ctx *x)                  \
    {                                                                                              \
        if (!x->din)                                                                               \
            return DT_OK;                                                                          \
        return l->keep_grad ? x->ops->mul(x->be, x->din, x->dout, x->in, n_of(l, x))               \
                            : x->ops->NAME##_bwd(x->be, x->din, x->dout, x->SAVED_OF(s), n_of(l, x)); \
    }                                                                                              \
    const struct dt_layer_kind dt_layer_##NAME = {                                                 \
        .name = #NAME,                                                                             \
        .doc = DOC,                                                                                \
        .settings = "none",                                                                        \
        .build = build_plain,                                                                      \
        .fwd = NAME##_fwd,                                                                         \
        .bwd = NAME##_bwd,                                                                         \
        .decode = NAME##_decode,                                                                   \
        .ops = {DT_OP_##NAME##_fwd, DT_OP_##NAME##_bwd, DT_OP_##NAME##_fwd_keep, DT_OP_mul,       \
                DT_OP_COUNT},                                                                      \
        .keeps_grad = KEEPS_##NAME,                                                                \
    };

DT_UNARY_LIST(ACTIVATION, _)

/* ---- dropout ------------------------------------------------------------- */

struct dropout_cfg {
    double p;
};

static dt_status dropout_build(struct dt_layer *l, const struct dt_layer_spec *spec,
                               const struct dt_job *job, int64_t num_classes)
{
    static const char *const known[] = {"p", NULL};
    struct dropout_cfg *c = (struct dropout_cfg *)l->cfg;
    dt_status st;
    DT_CHECK(dt_layer_known(l, spec, known));
    DT_CHECK(dt_layer_float(l, spec, "p", 0.5, 0, 1, 1, &c->p));
    l->out = l->in;
    l->has_eval_mode = 1;
out:
    return st;
}

/* Randomness keyed by (seed, layer position, step) and the element's
 * place in the global batch, so any split of the batch over ranks and
 * micro-batches draws the same mask. */
static struct dt_rng_key key_of(const struct dt_layer *l, const struct dt_layer_ctx *x)
{
    struct dt_rng_key k = {.seed = x->seed,
                           .purpose = DT_RNG_DROPOUT,
                           .stream = (uint32_t)l->id,
                           .step = (uint64_t)x->step};
    return k;
}

static dt_status dropout_fwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    const struct dropout_cfg *c = (const struct dropout_cfg *)l->cfg;
    struct dt_rng_key k = key_of(l, x);
    float p = x->training ? (float)c->p : 0.0f;
    return x->ops->dropout_fwd(x->be, x->out, x->in, (int)x->rows, (int)dt_shape_numel(&l->in), p,
                               &k, (uint64_t)x->row0);
}

static dt_status dropout_bwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    const struct dropout_cfg *c = (const struct dropout_cfg *)l->cfg;
    if (!x->din)
        return DT_OK;
    struct dt_rng_key k = key_of(l, x);
    float p = x->training ? (float)c->p : 0.0f;
    return x->ops->dropout_bwd(x->be, x->din, x->dout, (int)x->rows, (int)dt_shape_numel(&l->in), p,
                               &k, (uint64_t)x->row0);
}

/* Generation is evaluation: no dropout, a copy. */
static dt_status dropout_decode(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    return x->ops->flatten_fwd(x->be, x->out, x->in, dt_layer_decode_numel(&l->in, x->positions));
}

static void dropout_describe(const struct dt_layer *l, char *buf, size_t len)
{
    snprintf(buf, len, "p=%.3g", ((const struct dropout_cfg *)l->cfg)->p);
}

const struct dt_layer_kind dt_layer_dropout = {
    .name = "dropout",
    .doc = "inverted dropout while training (keyed by seed, step and sample)",
    .settings = "p: 0.5",
    .build = dropout_build,
    .fwd = dropout_fwd,
    .bwd = dropout_bwd,
    .decode = dropout_decode,
    .describe = dropout_describe,
    .ops = {DT_OP_dropout_fwd, DT_OP_dropout_bwd, DT_OP_COUNT},
};
