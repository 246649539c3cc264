/*
 * test_engine.c - the engine above the ops: model building, initialisation,
 * whole-model gradients, micro-batch accumulation, optimizers, schedules
 * and clipping, on the CPU backend.
 */
#include <string.h>

#include "kernels/backend.h"
#include "runtime/config/config.h"
#include "runtime/monitor/memory.h"
#include "runtime/model/model.h"
#include "runtime/train/optim.h"
#include "core/rng.h"
#include "cu_util.h"

#define IN_H 3
#define IN_W 4
#define CLASSES 5

static struct dt_job job;
static dt_backend_t *be;

static void small_job(const char *act, double dropout)
{
    dt_job_defaults(&job);
    job.model.nhidden = 2;
    job.model.hidden[0] = 7;
    job.model.hidden[1] = 6;
    snprintf(job.model.activation, sizeof job.model.activation, "%s", act);
    job.model.dropout = dropout;
}

static dt_model_t *make_model(int64_t rows)
{
    struct dt_model_io io = {.ndim = 2, .shape = {IN_H, IN_W}, .num_classes = CLASSES};
    dt_model_t *m = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_model_create(&job, &io, be, rows, &m), DT_OK);
    CU_ASSERT_EQUAL_FATAL(dt_model_init_params(m, 7), DT_OK);
    return m;
}

static void random_batch(float *x, int32_t *y, int rows, uint64_t salt)
{
    struct dt_rng_key k = {.seed = salt, .purpose = DT_RNG_TEST};
    for (int i = 0; i < rows * IN_H * IN_W; i++)
        x[i] = dt_rng_normal(&k, (uint64_t)i);
    for (int i = 0; i < rows; i++)
        y[i] = (int32_t)dt_rng_below(&k, 100000 + (uint64_t)i, CLASSES);
}

static void test_layout_and_init(void)
{
    small_job("relu", 0.0);
    dt_model_t *a = make_model(4), *b = make_model(4);
    size_t n = dt_model_num_params(a);
    /* 12*7+7 + 7*6+6 + 6*5+5, each tensor on a 64-float boundary */
    CU_ASSERT_EQUAL(dt_model_param_numel(a), (size_t)(12 * 7 + 7 + 7 * 6 + 6 + 6 * 5 + 5));
    CU_ASSERT_EQUAL(n, (size_t)(6 * 64 + 7));
    CU_ASSERT_EQUAL(dt_model_param_count(a), 6);
    /* GEMMs 12x7, 7x6, 6x5: forward 2*(84+42+30); training adds the weight
     * gradients of all three and the input gradients of the last two */
    CU_ASSERT_DOUBLE_EQUAL(dt_model_flops_per_sample(a, 0), 312.0, 1e-9);
    CU_ASSERT_DOUBLE_EQUAL(dt_model_flops_per_sample(a, 1), 312.0 + 312.0 + 2 * (42 + 30), 1e-9);
    /* last layer first in the flat buffer */
    const struct dt_param_info *first = NULL;
    for (int i = 0; i < dt_model_param_count(a); i++)
        if (dt_model_param(a, i)->offset == 0)
            first = dt_model_param(a, i);
    CU_ASSERT_PTR_NOT_NULL_FATAL(first);
    CU_ASSERT_STRING_EQUAL(first->name, "fc3.weight");
    float pa[512], pb[512];
    CU_ASSERT_EQUAL(dt_model_get_params(a, pa), DT_OK);
    CU_ASSERT_EQUAL(dt_model_get_params(b, pb), DT_OK);
    CU_ASSERT_EQUAL(memcmp(pa, pb, n * sizeof(float)), 0);
    CU_ASSERT_EQUAL(dt_model_init_params(b, 8), DT_OK);
    CU_ASSERT_EQUAL(dt_model_get_params(b, pb), DT_OK);
    CU_ASSERT_NOT_EQUAL(memcmp(pa, pb, n * sizeof(float)), 0);
    /* kaiming-uniform bound for fc1 (fan_in 12): sqrt(2) * sqrt(3/12) */
    const struct dt_param_info *fc1 = dt_model_param(a, 0);
    double bound = sqrt(2.0) * sqrt(3.0 / 12.0), maxabs = 0;
    for (size_t e = 0; e < fc1->numel; e++)
        maxabs = fmax(maxabs, fabs(pa[fc1->offset + e]));
    CU_ASSERT(maxabs <= bound && maxabs > 0.5 * bound);
    dt_model_destroy(a);
    dt_model_destroy(b);
}

static double model_loss(dt_model_t *m, const float *x, const int32_t *y, int rows)
{
    double loss = 0;
    int64_t correct = 0;
    CU_ASSERT_EQUAL(dt_model_forward(m, x, y, rows, 0, 1, 0, 0, &loss, &correct), DT_OK);
    return loss;
}

/* Whole-model gradient against central differences of the summed loss. */
static void check_model_grad(const char *act)
{
    small_job(act, 0.0);
    enum { R = 6 };
    dt_model_t *m = make_model(R);
    float x[R * IN_H * IN_W];
    int32_t y[R];
    random_batch(x, y, R, 3);
    size_t n = dt_model_num_params(m);
    float *p = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    double loss = 0;
    int64_t correct = 0;
    CU_ASSERT_EQUAL(dt_model_zero_grads(m), DT_OK);
    CU_ASSERT_EQUAL(dt_model_forward(m, x, y, R, 1, 1, 0, 0, &loss, &correct), DT_OK);
    CU_ASSERT_EQUAL(dt_model_backward(m, R, 1.0f, NULL), DT_OK);
    CU_ASSERT_EQUAL(dt_model_get_grads(m, g), DT_OK);
    CU_ASSERT_EQUAL(dt_model_get_params(m, p), DT_OK);
    const double h = 1e-2;
    double worst = 0;
    for (size_t i = 0; i < n; i += 7) {
        int inside = 0; /* not in the padding between tensors */
        for (int t = 0; t < dt_model_param_count(m); t++)
            inside |= i >= dt_model_param(m, t)->offset &&
                      i < dt_model_param(m, t)->offset + dt_model_param(m, t)->numel;
        if (!inside)
            continue;
        float keep = p[i];
        p[i] = keep + (float)h;
        CU_ASSERT_EQUAL(dt_model_set_params(m, p), DT_OK);
        double lp = model_loss(m, x, y, R);
        p[i] = keep - (float)h;
        CU_ASSERT_EQUAL(dt_model_set_params(m, p), DT_OK);
        double lm = model_loss(m, x, y, R);
        p[i] = keep;
        double fd = (lp - lm) / (2 * h);
        worst = fmax(worst, fabs(fd - g[i]) / fmax(1e-1, fabs(fd)));
    }
    CU_ASSERT(worst < 2e-2);
    if (worst >= 2e-2)
        fprintf(stderr, "%s model gradient: worst relative error %g\n", act, worst);
    free(p);
    free(g);
    dt_model_destroy(m);
}

static void test_grad_tanh(void) { check_model_grad("tanh"); }
static void test_grad_gelu(void) { check_model_grad("gelu"); }

/* One batch of 8 rows vs two micro-batches of 4 (rows 0-3 and 4-7), with
 * dropout on: the accumulated gradients and the loss must agree. */
static void test_accumulation(void)
{
    small_job("relu", 0.3);
    enum { R = 8 };
    dt_model_t *a = make_model(R), *b = make_model(R / 2);
    float x[R * IN_H * IN_W];
    int32_t y[R];
    random_batch(x, y, R, 5);
    size_t n = dt_model_num_params(a);
    float *ga = malloc(n * sizeof(float)), *gb = malloc(n * sizeof(float));
    double la = 0, lb = 0;
    int64_t ca = 0, cb = 0;
    dt_model_zero_grads(a);
    CU_ASSERT_EQUAL(dt_model_forward(a, x, y, R, 1, 11, 3, 0, &la, &ca), DT_OK);
    CU_ASSERT_EQUAL(dt_model_backward(a, R, 1.0f / R, NULL), DT_OK);
    dt_model_zero_grads(b);
    for (int k = 0; k < 2; k++) {
        int off = k * R / 2;
        CU_ASSERT_EQUAL(dt_model_forward(b, x + off * IN_H * IN_W, y + off, R / 2, 1, 11, 3, off,
                                         &lb, &cb),
                        DT_OK);
        CU_ASSERT_EQUAL(dt_model_backward(b, R / 2, 1.0f / R, NULL), DT_OK);
    }
    dt_model_get_grads(a, ga);
    dt_model_get_grads(b, gb);
    double worst = 0, gmax = 0;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs(ga[i] - gb[i]));
        gmax = fmax(gmax, fabs(ga[i]));
    }
    CU_ASSERT(gmax > 0);
    CU_ASSERT(worst <= 1e-6 * gmax);
    CU_ASSERT(cu_rel_diff(la, lb, 1e-12) < 1e-6);
    CU_ASSERT_EQUAL(ca, cb);
    /* a different step draws different dropout masks */
    double lc = 0;
    int64_t cc = 0;
    CU_ASSERT_EQUAL(dt_model_forward(a, x, y, R, 1, 11, 4, 0, &lc, &cc), DT_OK);
    CU_ASSERT(fabs(lc - la) > 1e-6);
    free(ga);
    free(gb);
    dt_model_destroy(a);
    dt_model_destroy(b);
}

struct hook_log {
    size_t calls, last, first_done;
    int monotonic;
    float *first_copy; /* the gradient buffer at the first report */
    dt_model_t *m;
};

static dt_status record_ready(void *ctx, size_t done)
{
    struct hook_log *h = ctx;
    h->monotonic &= done > h->last;
    h->last = done;
    if (h->calls++ == 0) {
        h->first_done = done;
        dt_model_get_grads(h->m, h->first_copy);
    }
    return DT_OK;
}

/* The hook reports a growing prefix of final gradients: what it reported
 * as final does not change during the rest of backward. */
static void test_grad_hook(void)
{
    small_job("relu", 0.0);
    enum { R = 5 };
    dt_model_t *m = make_model(R);
    float x[R * IN_H * IN_W];
    int32_t y[R];
    random_batch(x, y, R, 9);
    size_t n = dt_model_num_params(m);
    float *final = malloc(n * sizeof(float));
    struct hook_log h = {.monotonic = 1, .first_copy = malloc(n * sizeof(float)), .m = m};
    struct dt_grad_hook hook = {.ready = record_ready, .ctx = &h};
    double loss = 0;
    int64_t correct = 0;
    dt_model_zero_grads(m);
    CU_ASSERT_EQUAL(dt_model_forward(m, x, y, R, 1, 1, 0, 0, &loss, &correct), DT_OK);
    CU_ASSERT_EQUAL(dt_model_backward(m, R, 1.0f, &hook), DT_OK);
    dt_model_get_grads(m, final);
    CU_ASSERT_EQUAL(h.calls, 3); /* three linear layers */
    CU_ASSERT(h.monotonic);
    CU_ASSERT_EQUAL(h.last, n);
    /* the first report is fc3 alone: 6*5 weights at 0, 5 biases at 64 */
    CU_ASSERT_EQUAL(h.first_done, (size_t)(64 + 5));
    CU_ASSERT_EQUAL(memcmp(h.first_copy, final, h.first_done * sizeof(float)), 0);
    double mag = 0;
    for (size_t i = 0; i < h.first_done; i++)
        mag += fabs(final[i]);
    CU_ASSERT(mag > 0);
    free(final);
    free(h.first_copy);
    dt_model_destroy(m);
}

static void test_schedules(void)
{
    dt_job_defaults(&job);
    job.train.optimizer.lr = 1.0;
    job.train.schedule.warmup_steps = 10;
    snprintf(job.train.schedule.name, sizeof job.train.schedule.name, "constant");
    CU_ASSERT_DOUBLE_EQUAL(dt_schedule_lr(&job, 0, 100), 0.1, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(dt_schedule_lr(&job, 9, 100), 1.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(dt_schedule_lr(&job, 50, 100), 1.0, 1e-12);
    snprintf(job.train.schedule.name, sizeof job.train.schedule.name, "step");
    job.train.schedule.step_size = 20;
    job.train.schedule.gamma = 0.5;
    CU_ASSERT_DOUBLE_EQUAL(dt_schedule_lr(&job, 29, 100), 1.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(dt_schedule_lr(&job, 30, 100), 0.5, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(dt_schedule_lr(&job, 75, 100), 0.125, 1e-12);
    snprintf(job.train.schedule.name, sizeof job.train.schedule.name, "cosine");
    job.train.schedule.min_lr = 0.1;
    CU_ASSERT_DOUBLE_EQUAL(dt_schedule_lr(&job, 10, 100), 1.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(dt_schedule_lr(&job, 99, 100), 0.1, 1e-12);
    /* half way through the decay: (1 + 0.1) / 2 */
    CU_ASSERT_DOUBLE_EQUAL(dt_schedule_lr(&job, 10 + 89 / 2, 100),
                           0.1 + 0.9 * 0.5 * (1 + cos(M_PI * 44.0 / 89.0)), 1e-12);
    CU_ASSERT(dt_schedule_lr(&job, 60, 100) < dt_schedule_lr(&job, 40, 100));
}

/* The step gate on the CPU: clipping by the global norm, fp16's unscale
 * first, the norm of ranges, and a skip that leaves a gated update alone. */
static dt_status gate(float *g, size_t lo, size_t hi, float unscale, double clip,
                      struct dt_gate *out)
{
    struct dt_gate_args a = {
        .lo = &lo, .hi = &hi, .count = 1, .decide = 1, .unscale = unscale, .clip_norm = clip};
    return dt_backend_ops(be)->step_gate(be, g, &a, out);
}

static void test_clip(void)
{
    float g[4] = {3, 4, 0, 0};
    struct dt_gate out;
    CU_ASSERT_EQUAL(gate(g, 0, 4, 1.0f, 10.0, &out), DT_OK); /* under the limit */
    CU_ASSERT(out.sumsq == 25.0 && out.factor == 1.0f && !out.skip);
    CU_ASSERT_EQUAL(g[0], 3.0f);
    CU_ASSERT_EQUAL(gate(g, 0, 4, 1.0f, 0.0, &out), DT_OK); /* no limit */
    CU_ASSERT_EQUAL(g[1], 4.0f);
    CU_ASSERT_EQUAL(gate(g, 0, 4, 1.0f, 1.0, &out), DT_OK);
    CU_ASSERT(out.factor == (float)(1.0 / (5.0 + 1e-6)));
    CU_ASSERT_DOUBLE_EQUAL(sqrt(g[0] * g[0] + g[1] * g[1]), 1.0, 1e-5);
    CU_ASSERT_DOUBLE_EQUAL(g[1] / g[0], 4.0 / 3.0, 1e-5);
    /* scaled gradients: unscaled first, then clipped by the unscaled norm */
    float h[4] = {24, 32, 0, 0}; /* 8 x (3, 4) */
    CU_ASSERT_EQUAL(gate(h, 0, 4, 0.125f, 10.0, &out), DT_OK);
    CU_ASSERT(out.sumsq == 1600.0 && out.factor == 1.0f && h[0] == 3.0f && h[1] == 4.0f);
    /* the sum over two ranges, without a decision: nothing changes */
    float k[4] = {1, 2, 3, 4};
    size_t lo[2] = {0, 2}, hi[2] = {1, 4};
    struct dt_gate_args two = {.lo = lo, .hi = hi, .count = 2};
    CU_ASSERT_EQUAL(dt_backend_ops(be)->step_gate(be, k, &two, &out), DT_OK);
    CU_ASSERT(out.sumsq == 1.0 + 9.0 + 16.0 && k[0] == 1.0f && k[3] == 4.0f);
    /* not finite: the gate skips, a gated update changes nothing, an
     * ungated one still runs */
    float bad[2] = {NAN, 1}, p[2] = {1, 1};
    CU_ASSERT_EQUAL(gate(bad, 0, 2, 1.0f, 1.0, &out), DT_OK);
    CU_ASSERT(out.skip && bad[1] == 1.0f);
    struct dt_sgd_args sgd = {.lr = 0.5f, .gated = 1};
    float ok[2] = {1, 1};
    CU_ASSERT_EQUAL(dt_backend_ops(be)->sgd_update(be, p, ok, NULL, 2, &sgd), DT_OK);
    CU_ASSERT(p[0] == 1.0f && p[1] == 1.0f);
    sgd.gated = 0;
    CU_ASSERT_EQUAL(dt_backend_ops(be)->sgd_update(be, p, ok, NULL, 2, &sgd), DT_OK);
    CU_ASSERT(p[0] == 0.5f);
    CU_ASSERT_EQUAL(gate(ok, 0, 2, 1.0f, 0.0, &out), DT_OK); /* finite again: opens */
    sgd.gated = 1;
    CU_ASSERT_EQUAL(dt_backend_ops(be)->sgd_update(be, p, ok, NULL, 2, &sgd), DT_OK);
    CU_ASSERT(p[0] == 0.0f && !out.skip);
}

static void test_optim_sgd_steps(void)
{
    dt_job_defaults(&job);
    snprintf(job.train.optimizer.name, sizeof job.train.optimizer.name, "sgd");
    job.train.optimizer.momentum = 0.5;
    job.train.optimizer.weight_decay = 0;
    dt_optim_t *o = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_optim_create(&job, be, 2, &o), DT_OK);
    float p[2] = {1, 2}, g[2] = {1, -1};
    CU_ASSERT_EQUAL(dt_optim_step(o, p, g, 0.1), DT_OK); /* buf = g */
    CU_ASSERT_DOUBLE_EQUAL(p[0], 0.9, 1e-6);
    CU_ASSERT_EQUAL(dt_optim_step(o, p, g, 0.1), DT_OK); /* buf = 0.5 g + g */
    CU_ASSERT_DOUBLE_EQUAL(p[0], 0.9 - 0.15, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(p[1], 2.1 + 0.15, 1e-6);
    CU_ASSERT_EQUAL(dt_optim_steps(o), 2);
    dt_optim_destroy(o);
    snprintf(job.train.optimizer.name, sizeof job.train.optimizer.name, "lion");
    CU_ASSERT_EQUAL(dt_optim_create(&job, be, 2, &o), DT_ERR_USAGE);
}

/* The memory decision: more than the limit or than the node could ever
 * give a rank is the job's fault (64); more than is free now may pass
 * later (75); what the process holds counts against the node's total but
 * is no longer free, so it is not counted twice. */
static void test_memory_check(void)
{
    const uint64_t G = 1ull << 30;
    struct dt_mem_need need = {
        .params = 1 * G, .grads = 1 * G, .activations = 2 * G, .resident = G, .rows = 128};
    struct dt_mem_avail avail = {.node_total = 32 * G, .node_available = 24 * G, .local_ranks = 4};
    snprintf(avail.host, sizeof avail.host, "node7");
    CU_ASSERT_EQUAL(dt_mem_need_total(&need), 4 * G);
    /* 4 GiB + 1 resident against 8 per rank in total and 6 free: fits */
    CU_ASSERT_EQUAL(dt_mem_check(&need, &avail, 0, 3), DT_OK);
    /* the limit */
    CU_ASSERT_EQUAL(dt_mem_check(&need, &avail, 4.5, 3), DT_ERR_USAGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "more than runtime.memory_limit=4.5 GiB"));
    CU_ASSERT_EQUAL(dt_mem_check(&need, &avail, 5.5, 3), DT_OK);
    /* free memory short now, but the node is large enough: 75 */
    avail.node_available = 12 * G; /* 3 GiB per rank */
    CU_ASSERT_EQUAL(dt_mem_check(&need, &avail, 0, 3), DT_ERR_BUSY);
    CU_ASSERT_EQUAL(dt_status_exit_code(DT_ERR_BUSY), 75);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "only 3.00 GiB is free for rank 3 on node7"));
    /* more than a rank's share of the node: 64, with the numbers */
    need.activations = 7 * G; /* 9 + 1 resident > 8 per rank */
    avail.node_available = 32 * G;
    CU_ASSERT_EQUAL(dt_mem_check(&need, &avail, 0, 3), DT_ERR_USAGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "about 10.0 GiB of host memory"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "activations for 128 rows 7.00 GiB"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(),
                                  "can have at most 8.00 GiB (32.0 GiB on the node, "
                                  "shared by 4 ranks)"));
    /* sizes past counting saturate instead of wrapping */
    need.optim = UINT64_MAX;
    CU_ASSERT_EQUAL(dt_mem_need_total(&need), UINT64_MAX);
    CU_ASSERT_EQUAL(dt_mem_check(&need, &avail, 0, 0), DT_ERR_USAGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "more than 16 EiB"));
    /* nothing known about the node: nothing refused */
    need.optim = 0;
    avail = (struct dt_mem_avail){
        .node_total = UINT64_MAX, .node_available = UINT64_MAX, .local_ranks = 1};
    CU_ASSERT_EQUAL(dt_mem_check(&need, &avail, 0, 0), DT_OK);
    /* this machine's own figures are read */
    dt_mem_probe(1, &avail);
    CU_ASSERT(avail.node_total > 0 && avail.node_total != UINT64_MAX);
    CU_ASSERT(avail.node_available <= avail.node_total);
    CU_ASSERT(dt_mem_resident() > 0);
}

/* The model's sizes are known before it is allocated, and a model whose
 * sizes overflow is refused naming the key, not wrapped. */
static void test_model_measure(void)
{
    struct dt_job jb;
    struct dt_model_size ms;
    struct dt_model_io io = {.ndim = 2, .shape = {28, 28}, .num_classes = 10};
    dt_job_defaults(&jb);
    CU_ASSERT_EQUAL_FATAL(dt_model_measure(&jb, &io, 128, &ms), DT_OK);
    /* 784-512-512-10: 669706 parameters; fc3's bias ends at 5130, so fc2's
     * weight starts at 5184 (a multiple of 64 floats), the rest aligned */
    CU_ASSERT_EQUAL(ms.params, 784u * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10 + 54);
    CU_ASSERT(ms.arena_bytes >= 128u * (784 + 512 + 512 + 10) * 4);
    io.shape[0] = 1ll << 40; /* a sample too large for a layer */
    CU_ASSERT_EQUAL(dt_model_measure(&jb, &io, 128, &ms), DT_ERR_BAD_DATA);
    io.shape[0] = 28;
    CU_ASSERT_EQUAL(dt_model_measure(&jb, &io, 1ll << 40, &ms), DT_ERR_USAGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "train.micro_batch"));
}

int main(void)
{
    struct dt_backend_opts bo = {.threads = 1};
    if (dt_backend_create("cpu", &bo, &be) != DT_OK) {
        fprintf(stderr, "cannot create the cpu backend: %s\n", dt_last_error());
        return 1;
    }
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("engine", NULL, NULL);
    CU_ADD(s, test_layout_and_init);
    CU_ADD(s, test_grad_tanh);
    CU_ADD(s, test_grad_gelu);
    CU_ADD(s, test_accumulation);
    CU_ADD(s, test_grad_hook);
    CU_ADD(s, test_schedules);
    CU_ADD(s, test_clip);
    CU_ADD(s, test_optim_sgd_steps);
    CU_ADD(s, test_memory_check);
    CU_ADD(s, test_model_measure);
    int rc = cu_run_all();
    dt_backend_destroy(be);
    return rc;
}
