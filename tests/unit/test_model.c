/*
 * test_model.c - the model as a graph of layers, on the CPU backend:
 * residual sums and shared inputs (whole-model gradients against central
 * differences), linear over the last dimension of N-d inputs,
 * recomputation (bit-identical gradients, a smaller arena), batch norm's
 * running statistics, parameter groups in the optimizer, the model
 * families' layer names, the messages for bad layer lists, and the flat
 * buffers' layout (aligned tensors, zero padding).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "runtime/config/config.h"
#include "runtime/model/model.h"
#include "runtime/train/optim.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "cu_util.h"

#define IN_H 6
#define IN_W 6
#define CLASSES 5

static struct dt_job job;
static dt_backend_t *be;

/* A job whose model is the given model.layers entries (YAML lines). */
static dt_status layers_job(const char *layers, const char *extra)
{
    char text[4096];
    snprintf(text, sizeof text, "model:\n  type: layers\n%s  layers:\n%s", extra ? extra : "",
             layers);
    dt_status st = dt_job_load_text("test.yaml", text, &job);
    return st == DT_OK ? dt_job_validate(&job) : st;
}

static dt_status try_model(int64_t rows, dt_model_t **m)
{
    struct dt_model_io io = {.ndim = 2, .shape = {IN_H, IN_W}, .num_classes = CLASSES};
    *m = NULL;
    dt_status st = dt_model_create(&job, &io, be, rows, m);
    if (st == DT_OK)
        st = dt_model_init_params(*m, 7);
    return st;
}

static void random_batch(float *x, int32_t *y, int rows, uint64_t salt)
{
    struct dt_rng_key k = {.seed = salt, .purpose = DT_RNG_TEST};
    for (int i = 0; i < rows * IN_H * IN_W; i++)
        x[i] = dt_rng_normal(&k, (uint64_t)i);
    for (int i = 0; i < rows; i++)
        y[i] = (int32_t)dt_rng_below(&k, 100000 + (uint64_t)i, CLASSES);
}

static double loss_of(dt_model_t *m, const float *x, const int32_t *y, int rows, int training)
{
    double loss = 0;
    int64_t correct = 0;
    CU_ASSERT_EQUAL(dt_model_forward(m, x, y, rows, training, 1, 0, 0, &loss, &correct), DT_OK);
    return loss;
}

/* Whether float i of the flat buffers belongs to a parameter tensor (not
 * to the alignment padding between them). */
static int in_tensor(const dt_model_t *m, size_t i)
{
    for (int t = 0; t < dt_model_param_count(m); t++) {
        const struct dt_param_info *p = dt_model_param(m, t);
        if (i >= p->offset && i < p->offset + p->numel)
            return 1;
    }
    return 0;
}

/* Every `stride`-th parameter's gradient against central differences of
 * the summed loss (training forward: batch statistics, no dropout). */
static double worst_fd(dt_model_t *m, const float *x, const int32_t *y, int rows, size_t stride,
                       double h)
{
    size_t n = dt_model_num_params(m);
    float *p = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    double loss = 0, worst = 0;
    int64_t correct = 0;
    CU_ASSERT_EQUAL(dt_model_zero_grads(m), DT_OK);
    CU_ASSERT_EQUAL(dt_model_forward(m, x, y, rows, 1, 1, 0, 0, &loss, &correct), DT_OK);
    CU_ASSERT_EQUAL(dt_model_backward(m, rows, 1.0f, NULL), DT_OK);
    CU_ASSERT_EQUAL(dt_model_get_grads(m, g), DT_OK);
    CU_ASSERT_EQUAL(dt_model_get_params(m, p), DT_OK);
    for (size_t i = 0; i < n; i += stride) {
        if (!in_tensor(m, i)) {
            CU_ASSERT_EQUAL(g[i], 0.0f); /* padding: no gradient */
            continue;
        }
        float keep = p[i];
        p[i] = keep + (float)h;
        CU_ASSERT_EQUAL(dt_model_set_params(m, p), DT_OK);
        double lp = loss_of(m, x, y, rows, 1);
        p[i] = keep - (float)h;
        CU_ASSERT_EQUAL(dt_model_set_params(m, p), DT_OK);
        double lm = loss_of(m, x, y, rows, 1);
        p[i] = keep;
        CU_ASSERT_EQUAL(dt_model_set_params(m, p), DT_OK);
        double fd = (lp - lm) / (2 * h);
        worst = fmax(worst, fabs(fd - g[i]) / fmax(1e-1, fabs(fd)));
    }
    free(p);
    free(g);
    return worst;
}

/* A residual sum whose input also feeds another layer (its gradient is
 * the sum of two), a linear layer over the last dimension of an image,
 * a sum that names the model input, and layer norm. */
static void test_residual_gradient(void)
{
    CU_ASSERT_EQUAL_FATAL(layers_job("    - {name: a, kind: linear, out: 6}\n"
                                     "    - {name: r1, kind: tanh}\n"
                                     "    - {name: b, kind: linear, out: 6}\n"
                                     "    - {name: s, kind: add, inputs: [b, r1, x]}\n"
                                     "    - {name: n, kind: layernorm}\n"
                                     "    - {name: t, kind: tanh}\n"
                                     "    - {name: f, kind: flatten}\n"
                                     "    - {name: out, kind: linear, out: classes}\n",
                                     NULL),
                          DT_OK);
    dt_model_t *m = NULL;
    CU_ASSERT_EQUAL_FATAL(try_model(4, &m), DT_OK);
    /* a: 6x6+6, b: 6x6+6, norm 6+6, out: 36x5+5 */
    CU_ASSERT_EQUAL(dt_model_param_numel(m), (size_t)(42 + 42 + 12 + 185));
    float x[4 * IN_H * IN_W];
    int32_t y[4];
    random_batch(x, y, 4, 11);
    double worst = worst_fd(m, x, y, 4, 1, 1e-2);
    CU_ASSERT(worst < 2e-2);
    if (worst >= 2e-2)
        fprintf(stderr, "residual model gradient: worst relative error %g\n", worst);
    dt_model_destroy(m);
}

/* RMS norm on the model input (it has no input gradient: its dx goes to
 * the workspace) and after a linear layer, with SiLU between. */
static void test_rmsnorm_silu_gradient(void)
{
    CU_ASSERT_EQUAL_FATAL(layers_job("    - {name: n0, kind: rmsnorm}\n"
                                     "    - {name: a, kind: linear, out: 6}\n"
                                     "    - {name: n1, kind: rmsnorm, eps: 1e-3}\n"
                                     "    - {name: s, kind: silu}\n"
                                     "    - {name: f, kind: flatten}\n"
                                     "    - {name: out, kind: linear, out: classes}\n",
                                     NULL),
                          DT_OK);
    dt_model_t *m = NULL;
    CU_ASSERT_EQUAL_FATAL(try_model(4, &m), DT_OK);
    /* n0: 6 (no bias), a: 6x6+6, n1: 6, out: 36x5+5 */
    CU_ASSERT_EQUAL(dt_model_param_numel(m), (size_t)(6 + 42 + 6 + 185));
    float x[4 * IN_H * IN_W];
    int32_t y[4];
    random_batch(x, y, 4, 13);
    double worst = worst_fd(m, x, y, 4, 1, 1e-2);
    CU_ASSERT(worst < 2e-2);
    if (worst >= 2e-2)
        fprintf(stderr, "rmsnorm/silu model gradient: worst relative error %g\n", worst);
    dt_model_destroy(m);
}

static const char *const CNN =
    "    - {name: blk.conv, kind: conv2d, out: 4, kernel: 3, padding: 1}\n"
    "    - {name: blk.bn, kind: batchnorm}\n"
    "    - {name: blk.relu, kind: relu}\n"
    "    - {name: blk.drop, kind: dropout, p: 0.25}\n"
    "    - {name: blk.pool, kind: maxpool2d, kernel: 2}\n"
    "    - {name: res.conv, kind: conv2d, out: 4, kernel: 3, padding: 1, bias: false}\n"
    "    - {name: res.bn, kind: batchnorm}\n"
    "    - {name: res.add, kind: add, inputs: [res.bn, blk.pool]}\n"
    "    - {name: gap, kind: global_avgpool}\n"
    "    - {name: fc, kind: linear, out: classes}\n";

/* room for the CNN's flat gradient and buffer copies below */
#define CNN_MAX_FLOATS 4096
#define CNN_MAX_BUFFER_FLOATS 256

static void layers_grads(const char *layers, const char *recompute, float *g, size_t *n,
                         uint64_t *arena, float *bufs)
{
    char extra[128];
    snprintf(extra, sizeof extra, "  recompute: %s\n", recompute);
    CU_ASSERT_EQUAL_FATAL(layers_job(layers, extra), DT_OK);
    dt_model_t *m = NULL;
    CU_ASSERT_EQUAL_FATAL(try_model(8, &m), DT_OK);
    float x[8 * IN_H * IN_W];
    int32_t y[8];
    random_batch(x, y, 8, 5);
    double loss = 0;
    int64_t correct = 0;
    *n = dt_model_num_params(m);
    *arena = dt_model_arena_bytes(m);
    CU_ASSERT_FATAL(*n <= CNN_MAX_FLOATS && dt_model_num_buffer_elems(m) <= CNN_MAX_BUFFER_FLOATS);
    CU_ASSERT_EQUAL(dt_model_zero_grads(m), DT_OK);
    CU_ASSERT_EQUAL(dt_model_forward(m, x, y, 8, 1, 3, 2, 0, &loss, &correct), DT_OK);
    CU_ASSERT_EQUAL(dt_model_backward(m, 8, 0.125f, NULL), DT_OK);
    CU_ASSERT_EQUAL(dt_model_get_grads(m, g), DT_OK);
    CU_ASSERT_EQUAL(dt_model_get_buffers(m, bufs), DT_OK);
    dt_model_destroy(m);
}

/* Recomputing blocks gives the same gradients bit for bit (dropout's mask
 * and batch norm's statistics recomputed, running statistics updated
 * once), in a smaller arena. */
static void test_recompute(void)
{
    static float g0[CNN_MAX_FLOATS], g1[CNN_MAX_FLOATS], g2[CNN_MAX_FLOATS];
    static float b0[CNN_MAX_BUFFER_FLOATS], b1[CNN_MAX_BUFFER_FLOATS], b2[CNN_MAX_BUFFER_FLOATS];
    size_t n0, n1, n2;
    uint64_t a0, a1, a2;
    layers_grads(CNN, "none", g0, &n0, &a0, b0);
    layers_grads(CNN, "blk", g1, &n1, &a1, b1);
    layers_grads(CNN, "all", g2, &n2, &a2, b2);
    CU_ASSERT_EQUAL(n0, n1);
    CU_ASSERT_EQUAL(n0, n2);
    CU_ASSERT(memcmp(g0, g1, n0 * sizeof(float)) == 0);
    CU_ASSERT(memcmp(g0, g2, n0 * sizeof(float)) == 0);
    /* the running statistics (4 tensors of 4, each on a 64-float boundary) */
    CU_ASSERT(memcmp(b0, b1, sizeof b0) == 0);
    CU_ASSERT(memcmp(b0, b2, sizeof b0) == 0);
    /* one block moves its inner outputs to the shared region; two share it */
    CU_ASSERT(a1 <= a0);
    CU_ASSERT(a2 < a0);
    /* the running means moved from 0 (momentum 0.1 of the batch mean) */
    int moved = 0;
    for (int i = 0; i < 4; i++)
        moved += b0[i] != 0.0f;
    CU_ASSERT(moved > 0);
}

/* The gradients (into g0) and buffers of a layer list with recompute r0,
 * which must equal those with r1 bit for bit. */
static void grads_agree(const char *layers, const char *r0, const char *r1, float *g0)
{
    static float g1[CNN_MAX_FLOATS];
    static float b0[CNN_MAX_BUFFER_FLOATS], b1[CNN_MAX_BUFFER_FLOATS];
    size_t n0, n1;
    uint64_t a0, a1;
    layers_grads(layers, r0, g0, &n0, &a0, b0);
    layers_grads(layers, r1, g1, &n1, &a1, b1);
    CU_ASSERT_EQUAL_FATAL(n0, n1);
    CU_ASSERT(memcmp(g0, g1, n0 * sizeof(float)) == 0);
    CU_ASSERT(memcmp(b0, b1, sizeof b0) == 0);
}

/* A block that ends in a flatten of a recomputed output, then a block
 * whose recomputed output takes the same shared region: the flatten must
 * keep a copy (a view of the region would be overwritten before fc1's
 * backward reads it), so the gradients are those without recomputation. */
static void test_recompute_flatten(void)
{
    static const char *const layers = "    - {name: a.conv, kind: conv2d, out: 2, kernel: 3}\n"
                                      "    - {name: a.act, kind: tanh}\n"
                                      "    - {name: a.flat, kind: flatten}\n"
                                      "    - {name: b.fc1, kind: linear, out: 96}\n"
                                      "    - {name: b.act, kind: tanh}\n"
                                      "    - {name: out, kind: linear, out: classes}\n";
    static float g[CNN_MAX_FLOATS];
    grads_agree(layers, "none", "all", g);
}

struct count_lines {
    const char *needle;
    int n;
};

static void count_marked(void *ctx, const char *s)
{
    struct count_lines *c = ctx;
    c->n += strstr(s, c->needle) != NULL;
}

/* The layers of a job's model whose line in the layer list holds needle. */
static int layers_marked(const char *layers, const char *recompute, const char *needle)
{
    char extra[128];
    snprintf(extra, sizeof extra, "  recompute: %s\n", recompute);
    CU_ASSERT_EQUAL_FATAL(layers_job(layers, extra), DT_OK);
    dt_model_t *m = NULL;
    CU_ASSERT_EQUAL_FATAL(try_model(8, &m), DT_OK);
    struct count_lines c = {needle, 0};
    dt_model_describe(m, count_marked, &c);
    dt_model_destroy(m);
    return c.n;
}

/* The layers that describe themselves as folded in. */
static int folded_layers(const char *layers, const char *recompute)
{
    return layers_marked(layers, recompute, "folded into");
}

/* A relu that alone reads a batchnorm's output is folded into it, and the
 * gradients and running statistics are those of the two layers run in
 * turn, bit for bit: a.bn ends block a and b.relu is recomputed in block
 * b, so with recomputation the relu runs as a layer of its own. The relu
 * after the residual sum (an add) stays a layer. */
static void test_fused_relu(void)
{
    static const char *const layers =
        "    - {name: a.conv, kind: conv2d, out: 4, kernel: 3, padding: 1}\n"
        "    - {name: a.bn, kind: batchnorm}\n"
        "    - {name: b.relu, kind: relu}\n"
        "    - {name: b.conv, kind: conv2d, out: 4, kernel: 3, padding: 1, bias: false}\n"
        "    - {name: c.bn, kind: batchnorm}\n"
        "    - {name: c.add, kind: add, inputs: [c.bn, b.conv]}\n"
        "    - {name: c.relu, kind: relu}\n"
        "    - {name: gap, kind: global_avgpool}\n"
        "    - {name: fc, kind: linear, out: classes}\n";
    static float g[CNN_MAX_FLOATS];
    CU_ASSERT_EQUAL(folded_layers(layers, "none"), 1);
    CU_ASSERT_EQUAL(folded_layers(layers, "b"), 0);
    grads_agree(layers, "none", "b", g);
    int moved = 0; /* the gradients reached the first layer */
    for (size_t i = 0; i < 4 * 9; i++)
        moved += g[i] != 0.0f;
    CU_ASSERT(moved > 0);
}

/* The layers of a job's model that keep their gradient over their input. */
static int kept_layers(const char *layers, const char *recompute)
{
    return layers_marked(layers, recompute, "(gradient kept in ");
}

/* A GELU that alone reads a convolution's or a linear layer's output
 * writes its gradient over it and multiplies by it in backward; not when
 * that output has another reader (c.gelu: b.out feeds c.add too), nor
 * when the GELU is recomputed and its input is not (b.gelu, first of
 * block b, reads a.fc, which ends block a): its forward, run again,
 * would read the gradient. With and without recomputation, the gradients
 * and the buffers are the same, bit for bit. */
static void test_kept_gradient(void)
{
    static const char *const layers =
        "    - {name: a.conv, kind: conv2d, out: 4, kernel: 3, padding: 1}\n"
        "    - {name: a.gelu, kind: gelu}\n"
        "    - {name: a.flat, kind: flatten}\n"
        "    - {name: a.fc, kind: linear, out: 12}\n"
        "    - {name: b.gelu, kind: gelu}\n"
        "    - {name: b.fc, kind: linear, out: 16}\n"
        "    - {name: b.tanh, kind: gelu_tanh}\n"
        "    - {name: b.out, kind: linear, out: 16}\n"
        "    - {name: c.gelu, kind: gelu}\n"
        "    - {name: c.add, kind: add, inputs: [c.gelu, b.out]}\n"
        "    - {name: fc, kind: linear, out: classes}\n";
    static float g[CNN_MAX_FLOATS];
    CU_ASSERT_EQUAL(kept_layers(layers, "none"), 3);
    CU_ASSERT_EQUAL(kept_layers(layers, "a,b"), 2);
    CU_ASSERT_EQUAL(kept_layers(layers, "b"), 2);
    grads_agree(layers, "none", "a,b", g);
    grads_agree(layers, "none", "all", g);
    int moved = 0; /* the gradients reached the first layer */
    for (size_t i = 0; i < 4 * 9; i++)
        moved += g[i] != 0.0f;
    CU_ASSERT(moved > 0);
}

/* The same network without kinks (max pooling and ReLU switch under a
 * finite difference) and without dropout, for central differences. */
static const char *const CNN_SMOOTH =
    "    - {name: blk.conv, kind: conv2d, out: 4, kernel: 3, padding: 1}\n"
    "    - {name: blk.bn, kind: batchnorm}\n"
    "    - {name: blk.act, kind: tanh}\n"
    "    - {name: blk.pool, kind: avgpool2d, kernel: 2}\n"
    "    - {name: res.conv, kind: conv2d, out: 4, kernel: 3, padding: 1, bias: false}\n"
    "    - {name: res.bn, kind: batchnorm}\n"
    "    - {name: res.add, kind: add, inputs: [res.bn, blk.pool]}\n"
    "    - {name: gap, kind: global_avgpool}\n"
    "    - {name: fc, kind: linear, out: classes}\n";

/* The convolutional model's gradients against central differences (the
 * comparison with PyTorch, tests/torch, checks max pooling and ReLU). */
static void test_cnn_gradient(void)
{
    CU_ASSERT_EQUAL_FATAL(layers_job(CNN_SMOOTH, "  recompute: all\n"), DT_OK);
    dt_model_t *m = NULL;
    CU_ASSERT_EQUAL_FATAL(try_model(8, &m), DT_OK);
    float x[8 * IN_H * IN_W];
    int32_t y[8];
    random_batch(x, y, 8, 9);
    double worst = worst_fd(m, x, y, 8, 3, 1e-2);
    CU_ASSERT(worst < 3e-2);
    if (worst >= 3e-2)
        fprintf(stderr, "cnn model gradient: worst relative error %g\n", worst);
    /* evaluation uses the running statistics, so it differs from training */
    double train = loss_of(m, x, y, 8, 1), eval = loss_of(m, x, y, 8, 0);
    CU_ASSERT(fabs(train - eval) > 1e-6);
    dt_model_destroy(m);
}

/* Each tensor takes its group's weight decay: with zero gradients, SGD
 * without momentum shrinks weights by lr*wd and biases/norms by theirs. */
static void test_groups(void)
{
    CU_ASSERT_EQUAL_FATAL(layers_job(CNN, NULL), DT_OK);
    snprintf(job.train.optimizer.name, sizeof job.train.optimizer.name, "sgd");
    job.train.optimizer.momentum = 0;
    job.train.optimizer.weight_decay = 0.5;
    job.train.optimizer.bias_weight_decay = 0.25;
    job.train.optimizer.norm_weight_decay = 0;
    dt_model_t *m = NULL;
    dt_optim_t *o = NULL;
    CU_ASSERT_EQUAL_FATAL(try_model(2, &m), DT_OK);
    size_t n = dt_model_num_params(m);
    CU_ASSERT_EQUAL_FATAL(dt_optim_create(&job, be, n, &o), DT_OK);
    CU_ASSERT_EQUAL_FATAL(dt_optim_groups_from_model(o, &job, m), DT_OK);
    float *before = malloc(n * sizeof(float)), *after = malloc(n * sizeof(float));
    CU_ASSERT_EQUAL(dt_model_get_params(m, before), DT_OK);
    /* biases start at zero: give every parameter a value (the padding
     * between tensors stays zero) */
    for (size_t i = 0; i < n; i++)
        before[i] = in_tensor(m, i) ? 1.0f + (float)(i % 7) : 0.0f;
    CU_ASSERT_EQUAL(dt_model_set_params(m, before), DT_OK);
    CU_ASSERT_EQUAL(dt_model_zero_grads(m), DT_OK);
    CU_ASSERT_EQUAL(dt_optim_step(o, dt_model_params(m), dt_model_grads(m), 0.1), DT_OK);
    CU_ASSERT_EQUAL(dt_model_get_params(m, after), DT_OK);
    int seen[3] = {0};
    for (int t = 0; t < dt_model_param_count(m); t++) {
        const struct dt_param_info *p = dt_model_param(m, t);
        double wd = p->group == DT_GROUP_WEIGHT ? 0.5 : p->group == DT_GROUP_BIAS ? 0.25 : 0.0;
        seen[p->group] = 1;
        for (size_t e = 0; e < p->numel; e++) {
            float want = before[p->offset + e] - 0.1f * (float)wd * before[p->offset + e];
            CU_ASSERT_DOUBLE_EQUAL(after[p->offset + e], want, 1e-6);
        }
    }
    CU_ASSERT(seen[DT_GROUP_WEIGHT] && seen[DT_GROUP_BIAS] && seen[DT_GROUP_NORM]);
    free(before);
    free(after);
    dt_optim_destroy(o);
    dt_model_destroy(m);
}

/* The families expand to the names earlier versions used (mlp), or to
 * blocks recomputation can name (cnn, resnet). */
static void test_families(void)
{
    struct dt_layer_spec l[64];
    int n = 0;
    dt_job_defaults(&job);
    CU_ASSERT_EQUAL(dt_model_expand(&job, l, 64, &n), DT_OK);
    CU_ASSERT_EQUAL(n, 9); /* flatten, (fc, relu, dropout) x 2, fc3, loss */
    CU_ASSERT_STRING_EQUAL(l[1].name, "fc1");
    CU_ASSERT_STRING_EQUAL(l[3].name, "dropout1");
    CU_ASSERT_STRING_EQUAL(l[7].name, "fc3");
    CU_ASSERT_STRING_EQUAL(l[8].kind, "softmax_xent");
    snprintf(job.model.type, sizeof job.model.type, "resnet");
    CU_ASSERT_EQUAL(dt_model_expand(&job, l, 64, &n), DT_OK);
    CU_ASSERT_STRING_EQUAL(l[3].name, "stage1.block1");
    CU_ASSERT_STRING_EQUAL(l[5].kind, "residual");
    CU_ASSERT_EQUAL(dt_model_expand(&job, l, 4, &n), DT_ERR_USAGE);
    /* resnet on 6x6 images: 2 stages, the second halves to 3x3 */
    job.model.nchannels = 2;
    job.model.channels[0] = 4;
    job.model.channels[1] = 8;
    job.model.nblocks = 2;
    job.model.blocks[0] = 1;
    job.model.blocks[1] = 1;
    snprintf(job.model.recompute, sizeof job.model.recompute, "stage1.block1,stage2.block1");
    snprintf(job.model.activation, sizeof job.model.activation, "tanh"); /* no kinks */
    dt_model_t *m = NULL;
    CU_ASSERT_EQUAL_FATAL(try_model(4, &m), DT_OK);
    int proj = 0;
    for (int i = 0; i < dt_model_param_count(m); i++)
        proj += strcmp(dt_model_param(m, i)->name, "stage2.block1.proj.weight") == 0;
    CU_ASSERT_EQUAL(proj, 1);
    CU_ASSERT(dt_model_arena_bytes(m) < dt_model_arena_bytes_full(m));
    float x[4 * IN_H * IN_W];
    int32_t y[4];
    random_batch(x, y, 4, 2);
    double worst = worst_fd(m, x, y, 4, 29, 1e-2);
    CU_ASSERT(worst < 3e-2);
    if (worst >= 3e-2)
        fprintf(stderr, "resnet gradient: worst relative error %g\n", worst);
    dt_model_destroy(m);
}

static void expect_error(const char *layers, const char *extra, const char *part)
{
    dt_status st = layers_job(layers, extra);
    dt_model_t *m = NULL;
    if (st == DT_OK)
        st = try_model(4, &m);
    dt_model_destroy(m);
    CU_ASSERT_EQUAL(st, DT_ERR_USAGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), part));
    if (!strstr(dt_last_error(), part))
        fprintf(stderr, "\n  got:  %s\n  want: ...%s...\n", dt_last_error(), part);
}

static void test_errors(void)
{
    expect_error("    - {kind: conv3d}\n", NULL,
                 "model.layers[0] (conv3d): unknown layer kind 'conv3d' (kinds: linear, conv2d");
    expect_error("    - {kind: linear, out: 4, inputs: nope}\n", NULL,
                 "model.layers[0] (linear): inputs: no earlier layer is named 'nope'");
    expect_error("    - {name: a, kind: linear, out: 4}\n    - {kind: flatten, inputs: x}\n"
                 "    - {kind: linear, out: classes}\n",
                 NULL, "nothing reads the output of layer a");
    expect_error("    - {kind: conv2d, out: 4, kernel: 9}\n", NULL,
                 "a 9x9 kernel (dilation 1) does not fit the 6x6 input");
    expect_error("    - {kind: conv2d, out: 4, colour: red}\n", NULL,
                 "conv2d has no setting 'colour' (its settings: out, kernel");
    expect_error("    - {kind: conv2d, out: 4, stride: [1, 2, 3]}\n", NULL,
                 "stride: expected an integer from 1 to 1024, or a list of two");
    expect_error("    - {kind: flatten}\n    - {kind: linear, out: 7}\n", NULL,
                 "needs one score per class (5 values per sample, or per position of a sequence), "
                 "but its input is 7");
    expect_error("    - {name: a, kind: flatten}\n    - {kind: add, inputs: [a, x]}\n", NULL,
                 "summed inputs must have one shape, got 36 and 1x6x6");
    expect_error("    - {kind: flatten}\n    - {kind: conv2d, out: 2}\n", NULL,
                 "conv2d takes images (channels, height, width), but its input is 36");
    expect_error("    - {kind: flatten}\n    - {kind: linear, out: classes}\n",
                 "  recompute: stage9\n", "model.recompute: no block named 'stage9'");
    expect_error("    - {name: b.c, kind: conv2d, out: 2}\n    - {name: b.r, kind: relu}\n"
                 "    - {name: s, kind: add, inputs: [b.r, b.c]}\n    - {kind: flatten}\n"
                 "    - {kind: linear, out: classes}\n",
                 "  recompute: b\n", "layer b.c inside it feeds s after it");
    expect_error("    - {kind: flatten}\n    - {name: l1, kind: linear, out: classes}\n"
                 "    - {kind: softmax_xent}\n    - {kind: relu, inputs: l1}\n",
                 NULL, "a loss layer must be the last layer");
    /* the config side: a list entry without a kind, duplicate names */
    CU_ASSERT_EQUAL(layers_job("    - {name: a}\n", NULL), DT_ERR_USAGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "model.layers[0]: no kind"));
    CU_ASSERT_EQUAL(layers_job("    - {name: a, kind: relu}\n    - {name: a, kind: relu}\n", NULL),
                    DT_ERR_USAGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "'a' names layer 0 already"));
}

/* The one dtype enum and shape descriptor (core/tensor.h). */
static void test_tensor_core(void)
{
    static const char *const names[] = {"f32", "bf16", "f16", "f64", "i32", "i64", "u16", "u8"};
    static const size_t sizes[] = {4, 2, 2, 8, 4, 8, 2, 1};
    for (int t = 0; t < DT_DTYPE_COUNT; t++) {
        CU_ASSERT_STRING_EQUAL(dt_dtype_name((enum dt_dtype)t), names[t]);
        CU_ASSERT_EQUAL(dt_dtype_parse(names[t]), t);
        CU_ASSERT_EQUAL(dt_dtype_size((enum dt_dtype)t), sizes[t]);
        CU_ASSERT_EQUAL(dt_dtype_is_float((enum dt_dtype)t), t <= DT_F64);
    }
    CU_ASSERT_EQUAL(dt_dtype_parse("float32"), -1);
    CU_ASSERT_EQUAL(dt_dtype_size((enum dt_dtype)99), 0);
    CU_ASSERT_STRING_EQUAL(dt_dtype_name((enum dt_dtype) - 1), "unknown");
    char buf[64];
    struct dt_shape s = dt_shape_make(4, 64, 1, 3, 3), t = s;
    CU_ASSERT_EQUAL(dt_shape_numel(&s), 576);
    CU_ASSERT_STRING_EQUAL(dt_shape_format(&s, buf, sizeof buf), "64x1x3x3");
    CU_ASSERT(dt_shape_equal(&s, &t));
    t.dim[3] = 4;
    CU_ASSERT(!dt_shape_equal(&s, &t));
    struct dt_shape scalar = dt_shape_make(0, 0, 0, 0, 0);
    CU_ASSERT_EQUAL(dt_shape_numel(&scalar), 1);
    CU_ASSERT_STRING_EQUAL(dt_shape_format(&scalar, buf, sizeof buf), "scalar");
    struct dt_shape big = {.ndim = 8};
    for (int i = 0; i < 8; i++)
        big.dim[i] = 1 << 20; /* 2^160 elements */
    CU_ASSERT_EQUAL(dt_shape_numel(&big), -1);
    big.ndim = 9;
    CU_ASSERT_EQUAL(dt_shape_numel(&big), -1);
    s.dim[1] = -1;
    CU_ASSERT_EQUAL(dt_shape_numel(&s), -1);
}

/* docs/layers.md is what `dtrain config layers` prints. */
/* ---- a GPT --------------------------------------------------------------- */

#define GPT_T 6
#define GPT_V 11
#define GPT_ROWS 3

static dt_status gpt_model(const char *extra, int64_t rows, dt_model_t **m)
{
    char text[1024];
    snprintf(text, sizeof text,
             "model:\n  type: gpt\n  n_layer: 2\n  n_head: 2\n  n_embd: 8\n%s%s",
             extra && strstr(extra, "dropout") ? "" : "  dropout: 0\n", extra ? extra : "");
    dt_status st = dt_job_load_text("gpt.yaml", text, &job);
    if (st == DT_OK)
        st = dt_job_validate(&job);
    struct dt_model_io io = {.ndim = 1, .shape = {GPT_T}, .num_classes = GPT_V};
    *m = NULL;
    if (st == DT_OK)
        st = dt_model_create(&job, &io, be, rows, m);
    if (st == DT_OK)
        st = dt_model_init_params(*m, 7);
    return st;
}

static void gpt_batch(float *x, int32_t *y)
{
    struct dt_rng_key k = {.seed = 3, .purpose = DT_RNG_TEST};
    for (int i = 0; i < GPT_ROWS * GPT_T; i++) {
        x[i] = (float)dt_rng_below(&k, (uint64_t)i, GPT_V);
        y[i] = (int32_t)dt_rng_below(&k, 1000 + (uint64_t)i, GPT_V);
    }
}

static void gpt_grads(const char *extra, float *g, size_t *n)
{
    dt_model_t *m = NULL;
    float x[GPT_ROWS * GPT_T];
    int32_t y[GPT_ROWS * GPT_T];
    double loss = 0;
    int64_t correct = 0;
    gpt_batch(x, y);
    CU_ASSERT_EQUAL_FATAL(gpt_model(extra, GPT_ROWS, &m), DT_OK);
    *n = dt_model_num_params(m);
    CU_ASSERT_EQUAL(dt_model_zero_grads(m), DT_OK);
    CU_ASSERT_EQUAL(dt_model_forward(m, x, y, GPT_ROWS, 1, 1, 0, 0, &loss, &correct), DT_OK);
    CU_ASSERT_EQUAL(dt_model_backward(m, GPT_ROWS, 1.0f, NULL), DT_OK);
    CU_ASSERT_EQUAL(dt_model_get_grads(m, g), DT_OK);
    dt_model_destroy(m);
}

/* model.type gpt: tied embeddings are one tensor whose gradient is the
 * sum of both uses (checked by central differences, every parameter),
 * one label per position, and recomputed blocks give the same bits. */
static void test_gpt(void)
{
    dt_model_t *m = NULL;
    CU_ASSERT_EQUAL_FATAL(gpt_model(NULL, GPT_ROWS, &m), DT_OK);
    /* wte 11x8, wpe 6x8; per block ln1 16, qkv 8x24+24, proj 8x8+8, ln2 16, fc 8x32+32,
     * fc2 32x8+8; ln_f 16; the head has no tensor of its own */
    const size_t block = 16 + 216 + 72 + 16 + 288 + 264;
    CU_ASSERT_EQUAL(dt_model_param_numel(m), (size_t)(88 + 48 + 2 * block + 16));
    CU_ASSERT_EQUAL(dt_model_param_count(m), 2 + 2 * 12 + 2);
    CU_ASSERT_EQUAL(dt_model_labels_per_row(m), GPT_T);
    const struct dt_param_info *wte = dt_model_param(m, 0);
    CU_ASSERT_STRING_EQUAL(wte->name, "wte.weight");
    CU_ASSERT_EQUAL(wte->init, DT_INIT_NORMAL);
    /* the embedding's gradient comes last in backward: the end of the buffer */
    CU_ASSERT_EQUAL(wte->offset + wte->numel, dt_model_num_params(m));
    float x[GPT_ROWS * GPT_T];
    int32_t y[GPT_ROWS * GPT_T];
    gpt_batch(x, y);
    /* a step far below the residual stream's scale (0.02 at the start),
     * where layer norm's curvature would swamp a larger one */
    double worst = worst_fd(m, x, y, GPT_ROWS, 1, 1e-3);
    CU_ASSERT(worst < 2e-2);
    if (worst >= 2e-2)
        fprintf(stderr, "gpt gradient: worst relative error %g\n", worst);
    /* a sample's loss is the mean over its positions: ln(V) at uniform
     * outputs, so the start is near GPT_ROWS * ln(11) */
    double loss = loss_of(m, x, y, GPT_ROWS, 0);
    CU_ASSERT(fabs(loss / GPT_ROWS - log((double)GPT_V)) < 0.1);
    /* a token id outside the vocabulary is refused */
    x[4] = (float)GPT_V;
    double l2 = 0;
    int64_t c2 = 0;
    CU_ASSERT_EQUAL(dt_model_forward(m, x, y, GPT_ROWS, 0, 1, 0, 0, &l2, &c2), DT_ERR_INVALID_ARG);
    dt_model_destroy(m);

    static float g0[8192], g1[8192];
    size_t n0 = 0, n1 = 0;
    gpt_grads(NULL, g0, &n0);
    gpt_grads("  recompute: all\n", g1, &n1);
    CU_ASSERT_FATAL(n0 == n1 && n0 < 8192);
    CU_ASSERT(memcmp(g0, g1, n0 * sizeof(float)) == 0);

    /* untied, with a padded vocabulary: the head has its own weight */
    CU_ASSERT_EQUAL_FATAL(gpt_model("  tie_embeddings: false\n", GPT_ROWS, &m), DT_OK);
    CU_ASSERT_EQUAL(dt_model_param_numel(m), (size_t)(88 + 48 + 2 * block + 16 + 88));
    dt_model_destroy(m);
    CU_ASSERT_EQUAL(gpt_model("  n_head: 3\n", GPT_ROWS, &m), DT_ERR_USAGE);
}

/* Largest difference between the decoded next-token probabilities of
 * position `at` and row `at` of a whole window's forward. */
static double decode_gap(const float *whole, const float *last, int at)
{
    double worst = 0;
    for (int v = 0; v < GPT_V; v++) {
        double d = fabs((double)whole[at * GPT_V + v] - (double)last[v]);
        worst = d > worst ? d : worst;
    }
    return worst;
}

/* Decoding with a key/value cache (dt_model_decode): a prompt of 3
 * positions at once and then one position at a time give the
 * probabilities the whole window's forward gives at those positions; a
 * new sequence at position 0 starts afresh; for every gpt variant. */
static void test_gpt_decode(void)
{
    static const char *const variants[] = {
        NULL,
        "  norm: rmsnorm\n  gelu: tanh\n",
        "  tie_embeddings: false\n",
        "  dropout: 0.2\n",
        "  recompute: all\n",
    };
    for (size_t k = 0; k < sizeof variants / sizeof *variants; k++) {
        dt_model_t *m = NULL;
        dt_status built = gpt_model(variants[k], 1, &m);
        if (built != DT_OK)
            fprintf(stderr, "gpt variant %zu: %s\n", k, dt_last_error());
        CU_ASSERT_EQUAL_FATAL(built, DT_OK);
        CU_ASSERT_EQUAL(dt_model_init_params(m, 7 + k), DT_OK);

        /* outputs per position: the padded vocabulary when the head is wte */
        int64_t V = (int64_t)dt_model_param(m, 0)->shape.dim[0];
        float x[GPT_ROWS * GPT_T], whole[GPT_T * 16], last[16], x2[GPT_T];
        int32_t y[GPT_ROWS * GPT_T];
        double loss = 0;
        int64_t correct = 0;
        gpt_batch(x, y);
        CU_ASSERT_FATAL(V <= 16);
        CU_ASSERT_EQUAL(dt_model_forward(m, x, y, 1, 0, 1, 0, 0, &loss, &correct), DT_OK);
        CU_ASSERT_EQUAL(dt_model_get_output(m, whole), DT_OK);
        CU_ASSERT_EQUAL_FATAL(dt_model_decode_open(m), DT_OK);
        double worst = 0;
        /* the rows of `whole` are V wide; decode_gap reads GPT_V of them */
        float packed[GPT_T * GPT_V];
        for (int t = 0; t < GPT_T; t++)
            memcpy(packed + t * GPT_V, whole + t * V, GPT_V * sizeof(float));
        CU_ASSERT_EQUAL(dt_model_decode(m, x, 3, 0, last), DT_OK);
        worst = fmax(worst, decode_gap(packed, last, 2));

        for (int t = 3; t < GPT_T; t++) {
            CU_ASSERT_EQUAL(dt_model_decode(m, x + t, 1, t, last), DT_OK);
            worst = fmax(worst, decode_gap(packed, last, t));
        }
        /* a new sequence: the second window, one position, then two */
        for (int t = 0; t < GPT_T; t++)
            x2[t] = x[GPT_T + t];
        CU_ASSERT_EQUAL(dt_model_forward(m, x2, y, 1, 0, 1, 0, 0, &loss, &correct), DT_OK);
        CU_ASSERT_EQUAL(dt_model_get_output(m, whole), DT_OK);
        for (int t = 0; t < GPT_T; t++)
            memcpy(packed + t * GPT_V, whole + t * V, GPT_V * sizeof(float));
        CU_ASSERT_EQUAL(dt_model_decode(m, x2, 1, 0, last), DT_OK);
        worst = fmax(worst, decode_gap(packed, last, 0));
        CU_ASSERT_EQUAL(dt_model_decode(m, x2 + 1, 2, 1, last), DT_OK);
        worst = fmax(worst, decode_gap(packed, last, 2));
        CU_ASSERT(worst < 1e-6);
        if (worst >= 1e-6)
            fprintf(stderr, "gpt decoding (variant %zu): worst difference %g\n", k, worst);
        /* past the window */
        CU_ASSERT_EQUAL(dt_model_decode(m, x, 2, GPT_T - 1, last), DT_ERR_INVALID_ARG);
        dt_model_destroy(m);
    }
    /* a model that is not a sequence model cannot decode */
    dt_model_t *m = NULL;
    CU_ASSERT_EQUAL_FATAL(layers_job("    - {name: f, kind: flatten}\n"
                                     "    - {name: out, kind: linear, out: classes}\n",
                                     NULL),
                          DT_OK);
    CU_ASSERT_EQUAL_FATAL(try_model(2, &m), DT_OK);
    CU_ASSERT_EQUAL(dt_model_decode_open(m), DT_ERR_USAGE);
    dt_model_destroy(m);
}

/* model.norm rmsnorm: ln1, ln2 and ln_f keep their names and lose their
 * bias; the whole GPT's gradient against finite differences. */
static void test_gpt_rmsnorm(void)
{
    dt_model_t *m = NULL;
    CU_ASSERT_EQUAL_FATAL(gpt_model("  norm: rmsnorm\n", GPT_ROWS, &m), DT_OK);
    /* as test_gpt, each of the 5 norms with 8 floats fewer (no bias) */
    const size_t block = 8 + 216 + 72 + 8 + 288 + 264;
    CU_ASSERT_EQUAL(dt_model_param_numel(m), (size_t)(88 + 48 + 2 * block + 8));
    CU_ASSERT_EQUAL(dt_model_param_count(m), 2 + 2 * 10 + 1);
    int norms = 0;
    for (int i = 0; i < dt_model_param_count(m); i++) {
        const char *name = dt_model_param(m, i)->name;
        norms += strstr(name, "ln") != NULL;
        CU_ASSERT(!(strstr(name, "ln") && strstr(name, "bias")));
    }
    CU_ASSERT_EQUAL(norms, 5);
    float x[GPT_ROWS * GPT_T];
    int32_t y[GPT_ROWS * GPT_T];
    gpt_batch(x, y);
    double worst = worst_fd(m, x, y, GPT_ROWS, 1, 1e-3);
    CU_ASSERT(worst < 2e-2);
    if (worst >= 2e-2) fprintf(stderr, "gpt rmsnorm gradient: worst relative error %g\n", worst);
    dt_model_destroy(m);
    CU_ASSERT_EQUAL(gpt_model("  norm: batchnorm\n", GPT_ROWS, &m), DT_ERR_USAGE);
}

/* ---- the flat buffers' layout -------------------------------------------- */

/* Whether tensors [0, count) start on DT_MODEL_ALIGN_BYTES, lie inside
 * [0, total) without overlapping, and add up to numel elements; and
 * whether every float of host outside them (the padding) is zero. */
static void check_tensors(const struct dt_param_info *t, int count, size_t total, size_t numel,
                          const float *host, const char *what)
{
    size_t sum = 0, end = 0, nonzero = 0;
    for (int i = 0; i < count; i++) {
        CU_ASSERT_EQUAL(t[i].offset * sizeof(float) % DT_MODEL_ALIGN_BYTES, 0);
        CU_ASSERT(t[i].offset + t[i].numel <= total);
        for (int j = 0; j < i; j++)
            CU_ASSERT(t[i].offset >= t[j].offset + t[j].numel ||
                      t[j].offset >= t[i].offset + t[i].numel);
        sum += t[i].numel;
        end = t[i].offset + t[i].numel > end ? t[i].offset + t[i].numel : end;
    }
    CU_ASSERT_EQUAL(sum, numel);
    CU_ASSERT_EQUAL(end, total); /* no padding after the last tensor */
    for (size_t e = 0; e < total; e++) {
        int inside = 0;
        for (int i = 0; i < count && !inside; i++)
            inside = e >= t[i].offset && e < t[i].offset + t[i].numel;
        nonzero += !inside && host[e] != 0.0f;
    }
    CU_ASSERT_EQUAL(nonzero, 0);
    if (nonzero)
        fprintf(stderr, "\n    %s: %zu floats of padding are not zero\n", what, nonzero);
}

static struct dt_param_info *params_of(dt_model_t *m, int buffers)
{
    int n = buffers ? dt_model_buffer_count(m) : dt_model_param_count(m);
    struct dt_param_info *t = calloc((size_t)n + 1, sizeof *t);
    for (int i = 0; i < n && t; i++)
        t[i] = buffers ? *dt_model_buffer(m, i) : *dt_model_param(m, i);
    return t;
}

/* The model's flat buffers after init, backward and an AdamW step with
 * weight decay on every group: aligned tensors, zero padding in the
 * parameters, gradients and optimizer state, finite values; and a host
 * copy with a value in the padding is refused. */
static void check_layout(dt_model_t *m, const float *x, const int32_t *y, int rows)
{
    size_t n = dt_model_num_params(m), nb = dt_model_num_buffer_elems(m);
    int np = dt_model_param_count(m), nbt = dt_model_buffer_count(m);
    float *h = calloc(n + nb + 1, sizeof(float));
    struct dt_param_info *pt = params_of(m, 0), *bt = params_of(m, 1);
    dt_optim_t *o = NULL;
    double loss = 0;
    int64_t correct = 0;
    CU_ASSERT_PTR_NOT_NULL_FATAL(h);
    CU_ASSERT_PTR_NOT_NULL_FATAL(pt);
    CU_ASSERT_PTR_NOT_NULL_FATAL(bt);
    CU_ASSERT_EQUAL((uintptr_t)dt_model_params(m) % DT_MODEL_ALIGN_BYTES, 0);
    CU_ASSERT_EQUAL((uintptr_t)dt_model_grads(m) % DT_MODEL_ALIGN_BYTES, 0);
    CU_ASSERT(n > dt_model_param_numel(m)); /* these models have padding */
    CU_ASSERT_EQUAL(dt_model_get_params(m, h), DT_OK);
    check_tensors(pt, np, n, dt_model_param_numel(m), h, "initial parameters");
    size_t bsum = 0;
    for (int i = 0; i < nbt; i++)
        bsum += bt[i].numel;
    CU_ASSERT_EQUAL(dt_model_get_buffers(m, h), DT_OK);
    check_tensors(bt, nbt, nb, bsum, h, "initial buffers");

    snprintf(job.train.optimizer.name, sizeof job.train.optimizer.name, "adamw");
    job.train.optimizer.weight_decay = 0.1;
    job.train.optimizer.bias_weight_decay = 0.1;
    job.train.optimizer.norm_weight_decay = 0.1;
    CU_ASSERT_EQUAL_FATAL(dt_optim_create(&job, be, n, &o), DT_OK);
    CU_ASSERT_EQUAL(dt_optim_groups_from_model(o, &job, m), DT_OK);
    for (int step = 0; step < 2; step++) {
        CU_ASSERT_EQUAL(dt_model_zero_grads(m), DT_OK);
        CU_ASSERT_EQUAL(dt_model_forward(m, x, y, rows, 1, 1, step, 0, &loss, &correct), DT_OK);
        CU_ASSERT_EQUAL(dt_model_backward(m, rows, 1.0f, NULL), DT_OK);
        CU_ASSERT_EQUAL(dt_model_get_grads(m, h), DT_OK);
        check_tensors(pt, np, n, dt_model_param_numel(m), h, "gradients");
        CU_ASSERT_EQUAL(dt_optim_step(o, dt_model_params(m), dt_model_grads(m), 1e-2), DT_OK);
    }
    for (int s = 0; s < dt_optim_state_count(o); s++) {
        const char *name = NULL;
        float *state = dt_optim_state(o, s, &name);
        CU_ASSERT_EQUAL(dt_backend_copy(be, h, state, n * sizeof(float), DT_COPY_D2H), DT_OK);
        check_tensors(pt, np, n, dt_model_param_numel(m), h, name);
    }
    CU_ASSERT_EQUAL(dt_model_get_buffers(m, h), DT_OK);
    check_tensors(bt, nbt, nb, bsum, h, "running statistics");
    CU_ASSERT_EQUAL(dt_model_get_params(m, h), DT_OK);
    check_tensors(pt, np, n, dt_model_param_numel(m), h, "trained parameters");
    size_t finite = 0;
    for (size_t e = 0; e < n; e++)
        finite += isfinite(h[e]) != 0;
    CU_ASSERT_EQUAL(finite, n);

    /* a value in the padding is refused, naming where it is */
    size_t pad = n, align = DT_MODEL_ALIGN_BYTES / sizeof(float);
    for (int i = 0; i < np; i++) /* the first float after a tensor that ends off a boundary */
        if (pt[i].offset + pt[i].numel < n && (pt[i].offset + pt[i].numel) % align != 0)
            pad = pt[i].offset + pt[i].numel;
    CU_ASSERT_FATAL(pad < n);
    h[pad] = 1.0f;
    CU_ASSERT_EQUAL(dt_model_set_params(m, h), DT_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "padding"));
    h[pad] = 0.0f;
    CU_ASSERT_EQUAL(dt_model_set_params(m, h), DT_OK);
    dt_optim_destroy(o);
    free(pt);
    free(bt);
    free(h);
}

static void count_line(void *ctx, const char *s)
{
    (void)s;
    ++*(int *)ctx;
}

/* A family job from YAML text; its model built on 6x6 images (or token
 * windows of GPT_T for a gpt): the status, and the layers it has. */
static dt_status family_layers(const char *text, int *layers)
{
    dt_status st = dt_job_load_text("deep.yaml", text, &job);
    if (st == DT_OK) st = dt_job_validate(&job);
    int gpt = st == DT_OK && strcmp(job.model.type, "gpt") == 0;
    struct dt_model_io io = {.ndim = 2, .shape = {IN_H, IN_W}, .num_classes = CLASSES};
    if (gpt) io = (struct dt_model_io){.ndim = 1, .shape = {GPT_T}, .num_classes = GPT_V};
    dt_model_t *m = NULL;
    *layers = 0;
    if (st == DT_OK) st = dt_model_create(&job, &io, be, 1, &m);
    if (st == DT_OK) dt_model_describe(m, count_line, layers);
    dt_model_destroy(m);
    return st;
}

/* The deepest gpt and resnet the job accepts build, with the layer counts
 * config.h states; one block more is refused by the job's checks, naming
 * the key and the bound, before any model is built. */
static void test_deepest_families(void)
{
    static const char gpt[] = "model:\n  type: gpt\n  n_layer: %d\n  n_head: 1\n  n_embd: 4\n"
                              "  dropout: %s\n";
    static const char resnet[] = "model:\n  type: resnet\n  channels: [1, 1, 1, 1]\n"
                                 "  blocks: [64, %d, 1, 1]\n";
    char text[256];
    int n = 0;
    snprintf(text, sizeof text, gpt, DT_JOB_MAX_GPT_BLOCKS, "0");
    CU_ASSERT_EQUAL(family_layers(text, &n), DT_OK);
    CU_ASSERT_EQUAL(n, DT_JOB_GPT_LAYERS(DT_JOB_MAX_GPT_BLOCKS, 0));
    snprintf(text, sizeof text, gpt, DT_JOB_MAX_GPT_BLOCKS_DROPOUT, "0.1");
    CU_ASSERT_EQUAL(family_layers(text, &n), DT_OK);
    CU_ASSERT_EQUAL(n, DT_JOB_GPT_LAYERS(DT_JOB_MAX_GPT_BLOCKS_DROPOUT, 1));
    snprintf(text, sizeof text, gpt, DT_JOB_MAX_GPT_BLOCKS + 1, "0");
    CU_ASSERT_EQUAL(family_layers(text, &n), DT_ERR_USAGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "model.n_layer: expected an integer from 1 to "
                                                   "50, got '51' (a deeper gpt is more than the "
                                                   "512 layers a model holds: 10 per block)"));
    snprintf(text, sizeof text, gpt, DT_JOB_MAX_GPT_BLOCKS_DROPOUT + 1, "0.1");
    CU_ASSERT_EQUAL(family_layers(text, &n), DT_ERR_USAGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "model.n_layer: a gpt of 43 transformer blocks "
                                                   "with model.dropout 0.1 is 522 layers"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "at most 42 blocks with dropout, 50 with "
                                                   "model.dropout 0"));
    /* four stages: 64 + 5 + 1 + 1 blocks are 6 + 7 x 71 + 2 x 3 = 509 layers */
    snprintf(text, sizeof text, resnet, 5);
    CU_ASSERT_EQUAL(family_layers(text, &n), DT_OK);
    CU_ASSERT_EQUAL(n, DT_JOB_RESNET_LAYERS(71, 4));
    snprintf(text, sizeof text, resnet, 6);
    CU_ASSERT_EQUAL(family_layers(text, &n), DT_ERR_USAGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(),
                                  "model.blocks: a resnet of 72 residual blocks in "
                                  "4 stages is 516 layers"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "at most 71 blocks in 4 stages"));
}

/* A layer setting too small for a double is a value (the nearest double),
 * as a job key is, not an error. */
static void test_tiny_setting(void)
{
    static const char *const p[] = {"1e-320", "1e-400"};
    char text[256];
    for (int i = 0; i < 2; i++) {
        snprintf(text, sizeof text,
                 "    - {kind: flatten}\n    - {kind: dropout, p: %s}\n"
                 "    - {kind: linear, out: classes}\n",
                 p[i]);
        dt_model_t *m = NULL;
        dt_status st = layers_job(text, NULL);
        if (st == DT_OK) st = try_model(2, &m);
        CU_ASSERT_EQUAL(st, DT_OK);
        if (st != DT_OK) fprintf(stderr, "\n  p: %s: %s\n", p[i], dt_last_error());
        dt_model_destroy(m);
    }
}

/* A layer list whose residual entries expand past the graph: refused
 * naming model.layers, not as a family's count. */
static void test_layer_list_too_deep(void)
{
    char text[16384];
    size_t at = 0;
    for (int i = 0; i < 80 && at < sizeof text; i++)
        at += (size_t)snprintf(text + at, sizeof text - at, "    - {kind: residual, out: 1}\n");
    expect_error(text, NULL, "model.layers expands into more than the 512 layers a model holds");
}

/* A CNN with batch norm (buffers, a bias-free convolution) and a GPT
 * (tied embedding): the layout of their flat buffers. */
static void test_aligned_layout(void)
{
    CU_ASSERT_EQUAL_FATAL(layers_job(CNN, NULL), DT_OK);
    dt_model_t *m = NULL;
    CU_ASSERT_EQUAL_FATAL(try_model(8, &m), DT_OK);
    CU_ASSERT(dt_model_buffer_count(m) > 0);
    float x[8 * IN_H * IN_W];
    int32_t y[8];
    random_batch(x, y, 8, 21);
    check_layout(m, x, y, 8);
    dt_model_destroy(m);

    float gx[GPT_ROWS * GPT_T];
    int32_t gy[GPT_ROWS * GPT_T];
    gpt_batch(gx, gy);
    CU_ASSERT_EQUAL_FATAL(gpt_model(NULL, GPT_ROWS, &m), DT_OK);
    check_layout(m, gx, gy, GPT_ROWS);
    dt_model_destroy(m);
}

static void test_tie_errors(void)
{
    expect_error("    - {name: f, kind: flatten}\n"
                 "    - {name: a, kind: linear, out: 4}\n"
                 "    - {name: b, kind: linear, out: classes, tie: a}\n",
                 NULL, "b.weight is tied to a.weight, but its shape is 5x4 and that one's 4x36");
    expect_error("    - {name: f, kind: flatten}\n"
                 "    - {name: b, kind: linear, out: classes, tie: zz}\n",
                 NULL, "tie: no earlier layer has a parameter zz.weight");
}

static void test_reference_page(void)
{
    char path[4096], *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    dt_layer_write_reference(f);
    fclose(f);
    const char *file = __FILE__, *slash = strrchr(file, '/');
    snprintf(path, sizeof path, "%.*s/../../docs/layers.md", slash ? (int)(slash - file) : 1,
             slash ? file : ".");
    FILE *d = fopen(path, "rb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    char *doc = malloc(len + 2);
    size_t got = fread(doc, 1, len + 1, d);
    fclose(d);
    CU_ASSERT(got == len && memcmp(doc, text, len) == 0);
    if (got != len || memcmp(doc, text, len) != 0)
        fprintf(stderr, "\n  %s is out of date: regenerate it with dtrain config layers\n", path);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "| `conv2d` |"));
    free(doc);
    free(text);
}

int main(void)
{
    struct dt_backend_opts bo = {.threads = 1};
    if (dt_backend_create("cpu", &bo, &be) != DT_OK) {
        fprintf(stderr, "cannot create the cpu backend: %s\n", dt_last_error());
        return 1;
    }
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("model", NULL, NULL);
    CU_ADD(s, test_residual_gradient);
    CU_ADD(s, test_rmsnorm_silu_gradient);
    CU_ADD(s, test_recompute);
    CU_ADD(s, test_recompute_flatten);
    CU_ADD(s, test_kept_gradient);
    CU_ADD(s, test_fused_relu);
    CU_ADD(s, test_cnn_gradient);
    CU_ADD(s, test_groups);
    CU_ADD(s, test_families);
    CU_ADD(s, test_errors);
    CU_ADD(s, test_deepest_families);
    CU_ADD(s, test_layer_list_too_deep);
    CU_ADD(s, test_tiny_setting);
    CU_ADD(s, test_reference_page);
    CU_ADD(s, test_tensor_core);
    CU_ADD(s, test_gpt);
    CU_ADD(s, test_gpt_rmsnorm);
    CU_ADD(s, test_gpt_decode);
    CU_ADD(s, test_tie_errors);
    CU_ADD(s, test_aligned_layout);
    int rc = cu_run_all();
    dt_backend_destroy(be);
    return rc;
}
