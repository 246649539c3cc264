/*
 * model.h - models built from the job: a graph of layers (runtime/model/layers/)
 * over flat parameter and gradient buffers on a compute backend.
 *
 * The job's layer list (model.layers, or the list model.type mlp, cnn or
 * resnet expands into) is a list of named nodes in order; a node takes the
 * previous node's output, or the sum of the outputs it names, and the last
 * node is the loss. Parameters live in one flat device buffer, gradients
 * in another of the same layout, laid out in the order backward finishes
 * them (last node first) so a later gradient bucket is a contiguous slice.
 * Buffers (state that is not trained, such as batch norm's running
 * statistics) live in a third. Each tensor starts at a multiple of
 * DT_MODEL_ALIGN_BYTES from its buffer's base (which the backends align at
 * least as much), so GEMM and convolution libraries get aligned operands;
 * the padding between tensors is zero in every flat buffer and stays zero
 * (no layer reads or writes it, its gradient is zero). Checkpoints and
 * model files hold each tensor by name, so they do not depend on the
 * layout. Activations, gradients of activations and scratch come from one
 * arena sized at creation for `max_rows` rows; forward and backward never
 * allocate. A model is used by one thread.
 */
#ifndef DT_MODEL_H
#define DT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "runtime/config/config.h"
#include "core/rng.h"
#include "core/status.h"
#include "core/tensor.h"
#include "runtime/model/layers/layer.h"

#define DT_MODEL_MAX_LAYERS DT_JOB_MAX_GRAPH /* graph nodes; the job keeps within it */
#define DT_MODEL_MAX_PARAMS 1024
/* Where each parameter and buffer tensor starts in its flat buffer: a
 * multiple of this many bytes (cuBLAS, cuDNN and Hopper's tensor-memory
 * copies prefer 256-byte aligned operands). */
#define DT_MODEL_ALIGN_BYTES 256

typedef struct dt_model dt_model_t;

/* One parameter (or buffer) tensor: a named slice of the flat buffers. */
struct dt_param_info {
    char name[64];   /* e.g. "fc1.weight", "stage1.block1.bn1.running_mean" */
    size_t offset;   /* in floats, into the flat buffers; DT_MODEL_ALIGN_BYTES aligned */
    size_t numel;
    struct dt_shape shape;
    int64_t fan_in, fan_out;
    enum dt_init init;
    double init_std;           /* DT_INIT_NORMAL */
    enum dt_decay_group group; /* parameters: which weight decay applies */
};

/* What the model consumes and produces. */
struct dt_model_io {
    int ndim;             /* sample dims */
    int64_t shape[4];     /* sample shape, e.g. 28 x 28 */
    int64_t num_classes;
    /* 1: no flat gradient buffer (sharded gradients): every backward takes
     * a hook whose place() says where each parameter's gradient goes, and
     * dt_model_grads is NULL. */
    int grads_placed;
    /* 1: no flat parameter buffer (sharded parameters): the model asks
     * the hook set by dt_model_set_param_hook where each layer's
     * parameters are before it runs, and dt_model_params is NULL. */
    int params_placed;
};

dt_status dt_model_create(const struct dt_job *job, const struct dt_model_io *io, dt_backend_t *be,
                          int64_t max_rows, dt_model_t **out);

/* What dt_model_create would allocate, without allocating it: parameter
 * count and activation arena bytes. Same errors as dt_model_create for
 * shapes and sizes (DT_ERR_USAGE naming the key, DT_ERR_BAD_DATA for a
 * sample too large for a layer). */
struct dt_model_size {
    size_t params; /* floats per flat buffer, padding included (dt_model_num_params) */
    uint64_t arena_bytes;
    /* the arena without model.recompute (equal when nothing is recomputed) */
    uint64_t arena_bytes_full;
};
dt_status dt_model_measure(const struct dt_job *job, const struct dt_model_io *io, int64_t max_rows,
                           struct dt_model_size *out);
void dt_model_destroy(dt_model_t *m);

/* The layer list the job's model.type expands into (model.layers as it is
 * for type layers), compound layers (residual) not yet expanded: up to max
 * entries into out, their count in *n. DT_ERR_USAGE for a list too long. */
dt_status dt_model_expand(const struct dt_job *job, struct dt_layer_spec *out, int max, int *n);

/* Statistics shared across ranks (model.sync_bn): the trainer gives the
 * model its all-reduce. Without it each rank's statistics are its own. */
void dt_model_set_sync(dt_model_t *m, const struct dt_model_sync *sync);

/* Batch statistics reported instead of applied (train.reproducible): the
 * doubles of one training forward's record (0: no layer keeps running
 * statistics); from dt_model_set_stat_out(m, rec) on, each training
 * forward writes its record to rec (NULL: layers update their running
 * statistics themselves, the default), and dt_model_apply_stats updates
 * the running statistics from one record, as that forward would have
 * (host-memory backends). */
size_t dt_model_stat_len(const dt_model_t *m);
/* Points the model's gradients at g (the layout of dt_model_grads, in
 * the backend's memory; the caller keeps it and restores the model's own
 * before the model is destroyed). Backward adds into it from then on. */
void dt_model_set_grads(dt_model_t *m, float *g);
void dt_model_set_stat_out(dt_model_t *m, double *rec);
void dt_model_apply_stats(dt_model_t *m, const double *rec);

/* Fills parameters with the job's initialiser from (seed, DT_RNG_INIT,
 * parameter index), biases zero. The same on every rank and every run.
 * Sharded parameters (params_placed): the buffers only (see
 * dt_model_init_range). */
dt_status dt_model_init_params(dt_model_t *m, uint64_t seed);
/* What dt_model_init_params puts in elements [lo, hi) of the flat
 * parameter layout (zero in the padding), into host dst[0 .. hi - lo):
 * each element's value depends on its position alone, so a rank fills
 * its own part of sharded parameters without the rest. */
void dt_model_init_range(const dt_model_t *m, uint64_t seed, size_t lo, size_t hi, float *dst);

/* Sharded parameters: before a layer runs (forward, recomputation,
 * backward), fetch says where the parameter at [off, off + n) of the flat
 * layout can be read, for each of its parameters in turn; the pointers
 * hold until release, called once the layer has run. ahead (may be NULL)
 * names a parameter of the next layer to run, called after this layer's
 * fetches so it can be brought in meanwhile. The model makes these calls
 * (and the gradient hook's) in an order that depends on the graph alone,
 * never on the data, so ranks that must call them alike do. */
struct dt_param_hook {
    dt_status (*fetch)(void *ctx, size_t off, size_t n, float **p);
    dt_status (*ahead)(void *ctx, size_t off, size_t n);
    dt_status (*release)(void *ctx);
    void *ctx;
};
void dt_model_set_param_hook(dt_model_t *m, const struct dt_param_hook *hook);

/* Forward on `rows` samples (x: rows * sample elems host floats, y: rows *
 * dt_model_labels_per_row labels).
 * `training` enables dropout keyed by (seed, DT_RNG_DROPOUT, layer, step)
 * with rows numbered from row0 within the global batch. Adds the summed
 * loss and the number of correct predictions. */
dt_status dt_model_forward(dt_model_t *m, const float *x, const int32_t *y, int64_t rows,
                           int training, uint64_t seed, int64_t step, int64_t row0,
                           double *loss_sum, int64_t *correct);

/* Called during backward each time more gradients are final: elements
 * [0, done) of the flat gradient buffer will not change again in this
 * backward. A non-OK status stops the backward and is returned.
 * place (NULL: the model's flat buffer) says where the gradient of the
 * parameter at [off, off + n) of the flat layout goes, before each layer
 * that writes it runs backward; the layer adds into what it points to.
 * Placing one parameter may move the ones placed before it, so the model
 * places all of a layer's parameters and then asks again: asking for a
 * placed one neither moves anything nor changes its values. */
struct dt_grad_hook {
    dt_status (*ready)(void *ctx, size_t done);
    void *ctx;
    dt_status (*place)(void *ctx, size_t off, size_t n, float **g);
};

/* Backward for the last forward: parameter gradients += d(loss_sum * scale).
 * hook may be NULL. */
dt_status dt_model_backward(dt_model_t *m, int64_t rows, float scale,
                            const struct dt_grad_hook *hook);

dt_status dt_model_zero_grads(dt_model_t *m);

/* The hooks' calls of a forward, and with `backward` of the backward
 * after it, in the same order as for a real micro-batch, computing
 * nothing: a rank without rows in a step or an evaluation round takes
 * part in the collectives its peers' hooks start. Placed gradients get
 * nothing added. */
dt_status dt_model_replay(dt_model_t *m, int backward, const struct dt_grad_hook *hook);

/* The last forward's output of the last layer (the loss: class
 * probabilities, per position for a language model) into host: rows *
 * that layer's output values. */
dt_status dt_model_get_output(dt_model_t *m, float *host);

/* Incremental decoding of a causal language model (generation with a
 * key/value cache). Open checks that every layer can run a few positions
 * of one sequence at a time (DT_ERR_USAGE naming the first that cannot:
 * the caller then runs whole windows with dt_model_forward) and allocates
 * the layers' caches (attention's keys and values of every position). Then
 * dt_model_decode runs positions pos..pos+n-1 of the sequence whose
 * positions 0..pos-1 earlier calls ran: ids holds their n token ids, and
 * `last` (host) gets the output of position pos+n-1 (the next token's
 * probabilities). A call at pos 0 starts a new sequence. */
dt_status dt_model_decode_open(dt_model_t *m);
dt_status dt_model_decode(dt_model_t *m, const float *ids, int64_t n, int64_t pos, float *last);

/* Floats in each flat buffer (parameters, gradients, each optimizer
 * state): the parameters and the alignment padding between them. What
 * host copies, optimizer state and the gradient reducer are sized by. */
size_t dt_model_num_params(const dt_model_t *m);
/* Parameters as a user counts them: the tensors' elements, no padding. */
size_t dt_model_param_numel(const dt_model_t *m);
int64_t dt_model_max_rows(const dt_model_t *m);    /* rows one forward takes */
int64_t dt_model_input_numel(const dt_model_t *m); /* floats per input sample */
/* Labels per sample the loss reads: 1, or the sequence length of a
 * language model (y then holds rows * that many labels). */
int64_t dt_model_labels_per_row(const dt_model_t *m);
int dt_model_param_count(const dt_model_t *m);     /* tensors */
const struct dt_param_info *dt_model_param(const dt_model_t *m, int i);
/* Device pointers to the flat parameter and gradient buffers. */
float *dt_model_params(dt_model_t *m);
float *dt_model_grads(dt_model_t *m);
dt_backend_t *dt_model_backend(dt_model_t *m);
/* GEMM FLOPs per sample (multiply-add = 2) of a forward pass, or with
 * `training` of forward + backward as run (the first layer computes no
 * input gradient), for throughput reports. */
double dt_model_flops_per_sample(const dt_model_t *m, int training);
/* One line per layer ("fc1 linear 784 -> 512"), for logs. */
void dt_model_describe(const dt_model_t *m, void (*line)(void *ctx, const char *s), void *ctx);

/* Buffers: state that is not trained (batch norm running statistics).
 * dt_model_num_buffer_elems: floats in their flat buffer, padding included. */
size_t dt_model_num_buffer_elems(const dt_model_t *m);
int dt_model_buffer_count(const dt_model_t *m);
const struct dt_param_info *dt_model_buffer(const dt_model_t *m, int i);
dt_status dt_model_get_buffers(dt_model_t *m, float *host);
dt_status dt_model_set_buffers(dt_model_t *m, const float *host);

/* Activation arena bytes, and what they would be without model.recompute. */
uint64_t dt_model_arena_bytes(const dt_model_t *m);
uint64_t dt_model_arena_bytes_full(const dt_model_t *m);

/* Host copies of the flat buffers (n = dt_model_num_params floats, or
 * dt_model_num_buffer_elems for the buffers). A host buffer passed to a
 * set function must hold zeros in the padding between tensors (allocate
 * it zeroed, then fill the tensors at their offsets). */
dt_status dt_model_get_params(dt_model_t *m, float *host);
dt_status dt_model_set_params(dt_model_t *m, const float *host);
dt_status dt_model_get_grads(dt_model_t *m, float *host);

#endif
