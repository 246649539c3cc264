/*
 * transformer.c - the layers a GPT-style language model adds to the
 * registry: token embedding, learned position embedding and multi-head
 * self-attention. (Layer norm, GELU, linear, dropout and the residual sums
 * are the general kinds; model_expand.c puts them together as model.type
 * gpt.)
 *
 * embedding:     (T) token ids, held as floats (exact below 2^24), to (T, dim)
 *                rows of a (vocab, dim) table.
 * pos_embedding: (T, C) + a learned (T, C) table: position t of every sample
 *                gets row t. It is the linear layer's bias op over T * C
 *                values, so it needs no op of its own.
 * attention:     (T, 3C) packed queries, keys and values (a linear layer of
 *                out 3C in front) to (T, C): softmax(q k^T / sqrt(C/heads))
 *                v per head, causal by default. It keeps one log-sum-exp per
 *                (head, position) for backward, never the T x T scores, so
 *                its memory grows linearly with T.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "layer.h"

/* ---- embedding ------------------------------------------------------------ */

struct emb_cfg {
    int64_t vocab, dim, T;
};

static dt_status emb_build(struct dt_layer *l, const struct dt_layer_spec *spec,
                           const struct dt_job *job, int64_t num_classes)
{
    static const char *const known[] = {"vocab", "dim", "init_std", NULL};
    struct emb_cfg *c = (struct emb_cfg *)l->cfg;
    char s[64];
    dt_status st;
    DT_CHECK(dt_layer_known(l, spec, known));
    const char *vocab = NULL;
    for (int i = 0; i < spec->nargs; i++)
        if (strcmp(spec->args[i].key, "vocab") == 0)
            vocab = spec->args[i].value;
    if (!vocab || strcmp(vocab, "classes") == 0)
        c->vocab = num_classes;
    else
        DT_CHECK(dt_layer_int(l, spec, "vocab", 0, 2, (int64_t)1 << 24, &c->vocab));
    if (c->vocab < num_classes) {
        st = dt_set_error(DT_ERR_USAGE,
                          "%s: vocab %lld is smaller than the dataset's vocabulary (%lld tokens)",
                          l->where, (long long)c->vocab, (long long)num_classes);
        goto out;
    }
    DT_CHECK(dt_layer_int(l, spec, "dim", 0, 1, DT_JOB_MAX_WIDTH, &c->dim));
    if (c->dim == 0) {
        st = dt_set_error(DT_ERR_USAGE, "%s: embedding needs dim (the vector per token)", l->where);
        goto out;
    }
    if (l->in.ndim != 1) {
        st = dt_set_error(DT_ERR_USAGE,
                          "%s: embedding takes a sequence of token ids (T), not %s; it reads a "
                          "language-model dataset's windows",
                          l->where, dt_shape_format(&l->in, s, sizeof s));
        goto out;
    }
    c->T = l->in.dim[0];
    l->out = dt_shape_make(2, c->T, c->dim, 0, 0);
    dt_layer_param(l, "weight", dt_shape_make(2, c->vocab, c->dim, 0, 0), DT_INIT_NORMAL,
                   DT_GROUP_WEIGHT, c->vocab, c->dim);
    DT_CHECK(dt_layer_init_std(l, spec, 0.02));
out:
    return st;
}

static dt_status emb_fwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    const struct emb_cfg *c = (const struct emb_cfg *)l->cfg;
    return x->ops->embedding_fwd(x->be, x->out, x->in, x->p[0], (int)(x->rows * c->T),
                                 (int)c->vocab, (int)c->dim);
}

static dt_status emb_decode(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    const struct emb_cfg *c = (const struct emb_cfg *)l->cfg;
    return x->ops->embedding_fwd(x->be, x->out, x->in, x->p[0], (int)x->positions, (int)c->vocab,
                                 (int)c->dim);
}

static dt_status emb_bwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    const struct emb_cfg *c = (const struct emb_cfg *)l->cfg;
    return x->ops->embedding_bwd(x->be, x->g[0], x->dout, x->in, (int)(x->rows * c->T),
                                 (int)c->vocab, (int)c->dim);
}

static void emb_describe(const struct dt_layer *l, char *buf, size_t len)
{
    const struct emb_cfg *c = (const struct emb_cfg *)l->cfg;
    snprintf(buf, len, "vocab %lld", (long long)c->vocab);
}

const struct dt_layer_kind dt_layer_embedding = {
    .name = "embedding",
    .doc = "token embedding: a sequence of token ids (T) to (T, dim) rows of a (vocab, dim) "
           "table (torch.nn.Embedding)",
    .settings = "dim, vocab: classes (the dataset's vocabulary), init_std: 0.02",
    .build = emb_build,
    .fwd = emb_fwd,
    .bwd = emb_bwd,
    .decode = emb_decode,
    .describe = emb_describe,
    .ops = {DT_OP_embedding_fwd, DT_OP_embedding_bwd, DT_OP_COUNT},
};

/* ---- position embedding ----------------------------------------------------- */

static dt_status pos_build(struct dt_layer *l, const struct dt_layer_spec *spec,
                           const struct dt_job *job, int64_t num_classes)
{
    static const char *const known[] = {"init_std", NULL};
    char s[64];
    dt_status st;
    DT_CHECK(dt_layer_known(l, spec, known));
    if (l->in.ndim != 2) {
        st = dt_set_error(DT_ERR_USAGE,
                          "%s: pos_embedding takes (T, C) vectors per position, not %s", l->where,
                          dt_shape_format(&l->in, s, sizeof s));
        goto out;
    }
    l->out = l->in;
    dt_layer_param(l, "weight", l->in, DT_INIT_NORMAL, DT_GROUP_WEIGHT, l->in.dim[1], l->in.dim[1]);
    DT_CHECK(dt_layer_init_std(l, spec, 0.02));
out:
    return st;
}

/* out = in + the table, one pass over each sample (the sums of a copy
 * followed by a bias add, without the copy). */
static dt_status pos_fwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    size_t n = (size_t)dt_shape_numel(&l->in);
    dt_status st = DT_OK;
    for (int64_t r = 0; r < x->rows && st == DT_OK; r++)
        st = x->ops->add(x->be, x->out + (size_t)r * n, x->in + (size_t)r * n, x->p[0], n);
    return st;
}

/* The table's gradient; the input gradient is dout itself, which the
 * model hands on (grad_through). */
static dt_status pos_bwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    int n = (int)dt_shape_numel(&l->in);
    return x->ops->bias_bwd(x->be, x->g[0], x->dout, (int)x->rows, n);
}

/* Positions pos.. get the table's rows pos.. */
static dt_status pos_decode(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    size_t per = dt_layer_decode_numel(&l->in, 1);
    return x->ops->add(x->be, x->out, x->in, x->p[0] + (size_t)x->pos * per,
                       per * (size_t)x->positions);
}

/* The backend's scratch for the table gradient's column sums. */
static dt_status pos_workspace(struct dt_layer *l, dt_backend_t *be, int64_t max_rows)
{
    dt_status st = dt_backend_reserve(be, DT_OP_bias_bwd, max_rows, dt_shape_numel(&l->in), 0);
    return st != DT_OK ? dt_error_context(st, "%s", l->where) : DT_OK;
}

const struct dt_layer_kind dt_layer_pos_embedding = {
    .name = "pos_embedding",
    .doc = "learned position embedding: adds a (T, C) table to every sample's (T, C) input",
    .settings = "init_std: 0.02",
    .build = pos_build,
    .fwd = pos_fwd,
    .bwd = pos_bwd,
    .decode = pos_decode,
    .workspace = pos_workspace,
    .grad_through = 1,
    .ops = {DT_OP_add, DT_OP_bias_bwd, DT_OP_COUNT},
};

/* ---- attention ------------------------------------------------------------------ */

struct attn_cfg {
    int64_t T, C, heads;
    int causal;
};

static dt_status attn_build(struct dt_layer *l, const struct dt_layer_spec *spec,
                            const struct dt_job *job, int64_t num_classes)
{
    static const char *const known[] = {"heads", "causal", NULL};
    struct attn_cfg *c = (struct attn_cfg *)l->cfg;
    char s[64];
    dt_status st;
    DT_CHECK(dt_layer_known(l, spec, known));
    DT_CHECK(dt_layer_int(l, spec, "heads", 1, 1, 4096, &c->heads));
    DT_CHECK(dt_layer_bool(l, spec, "causal", 1, &c->causal));
    if (l->in.ndim != 2 || l->in.dim[1] % (3 * c->heads) != 0) {
        st = dt_set_error(DT_ERR_USAGE,
                          "%s: attention takes (T, 3C) packed queries, keys and values with C a "
                          "multiple of heads (%lld), not %s; put a linear layer of out 3C in "
                          "front",
                          l->where, (long long)c->heads, dt_shape_format(&l->in, s, sizeof s));
        goto out;
    }
    c->T = l->in.dim[0];
    c->C = l->in.dim[1] / 3;
    l->out = dt_shape_make(2, c->T, c->C, 0, 0);
    l->saved_per_row = c->heads * c->T; /* the log-sum-exp per head and position */
    /* q k^T and p v, each 2 T^2 C, counted whole even when causal (as the
     * usual model-FLOPs figures count them) */
    l->flops = 4.0 * (double)c->T * (double)c->T * (double)c->C;
out:
    return st;
}

static dt_status attn_workspace(struct dt_layer *l, dt_backend_t *be, int64_t max_rows)
{
    const struct attn_cfg *c = (const struct attn_cfg *)l->cfg;
    size_t bytes = 0;
    int Dh = (int)(c->C / c->heads);
    const struct dt_ops *ops = be ? dt_backend_ops(be) : dt_backend_host_ops();
    dt_status st = ops->attention_workspace(be, (int)max_rows, (int)c->T, (int)c->heads, Dh,
                                            c->causal, &bytes);
    if (st != DT_OK)
        return dt_error_context(st, "%s: sizing the attention's workspace", l->where);
    l->ws_fixed = bytes;
    l->ws_per_row = 0;
    return DT_OK;
}

static dt_status attn_fwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    const struct attn_cfg *c = (const struct attn_cfg *)l->cfg;
    return x->ops->attention_fwd(x->be, x->out, x->saved, x->in, (int)x->rows, (int)c->T,
                                 (int)c->heads, (int)(c->C / c->heads), c->causal, x->ws,
                                 x->ws_bytes);
}

static dt_status attn_bwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    const struct attn_cfg *c = (const struct attn_cfg *)l->cfg;
    if (!x->din)
        return DT_OK;
    return x->ops->attention_bwd(x->be, x->din, x->dout, x->in, x->out, x->saved, (int)x->rows,
                                 (int)c->T, (int)c->heads, (int)(c->C / c->heads), c->causal, x->ws,
                                 x->ws_bytes);
}

/* The keys and values of every position so far: (T, C) each. */
static size_t attn_decode_cache(const struct dt_layer *l)
{
    const struct attn_cfg *c = (const struct attn_cfg *)l->cfg;
    return (size_t)(2 * c->T * c->C);
}

static dt_status attn_decode(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    const struct attn_cfg *c = (const struct attn_cfg *)l->cfg;
    if (!c->causal)
        return dt_set_error(DT_ERR_USAGE,
                            "%s: attention without the causal mask cannot be decoded position by "
                            "position",
                            l->where);
    return x->ops->attention_decode(x->be, x->out, x->cache, x->cache + c->T * c->C, x->in,
                                    (int)x->pos, (int)x->positions, (int)c->T, (int)c->heads,
                                    (int)(c->C / c->heads));
}

static void attn_describe(const struct dt_layer *l, char *buf, size_t len)
{
    const struct attn_cfg *c = (const struct attn_cfg *)l->cfg;
    snprintf(buf, len, "%lld heads%s", (long long)c->heads, c->causal ? ", causal" : "");
}

const struct dt_layer_kind dt_layer_attention = {
    .name = "attention",
    .doc = "multi-head scaled dot-product self-attention over (T, 3C) packed queries, keys and "
           "values, to (T, C); causal: each position sees itself and earlier ones",
    .settings = "heads: 1, causal: true",
    .build = attn_build,
    .fwd = attn_fwd,
    .bwd = attn_bwd,
    .decode = attn_decode,
    .decode_cache = attn_decode_cache,
    .describe = attn_describe,
    .workspace = attn_workspace,
    .ops = {DT_OP_attention_workspace, DT_OP_attention_fwd, DT_OP_attention_bwd,
            DT_OP_attention_decode, DT_OP_COUNT},
};
