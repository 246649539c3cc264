/*
 * layer.h - layer kinds: the registry every model is built from.
 *
 * A kind (one file each in this folder) turns one entry of the layer list
 * (struct dt_layer_spec: its settings as text) into a struct dt_layer:
 * it checks the settings, computes the output shape from the input shape,
 * and declares what it needs from the model - parameter tensors (shape,
 * initialiser, weight-decay group), buffers that are state but not trained
 * (batch norm's running statistics), floats kept from forward to backward,
 * workspace, and its FLOPs. The model (runtime/model/model.c) owns all memory
 * and runs the graph; a kind only computes, through the backend's ops, on
 * the pointers the model hands it in struct dt_layer_ctx. Nothing in the
 * model or the step loop knows any kind by name.
 *
 * Shapes are per sample (the batch dimension is the row count of a call),
 * dense and row-major; images are (C, H, W).
 */
#ifndef DT_LAYER_H
#define DT_LAYER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels/backend.h"
#include "runtime/config/config.h"
#include "core/rng.h"
#include "core/status.h"
#include "core/tensor.h"

#define DT_LAYER_MAX_PARAMS 4
#define DT_LAYER_MAX_BUFFERS 2
#define DT_LAYER_CFG_BYTES 128

enum dt_init {
    DT_INIT_FAN_IN, /* model.init (kaiming with the activation's gain, or xavier) */
    DT_INIT_ZEROS,
    DT_INIT_ONES,
    DT_INIT_NORMAL, /* normal(0, init_std), as GPT-2 initialises */
};

/* Which weight-decay factor a parameter takes (train.optimizer.*). */
enum dt_decay_group {
    DT_GROUP_WEIGHT, /* matrices and kernels: weight_decay */
    DT_GROUP_BIAS,   /* bias_weight_decay */
    DT_GROUP_NORM,   /* norm_weight_decay */
};
const char *dt_decay_group_name(enum dt_decay_group g);

/* A tensor a layer declares: a parameter or a buffer. */
struct dt_tensor_decl {
    char what[16]; /* "weight", "bias", "running_mean"; the name is <layer>.<what> */
    struct dt_shape shape;
    enum dt_init init;
    enum dt_decay_group group;
    int64_t fan_in, fan_out; /* DT_INIT_FAN_IN */
    double init_std;         /* DT_INIT_NORMAL */
    /* "" or the full name of an earlier layer's parameter ("wte.weight")
     * this one IS (tied weights: one tensor, its gradient the sum of both
     * uses); the shapes must be equal */
    char tie[64];
};

/* Sums over ranks, for statistics every rank must share (model.sync_bn):
 * sum_f64 replaces host[0..n) by its sum over every rank. */
struct dt_model_sync {
    dt_status (*sum_f64)(void *ctx, double *host, size_t n);
    void *ctx;
};

struct dt_layer_kind;

struct dt_layer {
    const struct dt_layer_kind *kind;
    char name[DT_LAYER_NAME];
    char where[96];          /* for messages: "model.layers[3] (conv2)" */
    int id;                  /* position in the model; keys dropout randomness */
    struct dt_shape in, out; /* per sample */
    int nparams, nbuffers;
    struct dt_tensor_decl params[DT_LAYER_MAX_PARAMS];
    struct dt_tensor_decl buffers[DT_LAYER_MAX_BUFFERS];
    int64_t saved_per_row;       /* floats per sample kept from forward to backward */
    int64_t saved_fixed;         /* and floats kept whatever the row count */
    size_t ws_fixed, ws_per_row; /* scratch bytes during one forward or backward call */
    double flops;      /* per sample, forward, multiply-add = 2 (matmuls and convolutions) */
    int loss;          /* the kind is a loss: fwd adds to the loss and the correct count */
    int64_t labels_per_row; /* a loss: labels per sample it reads (1, or a sequence's length) */
    int input_grad;    /* set by the model before workspace(): backward gets a din */
    int recomputed;    /* set by the model before workspace(): forward runs again before
                          backward (model.recompute), so keeping more is no help */
    int has_eval_mode; /* forward differs between training and evaluation */
    int fused_relu;    /* set by the model (a kind with fuses_relu): a relu layer that alone
                          reads this output is folded in, so forward writes max(output, 0)
                          and backward's dout is the gradient of that */
    int keep_grad;     /* set by the model (a kind with keeps_grad): this layer alone reads
                          its input, which nothing reads after it, so forward writes its
                          gradient over the input and backward multiplies dout by that */
    size_t stat_len;   /* doubles of batch statistics a training forward reports through
                          stat_out (train.reproducible); 0: none */
    unsigned char cfg[DT_LAYER_CFG_BYTES] __attribute__((aligned(8))); /* the kind's settings */
};

/* What one forward or backward call of a layer gets from the model. */
struct dt_layer_ctx {
    dt_backend_t *be;
    const struct dt_ops *ops;
    int64_t rows;
    const float *in;   /* rows x numel(in) */
    float *out;        /* rows x numel(out) */
    const float *dout; /* backward: the output gradient (NULL for a loss) */
    float *din;        /* backward: the input gradient, written; NULL when nothing needs it */
    float *p[DT_LAYER_MAX_PARAMS], *g[DT_LAYER_MAX_PARAMS]; /* parameters, their gradients */
    float *buf[DT_LAYER_MAX_BUFFERS];
    float *saved; /* rows x saved_per_row, then saved_fixed floats */
    void *ws;     /* ws_fixed + rows x ws_per_row bytes (or more), 64-byte aligned */
    size_t ws_bytes;
    int training;  /* training forward: dropout on, batch statistics */
    int recompute; /* a forward that recomputes dropped activations: no state changes */
    uint64_t seed;
    int64_t step, row0; /* dropout keys: optimizer step, first row in the global batch */
    const struct dt_model_sync *sync; /* NULL: statistics of this rank's rows alone */
    double *host;                     /* host scratch for sync, host_len doubles */
    size_t host_len;
    /* loss layers: labels_per_row labels per row */
    const int32_t *labels;
    double *loss_sum;
    int64_t *correct;
    float scale; /* backward: gradient of (loss_sum * scale) */
    /* training forward, not NULL: the layer writes its batch statistics
     * here (stat_len doubles, host memory) and leaves its running
     * statistics alone; they are updated later by apply_stats */
    double *stat_out;
    /* decoding (the kind's decode; dt_model_decode): the call covers
     * `positions` positions of one sequence, starting at position pos
     * (rows is 1); cache is the layer's decoding cache (decode_cache
     * floats) or NULL */
    int64_t positions, pos;
    float *cache;
};

struct dt_layer_kind {
    const char *name;
    const char *doc;      /* one line for the layer reference */
    const char *settings; /* its settings with defaults, for the reference */
    /* Checks spec's settings and the input shape l->in (set by the
     * model), fills l->out and the declarations. num_classes: the
     * dataset's, for loss layers. Errors: DT_ERR_USAGE naming l->where. */
    dt_status (*build)(struct dt_layer *l, const struct dt_layer_spec *spec,
                       const struct dt_job *job, int64_t num_classes);
    dt_status (*fwd)(struct dt_layer *l, const struct dt_layer_ctx *c);
    dt_status (*bwd)(struct dt_layer *l, const struct dt_layer_ctx *c);
    /* "k3 s1 p1" or similar after the shapes in the model's description
     * (NULL: nothing more). */
    void (*describe)(const struct dt_layer *l, char *buf, size_t len);
    /* Sets l->ws_fixed and ws_per_row for max_rows rows on backend be, or
     * as the CPU backend would when be is NULL (sizing without a backend).
     * NULL: the build's values stand. */
    dt_status (*workspace)(struct dt_layer *l, dt_backend_t *be, int64_t max_rows);
    /* Updates the running statistics in buf (host memory) from what a
     * training forward wrote to stat_out (NULL: the kind keeps none). */
    void (*apply_stats)(const struct dt_layer *l, float *const *buf, const double *stats);
    /* Incremental decoding of a causal sequence model (generation with a
     * key/value cache): the forward of c->positions positions of one
     * sequence from position c->pos, the earlier positions' state in
     * c->cache. Its input and output are (T, ...) sequences, of which the
     * call reads and writes the first c->positions rows. NULL: the kind
     * cannot decode (the model then runs whole windows). */
    dt_status (*decode)(struct dt_layer *l, const struct dt_layer_ctx *c);
    /* Floats of its decoding cache; NULL: it keeps none. */
    size_t (*decode_cache)(const struct dt_layer *l);
    /* The ops the kind needs on the model's backend (DT_OP_COUNT ends). */
    enum dt_op_id ops[12];
    /* 1: its output is its input's values in the same order (flatten, add),
     * so the model may hand the input's buffer on as the output and the
     * output gradient to the producers, running neither fwd, decode nor
     * bwd (where the buffers allow: model.c). */
    int view;
    /* 1: the kind can apply a ReLU to its own output (l->fused_relu), so
     * the model may fold in a relu layer that alone reads that output. */
    int fuses_relu;
    /* 1: its input gradient is its output gradient (pos_embedding), so the
     * model hands dout on to the producer itself and bwd gets din NULL
     * (bwd computes the parameter gradients alone). */
    int grad_through;
    /* 1: its backward does not read its output (linear, conv2d), so a layer
     * that alone reads that output may write over it once read. */
    int output_free;
    /* 1: it can write its gradient over its input (l->keep_grad) and
     * compute its backward from that alone, with the same bits. */
    int keeps_grad;
};

/* The kind of that name, or NULL. */
const struct dt_layer_kind *dt_layer_kind_find(const char *name);
/* Every kind's name, joined by ", ". */
void dt_layer_kind_names(char *buf, size_t len);
int dt_layer_kind_count(void);
const struct dt_layer_kind *dt_layer_kind_at(int i);

/* The layer reference page (docs/layers.md) as Markdown. */
void dt_layer_write_reference(FILE *out);

/* ---- for kinds: reading settings ----------------------------------------- */

/* Integer setting `key` of spec, default def when absent, in [lo, hi]. */
dt_status dt_layer_int(const struct dt_layer *l, const struct dt_layer_spec *spec, const char *key,
                       int64_t def, int64_t lo, int64_t hi, int64_t *out);
/* One or two integers (a square or a (height, width) setting such as
 * kernel: 3 or kernel: [3, 5]). */
dt_status dt_layer_int2(const struct dt_layer *l, const struct dt_layer_spec *spec, const char *key,
                        int64_t def, int64_t lo, int64_t hi, int64_t out[2]);
dt_status dt_layer_float(const struct dt_layer *l, const struct dt_layer_spec *spec,
                         const char *key, double def, double lo, double hi, int hi_excl,
                         double *out);
dt_status dt_layer_bool(const struct dt_layer *l, const struct dt_layer_spec *spec, const char *key,
                        int def, int *out);
/* Refuses settings other than the NULL-terminated `known`, naming them. */
dt_status dt_layer_known(const struct dt_layer *l, const struct dt_layer_spec *spec,
                         const char *const *known);
/* Input shape checks: an image (C, H, W), or anything with a last dim. */
dt_status dt_layer_want_image(const struct dt_layer *l);

/* Adds setting `key` with a printf-formatted value to a layer-list entry
 * built in code (the model families, compound layers); past
 * DT_LAYER_MAX_ARGS settings it does nothing. */
void dt_layer_spec_arg(struct dt_layer_spec *e, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Adds a parameter or buffer declaration. */
void dt_layer_param(struct dt_layer *l, const char *what, struct dt_shape shape, enum dt_init init,
                    enum dt_decay_group group, int64_t fan_in, int64_t fan_out);
void dt_layer_buffer(struct dt_layer *l, const char *what, struct dt_shape shape,
                     enum dt_init init);
/* The init_std setting (normal initialisation with that standard
 * deviation; 0 or absent: def) applied to the last declared parameter;
 * def 0 keeps the declared initialiser. */
dt_status dt_layer_init_std(struct dt_layer *l, const struct dt_layer_spec *spec, double def);

/* Decoding: the elements of `positions` rows of a (T, ...) sequence shape. */
static inline size_t dt_layer_decode_numel(const struct dt_shape *s, int64_t positions)
{
    return (size_t)(dt_shape_numel(s) / s->dim[0] * positions);
}

/* numel of a per-sample shape as int (every shape the model accepts fits). */
static inline int64_t dt_layer_numel(const struct dt_shape *s) { return dt_shape_numel(s); }

#endif
