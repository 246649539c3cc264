/*
 * model.c - the graph of layers a job's model is, and running it.
 *
 * Building turns the layer list (dt_model_expand) into nodes: each node
 * is a layer of some kind (runtime/model/layers/) with the ids of the nodes it
 * reads (-1: the model input); several inputs are summed into a buffer of
 * the node's own first. Then one planning pass lays out everything in one
 * activation arena: the input and labels, each node's output, the sums,
 * what layers keep for backward, the gradients of activations, scratch.
 *
 * Gradients of activations live in "slots" reused as backward moves on:
 * a node's output gradient is live from the backward of its last consumer
 * to its own backward, so a chain needs two slots, as a ping-pong would.
 * The first consumer to finish writes the gradient, later ones add to it
 * (through a scratch buffer, as ops write input gradients), so a shared
 * input's gradient is the sum of its consumers'.
 *
 * Views: a node of a kind whose output is its input's values in the same
 * order (flatten, add) has no buffer of its own; its output is its input's
 * (the sum, for several inputs), and backward hands its output gradient to
 * its producers. Not where the input lives in a recomputed block's scratch
 * or the node is recomputed itself: those copy. A relu that alone reads
 * the output of a kind that can apply it (batchnorm: fuses_relu) is a view
 * too, folded in: the producer writes the ReLU's output and takes its
 * gradient. A kind whose input gradient is its output gradient
 * (pos_embedding: grad_through) runs its backward for its parameters
 * alone and the model hands the gradient on. A single producer that feeds
 * nothing but such a node or a view shares that node's gradient slot, so
 * the gradient is handed on in place.
 *
 * An activation whose gradient is dy times one expression (gelu: a kind
 * with keeps_grad) and that alone reads the output of a layer whose
 * backward does not read it (linear: output_free) writes that expression
 * over its input as it runs forward, and its backward is one multiply: the
 * same bits, without evaluating the activation again (keeps_grad below).
 *
 * Recomputation (model.recompute): the nodes of a block named there,
 * except its last, write their outputs into one scratch region instead of
 * their own buffers; backward, on reaching the block's last node, runs
 * their forward again (same keys, no running-statistics updates) and then
 * their backward, so the gradients are bit-identical.
 */
#include "model.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/alloc.h"

#define MAX_INPUTS 8
#define ALIGN 16 /* floats: every arena region starts on 64 bytes */
#define PARAM_ALIGN (DT_MODEL_ALIGN_BYTES / sizeof(float)) /* floats */

struct node {
    struct dt_layer l;
    int nin;
    int in[MAX_INPUTS]; /* producers; -1 = the model input */
    int pidx[DT_LAYER_MAX_PARAMS], bidx[DT_LAYER_MAX_BUFFERS];
    int owns[DT_LAYER_MAX_PARAMS]; /* 0: a tied parameter an earlier node owns */
    int block;      /* recompute block (index into the block table), -1 none */
    int inner;      /* output dropped after forward and recomputed */
    int view;       /* output is its input's buffer (a view kind, see plan_views) */
    int needs_grad; /* its output gradient is needed (a parameter at or before it) */
    int want_din;   /* an input needs a gradient */
    int nconsumers, last_consumer;
    int slot;                           /* gradient slot of its output, -1 none */
    size_t stat_off;                    /* its batch statistics in a forward's record */
    size_t out_off, sum_off, saved_off; /* arena offsets, floats (out_off: in the recompute
                                           scratch when inner) */
    float *out, *sum, *saved;
};

struct block {
    char name[DT_LAYER_NAME];
    int first, last; /* node range */
    int on;          /* recomputed */
    size_t scratch;  /* floats per row of its inner outputs */
};

struct dt_model {
    dt_backend_t *be;
    const struct dt_ops *ops;
    struct dt_model_io io;
    struct dt_shape in_shape;
    int64_t in_numel, max_rows;
    int64_t labels_per_row; /* the loss layer's */
    char init[DT_JOB_STR];
    char activation[DT_JOB_STR];
    int nnodes;
    struct node *nodes;
    int nblocks;
    struct block *blocks;
    int nparams, nbuffers;
    struct dt_param_info *params, *buffers;
    size_t total, buf_total; /* floats per flat buffer, padding included */
    size_t param_numel;      /* the parameter tensors' elements alone */
    float *param_buf, *grad_buf, *buf_buf;
    /* arena plan (floats) */
    size_t arena_floats, arena_full;
    /* the input batch in DT_BACKEND_INPUT_SLOTS slots, taken in turn, so
     * that the next batch's upload need not wait for this one's backward */
    size_t x_off[DT_BACKEND_INPUT_SLOTS], y_off[DT_BACKEND_INPUT_SLOTS];
    size_t rc_off, scratch_off, ws_off, slots_off;
    size_t ws_bytes;
    int nslots;
    size_t *slot_size; /* floats per row */
    size_t *slot_off;
    float *arena, *x, *rc, *scratch; /* x: the slot of the last forward */
    int32_t *y;
    int input_slot; /* the slot the next forward uploads into */
    void *ws;
    int *written; /* backward: whether a node's output gradient holds a value yet */
    double *host;
    size_t host_len;
    struct dt_model_sync sync;
    int has_sync;
    size_t stat_len; /* doubles of one training forward's statistics record */
    double *stat_out; /* where the next training forwards report them; NULL: not reported */
    /* the forward the next backward belongs to */
    int64_t last_rows, last_step, last_row0;
    uint64_t last_seed;
    int last_training;
    /* sharded parameters: where each layer's are (dt_model_set_param_hook) */
    struct dt_param_hook phook;
    int dry; /* dt_model_replay: the hooks' calls, no compute */
    /* decoding (dt_model_decode_open): the layers' caches, one allocation */
    float *dcache;
    size_t *dcache_off; /* per node, into dcache */
    int64_t dec_T;      /* positions of the sequence */
    double dec_loss;    /* the loss layer's totals, unused (a backend may add to them later) */
    int64_t dec_correct;
};

static size_t up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

static size_t param_up(size_t n) { return (n + PARAM_ALIGN - 1) / PARAM_ALIGN * PARAM_ALIGN; }

static size_t numel(const struct dt_shape *s) { return (size_t)dt_shape_numel(s); }

/* ---- building: nodes ------------------------------------------------------ */

static int find_node(const dt_model_t *m, const char *name, size_t len)
{
    if (len == 1 && name[0] == 'x')
        return -1;
    for (int i = m->nnodes - 1; i >= 0; i--)
        if (strlen(m->nodes[i].l.name) == len && strncmp(m->nodes[i].l.name, name, len) == 0)
            return i;
    return -2;
}

static dt_status resolve_inputs(dt_model_t *m, struct node *n, const char *inputs,
                                const char *where)
{
    char s1[64], s2[64];
    n->nin = 0;
    if (!inputs[0]) {
        n->in[n->nin++] = m->nnodes - 1; /* the previous node, or -1: the input */
    } else {
        for (const char *p = inputs; *p;) {
            size_t len = strcspn(p, ",");
            int id = find_node(m, p, len);
            if (id == -2)
                return dt_set_error(DT_ERR_USAGE,
                                    "%s: inputs: no earlier layer is named '%.*s' (a layer reads "
                                    "layers above it, or x for the model input)",
                                    where, (int)len, p);
            if (n->nin == MAX_INPUTS)
                return dt_set_error(DT_ERR_USAGE, "%s: inputs: at most %d", where, MAX_INPUTS);
            n->in[n->nin++] = id;
            p += len + (p[len] == ',');
        }
    }
    const struct dt_shape *first = NULL;
    for (int k = 0; k < n->nin; k++) {
        const struct dt_shape *s = n->in[k] < 0 ? &m->in_shape : &m->nodes[n->in[k]].l.out;
        if (n->in[k] >= 0 && m->nodes[n->in[k]].l.loss)
            return dt_set_error(DT_ERR_USAGE, "%s: inputs: a loss layer's output is no input",
                                where);
        if (first && !dt_shape_equal(first, s))
            return dt_set_error(
                DT_ERR_USAGE, "%s: inputs: summed inputs must have one shape, got %s and %s", where,
                dt_shape_format(first, s1, sizeof s1), dt_shape_format(s, s2, sizeof s2));
        first = s;
    }
    n->l.in = *first;
    return DT_OK;
}

static dt_status add_tensor(dt_model_t *m, const struct node *n, const struct dt_tensor_decl *d,
                            int buffer, int *idx)
{
    int *count = buffer ? &m->nbuffers : &m->nparams;
    struct dt_param_info *t = buffer ? &m->buffers[*count] : &m->params[*count];
    if (*count >= DT_MODEL_MAX_PARAMS)
        return dt_set_error(DT_ERR_USAGE, "the model has more than %d %s tensors",
                            DT_MODEL_MAX_PARAMS, buffer ? "buffer" : "parameter");
    int64_t ne = dt_shape_numel(&d->shape);
    if (ne < 1 || ne > ((int64_t)1 << 40))
        return dt_set_error(DT_ERR_USAGE, "%s: %s.%s would have %lld elements", n->l.where,
                            n->l.name, d->what, (long long)ne);
    memset(t, 0, sizeof *t);
    if (strlen(n->l.name) + 1 + strlen(d->what) >= sizeof t->name)
        return dt_set_error(DT_ERR_USAGE,
                            "%s: the tensor name %s.%s is longer than %zu characters; shorten "
                            "the layer's name",
                            n->l.where, n->l.name, d->what, sizeof t->name - 1);
    snprintf(t->name, sizeof t->name, "%.47s.%.15s", n->l.name, d->what);
    t->numel = (size_t)ne;
    t->shape = d->shape;
    t->fan_in = d->fan_in;
    t->fan_out = d->fan_out;
    t->init = d->init;
    t->init_std = d->init_std;
    t->group = d->group;
    *idx = (*count)++;
    return DT_OK;
}

/* A tied parameter: the earlier parameter of that name, same shape. */
static dt_status tie_tensor(dt_model_t *m, const struct node *n, const struct dt_tensor_decl *d,
                            int *idx)
{
    char a[64], b[64];
    for (int i = 0; i < m->nparams; i++) {
        if (strcmp(m->params[i].name, d->tie) != 0)
            continue;
        if (!dt_shape_equal(&m->params[i].shape, &d->shape))
            return dt_set_error(DT_ERR_USAGE,
                                "%s: %s.%s is tied to %s, but its shape is %s and that one's %s",
                                n->l.where, n->l.name, d->what, d->tie,
                                dt_shape_format(&d->shape, a, sizeof a),
                                dt_shape_format(&m->params[i].shape, b, sizeof b));
        *idx = i;
        return DT_OK;
    }
    return dt_set_error(DT_ERR_USAGE,
                        "%s: tie: no earlier layer has a parameter %s (name a layer above this "
                        "one whose weight has the same shape)",
                        n->l.where, d->tie);
}

static dt_status check_ops(const dt_model_t *m, const struct node *n)
{
    if (!m->be)
        return DT_OK;
    const size_t nops = sizeof n->l.kind->ops / sizeof n->l.kind->ops[0];
    const char *hint = dt_backend_caps(m->be)->missing_op_hint;
    for (size_t k = 0; k < nops && n->l.kind->ops[k] != DT_OP_COUNT; k++)
        if (!dt_backend_supports(m->be, n->l.kind->ops[k], DT_F32))
            return dt_set_error(DT_ERR_UNSUPPORTED,
                                "%s: %s layers need the %s op, which the %s backend of this "
                                "build lacks%s%s%s",
                                n->l.where, n->l.kind->name, dt_op_name(n->l.kind->ops[k]),
                                dt_backend_name(m->be), hint[0] ? " (" : "", hint,
                                hint[0] ? ")" : "");
    return DT_OK;
}

static dt_status add_node(dt_model_t *m, const struct dt_layer_spec *spec, const char *where,
                          const struct dt_job *job)
{
    char names[512];
    dt_status st;
    if (m->nnodes >= DT_MODEL_MAX_LAYERS) /* model.layers alone: the families are bounded */
        return dt_set_error(DT_ERR_USAGE,
                            "%s: model.layers expands into more than the %d layers a model holds "
                            "(an entry is one layer, a residual 7, or 9 with a projection "
                            "shortcut, and a loss is added when the last is none)",
                            where, DT_MODEL_MAX_LAYERS);
    struct node *n = &m->nodes[m->nnodes];
    memset(n, 0, sizeof *n);
    n->block = -1;
    n->slot = -1;
    n->l.id = m->nnodes;
    if (spec->name[0])
        snprintf(n->l.name, sizeof n->l.name, "%s", spec->name);
    else
        snprintf(n->l.name, sizeof n->l.name, "%s%d", spec->kind, m->nnodes + 1);
    snprintf(n->l.where, sizeof n->l.where, "%s", where);
    for (int i = 0; i < m->nnodes; i++)
        if (strcmp(m->nodes[i].l.name, n->l.name) == 0)
            return dt_set_error(DT_ERR_USAGE, "%s: the name %s is taken by an earlier layer", where,
                                n->l.name);
    n->l.kind = dt_layer_kind_find(spec->kind);
    if (!n->l.kind) {
        dt_layer_kind_names(names, sizeof names);
        return dt_set_error(DT_ERR_USAGE, "%s: unknown layer kind '%s' (kinds: %s, residual)",
                            where, spec->kind, names);
    }
    DT_CHECK(resolve_inputs(m, n, spec->inputs, where));
    DT_CHECK(n->l.kind->build(&n->l, spec, job, m->io.num_classes));
    DT_CHECK(check_ops(m, n));
    if (dt_shape_numel(&n->l.out) < 1 || dt_shape_numel(&n->l.out) > INT_MAX)
        return dt_set_error(DT_ERR_USAGE, "%s: an output of %lld values per sample", where,
                            (long long)dt_shape_numel(&n->l.out));
    for (int k = 0; k < n->l.nparams; k++) {
        n->owns[k] = !n->l.params[k].tie[0];
        if (n->owns[k])
            DT_CHECK(add_tensor(m, n, &n->l.params[k], 0, &n->pidx[k]));
        else
            DT_CHECK(tie_tensor(m, n, &n->l.params[k], &n->pidx[k]));
    }
    for (int k = 0; k < n->l.nbuffers; k++)
        DT_CHECK(add_tensor(m, n, &n->l.buffers[k], 1, &n->bidx[k]));
    m->nnodes++;
out:
    return st;
}

/* A spec built in code (compound layers). */
static struct dt_layer_spec spec_of(const char *kind, const char *name, const char *inputs)
{
    struct dt_layer_spec s;
    memset(&s, 0, sizeof s);
    snprintf(s.kind, sizeof s.kind, "%s", kind);
    snprintf(s.name, sizeof s.name, "%s", name);
    snprintf(s.inputs, sizeof s.inputs, "%s", inputs);
    return s;
}

/* residual (settings out, stride): the basic block of He et al.,
 *   conv1 3x3/stride, bn1, act1, conv2 3x3, bn2, plus the shortcut (the
 *   input, or a 1x1 conv with stride and a batch norm when the shape
 *   changes), add, act2 - named <block>.<part>. */
static dt_status add_residual(dt_model_t *m, const struct dt_layer_spec *spec, const char *where,
                              const struct dt_job *job)
{
    static const char *const known[] = {"out", "stride", NULL};
    char name[DT_LAYER_NAME + 16], in[DT_LAYER_INPUTS], w[160], last[DT_LAYER_INPUTS];
    struct dt_layer probe = {.kind = NULL};
    dt_status st;
    int64_t out, stride;
    const char *act = job->model.activation;
    snprintf(probe.where, sizeof probe.where, "%s", where);
    static const struct dt_layer_kind residual_kind = {.name = "residual"};
    probe.kind = &residual_kind;
    DT_CHECK(dt_layer_known(&probe, spec, known));
    DT_CHECK(dt_layer_int(&probe, spec, "out", 0, 1, 65536, &out));
    DT_CHECK(dt_layer_int(&probe, spec, "stride", 1, 1, 16, &stride));
    if (out == 0) {
        st = dt_set_error(DT_ERR_USAGE, "%s: residual needs out (its channels)", where);
        goto out;
    }
    char bname[DT_LAYER_NAME];
    if (spec->name[0])
        snprintf(bname, sizeof bname, "%s", spec->name);
    else
        snprintf(bname, sizeof bname, "residual%d", m->nnodes + 1);
    /* the block's input: as given, or the previous node's output */
    if (spec->inputs[0])
        snprintf(in, sizeof in, "%s", spec->inputs);
    else
        snprintf(in, sizeof in, "%s", m->nnodes ? m->nodes[m->nnodes - 1].l.name : "x");
    if (strchr(in, ','))
        return dt_set_error(DT_ERR_USAGE, "%s: inputs: a residual block reads one input", where);
    int id = find_node(m, in, strlen(in));
    if (id == -2)
        return dt_set_error(DT_ERR_USAGE, "%s: inputs: no earlier layer is named '%s'", where, in);
    const struct dt_shape *ins = id < 0 ? &m->in_shape : &m->nodes[id].l.out;
    if (ins->ndim != 3)
        return dt_set_error(DT_ERR_USAGE, "%s: residual takes images (channels, height, width)",
                            where);
    struct dt_layer_spec s;
#define PART(KIND, PART_NAME, INPUTS)                                                              \
    snprintf(name, sizeof name, "%s." PART_NAME, bname);                                           \
    snprintf(w, sizeof w, "%s (%s." PART_NAME ")", where, bname);                                  \
    s = spec_of(KIND, name, INPUTS)
    PART("conv2d", "conv1", in);
    dt_layer_spec_arg(&s, "out", "%lld", (long long)out);
    dt_layer_spec_arg(&s, "kernel", "3");
    dt_layer_spec_arg(&s, "padding", "1");
    dt_layer_spec_arg(&s, "stride", "%lld", (long long)stride);
    dt_layer_spec_arg(&s, "bias", "false");
    DT_CHECK(add_node(m, &s, w, job));
    PART("batchnorm", "bn1", "");
    DT_CHECK(add_node(m, &s, w, job));
    PART(act, "act1", "");
    DT_CHECK(add_node(m, &s, w, job));
    PART("conv2d", "conv2", "");
    dt_layer_spec_arg(&s, "out", "%lld", (long long)out);
    dt_layer_spec_arg(&s, "kernel", "3");
    dt_layer_spec_arg(&s, "padding", "1");
    dt_layer_spec_arg(&s, "bias", "false");
    DT_CHECK(add_node(m, &s, w, job));
    PART("batchnorm", "bn2", "");
    DT_CHECK(add_node(m, &s, w, job));
    snprintf(last, sizeof last, "%s", m->nodes[m->nnodes - 1].l.name);
    const char *shortcut = in;
    char proj[DT_LAYER_INPUTS];
    if (stride != 1 || ins->dim[0] != out) {
        PART("conv2d", "proj", in);
        dt_layer_spec_arg(&s, "out", "%lld", (long long)out);
        dt_layer_spec_arg(&s, "kernel", "1");
        dt_layer_spec_arg(&s, "stride", "%lld", (long long)stride);
        dt_layer_spec_arg(&s, "bias", "false");
        DT_CHECK(add_node(m, &s, w, job));
        PART("batchnorm", "proj_bn", "");
        DT_CHECK(add_node(m, &s, w, job));
        snprintf(proj, sizeof proj, "%s", m->nodes[m->nnodes - 1].l.name);
        shortcut = proj;
    }
    char sum[DT_LAYER_INPUTS];
    snprintf(sum, sizeof sum, "%.70s,%.70s", last, shortcut);
    PART("add", "add", sum);
    DT_CHECK(add_node(m, &s, w, job));
    PART(act, "act2", "");
    DT_CHECK(add_node(m, &s, w, job));
#undef PART
out:
    return st;
}

/* ---- building: analysis ---------------------------------------------------- */

static dt_status analyse(dt_model_t *m)
{
    for (int i = 0; i < m->nnodes; i++) {
        struct node *n = &m->nodes[i];
        n->last_consumer = -1;
        n->needs_grad = n->l.nparams > 0;
        for (int k = 0; k < n->nin; k++) {
            if (n->in[k] >= 0 && m->nodes[n->in[k]].needs_grad)
                n->needs_grad = n->want_din = 1;
        }
    }
    for (int i = 0; i < m->nnodes; i++)
        for (int k = 0; k < m->nodes[i].nin; k++) {
            int p = m->nodes[i].in[k];
            if (p >= 0) {
                m->nodes[p].nconsumers++;
                m->nodes[p].last_consumer = i;
            }
        }
    m->stat_len = 0;
    for (int i = 0; i < m->nnodes; i++) {
        m->nodes[i].stat_off = m->stat_len;
        m->stat_len += m->nodes[i].l.stat_len;
    }
    for (int i = 0; i < m->nnodes; i++) {
        const struct node *n = &m->nodes[i];
        if (n->l.loss && i != m->nnodes - 1)
            return dt_set_error(DT_ERR_USAGE, "%s: a loss layer must be the last layer",
                                n->l.where);
        if (!n->l.loss && n->nconsumers == 0)
            return dt_set_error(DT_ERR_USAGE,
                                "%s: nothing reads the output of layer %s (every layer but the "
                                "loss feeds a later one)",
                                n->l.where, n->l.name);
    }
    return DT_OK;
}

/* model.recompute: which blocks drop their inner activations. */
static dt_status plan_recompute(dt_model_t *m, const char *want)
{
    dt_status st = DT_OK;
    m->nblocks = 0;
    for (int i = 0; i < m->nnodes; i++) {
        const char *dot = strrchr(m->nodes[i].l.name, '.');
        if (!dot || m->nodes[i].l.loss)
            continue;
        size_t len = (size_t)(dot - m->nodes[i].l.name);
        struct block *b = m->nblocks ? &m->blocks[m->nblocks - 1] : NULL;
        if (b && strlen(b->name) == len && strncmp(b->name, m->nodes[i].l.name, len) == 0 &&
            b->last == i - 1) {
            b->last = i;
        } else {
            b = &m->blocks[m->nblocks++];
            memset(b, 0, sizeof *b);
            snprintf(b->name, sizeof b->name, "%.*s", (int)len, m->nodes[i].l.name);
            b->first = b->last = i;
        }
        m->nodes[i].block = (int)(b - m->blocks);
    }
    if (strcmp(want, "none") == 0)
        return DT_OK;
    for (const char *p = want; *p;) {
        size_t len = strcspn(p, ",");
        while (len && *p == ' ')
            p++, len--;
        int found = 0;
        for (int b = 0; b < m->nblocks; b++)
            if (strcmp(want, "all") == 0 ||
                (strlen(m->blocks[b].name) == len && !strncmp(m->blocks[b].name, p, len))) {
                m->blocks[b].on = 1;
                found = 1;
            }
        if (!found && strcmp(want, "all") != 0) {
            char list[512] = "";
            size_t at = 0;
            for (int b = 0; b < m->nblocks && at < sizeof list; b++) {
                int w =
                    snprintf(list + at, sizeof list - at, "%s%s", b ? ", " : "", m->blocks[b].name);
                at += w > 0 ? (size_t)w : 0;
            }
            return dt_set_error(DT_ERR_USAGE,
                                "model.recompute: no block named '%.*s' (blocks: %s; a block is "
                                "the layers named <block>.<layer>)",
                                (int)len, p, m->nblocks ? list : "none in this model");
        }
        if (strcmp(want, "all") == 0)
            break;
        p += len + (p[len] == ',');
    }
    for (int b = 0; b < m->nblocks; b++) {
        struct block *bl = &m->blocks[b];
        if (!bl->on)
            continue;
        for (int i = bl->first; i < bl->last; i++)
            if (m->nodes[i].last_consumer > bl->last) {
                st = dt_set_error(DT_ERR_USAGE,
                                  "model.recompute: block %s cannot be recomputed: layer %s inside "
                                  "it feeds %s after it (only a block's last layer may)",
                                  bl->name, m->nodes[i].l.name,
                                  m->nodes[m->nodes[i].last_consumer].l.name);
                return st;
            }
        for (int i = bl->first; i < bl->last; i++)
            m->nodes[i].inner = 1;
    }
    return st;
}

/* Offsets in reverse node order: backward finishes the last node first.
 * Each tensor starts on a multiple of PARAM_ALIGN floats; the buffer ends
 * where its last tensor ends, so the padding lies only between tensors.
 * (Each tensor has at most 2^40 elements and there are at most
 * DT_MODEL_MAX_PARAMS of them, so the sum with padding fits.) */
static void layout_params(dt_model_t *m)
{
    size_t off = 0, boff = 0, count = 0;
    for (int i = m->nnodes - 1; i >= 0; i--) {
        const struct node *n = &m->nodes[i];
        for (int k = 0; k < n->l.nparams; k++) {
            if (!n->owns[k])
                continue; /* laid out with its owner, whose backward comes last */
            off = param_up(off);
            m->params[n->pidx[k]].offset = off;
            off += m->params[n->pidx[k]].numel;
            count += m->params[n->pidx[k]].numel;
        }
        for (int k = 0; k < n->l.nbuffers; k++) {
            boff = param_up(boff);
            m->buffers[n->bidx[k]].offset = boff;
            boff += m->buffers[n->bidx[k]].numel;
        }
    }
    m->total = off;
    m->buf_total = boff;
    m->param_numel = count;
}

/* Whether node i is a relu layer folded into its producer (see the top of
 * this file): the producer's kind can apply it, the relu alone reads the
 * producer's output, and either neither is recomputed or both are, in the
 * same block (full: as if nothing were recomputed). */
static int fused_relu(const dt_model_t *m, int i, int full)
{
    const struct node *n = &m->nodes[i];
    int p = n->in[0];
    if (strcmp(n->l.kind->name, "relu") != 0 || n->nin != 1 || p < 0)
        return 0;
    const struct node *q = &m->nodes[p];
    return q->l.kind->fuses_relu && q->nconsumers == 1 &&
           (full || (n->inner == q->inner && (!n->inner || n->block == q->block)));
}

/* Whether node i is a view (see the top of this file): a kind marked so,
 * whose input buffer outlives the forward (not recompute scratch) and
 * which is not recomputed itself, or a relu folded into its producer;
 * full: as if nothing were recomputed. */
static int view_of(const dt_model_t *m, int i, int full)
{
    const struct node *n = &m->nodes[i];
    int p = n->in[0];
    return (n->l.kind->view &&
            (full || (!n->inner && (n->nin > 1 || p < 0 || !m->nodes[p].inner)))) ||
           fused_relu(m, i, full);
}

/* Whether node i keeps its gradient over its input (a kind with
 * keeps_grad): its one input is the output of a node of a kind whose
 * backward does not read it (output_free), which node i alone reads, not
 * a view (whose buffer is another node's), and either neither is
 * recomputed or both are, in the same block, so that a forward run again
 * rewrites that output before node i writes over it again. */
static int keeps_grad(const dt_model_t *m, int i)
{
    const struct node *n = &m->nodes[i];
    int p = n->in[0];
    if (!n->l.kind->keeps_grad || n->nin != 1 || p < 0 || n->view)
        return 0;
    const struct node *q = &m->nodes[p];
    return q->l.kind->output_free && q->nconsumers == 1 && !q->view && !q->l.fused_relu &&
           n->inner == q->inner && (!n->inner || n->block == q->block);
}

static void plan_views(dt_model_t *m)
{
    for (int i = 0; i < m->nnodes; i++) {
        m->nodes[i].view = view_of(m, i, 0);
        if (fused_relu(m, i, 0))
            m->nodes[m->nodes[i].in[0]].l.fused_relu = 1;
    }
    for (int i = 0; i < m->nnodes; i++)
        m->nodes[i].l.keep_grad = keeps_grad(m, i);
}

/* Whether producer p of node i takes node i's gradient slot as its own:
 * i is a view of p alone (not a sum: there, keeping the slot busy longer
 * cost the slot plan more than the copy saved) or hands its output
 * gradient on as its input gradient (grad_through), and p feeds nothing
 * else, so the gradient i hands on is p's, in place. full: as if nothing
 * were recomputed. */
static int shares_slot(const dt_model_t *m, int i, int p, int full)
{
    const struct node *n = &m->nodes[i];
    return n->nin == 1 && n->in[0] == p && n->slot >= 0 && m->nodes[p].nconsumers == 1 &&
           (view_of(m, i, full) || n->l.kind->grad_through);
}

/* Gradient slots, sized per row: see the file comment. full: as if
 * nothing were recomputed. */
static dt_status plan_slots(dt_model_t *m, int full)
{
    int *busy = NULL;
    dt_status st = dt_calloc((size_t)m->nnodes + 1, sizeof *busy, "the model", (void **)&busy);
    if (st != DT_OK)
        return st;
    m->nslots = 0;
    for (int i = 0; i < m->nnodes; i++)
        m->nodes[i].slot = -1;
    for (int i = m->nnodes - 1; i >= 0; i--) {
        struct node *n = &m->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            int p = n->in[k];
            if (p < 0 || !m->nodes[p].needs_grad || m->nodes[p].slot >= 0)
                continue;
            size_t need = up(numel(&m->nodes[p].l.out)), best = 0;
            if (shares_slot(m, i, p, full)) { /* stays busy: p's gradient now */
                m->nodes[p].slot = n->slot;
                if (m->slot_size[n->slot] < need)
                    m->slot_size[n->slot] = need;
                continue;
            }
            int pick = -1;
            for (int s = 0; s < m->nslots; s++) { /* the smallest free slot that fits */
                if (busy[s])
                    continue;
                if (m->slot_size[s] >= need && (pick < 0 || m->slot_size[s] < best))
                    pick = s, best = m->slot_size[s];
            }
            for (int s = 0; s < m->nslots && pick < 0; s++) /* else grow a free one */
                if (!busy[s])
                    pick = s;
            if (pick < 0)
                pick = m->nslots++, m->slot_size[pick] = 0;
            if (m->slot_size[pick] < need)
                m->slot_size[pick] = need;
            busy[pick] = 1;
            m->nodes[p].slot = pick;
        }
        int kept = n->nin == 1 && n->in[0] >= 0 && m->nodes[n->in[0]].slot == n->slot;
        if (n->slot >= 0 && !kept) /* else its producer took it (shares_slot) */
            busy[n->slot] = 0;
    }
    free(busy);
    return DT_OK;
}

/* The arena's layout for max_rows rows; full: as if nothing were recomputed. */
static dt_status plan_arena(dt_model_t *m, int full, size_t *total)
{
    const size_t rows = (size_t)m->max_rows;
    size_t off = 0, rc_per_row = 0, scratch_per_row = 0, ws_bytes = 0;
    int64_t guard;
    /* sizes per row must keep rows x size within size_t: checked at the end in doubles */
    double check = 0;
    for (int k = 0; k < DT_BACKEND_INPUT_SLOTS; k++) {
        m->x_off[k] = off, off += up(rows * (size_t)m->in_numel);
        m->y_off[k] = off, off += up(rows * (size_t)m->labels_per_row);
    }
    for (int i = 0; i < m->nnodes; i++) {
        struct node *n = &m->nodes[i];
        size_t o = view_of(m, i, full) ? 0 : up(rows * numel(&n->l.out));
        if (n->inner && !full) {
            struct block *b = &m->blocks[n->block];
            if (i == b->first)
                b->scratch = 0;
            n->out_off = b->scratch * rows;
            b->scratch += view_of(m, i, full) ? 0 : up(numel(&n->l.out));
            if (b->scratch > rc_per_row)
                rc_per_row = b->scratch;
        } else {
            n->out_off = off, off += o; /* o = 0 for a view: ctx_for points out at the input */
        }
        if (n->nin > 1)
            n->sum_off = off, off += up(rows * numel(&n->l.in));
        n->saved_off = off;
        off += up(rows * (size_t)n->l.saved_per_row + (size_t)n->l.saved_fixed);
        int shared = n->nin > 1;
        for (int k = 0; k < n->nin; k++)
            if (n->in[k] >= 0 && m->nodes[n->in[k]].nconsumers > 1)
                shared = 1;
        if (shared && n->want_din && numel(&n->l.in) > scratch_per_row)
            scratch_per_row = numel(&n->l.in);
        size_t ws = n->l.ws_fixed + rows * n->l.ws_per_row;
        if (ws > ws_bytes)
            ws_bytes = ws;
        check += (double)o + (double)rows * (double)n->l.saved_per_row;
    }
    m->rc_off = off, off += rc_per_row * rows;
    m->scratch_off = off, off += up(rows * scratch_per_row);
    for (int s = 0; s < m->nslots; s++)
        m->slot_off[s] = off, off += rows * m->slot_size[s];
    m->ws_off = off, off += up((ws_bytes + sizeof(float) - 1) / sizeof(float));
    m->ws_bytes = ws_bytes;
    check += (double)off;
    if (check * sizeof(float) > (double)SIZE_MAX / 4 || !dt_mul_i64((int64_t)off, 4, &guard))
        return dt_set_error(DT_ERR_USAGE,
                            "the activations of %lld rows (train.micro_batch, or the evaluation "
                            "batch per rank) are more than memory can hold; lower "
                            "train.micro_batch",
                            (long long)m->max_rows);
    *total = off;
    return DT_OK;
}

/* The nodes, parameter layout and arena plan of the job's model, nothing
 * allocated yet. */
static dt_status build(dt_model_t *m, const struct dt_job *job, const struct dt_model_io *io,
                       int64_t max_rows)
{
    dt_status st;
    struct dt_layer_spec *specs = NULL;
    int nspecs = 0;
    m->io = *io;
    m->max_rows = max_rows;
    if (max_rows < 1 || max_rows > INT_MAX)
        return dt_set_error(DT_ERR_USAGE,
                            "train.micro_batch (or the evaluation batch per rank): %lld rows is "
                            "outside 1 to %d",
                            (long long)max_rows, INT_MAX);
    /* a 2-D sample is a one-channel image */
    memset(&m->in_shape, 0, sizeof m->in_shape);
    if (io->ndim == 2) {
        m->in_shape = dt_shape_make(3, 1, io->shape[0], io->shape[1], 0);
    } else {
        m->in_shape.ndim = io->ndim;
        for (int i = 0; i < io->ndim && i < 4; i++)
            m->in_shape.dim[i] = io->shape[i];
    }
    m->in_numel = dt_shape_numel(&m->in_shape);
    if (m->in_numel < 1 || m->in_numel > INT_MAX)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "the dataset's samples have more than %d values; a model takes at "
                            "most that many inputs",
                            INT_MAX);
    snprintf(m->init, sizeof m->init, "%s", job->model.init);
    snprintf(m->activation, sizeof m->activation, "%s", job->model.activation);
    DT_CHECK(dt_calloc(DT_MODEL_MAX_LAYERS, sizeof *specs, "the layer list", (void **)&specs));
    DT_CHECK(dt_calloc(DT_MODEL_MAX_LAYERS, sizeof *m->nodes, "the model", (void **)&m->nodes));
    DT_CHECK(dt_calloc(DT_MODEL_MAX_LAYERS, sizeof *m->blocks, "the model", (void **)&m->blocks));
    DT_CHECK(dt_calloc(DT_MODEL_MAX_PARAMS, sizeof *m->params, "the model", (void **)&m->params));
    DT_CHECK(dt_calloc(DT_MODEL_MAX_PARAMS, sizeof *m->buffers, "the model", (void **)&m->buffers));
    DT_CHECK(
        dt_calloc(DT_MODEL_MAX_LAYERS, sizeof *m->slot_size, "the model", (void **)&m->slot_size));
    DT_CHECK(
        dt_calloc(DT_MODEL_MAX_LAYERS, sizeof *m->slot_off, "the model", (void **)&m->slot_off));
    DT_CHECK(dt_calloc(DT_MODEL_MAX_LAYERS, sizeof *m->written, "the model", (void **)&m->written));
    DT_CHECK(dt_model_expand(job, specs, DT_MODEL_MAX_LAYERS, &nspecs));
    int typed = strcmp(job->model.type, "layers") == 0;
    for (int i = 0; i < nspecs; i++) {
        char where[96];
        const char *nm = specs[i].name[0] ? specs[i].name : specs[i].kind;
        if (typed)
            snprintf(where, sizeof where, "model.layers[%d] (%.40s)", i, nm);
        else
            snprintf(where, sizeof where, "layer %.40s of model.type %.20s", nm, job->model.type);
        if (strcmp(specs[i].kind, "residual") == 0)
            DT_CHECK(add_residual(m, &specs[i], where, job));
        else
            DT_CHECK(add_node(m, &specs[i], where, job));
    }
    if (m->nnodes == 0 || !m->nodes[m->nnodes - 1].l.loss) {
        struct dt_layer_spec loss = spec_of("softmax_xent", "loss", "");
        DT_CHECK(add_node(m, &loss, "the loss (softmax_xent, added after the last layer)", job));
    }
    DT_CHECK(analyse(m));
    m->labels_per_row = m->nodes[m->nnodes - 1].l.labels_per_row;
    if (m->labels_per_row < 1)
        m->labels_per_row = 1;
    DT_CHECK(plan_recompute(m, job->model.recompute));
    plan_views(m);
    for (int i = 0; i < m->nnodes; i++) {
        struct node *n = &m->nodes[i];
        n->l.input_grad = n->want_din;
        n->l.recomputed = n->inner;
        if (n->l.kind->workspace)
            DT_CHECK(n->l.kind->workspace(&n->l, m->be, max_rows));
        size_t h = 2 * (size_t)numel(&n->l.in) + 1;
        if (n->l.nbuffers && h > m->host_len) /* statistics across ranks */
            m->host_len = h;
    }
    layout_params(m);
    DT_CHECK(plan_slots(m, 1));
    DT_CHECK(plan_arena(m, 1, &m->arena_full));
    DT_CHECK(plan_slots(m, 0));
    DT_CHECK(plan_arena(m, 0, &m->arena_floats));
out:
    free(specs);
    return st;
}

static void free_parts(dt_model_t *m)
{
    free(m->nodes);
    free(m->blocks);
    free(m->params);
    free(m->buffers);
    free(m->slot_size);
    free(m->slot_off);
    free(m->written);
    free(m->host);
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
        out->arena_bytes_full = (uint64_t)m->arena_full * sizeof(float);
    }
    if (m)
        free_parts(m);
    free(m);
    return st;
}

static dt_status alloc_buffers(dt_model_t *m)
{
    dt_status st;
    size_t rows = (size_t)m->max_rows;
    st = m->io.params_placed ? DT_OK
                             : dt_backend_alloc(m->be, (m->total ? m->total : 1) * sizeof(float),
                                                (void **)&m->param_buf);
    if (st == DT_OK && !m->io.grads_placed)
        st = dt_backend_alloc(m->be, (m->total ? m->total : 1) * sizeof(float),
                              (void **)&m->grad_buf);
    if (st == DT_OK)
        st = dt_backend_alloc(m->be, (m->buf_total ? m->buf_total : 1) * sizeof(float),
                              (void **)&m->buf_buf);
    if (st == DT_OK)
        st = dt_backend_alloc(m->be, m->arena_floats * sizeof(float), (void **)&m->arena);
    if (st == DT_OK && m->host_len)
        st = dt_malloc(m->host_len * sizeof(double), "batch-norm statistics", (void **)&m->host);
    if (st != DT_OK)
        return dt_error_context(st, "allocating a model of %zu parameters for %zu rows", m->total,
                                rows);
    float *a = m->arena;
    m->x = a + m->x_off[0];
    m->y = (int32_t *)(a + m->y_off[0]);
    m->rc = a + m->rc_off;
    m->scratch = a + m->scratch_off;
    m->ws = a + m->ws_off;
    for (int i = 0; i < m->nnodes; i++) {
        struct node *n = &m->nodes[i];
        n->out = n->view ? NULL : (n->inner ? m->rc : a) + n->out_off;
        n->sum = n->nin > 1 ? a + n->sum_off : NULL;
        n->saved = a + n->saved_off;
    }
    return DT_OK;
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
    if (m->be) {
        dt_backend_free(m->be, m->param_buf);
        dt_backend_free(m->be, m->grad_buf);
        dt_backend_free(m->be, m->buf_buf);
        dt_backend_free(m->be, m->arena);
        dt_backend_free(m->be, m->dcache);
    }
    free(m->dcache_off);
    free_parts(m);
    free(m);
}

void dt_model_set_sync(dt_model_t *m, const struct dt_model_sync *sync)
{
    m->has_sync = sync != NULL;
    if (sync)
        m->sync = *sync;
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

/* Elements [e0, e1) of tensor p's initial values into dst[0 .. e1 - e0). */
static void fill_init(const struct dt_param_info *p, float *dst, size_t e0, size_t e1,
                      const char *init, double gain, uint64_t seed, uint32_t stream)
{
    if (p->init == DT_INIT_NORMAL) { /* Box-Muller on two uniforms per value */
        struct dt_rng_key key = {.seed = seed, .purpose = DT_RNG_INIT, .stream = stream};
        for (size_t e = e0; e < e1; e++) {
            double u1 = dt_rng_uniform(&key, 2 * e), u2 = dt_rng_uniform(&key, 2 * e + 1);
            double r = sqrt(-2.0 * log(1.0 - u1));
            dst[e - e0] = (float)(p->init_std * r * cos(6.283185307179586 * u2));
        }
        return;
    }
    if (p->init != DT_INIT_FAN_IN) {
        float v = p->init == DT_INIT_ONES ? 1.0f : 0.0f;
        for (size_t e = e0; e < e1; e++)
            dst[e - e0] = v;
        return;
    }
    /* uniform(-bound, bound): variance bound^2 / 3 */
    double bound = strcmp(init, "xavier") == 0 ? sqrt(6.0 / (double)(p->fan_in + p->fan_out))
                                               : gain * sqrt(3.0 / (double)p->fan_in);
    struct dt_rng_key key = {.seed = seed, .purpose = DT_RNG_INIT, .stream = stream};
    for (size_t e = e0; e < e1; e++)
        dst[e - e0] = (float)((2.0 * dt_rng_uniform(&key, e) - 1.0) * bound);
}

void dt_model_init_range(const dt_model_t *m, uint64_t seed, size_t lo, size_t hi, float *dst)
{
    double gain = activation_gain(m->activation);
    memset(dst, 0, (hi > lo ? hi - lo : 0) * sizeof *dst);
    for (int i = 0; i < m->nparams; i++) {
        const struct dt_param_info *p = &m->params[i];
        size_t a = p->offset > lo ? p->offset : lo;
        size_t b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
        if (a < b)
            fill_init(p, dst + (a - lo), a - p->offset, b - p->offset, m->init, gain, seed,
                      (uint32_t)i);
    }
}

dt_status dt_model_init_params(dt_model_t *m, uint64_t seed)
{
    float *host = NULL;
    size_t n = m->param_buf && m->total > m->buf_total ? m->total : m->buf_total;
    /* zeroed: the padding between tensors */
    dt_status st = dt_calloc(n ? n : 1, sizeof(float), "initial parameters", (void **)&host);
    if (st != DT_OK)
        return st;
    if (m->param_buf) {
        dt_model_init_range(m, seed, 0, m->total, host);
        st = dt_model_set_params(m, host);
    }
    memset(host, 0, (n ? n : 1) * sizeof(float));
    double gain = activation_gain(m->activation);
    for (int i = 0; i < m->nbuffers && st == DT_OK; i++)
        fill_init(&m->buffers[i], host + m->buffers[i].offset, 0, m->buffers[i].numel, m->init,
                  gain, seed, 0);
    if (st == DT_OK)
        st = dt_model_set_buffers(m, host);
    free(host);
    return st;
}

/* ---- running ------------------------------------------------------------- */

static void ctx_for(dt_model_t *m, struct node *n, struct dt_layer_ctx *c, int64_t rows)
{
    memset(c, 0, sizeof *c);
    c->be = m->be;
    c->ops = m->ops;
    c->rows = rows;
    if (n->nin > 1)
        c->in = n->sum;
    else
        c->in = n->in[0] < 0 ? m->x : m->nodes[n->in[0]].out;
    if (n->view) /* the input's buffer, which the layer never writes */
        n->out = (float *)c->in;
    c->out = n->out;
    for (int k = 0; k < n->l.nparams; k++) {
        c->p[k] = m->param_buf ? m->param_buf + m->params[n->pidx[k]].offset : NULL;
        c->g[k] = m->grad_buf ? m->grad_buf + m->params[n->pidx[k]].offset : NULL;
    }
    for (int k = 0; k < n->l.nbuffers; k++)
        c->buf[k] = m->buf_buf + m->buffers[n->bidx[k]].offset;
    c->saved = n->saved;
    c->ws = m->ws;
    c->ws_bytes = m->ws_bytes;
    c->training = m->last_training;
    c->seed = m->last_seed;
    c->step = m->last_step;
    c->row0 = m->last_row0;
    c->sync = m->has_sync ? &m->sync : NULL;
    c->stat_out = m->stat_out && m->last_training && n->l.stat_len ? m->stat_out + n->stat_off
                                                                    : NULL;
    c->host = m->host;
    c->host_len = m->host_len;
    c->labels = m->y;
}

/* Sharded parameters: node n's, fetched into c->p. */
static dt_status fetch_node(dt_model_t *m, const struct node *n, struct dt_layer_ctx *c)
{
    dt_status st = DT_OK;
    for (int k = 0; k < n->l.nparams && m->phook.fetch && st == DT_OK; k++) {
        const struct dt_param_info *p = &m->params[n->pidx[k]];
        st = m->phook.fetch(m->phook.ctx, p->offset, p->numel, &c->p[k]);
    }
    return st;
}

/* Sharded parameters: names the parameters of the next node with any,
 * from node i in direction dir (+1 forward, -1 backward), not reaching
 * node `stop`; backward skips the nodes it does not run. */
static dt_status fetch_ahead(dt_model_t *m, int i, int dir, int stop)
{
    dt_status st = DT_OK;
    if (!m->phook.ahead) return DT_OK;
    for (int j = i + dir; j != stop && j >= 0 && j < m->nnodes; j += dir) {
        const struct node *n = &m->nodes[j];
        if (n->l.nparams == 0 || (dir < 0 && !n->needs_grad)) continue;
        for (int k = 0; k < n->l.nparams && st == DT_OK; k++) {
            const struct dt_param_info *p = &m->params[n->pidx[k]];
            st = m->phook.ahead(m->phook.ctx, p->offset, p->numel);
        }
        break;
    }
    return st;
}

static dt_status release_node(dt_model_t *m, const struct node *n)
{
    return m->phook.release && n->l.nparams > 0 ? m->phook.release(m->phook.ctx) : DT_OK;
}

/* Forward of node i; with sharded parameters its parameters are fetched
 * first and the next node's named (up to node `stop`). */
static dt_status forward_node(dt_model_t *m, int i, int64_t rows, int recompute, int stop,
                              double *loss_sum, int64_t *correct)
{
    struct node *n = &m->nodes[i];
    struct dt_layer_ctx c;
    dt_status st = DT_OK;
    if (n->nin > 1 && !m->dry) { /* the sum of the inputs */
        size_t e = (size_t)rows * numel(&n->l.in);
        const float *a = n->in[0] < 0 ? m->x : m->nodes[n->in[0]].out;
        for (int k = 1; k < n->nin && st == DT_OK; k++) {
            const float *b = n->in[k] < 0 ? m->x : m->nodes[n->in[k]].out;
            st = m->ops->add(m->be, n->sum, a, b, e);
            a = n->sum;
        }
    }
    ctx_for(m, n, &c, rows);
    c.recompute = recompute;
    c.loss_sum = loss_sum;
    c.correct = correct;
    if (st == DT_OK) st = fetch_node(m, n, &c);
    if (st == DT_OK) st = fetch_ahead(m, i, 1, stop);
    if (st == DT_OK && !m->dry && !n->view) st = n->l.kind->fwd(&n->l, &c);
    if (st == DT_OK) st = release_node(m, n);
    if (st != DT_OK)
        return dt_error_context(st, "forward of layer %s (%s)", n->l.name, n->l.kind->name);
    return DT_OK;
}

dt_status dt_model_forward(dt_model_t *m, const float *x, const int32_t *y, int64_t rows,
                           int training, uint64_t seed, int64_t step, int64_t row0,
                           double *loss_sum, int64_t *correct)
{
    dt_status st = DT_OK;
    if (rows < 1 || rows > m->max_rows)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "batch of %lld rows; the model was sized for 1..%lld", (long long)rows,
                            (long long)m->max_rows);
    m->last_rows = rows;
    m->last_training = training;
    m->last_seed = seed;
    m->last_step = step;
    m->last_row0 = row0;
    /* Everything that reads the previous batch's slot is queued by now
     * (its forward, backward and recomputation), so its slot is free after
     * that; this batch goes into the other one, beside the compute still
     * running (a copy stream on cuda). */
    const int k = m->input_slot, prev = (k + DT_BACKEND_INPUT_SLOTS - 1) % DT_BACKEND_INPUT_SLOTS;
    DT_CHECK(dt_backend_slot_free(m->be, prev));
    m->x = m->arena + m->x_off[k];
    m->y = (int32_t *)(m->arena + m->y_off[k]);
    m->input_slot = (k + 1) % DT_BACKEND_INPUT_SLOTS;
    DT_CHECK(dt_backend_upload_ahead(m->be, k, m->x, x,
                                     (size_t)(rows * m->in_numel) * sizeof(float)));
    DT_CHECK(dt_backend_upload_ahead(m->be, k, m->y, y,
                                     (size_t)(rows * m->labels_per_row) * sizeof(int32_t)));
    for (int i = 0; i < m->nnodes; i++)
        DT_CHECK(forward_node(m, i, rows, 0, m->nnodes, loss_sum, correct));
out:
    return st;
}

/* ---- decoding with a key/value cache ------------------------------------------ */

dt_status dt_model_decode_open(dt_model_t *m)
{
    dt_status st = DT_OK;
    size_t total = 0;
    if (m->dcache_off)
        return DT_OK;
    m->dec_T = m->in_shape.ndim == 1 ? m->in_shape.dim[0] : 0;
    if (!m->dec_T || !m->param_buf || m->labels_per_row != m->dec_T)
        return dt_set_error(DT_ERR_USAGE,
                            "the model does not read a sequence of token ids and predict a token "
                            "at each position: it cannot be decoded position by position");
    for (int i = 0; i < m->nnodes; i++) {
        const struct dt_layer *l = &m->nodes[i].l;
        if (!l->kind->decode || l->in.dim[0] != m->dec_T || l->out.dim[0] != m->dec_T)
            return dt_set_error(DT_ERR_USAGE,
                                "layer %s (%s) cannot be decoded position by position (%s)",
                                l->name, l->kind->name,
                                l->kind->decode ? "its input or output is not a sequence of the "
                                                  "model's positions"
                                                : "its kind has no decoding");
    }
    DT_CHECK(dt_calloc((size_t)m->nnodes, sizeof *m->dcache_off, "the decoding caches' places",
                       (void **)&m->dcache_off));
    for (int i = 0; i < m->nnodes; i++) {
        const struct dt_layer *l = &m->nodes[i].l;
        m->dcache_off[i] = total;
        total += l->kind->decode_cache ? up(l->kind->decode_cache(l)) : 0;
    }
    st = dt_backend_alloc(m->be, (total ? total : 1) * sizeof(float), (void **)&m->dcache);
    if (st != DT_OK) {
        free(m->dcache_off);
        m->dcache_off = NULL;
        st = dt_error_context(st, "allocating the key/value cache (%zu floats)", total);
    }
out:
    return st;
}

dt_status dt_model_decode(dt_model_t *m, const float *ids, int64_t n, int64_t pos, float *last)
{
    dt_status st = DT_OK;
    int32_t *zeros = NULL;
    DT_ASSERT(m->dcache_off);
    if (n < 1 || pos < 0 || pos + n > m->dec_T)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "decoding positions %lld..%lld of a model of %lld positions",
                            (long long)pos, (long long)(pos + n - 1), (long long)m->dec_T);
    m->last_rows = 1;
    m->last_training = 0;
    m->x = m->arena + m->x_off[0];
    m->y = (int32_t *)(m->arena + m->y_off[0]);
    DT_CHECK(dt_calloc((size_t)n, sizeof *zeros, "the decoding labels", (void **)&zeros));
    DT_CHECK(dt_backend_copy(m->be, m->x, ids, (size_t)n * sizeof(float), DT_COPY_H2D));
    DT_CHECK(dt_backend_copy(m->be, m->y, zeros, (size_t)n * sizeof(int32_t), DT_COPY_H2D));
    for (int i = 0; i < m->nnodes; i++) {
        struct node *nd = &m->nodes[i];
        struct dt_layer_ctx c;
        if (nd->nin > 1) {
            size_t e = dt_layer_decode_numel(&nd->l.in, n);
            const float *a = nd->in[0] < 0 ? m->x : m->nodes[nd->in[0]].out;
            for (int k = 1; k < nd->nin && st == DT_OK; k++) {
                const float *b = nd->in[k] < 0 ? m->x : m->nodes[nd->in[k]].out;
                st = m->ops->add(m->be, nd->sum, a, b, e);
                a = nd->sum;
            }
        }
        ctx_for(m, nd, &c, 1);
        c.positions = n;
        c.pos = pos;
        c.cache = nd->l.kind->decode_cache ? m->dcache + m->dcache_off[i] : NULL;
        c.loss_sum = &m->dec_loss;
        c.correct = &m->dec_correct;
        if (st == DT_OK && !nd->view)
            st = nd->l.kind->decode(&nd->l, &c);
        if (st != DT_OK) {
            st = dt_error_context(st, "decoding layer %s (%s)", nd->l.name, nd->l.kind->name);
            goto out;
        }
    }
    const struct node *o = &m->nodes[m->nnodes - 1];
    size_t per = dt_layer_decode_numel(&o->l.out, 1);
    st = dt_backend_copy(m->be, last, o->out + per * (size_t)(n - 1), per * sizeof(float),
                         DT_COPY_D2H);
out:
    free(zeros);
    return st;
}

size_t dt_model_stat_len(const dt_model_t *m) { return m->stat_len; }

void dt_model_set_grads(dt_model_t *m, float *g) { m->grad_buf = g; }

void dt_model_set_stat_out(dt_model_t *m, double *rec) { m->stat_out = rec; }

void dt_model_apply_stats(dt_model_t *m, const double *rec)
{
    for (int i = 0; i < m->nnodes; i++) {
        struct node *n = &m->nodes[i];
        float *buf[DT_LAYER_MAX_BUFFERS];
        if (!n->l.stat_len || !n->l.kind->apply_stats) continue;
        for (int k = 0; k < n->l.nbuffers; k++)
            buf[k] = m->buf_buf + m->buffers[n->bidx[k]].offset;
        n->l.kind->apply_stats(&n->l, buf, rec + n->stat_off);
    }
}

void dt_model_set_param_hook(dt_model_t *m, const struct dt_param_hook *hook)
{
    m->phook = hook ? *hook : (struct dt_param_hook){0};
}

/* End of node i's parameters in the flat buffers: with the reversed
 * layout, nodes i.. occupy [0, end), and node i's own come last. */
static size_t grads_done_after(const dt_model_t *m, int i)
{
    const struct node *n = &m->nodes[i];
    size_t end = 0;
    for (int k = 0; k < n->l.nparams; k++) {
        const struct dt_param_info *p = &m->params[n->pidx[k]];
        if (n->owns[k] && p->offset + p->numel > end)
            end = p->offset + p->numel;
    }
    return end;
}

static float *grad_of(dt_model_t *m, int node)
{
    return m->arena + m->slot_off[m->nodes[node].slot];
}

/* Hands a computed input gradient (in `d`) to the node's producers. */
static dt_status route_din(dt_model_t *m, const struct node *n, const float *d, int64_t rows)
{
    dt_status st = DT_OK;
    size_t e = (size_t)rows * numel(&n->l.in);
    for (int k = 0; k < n->nin && st == DT_OK; k++) {
        int p = n->in[k];
        if (p < 0 || !m->nodes[p].needs_grad)
            continue;
        float *g = grad_of(m, p);
        if (g == d || m->dry) {
            /* written in place by the layer, or nothing computed */
        } else if (!m->written[p]) {
            st = dt_backend_copy(m->be, g, d, e * sizeof(float), DT_COPY_D2D);
        } else {
            st = m->ops->accumulate(m->be, g, d, e);
        }
        m->written[p] = 1;
    }
    return st;
}

static dt_status run_backward(dt_model_t *m, int64_t rows, float scale,
                              const struct dt_grad_hook *hook)
{
    dt_status st = DT_OK;
    memset(m->written, 0, (size_t)m->nnodes * sizeof *m->written);
    for (int i = m->nnodes - 1; i >= 0; i--) {
        struct node *n = &m->nodes[i];
        if (!n->needs_grad)
            continue;
        if (n->block >= 0 && m->blocks[n->block].on && m->blocks[n->block].last == i)
            for (int j = m->blocks[n->block].first; j < i; j++)
                DT_CHECK(forward_node(m, j, rows, 1, i, NULL, NULL));
        if (!n->l.loss && !m->written[i])
            continue; /* no gradient reached it */
        struct dt_layer_ctx c;
        ctx_for(m, n, &c, rows);
        c.scale = scale;
        DT_CHECK(fetch_node(m, n, &c));
        DT_CHECK(fetch_ahead(m, i, -1, -1));
        /* twice: placing a later parameter may move the earlier ones */
        for (int pass = 0; pass < 2 && hook && hook->place; pass++)
            for (int k = 0; k < n->l.nparams; k++) {
                const struct dt_param_info *p = &m->params[n->pidx[k]];
                DT_CHECK(hook->place(hook->ctx, p->offset, p->numel, &c.g[k]));
            }
        c.dout = n->l.loss ? NULL : grad_of(m, i);
        if (n->view) { /* the input gradient is the output gradient */
            st = n->want_din ? route_din(m, n, c.dout, rows) : DT_OK;
            if (st != DT_OK)
                return dt_error_context(st, "backward of layer %s (%s)", n->l.name,
                                        n->l.kind->name);
            continue;
        }
        float *direct = NULL;
        int through = n->l.kind->grad_through; /* din is dout: handed on below */
        if (n->want_din && !through) {
            int p = n->in[0];
            if (n->nin == 1 && p >= 0 && !m->written[p])
                direct = grad_of(m, p);
            c.din = direct ? direct : m->scratch;
        }
        st = m->dry ? DT_OK : n->l.kind->bwd(&n->l, &c);
        if (st == DT_OK) st = release_node(m, n);
        if (st != DT_OK)
            return dt_error_context(st, "backward of layer %s (%s)", n->l.name, n->l.kind->name);
        if (n->want_din)
            DT_CHECK(route_din(m, n, through ? c.dout : c.din, rows));
        if (hook && n->l.nparams > 0) {
            size_t done = grads_done_after(m, i);
            if (done > 0 && (st = hook->ready(hook->ctx, done)) != DT_OK)
                return st;
        }
    }
out:
    return st;
}

dt_status dt_model_backward(dt_model_t *m, int64_t rows, float scale,
                            const struct dt_grad_hook *hook)
{
    if (rows != m->last_rows)
        return dt_set_error(DT_ERR_INVALID_ARG, "backward of %lld rows after a forward of %lld",
                            (long long)rows, (long long)m->last_rows);
    if (!m->grad_buf && !(hook && hook->place))
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "backward of a model without a gradient buffer needs a hook that "
                            "places the gradients");
    return run_backward(m, rows, scale, hook);
}

dt_status dt_model_replay(dt_model_t *m, int backward, const struct dt_grad_hook *hook)
{
    dt_status st = DT_OK;
    m->dry = 1;
    for (int i = 0; i < m->nnodes && st == DT_OK; i++)
        st = forward_node(m, i, 1, 0, m->nnodes, NULL, NULL);
    if (st == DT_OK && backward) st = run_backward(m, 1, 0.0f, hook);
    m->dry = 0;
    return st;
}

dt_status dt_model_get_output(dt_model_t *m, float *host)
{
    const struct node *n = &m->nodes[m->nnodes - 1];
    return dt_backend_copy(m->be, host, n->out,
                           (size_t)(m->last_rows * (int64_t)numel(&n->l.out)) * sizeof(float),
                           DT_COPY_D2H);
}

dt_status dt_model_zero_grads(dt_model_t *m)
{
    /* placed gradients are zeroed where they are placed */
    return m->total && m->grad_buf ? m->ops->fill(m->be, m->grad_buf, m->total, 0.0f) : DT_OK;
}

size_t dt_model_num_params(const dt_model_t *m) { return m->total; }
size_t dt_model_param_numel(const dt_model_t *m) { return m->param_numel; }
int64_t dt_model_max_rows(const dt_model_t *m) { return m->max_rows; }
int64_t dt_model_input_numel(const dt_model_t *m) { return m->in_numel; }
int64_t dt_model_labels_per_row(const dt_model_t *m) { return m->labels_per_row; }
int dt_model_param_count(const dt_model_t *m) { return m->nparams; }
const struct dt_param_info *dt_model_param(const dt_model_t *m, int i) { return &m->params[i]; }
float *dt_model_params(dt_model_t *m) { return m->param_buf; }
float *dt_model_grads(dt_model_t *m) { return m->grad_buf; }
dt_backend_t *dt_model_backend(dt_model_t *m) { return m->be; }
size_t dt_model_num_buffer_elems(const dt_model_t *m) { return m->buf_total; }
int dt_model_buffer_count(const dt_model_t *m) { return m->nbuffers; }
const struct dt_param_info *dt_model_buffer(const dt_model_t *m, int i) { return &m->buffers[i]; }
uint64_t dt_model_arena_bytes(const dt_model_t *m) { return (uint64_t)m->arena_floats * 4; }
uint64_t dt_model_arena_bytes_full(const dt_model_t *m) { return (uint64_t)m->arena_full * 4; }

double dt_model_flops_per_sample(const dt_model_t *m, int training)
{
    double f = 0;
    for (int i = 0; i < m->nnodes; i++) {
        const struct node *n = &m->nodes[i];
        f += n->l.flops; /* forward */
        if (training)    /* the weight gradient, and the input gradient where one is needed */
            f += n->l.flops * ((n->l.nparams > 0) + n->want_din);
    }
    return f;
}

void dt_model_describe(const dt_model_t *m, void (*line)(void *ctx, const char *s), void *ctx)
{
    char buf[448], a[64], b[64], extra[96];
    for (int i = 0; i < m->nnodes; i++) {
        const struct node *n = &m->nodes[i];
        extra[0] = '\0';
        if (n->l.kind->describe)
            n->l.kind->describe(&n->l, extra, sizeof extra);
        char ins[96] = "";
        if (n->nin > 1 || (n->nin == 1 && n->in[0] != i - 1)) {
            size_t at = 0;
            for (int k = 0; k < n->nin && at < sizeof ins; k++) {
                int w = snprintf(ins + at, sizeof ins - at, "%s%s", k ? "+" : " <- ",
                                 n->in[k] < 0 ? "x" : m->nodes[n->in[k]].l.name);
                at += w > 0 ? (size_t)w : 0;
            }
        }
        char folded[DT_LAYER_NAME + 48] = "";
        if (fused_relu(m, i, 0))
            snprintf(folded, sizeof folded, "  (folded into %s)", m->nodes[n->in[0]].l.name);
        else if (n->l.keep_grad)
            snprintf(folded, sizeof folded, "  (gradient kept in %s's output)",
                     m->nodes[n->in[0]].l.name);
        snprintf(buf, sizeof buf, "  %-22s %-14s %s -> %s%s%s%s%s%s", n->l.name, n->l.kind->name,
                 dt_shape_format(&n->l.in, a, sizeof a), dt_shape_format(&n->l.out, b, sizeof b),
                 extra[0] ? "  " : "", extra, ins, n->inner ? "  (recomputed)" : "", folded);
        line(ctx, buf);
    }
}

dt_status dt_model_get_params(dt_model_t *m, float *host)
{
    return dt_backend_copy(m->be, host, m->param_buf, m->total * sizeof(float), DT_COPY_D2H);
}

/* The padding after each tensor (up to the next aligned offset, which is
 * where the next tensor starts) must be zero in a host copy that is set:
 * a value there would stay in the flat buffers for good. */
static dt_status check_padding(const struct dt_param_info *t, int count, size_t total,
                               const float *host, const char *what)
{
    for (int i = 0; i < count; i++) {
        size_t end = t[i].offset + t[i].numel, stop = param_up(end);
        for (size_t e = end; e < stop && e < total; e++)
            if (host[e] != 0.0f)
                return dt_set_error(DT_ERR_INVALID_ARG,
                                    "model: setting the %s: float %zu, padding after tensor %s, "
                                    "holds %g; the padding between tensors must be zero (fill a "
                                    "zeroed host copy at the tensors' offsets)",
                                    what, e, t[i].name, (double)host[e]);
    }
    return DT_OK;
}

dt_status dt_model_set_params(dt_model_t *m, const float *host)
{
    dt_status st = check_padding(m->params, m->nparams, m->total, host, "parameters");
    if (st != DT_OK)
        return st;
    return dt_backend_copy(m->be, m->param_buf, host, m->total * sizeof(float), DT_COPY_H2D);
}

dt_status dt_model_get_grads(dt_model_t *m, float *host)
{
    if (!m->grad_buf)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "the model has no gradient buffer (its gradients are sharded)");
    return dt_backend_copy(m->be, host, m->grad_buf, m->total * sizeof(float), DT_COPY_D2H);
}

dt_status dt_model_get_buffers(dt_model_t *m, float *host)
{
    return dt_backend_copy(m->be, host, m->buf_buf, m->buf_total * sizeof(float), DT_COPY_D2H);
}

dt_status dt_model_set_buffers(dt_model_t *m, const float *host)
{
    dt_status st = check_padding(m->buffers, m->nbuffers, m->buf_total, host, "buffers");
    if (st != DT_OK)
        return st;
    return dt_backend_copy(m->be, m->buf_buf, host, m->buf_total * sizeof(float), DT_COPY_H2D);
}
