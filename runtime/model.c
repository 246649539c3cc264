/*
 * model.c - layers and the models built from them.
 *
 * A layer is a small vtable (forward, backward) plus its shape, its
 * parameter tensors (indices into the model's parameter table) and its
 * output buffer in the activation arena. The model runs layers in order on
 * forward and in reverse on backward, with activation gradients
 * ping-ponging between two arena buffers. Building a model from the job
 * means appending layers; the step loop never sees layer kinds.
 */
#include "model.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/util.h"

struct layer;

struct fwd_args {
    int training;
    uint64_t seed;
    int64_t step;
    int64_t row0;
};

struct layer_vt {
    const char *kind;
    dt_status (*fwd)(dt_model_t *m, struct layer *l, const float *in, float *out, int64_t rows,
                     const struct fwd_args *a);
    /* din is NULL when nobody needs the input gradient (first layer). */
    dt_status (*bwd)(dt_model_t *m, struct layer *l, const float *in, const float *out,
                     const float *dout, float *din, int64_t rows);
};

struct layer {
    const struct layer_vt *vt;
    char name[32];
    int64_t in_dim, out_dim; /* features per sample */
    int w, b;                /* parameter indices, -1 if none */
    float p;                 /* dropout probability */
    int id;                  /* position, keys dropout randomness */
    float *out;              /* arena: max_rows x out_dim */
    struct fwd_args last;    /* the forward the next backward belongs to */
};

struct dt_model {
    dt_backend_t *be;
    const struct dt_ops *ops;
    struct dt_model_io io;
    int64_t in_dim, max_rows, max_dim;
    char init[DT_JOB_STR];
    char activation[DT_JOB_STR];
    int nlayers;
    int first_trainable; /* no layer before it needs an input gradient */
    struct layer layers[DT_MODEL_MAX_LAYERS];
    int nparams;
    struct dt_param_info params[DT_MODEL_MAX_PARAMS];
    size_t total;
    size_t arena_floats; /* the activation arena for max_rows rows */
    float *param_buf, *grad_buf;
    float *arena;             /* one allocation for everything below */
    float *x, *probs, *gbuf[2];
    int32_t *y;
};

/* ---- layer kinds --------------------------------------------------------- */

static float *pw(dt_model_t *m, int i) { return m->param_buf + m->params[i].offset; }
static float *gw(dt_model_t *m, int i) { return m->grad_buf + m->params[i].offset; }

static dt_status linear_fwd(dt_model_t *m, struct layer *l, const float *in, float *out,
                            int64_t rows, const struct fwd_args *a)
{
    dt_status st = m->ops->linear_fwd(m->be, out, in, pw(m, l->w), (int)rows, (int)l->in_dim,
                                      (int)l->out_dim);
    if (st == DT_OK && l->b >= 0)
        st = m->ops->bias_fwd(m->be, out, pw(m, l->b), (int)rows, (int)l->out_dim);
    return st;
}

static dt_status linear_bwd(dt_model_t *m, struct layer *l, const float *in, const float *out,
                            const float *dout, float *din, int64_t rows)
{
    dt_status st = DT_OK;
    if (l->b >= 0)
        st = m->ops->bias_bwd(m->be, gw(m, l->b), dout, (int)rows, (int)l->out_dim);
    if (st == DT_OK)
        st = m->ops->linear_bwd(m->be, din, gw(m, l->w), dout, in, pw(m, l->w), (int)rows,
                                (int)l->in_dim, (int)l->out_dim);
    return st;
}

static dt_status flatten_fwd(dt_model_t *m, struct layer *l, const float *in, float *out,
                             int64_t rows, const struct fwd_args *a)
{
    return m->ops->flatten_fwd(m->be, out, in, (size_t)(rows * l->out_dim));
}

static dt_status flatten_bwd(dt_model_t *m, struct layer *l, const float *in, const float *out,
                             const float *dout, float *din, int64_t rows)
{
    return din ? m->ops->flatten_bwd(m->be, din, dout, (size_t)(rows * l->out_dim)) : DT_OK;
}

#define ACT_PAIR(NAME, SAVED)                                                                      \
    static dt_status NAME##_fwd(dt_model_t *m, struct layer *l, const float *in, float *out,       \
                                int64_t rows, const struct fwd_args *a)                            \
    {                                                                                              \
        return m->ops->NAME##_fwd(m->be, out, in, (size_t)(rows * l->out_dim));                   \
    }                                                                                              \
    static dt_status NAME##_bwd(dt_model_t *m, struct layer *l, const float *in, const float *out, \
                                const float *dout, float *din, int64_t rows)                       \
    {                                                                                              \
        return din ? m->ops->NAME##_bwd(m->be, din, dout, SAVED, (size_t)(rows * l->out_dim))     \
                   : DT_OK;                                                                        \
    }
ACT_PAIR(relu, in)
ACT_PAIR(gelu, in)
ACT_PAIR(tanh, out)

static struct dt_rng_key dropout_key(const struct layer *l, const struct fwd_args *a)
{
    struct dt_rng_key k = {
        .seed = a->seed, .purpose = DT_RNG_DROPOUT, .stream = (uint32_t)l->id, .step = (uint64_t)a->step};
    return k;
}

static dt_status dropout_fwd(dt_model_t *m, struct layer *l, const float *in, float *out,
                             int64_t rows, const struct fwd_args *a)
{
    float p = a->training ? l->p : 0.0f;
    struct dt_rng_key k = dropout_key(l, a);
    return m->ops->dropout_fwd(m->be, out, in, (int)rows, (int)l->out_dim, p, &k,
                               (uint64_t)a->row0);
}

static dt_status dropout_bwd(dt_model_t *m, struct layer *l, const float *in, const float *out,
                             const float *dout, float *din, int64_t rows)
{
    if (!din)
        return DT_OK;
    struct dt_rng_key k = dropout_key(l, &l->last);
    float p = l->last.training ? l->p : 0.0f;
    return m->ops->dropout_bwd(m->be, din, dout, (int)rows, (int)l->out_dim, p, &k,
                               (uint64_t)l->last.row0);
}

static const struct layer_vt LINEAR = {"linear", linear_fwd, linear_bwd};
static const struct layer_vt FLATTEN = {"flatten", flatten_fwd, flatten_bwd};
static const struct layer_vt RELU = {"relu", relu_fwd, relu_bwd};
static const struct layer_vt GELU = {"gelu", gelu_fwd, gelu_bwd};
static const struct layer_vt TANH = {"tanh", tanh_fwd, tanh_bwd};
static const struct layer_vt DROPOUT = {"dropout", dropout_fwd, dropout_bwd};

/* ---- building ------------------------------------------------------------ */

static dt_status add_param(dt_model_t *m, const char *layer, const char *what, int ndim,
                           int64_t d0, int64_t d1, int64_t fan_in, int64_t fan_out, int *idx)
{
    if (m->nparams >= DT_MODEL_MAX_PARAMS)
        return dt_set_error(DT_ERR_UNSUPPORTED, "model has more than %d parameter tensors",
                            DT_MODEL_MAX_PARAMS);
    struct dt_param_info *p = &m->params[m->nparams];
    snprintf(p->name, sizeof p->name, "%s.%s", layer, what);
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim > 1 ? d1 : 1;
    int64_t numel;
    if (!dt_mul_i64(d0, p->shape[1], &numel))
        return dt_set_error(DT_ERR_USAGE,
                            "model.hidden: %s.%s would have %lld x %lld elements, "
                            "more than dtrain can count",
                            layer, what, (long long)d0, (long long)p->shape[1]);
    p->numel = (size_t)numel;
    p->fan_in = fan_in;
    p->fan_out = fan_out;
    *idx = m->nparams++;
    return DT_OK;
}

static dt_status add_layer(dt_model_t *m, const struct layer_vt *vt, const char *name,
                           int64_t in_dim, int64_t out_dim, struct layer **out)
{
    if (m->nlayers >= DT_MODEL_MAX_LAYERS)
        return dt_set_error(DT_ERR_UNSUPPORTED, "model has more than %d layers",
                            DT_MODEL_MAX_LAYERS);
    struct layer *l = &m->layers[m->nlayers];
    memset(l, 0, sizeof *l);
    l->vt = vt;
    snprintf(l->name, sizeof l->name, "%s", name);
    l->in_dim = in_dim;
    l->out_dim = out_dim;
    l->w = l->b = -1;
    l->id = m->nlayers++;
    if (out_dim > m->max_dim)
        m->max_dim = out_dim;
    if (out)
        *out = l;
    return DT_OK;
}

static dt_status add_linear(dt_model_t *m, const char *name, int64_t in_dim, int64_t out_dim)
{
    struct layer *l = NULL;
    dt_status st = add_layer(m, &LINEAR, name, in_dim, out_dim, &l);
    if (st == DT_OK)
        st = add_param(m, name, "weight", 2, out_dim, in_dim, in_dim, out_dim, &l->w);
    if (st == DT_OK)
        st = add_param(m, name, "bias", 1, out_dim, 1, in_dim, out_dim, &l->b);
    return st;
}

static const struct layer_vt *activation_vt(const char *name)
{
    if (strcmp(name, "relu") == 0)
        return &RELU;
    if (strcmp(name, "gelu") == 0)
        return &GELU;
    if (strcmp(name, "tanh") == 0)
        return &TANH;
    return NULL;
}

static dt_status build_mlp(dt_model_t *m, const struct dt_job *job)
{
    dt_status st = DT_OK;
    int64_t dim = m->in_dim;
    const struct layer_vt *act = activation_vt(job->model.activation);
    if (!act)
        return dt_set_error(DT_ERR_USAGE, "model.activation: unknown activation '%s'",
                            job->model.activation);
    if (m->io.ndim > 1)
        DT_CHECK(add_layer(m, &FLATTEN, "flatten", dim, dim, NULL));
    for (int i = 0; i < job->model.nhidden; i++) {
        char name[32];
        snprintf(name, sizeof name, "fc%d", i + 1);
        DT_CHECK(add_linear(m, name, dim, job->model.hidden[i]));
        dim = job->model.hidden[i];
        snprintf(name, sizeof name, "%s%d", act->kind, i + 1);
        DT_CHECK(add_layer(m, act, name, dim, dim, NULL));
        if (job->model.dropout > 0) {
            struct layer *l = NULL;
            snprintf(name, sizeof name, "dropout%d", i + 1);
            DT_CHECK(add_layer(m, &DROPOUT, name, dim, dim, &l));
            l->p = (float)job->model.dropout;
        }
    }
    char name[32];
    snprintf(name, sizeof name, "fc%d", job->model.nhidden + 1);
    DT_CHECK(add_linear(m, name, dim, m->io.num_classes));
out:
    return st;
}

/* Offsets in reverse layer order: backward finishes the last layer first.
 * (Each tensor has at most 2^31 x 2^20 elements and there are at most
 * DT_MODEL_MAX_PARAMS of them, so the sum fits.) */
static void layout_params(dt_model_t *m)
{
    size_t off = 0;
    m->first_trainable = m->nlayers;
    for (int i = m->nlayers - 1; i >= 0; i--)
        if (m->layers[i].w >= 0 || m->layers[i].b >= 0)
            m->first_trainable = i;
    for (int i = m->nlayers - 1; i >= 0; i--) {
        const int idx[2] = {m->layers[i].w, m->layers[i].b};
        for (int k = 0; k < 2; k++) {
            if (idx[k] < 0)
                continue;
            m->params[idx[k]].offset = off;
            off += m->params[idx[k]].numel;
        }
    }
    m->total = off;
}

/* Floats of the activation arena: per row, the input, a label, the class
 * probabilities, two gradient buffers of the widest layer and every
 * layer's output. */
static dt_status size_arena(dt_model_t *m)
{
    int64_t per_row = m->in_dim + 1 + m->io.num_classes + 2 * m->max_dim, floats;
    for (int i = 0; i < m->nlayers; i++)
        per_row += m->layers[i].out_dim;
    if (!dt_mul_i64(m->max_rows, per_row, &floats) || (uint64_t)floats > SIZE_MAX / sizeof(float))
        return dt_set_error(DT_ERR_USAGE,
                            "the activations of %lld rows (train.micro_batch, or the evaluation "
                            "batch per rank) x %lld values per row are more than memory can hold; "
                            "lower train.micro_batch",
                            (long long)m->max_rows, (long long)per_row);
    m->arena_floats = (size_t)floats;
    return DT_OK;
}

static dt_status alloc_buffers(dt_model_t *m)
{
    dt_status st;
    size_t rows = (size_t)m->max_rows;
    st = dt_backend_alloc(m->be, m->total * sizeof(float), (void **)&m->param_buf);
    if (st == DT_OK)
        st = dt_backend_alloc(m->be, m->total * sizeof(float), (void **)&m->grad_buf);
    if (st == DT_OK)
        st = dt_backend_alloc(m->be, m->arena_floats * sizeof(float), (void **)&m->arena);
    if (st != DT_OK)
        return dt_error_context(st, "allocating a model of %zu parameters for %zu rows",
                                m->total, rows);
    float *p = m->arena;
    m->x = p, p += rows * (size_t)m->in_dim;
    m->y = (int32_t *)p, p += rows;
    m->probs = p, p += rows * (size_t)m->io.num_classes;
    m->gbuf[0] = p, p += rows * (size_t)m->max_dim;
    m->gbuf[1] = p, p += rows * (size_t)m->max_dim;
    for (int i = 0; i < m->nlayers; i++)
        m->layers[i].out = p, p += rows * (size_t)m->layers[i].out_dim;
    return DT_OK;
}

/* The layers, parameter layout and arena size of the job's model, nothing
 * allocated yet. Every dimension stays within what the ops take (int). */
static dt_status build(dt_model_t *m, const struct dt_job *job, const struct dt_model_io *io,
                       int64_t max_rows)
{
    dt_status st;
    m->io = *io;
    m->max_rows = max_rows;
    m->in_dim = 1;
    for (int i = 0; i < io->ndim; i++)
        if (!dt_mul_i64(m->in_dim, io->shape[i], &m->in_dim) || m->in_dim > INT_MAX)
            return dt_set_error(DT_ERR_BAD_DATA,
                                "the dataset's samples have more than %d values; a linear layer "
                                "takes at most that many inputs",
                                INT_MAX);
    if (max_rows < 1 || max_rows > INT_MAX)
        return dt_set_error(DT_ERR_USAGE,
                            "train.micro_batch (or the evaluation batch per rank): %lld rows is "
                            "outside 1 to %d",
                            (long long)max_rows, INT_MAX);
    snprintf(m->init, sizeof m->init, "%s", job->model.init);
    snprintf(m->activation, sizeof m->activation, "%s", job->model.activation);
    if (strcmp(job->model.type, "mlp") != 0)
        return dt_set_error(DT_ERR_UNSUPPORTED,
                            "model.type '%s' is not implemented in this version (available: mlp)",
                            job->model.type);
    DT_CHECK(build_mlp(m, job));
    layout_params(m);
    st = size_arena(m);
out:
    return st;
}

dt_status dt_model_measure(const struct dt_job *job, const struct dt_model_io *io, int64_t max_rows,
                           struct dt_model_size *out)
{
    dt_model_t *m = NULL;
    dt_status st = dt_calloc(1, sizeof *m, "the model", (void **)&m);
    if (st == DT_OK)
        st = build(m, job, io, max_rows);
    if (st == DT_OK) {
        out->params = m->total;
        out->arena_bytes = (uint64_t)m->arena_floats * sizeof(float);
    }
    free(m);
    return st;
}

dt_status dt_model_create(const struct dt_job *job, const struct dt_model_io *io, dt_backend_t *be,
                          int64_t max_rows, dt_model_t **out)
{
    dt_status st;
    dt_model_t *m = NULL;
    *out = NULL;
    DT_CHECK(dt_calloc(1, sizeof *m, "the model", (void **)&m));
    m->be = be;
    m->ops = dt_backend_ops(be);
    DT_CHECK(build(m, job, io, max_rows));
    DT_CHECK(alloc_buffers(m));
    *out = m;
    m = NULL;
out:
    dt_model_destroy(m);
    return st;
}

void dt_model_destroy(dt_model_t *m)
{
    if (!m)
        return;
    dt_backend_free(m->be, m->param_buf);
    dt_backend_free(m->be, m->grad_buf);
    dt_backend_free(m->be, m->arena);
    free(m);
}

/* ---- initialisation ------------------------------------------------------ */

/* Gain for the activation that follows a layer (He et al. for ReLU/GELU,
 * 5/3 for tanh as in common practice). */
static double activation_gain(const char *act)
{
    if (strcmp(act, "tanh") == 0)
        return 5.0 / 3.0;
    return sqrt(2.0);
}

dt_status dt_model_init_params(dt_model_t *m, uint64_t seed)
{
    float *host = NULL;
    dt_status st = dt_malloc(m->total * sizeof(float), "initial parameters", (void **)&host);
    if (st != DT_OK)
        return st;
    double gain = activation_gain(m->activation);
    for (int i = 0; i < m->nparams; i++) {
        const struct dt_param_info *p = &m->params[i];
        float *dst = host + p->offset;
        if (p->ndim == 1) {
            memset(dst, 0, p->numel * sizeof(float));
            continue;
        }
        /* uniform(-bound, bound): variance bound^2 / 3 */
        double bound = strcmp(m->init, "xavier") == 0
                           ? sqrt(6.0 / (double)(p->fan_in + p->fan_out))
                           : gain * sqrt(3.0 / (double)p->fan_in);
        struct dt_rng_key key = {.seed = seed, .purpose = DT_RNG_INIT, .stream = (uint32_t)i};
        for (size_t e = 0; e < p->numel; e++)
            dst[e] = (float)((2.0 * dt_rng_uniform(&key, e) - 1.0) * bound);
    }
    st = dt_model_set_params(m, host);
    free(host);
    return st;
}

/* ---- running ------------------------------------------------------------- */

dt_status dt_model_forward(dt_model_t *m, const float *x, const int32_t *y, int64_t rows,
                           int training, uint64_t seed, int64_t step, int64_t row0,
                           double *loss_sum, int64_t *correct)
{
    dt_status st = DT_OK;
    if (rows < 1 || rows > m->max_rows)
        return dt_set_error(DT_ERR_INVALID_ARG, "batch of %lld rows; the model was sized for 1..%lld",
                            (long long)rows, (long long)m->max_rows);
    struct fwd_args a = {.training = training, .seed = seed, .step = step, .row0 = row0};
    DT_CHECK(dt_backend_copy(m->be, m->x, x, (size_t)(rows * m->in_dim) * sizeof(float),
                             DT_COPY_H2D));
    DT_CHECK(dt_backend_copy(m->be, m->y, y, (size_t)rows * sizeof(int32_t), DT_COPY_H2D));
    const float *in = m->x;
    for (int i = 0; i < m->nlayers; i++) {
        struct layer *l = &m->layers[i];
        l->last = a;
        st = l->vt->fwd(m, l, in, l->out, rows, &a);
        if (st != DT_OK)
            return dt_error_context(st, "forward of layer %s (%s)", l->name, l->vt->kind);
        in = l->out;
    }
    DT_CHECK(m->ops->softmax_xent_fwd(m->be, m->probs, in, m->y, (int)rows,
                                      (int)m->io.num_classes, loss_sum, correct));
out:
    return st;
}

/* End of layer i's parameters in the flat buffers: with the reversed
 * layout, layers i.. occupy [0, end). */
static size_t grads_done_after(const dt_model_t *m, int i)
{
    size_t end = 0;
    const int idx[2] = {m->layers[i].w, m->layers[i].b};
    for (int k = 0; k < 2; k++)
        if (idx[k] >= 0 && m->params[idx[k]].offset + m->params[idx[k]].numel > end)
            end = m->params[idx[k]].offset + m->params[idx[k]].numel;
    return end;
}

dt_status dt_model_backward(dt_model_t *m, int64_t rows, float scale,
                            const struct dt_grad_hook *hook)
{
    dt_status st;
    int cur = 0;
    st = m->ops->softmax_xent_bwd(m->be, m->gbuf[cur], m->probs, m->y, (int)rows,
                                  (int)m->io.num_classes, scale);
    for (int i = m->nlayers - 1; i >= 0 && st == DT_OK; i--) {
        struct layer *l = &m->layers[i];
        const float *in = i > 0 ? m->layers[i - 1].out : m->x;
        float *din = i > m->first_trainable ? m->gbuf[1 - cur] : NULL;
        st = l->vt->bwd(m, l, in, l->out, m->gbuf[cur], din, rows);
        if (st != DT_OK)
            return dt_error_context(st, "backward of layer %s (%s)", l->name, l->vt->kind);
        size_t done = grads_done_after(m, i);
        if (hook && done > 0 && (st = hook->ready(hook->ctx, done)) != DT_OK)
            return st;
        cur = 1 - cur;
    }
    return st;
}

dt_status dt_model_zero_grads(dt_model_t *m) { return m->ops->fill(m->be, m->grad_buf, m->total, 0.0f); }

size_t dt_model_num_params(const dt_model_t *m) { return m->total; }
int dt_model_param_count(const dt_model_t *m) { return m->nparams; }
const struct dt_param_info *dt_model_param(const dt_model_t *m, int i) { return &m->params[i]; }
float *dt_model_params(dt_model_t *m) { return m->param_buf; }
float *dt_model_grads(dt_model_t *m) { return m->grad_buf; }
dt_backend_t *dt_model_backend(dt_model_t *m) { return m->be; }

double dt_model_flops_per_sample(const dt_model_t *m, int training)
{
    double f = 0;
    for (int i = 0; i < m->nlayers; i++) {
        const struct layer *l = &m->layers[i];
        if (l->vt != &LINEAR)
            continue;
        double gemm = 2.0 * (double)l->in_dim * (double)l->out_dim;
        f += gemm; /* forward */
        if (training) /* weight gradient, and the input gradient unless first */
            f += i > m->first_trainable ? 2 * gemm : gemm;
    }
    return f;
}

void dt_model_describe(const dt_model_t *m, void (*line)(void *ctx, const char *s), void *ctx)
{
    char buf[160];
    for (int i = 0; i < m->nlayers; i++) {
        const struct layer *l = &m->layers[i];
        if (l->vt == &LINEAR)
            snprintf(buf, sizeof buf, "  %-10s %-8s %lld -> %lld", l->name, l->vt->kind,
                     (long long)l->in_dim, (long long)l->out_dim);
        else if (l->vt == &DROPOUT)
            snprintf(buf, sizeof buf, "  %-10s %-8s p=%.3g", l->name, l->vt->kind, (double)l->p);
        else
            snprintf(buf, sizeof buf, "  %-10s %-8s", l->name, l->vt->kind);
        line(ctx, buf);
    }
}

dt_status dt_model_get_params(dt_model_t *m, float *host)
{
    return dt_backend_copy(m->be, host, m->param_buf, m->total * sizeof(float), DT_COPY_D2H);
}

dt_status dt_model_set_params(dt_model_t *m, const float *host)
{
    return dt_backend_copy(m->be, m->param_buf, host, m->total * sizeof(float), DT_COPY_H2D);
}

dt_status dt_model_get_grads(dt_model_t *m, float *host)
{
    return dt_backend_copy(m->be, host, m->grad_buf, m->total * sizeof(float), DT_COPY_D2H);
}
