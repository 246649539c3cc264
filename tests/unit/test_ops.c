/*
 * test_ops.c - the CPU ops of kernels/ops.h, through both op tables of the
 * cpu backend (the plain C reference and the fast BLAS/vectorised one).
 *
 * Every op with a backward gets a central-difference gradient check in
 * double against the loss L = sum(out * R) for a random R; parameter
 * gradients are checked to accumulate and activation gradients to be
 * written (buffers are pre-filled with NaN or with old values). The fast
 * table is compared with the reference on odd shapes, dropout with the
 * documented mask formula, the optimizers with the torch formulas written
 * out in double, and every op with its invalid-argument checks; last, the
 * rule that picks OpenBLAS's kernels when it did not know the CPU.
 */
#include <float.h>
#include <stdio.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "kernels/backend.h"
#include "core/rng.h"
#include "tests/common/op_args.h"
#include "cu_util.h"

/* finite differences: step, relative tolerance, and the gradient size
 * below which the tolerance becomes absolute (FD_TOL * FD_FLOOR) */
#define FD_H 1e-2f
#define FD_TOL 2e-3
#define FD_FLOOR 0.1
/* fast vs reference */
#define GEMM_TOL 1e-5 /* max |diff| / max |value| */
#define ELEM_TOL 1e-6 /* per element, relative */

enum { REF = 0, FAST = 1, NBACKENDS = 2 };
static const char *const bname[NBACKENDS] = {"reference", "fast"};
static dt_backend_t *backends[NBACKENDS];
static const struct dt_ops *ops[NBACKENDS];

/* ---- helpers ---------------------------------------------------------- */

static uint64_t draws; /* distinct draws for every array in the run */

static void fill_uniform(float *x, size_t n, float lo, float hi)
{
    struct dt_rng_key key = {.seed = 12345, .purpose = DT_RNG_TEST, .stream = 1};
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * dt_rng_uniform(&key, draws++);
}

/* Values with |x| in [0.1, 1], random sign: away from ReLU's kink. */
static void fill_away_from_zero(float *x, size_t n)
{
    fill_uniform(x, n, 0.1f, 1.0f);
    struct dt_rng_key key = {.seed = 777, .purpose = DT_RNG_TEST, .stream = 2};
    for (size_t i = 0; i < n; i++)
        if (dt_rng_uniform(&key, draws++) < 0.5f)
            x[i] = -x[i];
}

static void fill_value(float *x, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        x[i] = v;
}

static float *fnew(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof *p);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    return p;
}

static double dot(const float *a, const float *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

static double max_rel_err(const float *a, const float *b, size_t n, double floor_)
{
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = cu_rel_diff(a[i], b[i], floor_);
        if (!(e <= worst)) /* NaN counts as worst */
            worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

/* max |a - ref| / max |ref|: the error measure for sums (GEMM) */
static double norm_err(const float *a, const double *ref, size_t n)
{
    double diff = 0.0, mag = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(a[i] - ref[i]);
        if (isnan(d))
            return INFINITY;
        if (d > diff)
            diff = d;
        if (fabs(ref[i]) > mag)
            mag = fabs(ref[i]);
    }
    return diff / mag;
}

static int any_nan(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (isnan(x[i]))
            return 1;
    return 0;
}

typedef double (*loss_fn)(void *ctx);

/* Largest relative error between grad[i] and the central difference
 * (L(x_i + h) - L(x_i - h)) / (2h), with x perturbed in place. */
static double fd_max_err(loss_fn L, void *ctx, float *x, size_t n, const float *grad)
{
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        float x0 = x[i];
        x[i] = x0 + FD_H;
        float xp = x[i];
        double lp = L(ctx);
        x[i] = x0 - FD_H;
        float xm = x[i];
        double lm = L(ctx);
        x[i] = x0;
        double num = (lp - lm) / ((double)xp - (double)xm);
        double e = cu_rel_diff(grad[i], num, FD_FLOOR);
        if (!(e <= worst))
            worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

#define CHECK_FD(what, k, err)                                                                     \
    do {                                                                                           \
        double e_ = (err);                                                                         \
        if (!(e_ < FD_TOL))                                                                        \
            printf("\n  %s (%s): finite-difference rel err %.3g\n", what, bname[k], e_);          \
        CU_ASSERT(e_ < FD_TOL);                                                                    \
    } while (0)

#define OK(expr) CU_ASSERT_EQUAL_FATAL((expr), DT_OK)

/* The op failed with DT_ERR_INVALID_ARG and its message names the op. */
#define CHECK_INVALID(expr, opname)                                                                \
    do {                                                                                           \
        dt_clear_error();                                                                          \
        dt_status st_ = (expr);                                                                    \
        CU_ASSERT_EQUAL(st_, DT_ERR_INVALID_ARG);                                                  \
        CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), opname));                                   \
    } while (0)

static int suite_init(void)
{
    for (int k = 0; k < NBACKENDS; k++) {
        struct dt_backend_opts o = {.threads = 1, .reference_kernels = k == REF};
        if (dt_backend_create("cpu", &o, &backends[k]) != DT_OK)
            return -1;
        ops[k] = dt_backend_ops(backends[k]);
    }
    return 0;
}

static int suite_cleanup(void)
{
    for (int k = 0; k < NBACKENDS; k++) {
        dt_backend_destroy(backends[k]);
        backends[k] = NULL;
    }
    return 0;
}

/* ---- backend ---------------------------------------------------------- */

static void test_backend_create(void)
{
    for (int k = 0; k < NBACKENDS; k++) {
        CU_ASSERT_STRING_EQUAL(dt_backend_name(backends[k]), "cpu");
        const struct dt_ops *o = ops[k];
        CU_ASSERT_FATAL(o != NULL);
        /* every entry is filled */
        CU_ASSERT(o->linear_fwd && o->linear_bwd && o->bias_fwd && o->bias_bwd);
        CU_ASSERT(o->relu_fwd && o->relu_bwd && o->gelu_fwd && o->gelu_bwd);
        CU_ASSERT(o->tanh_fwd && o->tanh_bwd && o->dropout_fwd && o->dropout_bwd);
        CU_ASSERT(o->flatten_fwd && o->flatten_bwd && o->softmax_xent_fwd &&
                  o->softmax_xent_bwd);
        CU_ASSERT(o->sgd_update && o->adamw_update && o->sumsq && o->step_gate && o->scale &&
                  o->fill && o->all_finite);
        CU_ASSERT_EQUAL(dt_backend_sync(backends[k]), DT_OK);
    }
    /* reference_kernels selects a different table */
    CU_ASSERT(ops[REF] != ops[FAST]);
    CU_ASSERT(ops[REF]->linear_fwd != ops[FAST]->linear_fwd);
    CU_ASSERT(ops[REF]->adamw_update != ops[FAST]->adamw_update);

    dt_backend_t *be = NULL;
    struct dt_backend_opts bad = {.threads = 0};
    dt_clear_error();
    CU_ASSERT_EQUAL(dt_backend_create("cpu", &bad, &be), DT_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NULL(be);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "threads"));
}

/* What the cpu backend says it is, by instance and by name, and what it
 * says of the names it is not. */
static void test_backend_caps(void)
{
    const struct dt_backend_caps *named = dt_backend_caps_named("cpu");
    CU_ASSERT_PTR_NOT_NULL_FATAL(named);
    for (int k = 0; k < NBACKENDS; k++) {
        const struct dt_backend_caps *c = dt_backend_caps(backends[k]);
        CU_ASSERT_PTR_EQUAL(c, named); /* both op tables: one backend */
        struct dt_backend_mem mem;
        CU_ASSERT_EQUAL(dt_backend_mem_info(backends[k], &mem), DT_OK);
        CU_ASSERT_EQUAL(mem.device, c->device_memory);
        CU_ASSERT_EQUAL(c->has_stream, dt_backend_stream(backends[k]) != NULL);
    }
    CU_ASSERT_EQUAL(named->device_memory, 0);
    CU_ASSERT_EQUAL(named->has_stream, 0);
    CU_ASSERT_EQUAL(named->per_device, 0);
    CU_ASSERT_EQUAL(named->precisions, DT_PRECISION_BIT(DT_F32) | DT_PRECISION_BIT(DT_BF16) |
                                           DT_PRECISION_BIT(DT_F16));
    /* bf16 and fp16 are fp32 with rounded inputs here: not native */
    CU_ASSERT_EQUAL(named->native_precisions, DT_PRECISION_BIT(DT_F32));
    CU_ASSERT_STRING_EQUAL(named->missing_op_hint, "");
    CU_ASSERT_PTR_NULL(dt_backend_caps_named("tpu"));
    CU_ASSERT_PTR_NULL(dt_backend_caps_named(NULL));

    char why[512] = "x";
    CU_ASSERT_EQUAL(dt_backend_available("cpu", 0, why, sizeof why), 1);
    CU_ASSERT_EQUAL(dt_backend_available("tpu", 0, why, sizeof why), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "unknown compute backend 'tpu'"));
    const char *picked = dt_backend_auto(0, why, sizeof why);
    CU_ASSERT_PTR_NOT_NULL_FATAL(dt_backend_caps_named(picked));
#ifdef DT_HAVE_CUDA
    const struct dt_backend_caps *gpu = dt_backend_caps_named("cuda");
    CU_ASSERT_PTR_NOT_NULL_FATAL(gpu);
    CU_ASSERT_EQUAL(gpu->device_memory, 1);
    CU_ASSERT_EQUAL(gpu->has_stream, 1);
    CU_ASSERT_EQUAL(gpu->per_device, 1);
    CU_ASSERT(gpu->native_precisions & DT_PRECISION_BIT(DT_BF16));
    char probe[512];
    int usable = dt_cuda_usable_device(0, probe, sizeof probe);
    CU_ASSERT_EQUAL(dt_backend_caps_named(picked)->device_memory, usable);
    CU_ASSERT_EQUAL(why[0] != '\0', !usable);
#else
    /* no GPU backend in this build: auto is the cpu, and says why */
    CU_ASSERT_PTR_NULL(dt_backend_caps_named("cuda"));
    CU_ASSERT_STRING_EQUAL(picked, "cpu");
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "built without CUDA"));
    CU_ASSERT_EQUAL(dt_backend_available("cuda", 0, why, sizeof why), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "built without CUDA"));
#endif
}

static void test_backend_memory(void)
{
    dt_backend_t *be = backends[FAST];
    const size_t sizes[] = {0, 1, 3, 64, 1000, 1 << 20};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        unsigned char *p = NULL;
        CU_ASSERT_EQUAL_FATAL(dt_backend_alloc(be, sizes[s], (void **)&p), DT_OK);
        CU_ASSERT_PTR_NOT_NULL_FATAL(p);
        CU_ASSERT_EQUAL((uintptr_t)p % 256, 0);
        size_t nonzero = 0;
        for (size_t i = 0; i < sizes[s]; i++)
            nonzero += p[i] != 0;
        CU_ASSERT_EQUAL(nonzero, 0);
        memset(p, 0xab, sizes[s]); /* the whole size is writable */
        dt_backend_free(be, p);
    }
    dt_backend_free(be, NULL); /* no-op */

    float src[37], dst[37];
    fill_uniform(src, 37, -1, 1);
    const enum dt_copy_kind kinds[] = {DT_COPY_H2D, DT_COPY_D2H, DT_COPY_D2D};
    for (int k = 0; k < 3; k++) {
        memset(dst, 0, sizeof dst);
        CU_ASSERT_EQUAL(dt_backend_copy(be, dst, src, sizeof src, kinds[k]), DT_OK);
        CU_ASSERT_EQUAL(memcmp(dst, src, sizeof src), 0);
    }
    CU_ASSERT_EQUAL(dt_backend_copy(be, NULL, src, sizeof src, DT_COPY_D2D), DT_ERR_INVALID_ARG);
}

/* ---- linear ----------------------------------------------------------- */

struct lin_ctx {
    const struct dt_ops *o;
    dt_backend_t *be;
    float *in, *w, *out;
    const float *R;
    int B, I, O;
};

static double lin_loss(void *p)
{
    struct lin_ctx *c = p;
    CU_ASSERT_EQUAL(c->o->linear_fwd(c->be, c->out, c->in, c->w, NULL, c->B, c->I, c->O, NULL),
                    DT_OK);
    return dot(c->out, c->R, (size_t)c->B * c->O);
}

static void test_linear_grad(void)
{
    enum { B = 3, I = 5, O = 4 };
    for (int k = 0; k < NBACKENDS; k++) {
        float in[B * I], w[O * I], out[B * O], R[B * O], din[B * I], dw[O * I];
        fill_uniform(in, B * I, -1, 1);
        fill_uniform(w, O * I, -1, 1);
        fill_uniform(R, B * O, -1, 1);
        fill_value(din, B * I, NAN); /* written */
        fill_value(dw, O * I, 0.0f);
        OK(ops[k]->linear_bwd(backends[k], din, dw, R, in, w, B, I, O, NULL));
        struct lin_ctx c = {ops[k], backends[k], in, w, out, R, B, I, O};
        CHECK_FD("linear d/din", k, fd_max_err(lin_loss, &c, in, B * I, din));
        CHECK_FD("linear d/dw", k, fd_max_err(lin_loss, &c, w, O * I, dw));
    }
}

static void test_linear_accumulates(void)
{
    enum { B = 6, I = 19, O = 7 };
    for (int k = 0; k < NBACKENDS; k++) {
        float in[B * I], w[O * I], dout[B * O], din0[B * I], dw0[O * I], din[B * I], dw[O * I],
            old[O * I];
        fill_uniform(in, B * I, -1, 1);
        fill_uniform(w, O * I, -1, 1);
        fill_uniform(dout, B * O, -1, 1);
        fill_uniform(old, O * I, -1, 1);
        fill_value(dw0, O * I, 0.0f);
        OK(ops[k]->linear_bwd(backends[k], din0, dw0, dout, in, w, B, I, O, NULL));

        memcpy(dw, old, sizeof dw);
        fill_value(din, B * I, 1e30f);
        OK(ops[k]->linear_bwd(backends[k], din, dw, dout, in, w, B, I, O, NULL));
        CU_ASSERT(max_rel_err(din, din0, B * I, 1e-6) == 0.0); /* written, not added */
        float expect[O * I];
        for (int i = 0; i < O * I; i++)
            expect[i] = old[i] + dw0[i];
        CU_ASSERT(max_rel_err(dw, expect, O * I, 1.0) < ELEM_TOL); /* added */

        /* twice = 2x (micro-batch accumulation); din NULL skips din */
        fill_value(dw, O * I, 0.0f);
        OK(ops[k]->linear_bwd(backends[k], NULL, dw, dout, in, w, B, I, O, NULL));
        OK(ops[k]->linear_bwd(backends[k], NULL, dw, dout, in, w, B, I, O, NULL));
        for (int i = 0; i < O * I; i++)
            expect[i] = 2.0f * dw0[i];
        CU_ASSERT(max_rel_err(dw, expect, O * I, 1.0) < ELEM_TOL);
    }
}

/* Both tables against the product in double, on odd shapes. */
static void test_linear_fast_vs_ref(void)
{
    const int shapes[][3] = {{1, 1, 1}, {3, 7, 5}, {17, 33, 9}, {64, 100, 37}, {128, 784, 10}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], I = shapes[s][1], O = shapes[s][2];
        float *in = fnew((size_t)B * I), *w = fnew((size_t)O * I), *dout = fnew((size_t)B * O);
        float *out = fnew((size_t)B * O), *din = fnew((size_t)B * I), *dw = fnew((size_t)O * I);
        double *rout = calloc((size_t)B * O, sizeof *rout);
        double *rdin = calloc((size_t)B * I, sizeof *rdin);
        double *rdw = calloc((size_t)O * I, sizeof *rdw);
        CU_ASSERT_FATAL(rout && rdin && rdw);
        fill_uniform(in, (size_t)B * I, -1, 1);
        fill_uniform(w, (size_t)O * I, -1, 1);
        fill_uniform(dout, (size_t)B * O, -1, 1);
        for (int b = 0; b < B; b++)
            for (int o = 0; o < O; o++)
                for (int i = 0; i < I; i++) {
                    rout[b * O + o] += (double)in[b * I + i] * w[o * I + i];
                    rdin[b * I + i] += (double)dout[b * O + o] * w[o * I + i];
                    rdw[o * I + i] += (double)dout[b * O + o] * in[b * I + i];
                }
        for (int k = 0; k < NBACKENDS; k++) {
            fill_value(dw, (size_t)O * I, 0.0f);
            OK(ops[k]->linear_fwd(backends[k], out, in, w, NULL, B, I, O, NULL));
            OK(ops[k]->linear_bwd(backends[k], din, dw, dout, in, w, B, I, O, NULL));
            double e1 = norm_err(out, rout, (size_t)B * O), e2 = norm_err(din, rdin, (size_t)B * I),
                   e3 = norm_err(dw, rdw, (size_t)O * I);
            if (!(e1 < GEMM_TOL && e2 < GEMM_TOL && e3 < GEMM_TOL))
                printf("\n  linear %dx%dx%d (%s): err out %.3g din %.3g dw %.3g\n", B, I, O,
                       bname[k], e1, e2, e3);
            CU_ASSERT(e1 < GEMM_TOL && e2 < GEMM_TOL && e3 < GEMM_TOL);
        }
        free(in), free(w), free(dout), free(out), free(din), free(dw);
        free(rout), free(rdin), free(rdw);
    }
}

/* Known roundings: ties to even, overflow to infinity, NaN kept. */
static void test_round_values(void)
{
    CU_ASSERT_EQUAL(dt_cpu_round_bf16(1.0f + 0x1p-8f), 1.0f);             /* tie: to even */
    CU_ASSERT_EQUAL(dt_cpu_round_bf16(1.0f + 0x1p-8f + 0x1p-12f), 1.0f + 0x1p-7f);
    CU_ASSERT_EQUAL(dt_cpu_round_bf16(1.0f + 0x3p-8f), 1.0f + 0x1p-6f);  /* tie: to even, up */
    CU_ASSERT_EQUAL(dt_cpu_round_bf16(-3.0f), -3.0f);
    CU_ASSERT(isinf(dt_cpu_round_bf16(FLT_MAX)));
    CU_ASSERT(isnan(dt_cpu_round_bf16(NAN)));
    CU_ASSERT_EQUAL(dt_cpu_round_fp16(65504.0f), 65504.0f);
    CU_ASSERT(isinf(dt_cpu_round_fp16(65520.0f)));                         /* past the max */
    CU_ASSERT_EQUAL(dt_cpu_round_fp16(1.0f + 0x1p-11f), 1.0f);            /* tie: to even */
    CU_ASSERT_EQUAL(dt_cpu_round_fp16(0x1p-24f), 0x1p-24f);               /* subnormal */
    CU_ASSERT_EQUAL(dt_cpu_round_fp16(0x1p-26f), 0.0f);                   /* underflow */
}

/* Gradients to bf16 bits and back: known bit patterns, an exact round
 * trip for values bf16 holds, both tables alike. */
static void test_bf16_cast(void)
{
    const uint32_t in_bits[] = {0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f808001u, 0x7f7fffffu,
                                0x80000000u, 0x7f800000u, 0xff800000u, 0x7f800001u, 0xffc00000u,
                                0x00000001u, 0x00018000u};
    const uint16_t want[] = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0x7f80, 0x8000,
                             0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x0000, 0x0002};
    enum { N = sizeof want / sizeof want[0] };
    float x[N], back[N];
    uint16_t b[N];
    memcpy(x, in_bits, sizeof x);
    for (int k = 0; k < NBACKENDS; k++) {
        OK(ops[k]->to_bf16(backends[k], b, x, N));
        for (int i = 0; i < N; i++) {
            if (b[i] != want[i])
                printf("\n  to_bf16(%08x) = %04x, want %04x (%s)\n", in_bits[i], b[i], want[i],
                       bname[k]);
            CU_ASSERT_EQUAL(b[i], want[i]);
        }
        OK(ops[k]->from_bf16(backends[k], back, b, N));
        CU_ASSERT_EQUAL(back[0], 1.0f);
        CU_ASSERT_EQUAL(back[2], 1.0f + 0x1p-6f);
        CU_ASSERT(isinf(back[4]) && back[4] > 0);
        CU_ASSERT(signbit(back[5]) && back[5] == 0.0f);
        CU_ASSERT(isnan(back[8]) && isnan(back[9]));
        float r[64], r2[64];
        uint16_t rb[64];
        fill_uniform(r, 64, -1000, 1000);
        for (int i = 0; i < 64; i++)
            r[i] = dt_cpu_round_bf16(r[i]);
        OK(ops[k]->to_bf16(backends[k], rb, r, 64));
        OK(ops[k]->from_bf16(backends[k], r2, rb, 64));
        CU_ASSERT(memcmp(r, r2, sizeof r) == 0);
        OK(ops[k]->to_bf16(backends[k], NULL, NULL, 0));
        CU_ASSERT_EQUAL(ops[k]->from_bf16(backends[k], NULL, b, 3), DT_ERR_INVALID_ARG);
    }
}

/* bf16/fp16: both tables give what fp32 gives on operands rounded first,
 * bit for bit (the same GEMM on the same numbers), and differ from fp32 on
 * unrounded ones; an fp16 operand past 65504 overflows the product. */
static void test_linear_precision(void)
{
    const int B = 17, I = 33, O = 9;
    const enum dt_dtype precs[] = {DT_BF16, DT_F16};
    float *in = fnew((size_t)B * I), *w = fnew((size_t)O * I), *dout = fnew((size_t)B * O);
    float *rin = fnew((size_t)B * I), *rw = fnew((size_t)O * I), *rdout = fnew((size_t)B * O);
    float *out = fnew((size_t)B * O), *din = fnew((size_t)B * I), *dw = fnew((size_t)O * I);
    float *xout = fnew((size_t)B * O), *xdin = fnew((size_t)B * I), *xdw = fnew((size_t)O * I);
    fill_uniform(in, (size_t)B * I, -1, 1);
    fill_uniform(w, (size_t)O * I, -1, 1);
    fill_uniform(dout, (size_t)B * O, -1, 1);
    for (size_t p = 0; p < 2; p++) {
        float (*round)(float) = precs[p] == DT_BF16 ? dt_cpu_round_bf16 : dt_cpu_round_fp16;
        for (int i = 0; i < B * I; i++) rin[i] = round(in[i]);
        for (int i = 0; i < O * I; i++) rw[i] = round(w[i]);
        for (int i = 0; i < B * O; i++) rdout[i] = round(dout[i]);
        for (int ref = 0; ref <= 1; ref++) {
            dt_backend_t *lo = NULL;
            struct dt_backend_opts o = {.threads = 1, .reference_kernels = ref,
                                        .precision = precs[p]};
            CU_ASSERT_EQUAL_FATAL(dt_backend_create("cpu", &o, &lo), DT_OK);
            const struct dt_ops *lops = dt_backend_ops(lo);
            int k = ref ? REF : FAST;
            fill_value(dw, (size_t)O * I, 0.0f);
            fill_value(xdw, (size_t)O * I, 0.0f);
            OK(lops->linear_fwd(lo, out, in, w, NULL, B, I, O, NULL));
            OK(lops->linear_bwd(lo, din, dw, dout, in, w, B, I, O, NULL));
            OK(ops[k]->linear_fwd(backends[k], xout, rin, rw, NULL, B, I, O, NULL));
            OK(ops[k]->linear_bwd(backends[k], xdin, xdw, rdout, rin, rw, B, I, O, NULL));
            CU_ASSERT(memcmp(out, xout, sizeof(float) * B * O) == 0);
            CU_ASSERT(memcmp(din, xdin, sizeof(float) * B * I) == 0);
            CU_ASSERT(memcmp(dw, xdw, sizeof(float) * O * I) == 0);
            OK(ops[k]->linear_fwd(backends[k], xout, in, w, NULL, B, I, O, NULL));
            CU_ASSERT(memcmp(out, xout, sizeof(float) * B * O) != 0);
            float big = in[0];
            in[0] = 70000.0f; /* beyond fp16, within bf16 */
            OK(lops->linear_fwd(lo, out, in, w, NULL, B, I, O, NULL));
            CU_ASSERT_EQUAL(!isfinite(out[0]), precs[p] == DT_F16);
            in[0] = big;
            dt_backend_destroy(lo);
        }
    }
    free(in), free(w), free(dout), free(rin), free(rw), free(rdout);
    free(out), free(din), free(dw), free(xout), free(xdin), free(xdw);
}

/* Empty sums: I == 0 gives out = 0 (the bias with one), O == 0 gives din =
 * 0; B == 0 is a no-op. */
static void test_linear_empty(void)
{
    for (int k = 0; k < NBACKENDS; k++) {
        float out[6], din[6], dw[6], x[6] = {1, 2, 3, 4, 5, 6};
        fill_value(out, 6, NAN);
        OK(ops[k]->linear_fwd(backends[k], out, x, x, NULL, 2, 0, 3, NULL));
        for (int i = 0; i < 6; i++)
            CU_ASSERT_EQUAL(out[i], 0.0f);
        fill_value(out, 6, NAN);
        OK(ops[k]->linear_fwd(backends[k], out, x, x, x + 3, 2, 0, 3, NULL));
        for (int i = 0; i < 6; i++)
            CU_ASSERT_EQUAL(out[i], x[3 + i % 3]);
        fill_value(din, 6, NAN);
        fill_value(dw, 6, 7.0f);
        OK(ops[k]->linear_bwd(backends[k], din, dw, x, x, x, 2, 3, 0, NULL));
        for (int i = 0; i < 6; i++)
            CU_ASSERT_EQUAL(din[i], 0.0f);
        OK(ops[k]->linear_bwd(backends[k], din, dw, x, x, x, 0, 3, 2, NULL));
        for (int i = 0; i < 6; i++)
            CU_ASSERT_EQUAL(dw[i], 7.0f); /* nothing added */
    }
}

/* ---- bias ------------------------------------------------------------- */

struct bias_ctx {
    const struct dt_ops *o;
    dt_backend_t *be;
    const float *x0;
    float *x, *b;
    const float *R;
    int B, C;
};

static double bias_loss(void *p)
{
    struct bias_ctx *c = p;
    memcpy(c->x, c->x0, (size_t)c->B * c->C * sizeof *c->x);
    CU_ASSERT_EQUAL(c->o->bias_fwd(c->be, c->x, c->b, c->B, c->C), DT_OK);
    return dot(c->x, c->R, (size_t)c->B * c->C);
}

static void test_bias_grad(void)
{
    enum { B = 4, C = 21 };
    for (int k = 0; k < NBACKENDS; k++) {
        float x0[B * C], x[B * C], b[C], R[B * C], db[C], old[C];
        fill_uniform(x0, B * C, -1, 1);
        fill_uniform(b, C, -1, 1);
        fill_uniform(R, B * C, -1, 1);
        fill_value(db, C, 0.0f);
        OK(ops[k]->bias_bwd(backends[k], db, R, B, C));
        struct bias_ctx c = {ops[k], backends[k], x0, x, b, R, B, C};
        CHECK_FD("bias d/db", k, fd_max_err(bias_loss, &c, b, C, db));

        /* forward: x + b per row */
        bias_loss(&c);
        CU_ASSERT_EQUAL(x[2 * C + 5], x0[2 * C + 5] + b[5]);

        /* accumulates */
        fill_uniform(old, C, -1, 1);
        float acc[C];
        memcpy(acc, old, sizeof acc);
        OK(ops[k]->bias_bwd(backends[k], acc, R, B, C));
        float expect[C];
        for (int i = 0; i < C; i++)
            expect[i] = old[i] + db[i];
        CU_ASSERT(max_rel_err(acc, expect, C, 1.0) < ELEM_TOL);
    }
}

static void test_bias_fast_vs_ref(void)
{
    const int shapes[][2] = {{1, 1}, {3, 15}, {5, 16}, {7, 17}, {128, 512}, {9, 300}, {2, 700}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], C = shapes[s][1];
        size_t n = (size_t)B * C;
        float *x = fnew(n), *b = fnew(C), *xr = fnew(n), *xf = fnew(n);
        float *dbr = fnew(C), *dbf = fnew(C);
        fill_uniform(x, n, -1, 1);
        fill_uniform(b, C, -1, 1);
        fill_uniform(dbr, C, -1, 1);
        memcpy(dbf, dbr, C * sizeof *dbf);
        memcpy(xr, x, n * sizeof *x);
        memcpy(xf, x, n * sizeof *x);
        OK(ops[REF]->bias_fwd(backends[REF], xr, b, B, C));
        OK(ops[FAST]->bias_fwd(backends[FAST], xf, b, B, C));
        OK(ops[REF]->bias_bwd(backends[REF], dbr, x, B, C));
        OK(ops[FAST]->bias_bwd(backends[FAST], dbf, x, B, C));
        CU_ASSERT(max_rel_err(xf, xr, n, 1e-3) < ELEM_TOL);
        CU_ASSERT(max_rel_err(dbf, dbr, C, 1.0) < ELEM_TOL);
        free(x), free(b), free(xr), free(xf), free(dbr), free(dbf);
    }
}

/* ---- activations ------------------------------------------------------ */

struct act_ctx {
    const struct dt_ops *o;
    dt_backend_t *be;
    int a;
    float *in, *out;
    const float *R;
    size_t n;
};

static double act_loss(void *p)
{
    struct act_ctx *c = p;
    CU_ASSERT_EQUAL(dt_test_act_fwd(c->o, c->be, c->a, c->out, c->in, c->n), DT_OK);
    return dot(c->out, c->R, c->n);
}

/* Every element-wise op of DT_UNARY_LIST, inputs away from 0 at three
 * scales (around a ReLU's kink, in GELU's and tanh's bends, out in the
 * tails). */
static void check_act_grad(int a, float lo_scale)
{
    enum { N = 41 };
    for (int k = 0; k < NBACKENDS; k++) {
        float in[N], out[N], R[N], din[N];
        fill_away_from_zero(in, N);
        for (int i = 0; i < N; i++)
            in[i] *= lo_scale;
        fill_uniform(R, N, -1, 1);
        OK(dt_test_act_fwd(ops[k], backends[k], a, out, in, N));
        fill_value(din, N, NAN); /* written */
        OK(dt_test_act_bwd(ops[k], backends[k], a, din, R, in, out, N));
        struct act_ctx c = {ops[k], backends[k], a, in, out, R, N};
        char what[32];
        snprintf(what, sizeof what, "%s d/din x%g", dt_test_act_name(a), lo_scale);
        CHECK_FD(what, k, fd_max_err(act_loss, &c, in, N, din));
    }
}

static void test_activation_grad(void)
{
    const float scales[] = {1.0f, 2.0f, 3.0f};
    for (int a = 0; a < DT_TEST_NACT; a++)
        for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++)
            check_act_grad(a, scales[s]);
}

static void test_activation_values(void)
{
    const float x[] = {-2.0f, -1.0f, 0.0f, 0.5f, 1.0f, 3.0f, NAN};
    enum { N = sizeof x / sizeof x[0] };
    /* torch.nn.functional.gelu (exact) and tanh, in double */
    const double gelu[] = {-0.04550026389635842, -0.15865525393145707, 0.0, 0.34573123063700656,
                           0.8413447460685429, 2.99595030590511};
    for (int k = 0; k < NBACKENDS; k++) {
        float out[N];
        OK(ops[k]->relu_fwd(backends[k], out, x, N));
        CU_ASSERT(out[0] == 0.0f && out[1] == 0.0f && out[2] == 0.0f && out[3] == 0.5f &&
                  out[5] == 3.0f);
        CU_ASSERT(isnan(out[6])); /* NaN passes through */
        float ones[N], din[N];
        fill_value(ones, N, 1.0f);
        OK(ops[k]->relu_bwd(backends[k], din, ones, x, N));
        CU_ASSERT(din[0] == 0.0f && din[1] == 0.0f && din[3] == 1.0f && din[5] == 1.0f);
        CU_ASSERT(din[2] == 0.0f); /* dout * (in > 0): nothing through 0 */
        OK(ops[k]->gelu_fwd(backends[k], out, x, N));
        for (int i = 0; i < N - 1; i++)
            CU_ASSERT(fabs(out[i] - gelu[i]) < 1e-6);
        OK(ops[k]->tanh_fwd(backends[k], out, x, N));
        for (int i = 0; i < N - 1; i++)
            CU_ASSERT(fabs(out[i] - tanh(x[i])) < 1e-6);

        /* in place (out == in) */
        float y[N];
        memcpy(y, x, sizeof y);
        OK(ops[k]->relu_fwd(backends[k], y, y, N));
        CU_ASSERT(y[0] == 0.0f && y[5] == 3.0f);
    }
}

/* The magnitude of the terms a row's float formula adds at x (with dy for
 * the gradient) where they can cancel, else 0: GELU's tanh approximation
 * (0.5 x + 0.5 x tanh(u), and the gradient's two products), tanh's
 * gradient (dy - dy y^2, from the saved output) and SiLU's (its 1 and
 * x (1 - sigmoid(x)) meet at x = -1.28). Two versions that each
 * round tanh correctly to within an ulp differ there by a few ulps of
 * these terms, however small the result. */
static double act_terms(int a, int grad, double x, double dy)
{
    const double c = 0.7978845608028654, k = 0.044715;
    if (a == DT_TEST_ACT_gelu_tanh) {
        double th = tanh(c * (x + k * x * x * x));
        return grad ? fabs(dy) * (0.5 * (1.0 + fabs(th)) +
                                  0.5 * fabs(x) * (1.0 + th * th) * c * (1.0 + 3.0 * k * x * x))
                    : 0.5 * fabs(x) * (1.0 + fabs(th));
    }
    if (a == DT_TEST_ACT_tanh && grad)
        return fabs(dy) * (1.0 + tanh(x) * tanh(x));
    if (a == DT_TEST_ACT_silu && grad) {
        double sig = 1.0 / (1.0 + exp(-x));
        return fabs(dy) * sig * (1.0 + fabs(x) * (1.0 - sig));
    }
    return 0.0;
}

/* The largest |a - ref| over max(|ref|, the terms' magnitude, floor_). */
static double act_err(int a, int grad, const float *got, const float *ref, const float *in,
                      const float *dout, size_t n, double floor_)
{
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double t = act_terms(a, grad, in[i], dout[i]);
        double e = cu_rel_diff(got[i], ref[i], t > floor_ ? t : floor_);
        if (!(e <= worst))
            worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

static void test_activation_fast_vs_ref(void)
{
    const size_t sizes[] = {1, 15, 16, 17, 1000, 4099};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *in = fnew(n), *dout = fnew(n), *o[2], *d[2];
        fill_uniform(in, n, -4, 4);
        fill_uniform(dout, n, -1, 1);
        for (int a = 0; a < DT_TEST_NACT; a++) {
            for (int k = 0; k < NBACKENDS; k++) {
                o[k] = fnew(n), d[k] = fnew(n);
                fill_value(d[k], n, NAN);
                OK(dt_test_act_fwd(ops[k], backends[k], a, o[k], in, n));
                OK(dt_test_act_bwd(ops[k], backends[k], a, d[k], dout, in, o[k], n));
            }
            CU_ASSERT(act_err(a, 0, o[FAST], o[REF], in, dout, n, 1e-6) < ELEM_TOL);
            /* GELU's derivative Phi(x) + x phi(x) is a sum of terms near 0.2
             * that cancel around x = -0.75, where each version keeps only the
             * terms' rounding (the fast one computes Phi and phi another
             * way): there the error is measured against the terms' scale,
             * as act_terms does for the tanh rows */
            CU_ASSERT(act_err(a, 1, d[FAST], d[REF], in, dout, n,
                              a == DT_TEST_ACT_gelu ? 0.2 : 1e-6) < ELEM_TOL);
            for (int k = 0; k < NBACKENDS; k++)
                free(o[k]), free(d[k]);
        }
        free(in), free(dout);
    }
}

/* <unary>_fwd_keep gives the forward's output bit for bit and keeps a
 * gradient from which mul gives the backward: bit for bit for the rows
 * whose gradient is dy times one expression (the ones the model lets keep
 * it, and tanh), within the element tolerance for the others (ReLU's
 * comparison and SiLU's two products); mul in place too. Both tables. */
static void test_activation_keep(void)
{
    const size_t sizes[] = {1, 17, 100, 1000, 4099};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t n = sizes[si];
        float *in = fnew(n), *dout = fnew(n), *out = fnew(n), *outk = fnew(n), *kept = fnew(n);
        float *din = fnew(n), *dinm = fnew(n);
        fill_uniform(in, n, -5, 5);
        fill_uniform(dout, n, -1, 1);
        for (int a = 0; a < DT_TEST_NACT; a++)
            for (int k = 0; k < NBACKENDS; k++) {
                int exact = a == DT_TEST_ACT_gelu || a == DT_TEST_ACT_gelu_tanh ||
                            a == DT_TEST_ACT_tanh;
                memcpy(kept, in, n * sizeof *in);
                OK(dt_test_act_fwd(ops[k], backends[k], a, out, in, n));
                OK(dt_test_act_bwd(ops[k], backends[k], a, din, dout, in, out, n));
                OK(dt_test_act_keep(ops[k], backends[k], a, outk, kept, n));
                OK(ops[k]->mul(backends[k], dinm, dout, kept, n));
                CU_ASSERT(memcmp(out, outk, n * sizeof *out) == 0);
                if (exact) {
                    CU_ASSERT(memcmp(din, dinm, n * sizeof *din) == 0);
                } else {
                    CU_ASSERT(max_rel_err(dinm, din, n, 1e-6) < ELEM_TOL);
                }
                OK(ops[k]->mul(backends[k], kept, dout, kept, n)); /* out == b */
                CU_ASSERT(memcmp(kept, dinm, n * sizeof *kept) == 0);
            }
        free(in), free(dout), free(out), free(outk), free(kept), free(din), free(dinm);
    }
}

/* Huge, infinite, tiny and NaN inputs, in runs long enough for the fast
 * versions' whole groups: each fast row gives the reference's value (NaN
 * where it gives NaN), forward and backward. */
static void test_activation_extremes(void)
{
    const float special[] = {0.0f,  -0.0f,  1e-30f,    -1e-30f,   20.0f,    -20.0f,
                             1e20f, -1e20f, 1e30f,     -1e30f,    3e38f,    -3e38f,
                             NAN,   -NAN,   INFINITY,  -INFINITY, 1e-45f,   -1e-45f};
    enum { N = 150, NS = sizeof special / sizeof special[0] };
    float in[N], dout[N], o[NBACKENDS][N], d[NBACKENDS][N];
    for (int i = 0; i < N; i++)
        in[i] = special[i % NS], dout[i] = 1.0f;
    for (int a = 0; a < DT_TEST_NACT; a++) {
        for (int k = 0; k < NBACKENDS; k++) {
            OK(dt_test_act_fwd(ops[k], backends[k], a, o[k], in, N));
            OK(dt_test_act_bwd(ops[k], backends[k], a, d[k], dout, in, o[k], N));
        }
        int bad = 0;
        for (int i = 0; i < N; i++) {
            const float *got[2] = {&o[FAST][i], &d[FAST][i]}, *ref[2] = {&o[REF][i], &d[REF][i]};
            for (int g = 0; g < 2; g++) {
                int ok = isnan(*ref[g]) ? isnan(*got[g])
                         : isinf(*ref[g]) ? *got[g] == *ref[g]
                                          : cu_rel_diff(*got[g], *ref[g], 1e-6) < ELEM_TOL;
                if (!ok && bad++ < 4)
                    fprintf(stderr, "  %s %s(%g): fast %g, reference %g\n", dt_test_act_name(a),
                            g ? "bwd" : "fwd", (double)in[i], (double)*got[g], (double)*ref[g]);
            }
        }
        CU_ASSERT_EQUAL(bad, 0);
    }
}

/* ---- dropout ---------------------------------------------------------- */

static const struct dt_rng_key drop_key = {
    .seed = 2024, .purpose = DT_RNG_DROPOUT, .stream = 3, .step = 17};

/* The mask exactly as kernels/ops.h writes it. */
static int spec_keep(const struct dt_rng_key *key, uint64_t e, float p)
{
    uint32_t w[4];
    dt_rng_block(key, e / 4, 0, w);
    return dt_rng_u32_to_unit(w[e % 4]) >= p;
}

static void test_dropout_matches_spec(void)
{
    enum { ROWS = 5, COLS = 7 }; /* 7 columns: Philox blocks straddle rows */
    const uint64_t row0s[] = {0, 5, 1ull << 40};
    for (int k = 0; k < NBACKENDS; k++)
        for (size_t r = 0; r < 3; r++) {
            float in[ROWS * COLS], out[ROWS * COLS];
            fill_uniform(in, ROWS * COLS, 0.5f, 1.5f);
            const float p = 0.4f, scale = 1.0f / (1.0f - p);
            OK(ops[k]->dropout_fwd(backends[k], out, in, ROWS, COLS, p, &drop_key, row0s[r]));
            int bad = 0;
            for (int i = 0; i < ROWS * COLS; i++) {
                uint64_t e = row0s[r] * COLS + (uint64_t)i;
                float expect = spec_keep(&drop_key, e, p) ? in[i] * scale : 0.0f;
                bad += out[i] != expect;
            }
            CU_ASSERT_EQUAL(bad, 0);
        }
}

/* The ops the op table has no rows for, on three threads cut as finely as
 * they go, give the one-thread bits: dropout (a mask per element index),
 * SGD with momentum and AdamW (element-wise), and sumsq over more than one
 * block (block sums added in order), scale, fill and all_finite. */
static void test_threads_same_bits(void)
{
    enum { ROWS = 301, COLS = 77, N = 3 * 16384 + 123 };
    dt_backend_t *t3 = NULL;
    struct dt_backend_opts o = {.threads = 3, .tiny_tasks = 1};
    OK(dt_backend_create("cpu", &o, &t3));
    const struct dt_ops *o3 = dt_backend_ops(t3), *o1 = ops[FAST];
    dt_backend_t *b1 = backends[FAST];
    static float in[N], a[N], b[N], m1[N], m3[N], v1[N], v3[N], g[N];
    fill_uniform(in, N, -1, 1);
    fill_uniform(g, N, -1, 1);
    OK(o1->dropout_fwd(b1, a, in, ROWS, COLS, 0.3f, &drop_key, 11));
    OK(o3->dropout_fwd(t3, b, in, ROWS, COLS, 0.3f, &drop_key, 11));
    CU_ASSERT(memcmp(a, b, sizeof(float) * ROWS * COLS) == 0);

    memcpy(a, in, sizeof a);
    memcpy(b, in, sizeof b);
    memset(m1, 0, sizeof m1);
    memset(m3, 0, sizeof m3);
    memset(v1, 0, sizeof v1);
    memset(v3, 0, sizeof v3);
    struct dt_adamw_args aw = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                               .weight_decay = 0.1f};
    for (aw.t = 1; aw.t <= 3; aw.t++) {
        OK(o1->adamw_update(b1, a, g, m1, v1, N, &aw));
        OK(o3->adamw_update(t3, b, g, m3, v3, N, &aw));
    }
    CU_ASSERT(memcmp(a, b, sizeof a) == 0 && memcmp(m1, m3, sizeof m1) == 0 &&
              memcmp(v1, v3, sizeof v1) == 0);
    struct dt_sgd_args sg = {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-3f, .nesterov = 1,
                             .first_step = 1};
    for (int step = 0; step < 2; step++, sg.first_step = 0) {
        OK(o1->sgd_update(b1, a, g, m1, N, &sg));
        OK(o3->sgd_update(t3, b, g, m3, N, &sg));
    }
    CU_ASSERT(memcmp(a, b, sizeof a) == 0 && memcmp(m1, m3, sizeof m1) == 0);

    double s1 = 0, s3 = 1;
    OK(o1->sumsq(b1, in, N, &s1));
    OK(o3->sumsq(t3, in, N, &s3));
    CU_ASSERT(memcmp(&s1, &s3, sizeof s1) == 0);
    CU_ASSERT(fabs(s1 - (double)N / 3) < 0.05 * N); /* uniform on [-1, 1]: E x^2 = 1/3 */
    OK(o1->scale(b1, a, N, 0.75f));
    OK(o3->scale(t3, b, N, 0.75f));
    CU_ASSERT(memcmp(a, b, sizeof a) == 0);
    int f1 = -1, f3 = -1;
    b[N - 5] = NAN;
    OK(o3->all_finite(t3, b, N, &f3));
    OK(o1->all_finite(b1, a, N, &f1));
    CU_ASSERT(f3 == 0 && f1 == 1);
    OK(o3->fill(t3, b, N, 2.5f));
    int twos = 0;
    for (int i = 0; i < N; i++)
        twos += b[i] == 2.5f;
    CU_ASSERT_EQUAL(twos, N);
    dt_backend_destroy(t3);
}

static void test_dropout_p0_is_copy(void)
{
    enum { N = 53 };
    for (int k = 0; k < NBACKENDS; k++) {
        float in[N], out[N], din[N];
        fill_uniform(in, N, -1, 1);
        fill_value(out, N, NAN);
        OK(ops[k]->dropout_fwd(backends[k], out, in, 1, N, 0.0f, &drop_key, 0));
        CU_ASSERT_EQUAL(memcmp(out, in, sizeof in), 0);
        fill_value(din, N, NAN);
        OK(ops[k]->dropout_bwd(backends[k], din, in, 1, N, 0.0f, &drop_key, 0));
        CU_ASSERT_EQUAL(memcmp(din, in, sizeof in), 0);
    }
}

static void test_dropout_fraction(void)
{
    enum { ROWS = 256, COLS = 1021 };
    const size_t n = (size_t)ROWS * COLS;
    const float ps[] = {0.1f, 0.5f, 0.9f};
    float *in = fnew(n), *out = fnew(n);
    fill_uniform(in, n, 1.0f, 2.0f); /* never 0, so 0 means dropped */
    for (int k = 0; k < NBACKENDS; k++)
        for (int j = 0; j < 3; j++) {
            float p = ps[j], scale = 1.0f / (1.0f - p);
            OK(ops[k]->dropout_fwd(backends[k], out, in, ROWS, COLS, p, &drop_key, 0));
            size_t dropped = 0, wrong = 0;
            for (size_t i = 0; i < n; i++) {
                if (out[i] == 0.0f)
                    dropped++;
                else
                    wrong += out[i] != in[i] * scale;
            }
            double frac = (double)dropped / n; /* std < 1e-3 here */
            if (fabs(frac - p) >= 5e-3)
                printf("\n  dropout p=%g (%s): dropped fraction %.5f\n", p, bname[k], frac);
            CU_ASSERT(fabs(frac - p) < 5e-3);
            CU_ASSERT_EQUAL(wrong, 0);
        }
    free(in), free(out);
}

struct drop_ctx {
    const struct dt_ops *o;
    dt_backend_t *be;
    float *in, *out;
    const float *R;
    int rows, cols;
    float p;
};

static double drop_loss(void *pc)
{
    struct drop_ctx *c = pc;
    CU_ASSERT_EQUAL(c->o->dropout_fwd(c->be, c->out, c->in, c->rows, c->cols, c->p, &drop_key, 3),
                    DT_OK);
    return dot(c->out, c->R, (size_t)c->rows * c->cols);
}

/* Backward applies the forward's mask and scale to dout. */
static void test_dropout_backward(void)
{
    enum { ROWS = 6, COLS = 11, N = ROWS * COLS };
    for (int k = 0; k < NBACKENDS; k++) {
        float in[N], out[N], R[N], din[N];
        fill_uniform(in, N, 1.0f, 2.0f);
        fill_uniform(R, N, 1.0f, 2.0f);
        const float p = 0.3f;
        OK(ops[k]->dropout_fwd(backends[k], out, in, ROWS, COLS, p, &drop_key, 3));
        fill_value(din, N, NAN); /* written */
        OK(ops[k]->dropout_bwd(backends[k], din, R, ROWS, COLS, p, &drop_key, 3));
        int same_mask = 1;
        for (int i = 0; i < N; i++)
            same_mask &= (out[i] == 0.0f) == (din[i] == 0.0f);
        CU_ASSERT(same_mask);
        struct drop_ctx c = {ops[k], backends[k], in, out, R, ROWS, COLS, p};
        CHECK_FD("dropout d/din", k, fd_max_err(drop_loss, &c, in, N, din));
    }
}

/* The fast backward uses the mask its forward kept only for the same key,
 * rows, columns, row0 and p, and draws it again otherwise (another key's
 * step, stream, seed or purpose, another row0, p or shape, or a mask
 * pushed out by more than DT_CPU_MASKS forwards): the reference's bits in
 * every case. */
static void test_dropout_kept_mask(void)
{
    enum { ROWS = 6, COLS = 70, N = ROWS * COLS };
    float in[N], dout[N], want[N], got[N], out[N];
    fill_uniform(in, N, 1.0f, 2.0f);
    fill_uniform(dout, N, 1.0f, 2.0f);
    const float p = 0.3f;
    struct dt_rng_key other[4] = {drop_key, drop_key, drop_key, drop_key};
    other[0].step++;
    other[1].stream++;
    other[2].seed++;
    other[3].purpose++;
    for (int t = 0; t < 8; t++) {
        const struct dt_rng_key *bk = t < 4 ? &other[t] : &drop_key;
        uint64_t brow0 = t == 4 ? 4 : 3;
        float bp = t == 5 ? 0.25f : p;
        int bcols = t == 6 ? COLS + 2 : COLS, brows = N / bcols;
        OK(ops[FAST]->dropout_fwd(backends[FAST], out, in, ROWS, COLS, p, &drop_key, 3));
        if (t == 7) /* push the mask out */
            for (int k = 0; k <= DT_CPU_MASKS; k++)
                OK(ops[FAST]->dropout_fwd(backends[FAST], out, in, ROWS, COLS, p, &drop_key,
                                          100 + (uint64_t)k));
        OK(ops[REF]->dropout_bwd(backends[REF], want, dout, brows, bcols, bp, bk, brow0));
        OK(ops[FAST]->dropout_bwd(backends[FAST], got, dout, brows, bcols, bp, bk, brow0));
        if (memcmp(want, got, (size_t)brows * bcols * sizeof *got) != 0) {
            printf("\n  dropout backward after another forward (case %d): differs\n", t);
            CU_FAIL("dropout backward used a mask kept for other arguments");
        }
    }
    /* and with the same arguments: the kept mask, the same bits */
    OK(ops[FAST]->dropout_fwd(backends[FAST], out, in, ROWS, COLS, p, &drop_key, 3));
    OK(ops[REF]->dropout_bwd(backends[REF], want, dout, ROWS, COLS, p, &drop_key, 3));
    OK(ops[FAST]->dropout_bwd(backends[FAST], got, dout, ROWS, COLS, p, &drop_key, 3));
    CU_ASSERT_EQUAL(memcmp(want, got, sizeof got), 0);
}

static void test_dropout_deterministic(void)
{
    enum { ROWS = 8, COLS = 13, N = ROWS * COLS, HALF = N / 2 };
    const float p = 0.5f;
    float in[N], a[N], b[N], split[N];
    fill_uniform(in, N, 1.0f, 2.0f);
    for (int k = 0; k < NBACKENDS; k++) {
        /* same key and row0: same output */
        OK(ops[k]->dropout_fwd(backends[k], a, in, ROWS, COLS, p, &drop_key, 10));
        OK(ops[k]->dropout_fwd(backends[k], b, in, ROWS, COLS, p, &drop_key, 10));
        CU_ASSERT_EQUAL(memcmp(a, b, sizeof a), 0);

        /* rows r0..r0+7 in one call == rows r0..r0+3 and r0+4..r0+7 in two */
        for (uint64_t r0 = 0; r0 <= 10; r0 += 10) {
            OK(ops[k]->dropout_fwd(backends[k], a, in, ROWS, COLS, p, &drop_key, r0));
            OK(ops[k]->dropout_fwd(backends[k], split, in, ROWS / 2, COLS, p, &drop_key, r0));
            OK(ops[k]->dropout_fwd(backends[k], split + HALF, in + HALF, ROWS / 2, COLS, p,
                                   &drop_key, r0 + ROWS / 2));
            CU_ASSERT_EQUAL(memcmp(a, split, sizeof a), 0);
        }

        /* another step or another row0: another mask */
        OK(ops[k]->dropout_fwd(backends[k], a, in, ROWS, COLS, p, &drop_key, 10));
        struct dt_rng_key next = drop_key;
        next.step++;
        OK(ops[k]->dropout_fwd(backends[k], b, in, ROWS, COLS, p, &next, 10));
        CU_ASSERT(memcmp(a, b, sizeof a) != 0);
        OK(ops[k]->dropout_fwd(backends[k], b, in, ROWS, COLS, p, &drop_key, 0));
        CU_ASSERT(memcmp(a, b, sizeof a) != 0);
    }
}

/* The fast table against the reference, bit for bit, with each version
 * of the fast forward's rounds this CPU runs (dt_cpu_dropout_pin). */
static void test_dropout_fast_vs_ref(void)
{
    const int shapes[][2] = {{1, 1}, {1, 3}, {3, 5}, {17, 33}, {128, 512}};
    const uint64_t row0s[] = {0, 1, 7, 123456789};
    const int versions[] = {DT_CPU_DROPOUT_BEST, DT_CPU_DROPOUT_AVX512, DT_CPU_DROPOUT_AVX2,
                            DT_CPU_DROPOUT_GENERIC};
    int ran = 0;
    for (size_t v = 0; v < sizeof versions / sizeof versions[0]; v++) {
        if (!dt_cpu_dropout_pin(versions[v]))
            continue;
        ran++;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t r = 0; r < 4; r++) {
                int rows = shapes[s][0], cols = shapes[s][1];
                size_t n = (size_t)rows * cols;
                float *in = fnew(n), *a = fnew(n), *b = fnew(n);
                fill_uniform(in, n, -1, 1);
                OK(ops[REF]->dropout_fwd(backends[REF], a, in, rows, cols, 0.25f, &drop_key,
                                         row0s[r]));
                OK(ops[FAST]->dropout_fwd(backends[FAST], b, in, rows, cols, 0.25f, &drop_key,
                                          row0s[r]));
                CU_ASSERT_EQUAL(memcmp(a, b, n * sizeof *a), 0);
                OK(ops[REF]->dropout_bwd(backends[REF], a, in, rows, cols, 0.25f, &drop_key,
                                         row0s[r]));
                OK(ops[FAST]->dropout_bwd(backends[FAST], b, in, rows, cols, 0.25f, &drop_key,
                                          row0s[r]));
                CU_ASSERT_EQUAL(memcmp(a, b, n * sizeof *a), 0);
                free(in), free(a), free(b);
            }
    }
    CU_ASSERT(dt_cpu_dropout_pin(DT_CPU_DROPOUT_BEST));
    CU_ASSERT(ran >= 2); /* the best and the generic, at least */
}

/* ---- flatten ---------------------------------------------------------- */

struct flat_ctx {
    const struct dt_ops *o;
    dt_backend_t *be;
    float *in, *out;
    const float *R;
    size_t n;
};

static double flat_loss(void *p)
{
    struct flat_ctx *c = p;
    CU_ASSERT_EQUAL(c->o->flatten_fwd(c->be, c->out, c->in, c->n), DT_OK);
    return dot(c->out, c->R, c->n);
}

static void test_flatten(void)
{
    enum { N = 2 * 3 * 5 };
    for (int k = 0; k < NBACKENDS; k++) {
        float in[N], out[N], R[N], din[N];
        fill_uniform(in, N, -1, 1);
        fill_uniform(R, N, -1, 1);
        OK(ops[k]->flatten_fwd(backends[k], out, in, N));
        CU_ASSERT_EQUAL(memcmp(out, in, sizeof in), 0);
        fill_value(din, N, NAN);
        OK(ops[k]->flatten_bwd(backends[k], din, R, N));
        CU_ASSERT_EQUAL(memcmp(din, R, sizeof R), 0);
        OK(ops[k]->flatten_fwd(backends[k], out, out, N)); /* in place */
        CU_ASSERT_EQUAL(memcmp(out, in, sizeof in), 0);
        struct flat_ctx c = {ops[k], backends[k], in, out, R, N};
        CHECK_FD("flatten d/din", k, fd_max_err(flat_loss, &c, in, N, din));
    }
}

/* ---- softmax cross-entropy -------------------------------------------- */

struct xent_ctx {
    const struct dt_ops *o;
    dt_backend_t *be;
    float *logits, *probs;
    const int32_t *labels;
    int B, C;
};

static double xent_loss(void *p)
{
    struct xent_ctx *c = p;
    double loss = 0.0;
    int64_t correct = 0;
    CU_ASSERT_EQUAL(c->o->softmax_xent_fwd(c->be, c->probs, c->logits, c->labels, c->B, c->C, 1,
                                           &loss, &correct),
                    DT_OK);
    return loss;
}

static void test_xent_grad(void)
{
    enum { B = 4, C = 7 };
    const int32_t labels[B] = {0, 6, 3, 3};
    for (int k = 0; k < NBACKENDS; k++) {
        float logits[B * C], probs[B * C], d[B * C];
        fill_uniform(logits, B * C, -2, 2);
        struct xent_ctx c = {ops[k], backends[k], logits, probs, labels, B, C};
        xent_loss(&c);
        fill_value(d, B * C, NAN); /* written */
        OK(ops[k]->softmax_xent_bwd(backends[k], d, probs, labels, B, C, 1.0f));

        /* scale multiplies the gradient (the mean loss uses 1/B) */
        float d2[B * C];
        OK(ops[k]->softmax_xent_bwd(backends[k], d2, probs, labels, B, C, 0.25f));
        int bad = 0;
        for (int i = 0; i < B * C; i++)
            bad += fabsf(d2[i] - 0.25f * d[i]) > 1e-7f;
        CU_ASSERT_EQUAL(bad, 0);

        CHECK_FD("softmax_xent d/dlogits", k, fd_max_err(xent_loss, &c, logits, B * C, d));
    }
}

/* Loss, probabilities and count against a double computation. */
static void test_xent_values(void)
{
    enum { B = 5, C = 10 };
    const int32_t labels[B] = {1, 9, 0, 4, 4};
    float logits[B * C];
    fill_uniform(logits, B * C, -5, 5);
    logits[4 * C + 4] = 100.0f; /* make sure one row is right */
    double expect_loss = 0.0;
    int64_t expect_hits = 0;
    for (int b = 0; b < B; b++) {
        double s = 0.0;
        int arg = 0;
        for (int c = 0; c < C; c++) {
            s += exp(logits[b * C + c]);
            if (logits[b * C + c] > logits[b * C + arg])
                arg = c;
        }
        expect_loss += log(s) - logits[b * C + labels[b]];
        expect_hits += arg == labels[b];
    }
    CU_ASSERT(expect_hits >= 1);
    for (int k = 0; k < NBACKENDS; k++) {
        float probs[B * C];
        double loss = 100.0; /* both are added to */
        int64_t hits = 7;
        OK(ops[k]->softmax_xent_fwd(backends[k], probs, logits, labels, B, C, 1, &loss, &hits));
        CU_ASSERT(fabs((loss - 100.0) - expect_loss) < 1e-5 * fabs(expect_loss) + 1e-6);
        CU_ASSERT_EQUAL(hits - 7, expect_hits);
        for (int b = 0; b < B; b++) {
            double s = 0.0;
            for (int c = 0; c < C; c++)
                s += probs[b * C + c];
            CU_ASSERT(fabs(s - 1.0) < 1e-5);
        }
    }
}

static void test_xent_stable(void)
{
    enum { B = 3, C = 4 };
    const float logits[B * C] = {1e4f, 1e4f - 1.0f, -1e4f, 0.0f,   /* huge, label 1 */
                                 -1e4f, -1e4f, -1e4f, -1e4f + 2.0f, /* all very negative */
                                 3e4f,  -3e4f, 0.0f,  1.0f};        /* label far below max */
    const int32_t labels[B] = {1, 3, 1};
    /* row 0: 1 + log(1 + e^-1); row 1: log(3 e^-2 + 1); row 2: 6e4 (+ e^-big) */
    const double expect = (1.0 + log1p(exp(-1.0))) + log1p(3.0 * exp(-2.0)) + 6e4;
    for (int k = 0; k < NBACKENDS; k++) {
        float probs[B * C], d[B * C];
        double loss = 0.0;
        int64_t hits = 0;
        OK(ops[k]->softmax_xent_fwd(backends[k], probs, logits, labels, B, C, 1, &loss, &hits));
        CU_ASSERT(isfinite(loss));
        CU_ASSERT(fabs(loss - expect) < 1e-3);
        CU_ASSERT_EQUAL(hits, 1); /* row 1 */
        OK(ops[k]->softmax_xent_bwd(backends[k], d, probs, labels, B, C, 1.0f));
        CU_ASSERT(!any_nan(probs, B * C) && !any_nan(d, B * C));
        CU_ASSERT(fabs(d[2 * C + 1] + 1.0f) < 1e-6); /* probability ~0 at the label */
    }
}

static void test_xent_argmax_ties(void)
{
    const float logits[2 * 4] = {1, 3, 3, 0, 2, 2, 2, 2};
    const int32_t first[2] = {1, 0}, later[2] = {2, 3};
    for (int k = 0; k < NBACKENDS; k++) {
        float probs[8];
        double loss = 0.0;
        int64_t hits = 0;
        OK(ops[k]->softmax_xent_fwd(backends[k], probs, logits, first, 2, 4, 1, &loss, &hits));
        CU_ASSERT_EQUAL(hits, 2);
        hits = 0;
        OK(ops[k]->softmax_xent_fwd(backends[k], probs, logits, later, 2, 4, 1, &loss, &hits));
        CU_ASSERT_EQUAL(hits, 0);
    }
}

static void test_xent_fast_vs_ref(void)
{
    const int shapes[][2] = {{1, 1}, {3, 2}, {128, 10}, {7, 1001}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], C = shapes[s][1];
        size_t n = (size_t)B * C;
        float *logits = fnew(n), *pr = fnew(n), *pf = fnew(n);
        int32_t *labels = calloc((size_t)B, sizeof *labels);
        CU_ASSERT_FATAL(labels != NULL);
        fill_uniform(logits, n, -8, 8);
        struct dt_rng_key key = {.seed = 5, .purpose = DT_RNG_TEST};
        for (int b = 0; b < B; b++)
            labels[b] = (int32_t)dt_rng_below(&key, (uint64_t)b, (uint64_t)C);
        double lr = 0, lf = 0;
        int64_t hr = 0, hf = 0;
        OK(ops[REF]->softmax_xent_fwd(backends[REF], pr, logits, labels, B, C, 1, &lr, &hr));
        OK(ops[FAST]->softmax_xent_fwd(backends[FAST], pf, logits, labels, B, C, 1, &lf, &hf));
        CU_ASSERT(cu_rel_diff(lf, lr, 1e-3) < 1e-5);
        CU_ASSERT_EQUAL(hf, hr);
        CU_ASSERT(max_rel_err(pf, pr, n, 1e-6) < 1e-5);
        free(logits), free(pr), free(pf), free(labels);
    }
}

/* ---- optimizers ------------------------------------------------------- */

/* torch.optim.SGD in double, as kernels/ops.h writes it */
static void sgd_double(double *p, const float *g, double *buf, size_t n,
                       const struct dt_sgd_args *a)
{
    for (size_t i = 0; i < n; i++) {
        double gi = g[i] + (double)a->weight_decay * p[i];
        double d = gi;
        if (a->momentum != 0.0f) {
            buf[i] = a->first_step ? gi : a->momentum * buf[i] + gi;
            d = a->nesterov ? gi + a->momentum * buf[i] : buf[i];
        }
        p[i] -= a->lr * d;
    }
}

/* torch.optim.AdamW in double */
static void adamw_double(double *p, const float *g, double *m, double *v, size_t n,
                         const struct dt_adamw_args *a)
{
    double bc1 = 1.0 - pow(a->beta1, (double)a->t), bc2 = 1.0 - pow(a->beta2, (double)a->t);
    for (size_t i = 0; i < n; i++) {
        p[i] *= 1.0 - (double)a->lr * a->weight_decay;
        m[i] = a->beta1 * m[i] + (1.0 - a->beta1) * g[i];
        v[i] = a->beta2 * v[i] + (1.0 - a->beta2) * (double)g[i] * g[i];
        p[i] -= (a->lr / bc1) * m[i] / (sqrt(v[i]) / sqrt(bc2) + a->eps);
    }
}

static double max_err_vs_double(const float *x, const double *ref, size_t n, double floor_)
{
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = cu_rel_diff(x[i], ref[i], floor_);
        if (!(e <= worst))
            worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

static void test_sgd_vs_double(void)
{
    enum { N = 37, STEPS = 5 };
    const struct dt_sgd_args cfg[] = {
        {.lr = 0.1f},
        {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-2f},
        {.lr = 0.05f, .momentum = 0.8f, .weight_decay = 1e-3f, .nesterov = 1},
    };
    for (int k = 0; k < NBACKENDS; k++)
        for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
            float p[N], g[N], buf[N];
            double pd[N], bd[N];
            fill_uniform(p, N, -1, 1);
            fill_value(buf, N, NAN); /* "holds nothing yet": must not be read */
            for (int i = 0; i < N; i++)
                pd[i] = p[i], bd[i] = 0.0;
            for (int t = 0; t < STEPS; t++) {
                struct dt_sgd_args a = cfg[c];
                a.first_step = t == 0;
                fill_uniform(g, N, -1, 1);
                OK(ops[k]->sgd_update(backends[k], p, g, a.momentum != 0.0f ? buf : NULL, N, &a));
                sgd_double(pd, g, bd, N, &a);
            }
            double e = max_err_vs_double(p, pd, N, 1.0);
            if (!(e < 1e-5))
                printf("\n  sgd config %zu (%s): err %.3g\n", c, bname[k], e);
            CU_ASSERT(e < 1e-5);
            if (cfg[c].momentum != 0.0f)
                CU_ASSERT(max_err_vs_double(buf, bd, N, 1.0) < 1e-5);
        }
}

/* One step by hand: p - lr (g + wd p), and the first momentum step equals it. */
static void test_sgd_one_step(void)
{
    for (int k = 0; k < NBACKENDS; k++) {
        float p[3] = {1.0f, -2.0f, 0.5f}, g[3] = {0.5f, 0.25f, -1.0f}, buf[3] = {9, 9, 9};
        struct dt_sgd_args a = {.lr = 0.5f, .weight_decay = 0.5f};
        OK(ops[k]->sgd_update(backends[k], p, g, NULL, 3, &a));
        CU_ASSERT(p[0] == 1.0f - 0.5f * (0.5f + 0.5f));
        CU_ASSERT(p[1] == -2.0f - 0.5f * (0.25f - 1.0f));
        CU_ASSERT(p[2] == 0.5f - 0.5f * (-1.0f + 0.25f));
        float q[3] = {1.0f, -2.0f, 0.5f};
        struct dt_sgd_args m = {.lr = 0.5f, .weight_decay = 0.5f, .momentum = 0.9f,
                                .first_step = 1};
        OK(ops[k]->sgd_update(backends[k], q, g, buf, 3, &m));
        CU_ASSERT(memcmp(p, q, sizeof p) == 0);
        CU_ASSERT(buf[0] == 0.5f + 0.5f * 1.0f); /* buf = g' */
    }
}

static void test_adamw_vs_double(void)
{
    enum { N = 41, STEPS = 6 };
    const struct dt_adamw_args cfg[] = {
        {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 1e-2f},
        {.lr = 1e-2f, .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-6f, .weight_decay = 0.0f},
    };
    for (int k = 0; k < NBACKENDS; k++)
        for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
            float p[N], g[N], m[N], v[N];
            double pd[N], md[N], vd[N];
            fill_uniform(p, N, -1, 1);
            fill_value(m, N, 0.0f);
            fill_value(v, N, 0.0f);
            for (int i = 0; i < N; i++)
                pd[i] = p[i], md[i] = 0.0, vd[i] = 0.0;
            for (int t = 1; t <= STEPS; t++) {
                struct dt_adamw_args a = cfg[c];
                a.t = t;
                fill_uniform(g, N, -1, 1);
                OK(ops[k]->adamw_update(backends[k], p, g, m, v, N, &a));
                adamw_double(pd, g, md, vd, N, &a);
            }
            double ep = max_err_vs_double(p, pd, N, 1.0);
            double em = max_err_vs_double(m, md, N, 1e-3);
            double ev = max_err_vs_double(v, vd, N, 1e-4);
            if (!(ep < 1e-5 && em < 1e-5 && ev < 1e-5))
                printf("\n  adamw config %zu (%s): err p %.3g m %.3g v %.3g\n", c, bname[k], ep,
                       em, ev);
            CU_ASSERT(ep < 1e-5 && em < 1e-5 && ev < 1e-5);
        }
}

/* First step by hand: m^ = g, v^ = g^2, so p(1 - lr wd) - lr g / (|g| + eps). */
static void test_adamw_first_step(void)
{
    enum { N = 19 };
    for (int k = 0; k < NBACKENDS; k++) {
        float p[N], g[N], m[N] = {0}, v[N] = {0}, p0[N];
        fill_uniform(p, N, -1, 1);
        fill_away_from_zero(g, N);
        memcpy(p0, p, sizeof p);
        struct dt_adamw_args a = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                  .weight_decay = 0.1f, .t = 1};
        OK(ops[k]->adamw_update(backends[k], p, g, m, v, N, &a));
        int bad = 0;
        for (int i = 0; i < N; i++) {
            double expect = p0[i] * (1.0 - 0.01 * 0.1) - 0.01 * g[i] / (fabs(g[i]) + 1e-8);
            bad += fabs(p[i] - expect) > 1e-6;
        }
        CU_ASSERT_EQUAL(bad, 0);
    }
}

static void test_optim_fast_vs_ref(void)
{
    const size_t sizes[] = {1, 15, 16, 17, 1037};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *g = fnew(n), *p[2], *b[2], *m[2], *v[2];
        for (int k = 0; k < NBACKENDS; k++)
            p[k] = fnew(n), b[k] = fnew(n), m[k] = fnew(n), v[k] = fnew(n);
        fill_uniform(p[REF], n, -1, 1);
        memcpy(p[FAST], p[REF], n * sizeof(float));
        for (int t = 1; t <= 3; t++) {
            fill_uniform(g, n, -1, 1);
            for (int nest = 0; nest < 2; nest++) {
                struct dt_sgd_args a = {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-2f,
                                        .nesterov = nest, .first_step = t == 1 && nest == 0};
                for (int k = 0; k < NBACKENDS; k++)
                    OK(ops[k]->sgd_update(backends[k], p[k], g, b[k], n, &a));
            }
            struct dt_sgd_args plain = {.lr = 0.1f, .weight_decay = 1e-2f};
            struct dt_adamw_args w = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                      .weight_decay = 1e-2f, .t = t};
            for (int k = 0; k < NBACKENDS; k++) {
                OK(ops[k]->sgd_update(backends[k], p[k], g, NULL, n, &plain));
                OK(ops[k]->adamw_update(backends[k], p[k], g, m[k], v[k], n, &w));
            }
        }
        CU_ASSERT(max_rel_err(p[FAST], p[REF], n, 1.0) < ELEM_TOL);
        CU_ASSERT(max_rel_err(b[FAST], b[REF], n, 1.0) < ELEM_TOL);
        CU_ASSERT(max_rel_err(m[FAST], m[REF], n, 1e-3) < ELEM_TOL);
        CU_ASSERT(max_rel_err(v[FAST], v[REF], n, 1e-4) < ELEM_TOL);
        for (int k = 0; k < NBACKENDS; k++)
            free(p[k]), free(b[k]), free(m[k]), free(v[k]);
        free(g);
    }
}

/* The three updates (SGD plain, SGD with Nesterov momentum, AdamW), each
 * run twice from the same state: on g as it is, and with args' clear on a
 * copy of g. The cleared run gives the same bits and leaves its copy zero
 * (+0.0f), on the reference, the fast ops and the fast ops on 3 threads
 * (n past a block of DT_CPU_GRAIN, with a tail); and a gated update the
 * gate skipped changes nothing and still leaves the copy zero. */
static int optim_pair(const struct dt_ops *o, dt_backend_t *be, int which, size_t n, int t,
                      float *const s[2][3], const float *g, float *gc)
{
    int bad = 0;
    for (int c = 0; c < 2; c++) { /* c = 1: cleared */
        float *p = s[c][0], *m = s[c][1], *v = s[c][2];
        const float *gr = c ? gc : g;
        struct dt_sgd_args sg = {.lr = 0.1f, .momentum = which == 1 ? 0.9f : 0.0f,
                                 .weight_decay = 1e-2f, .nesterov = which == 1,
                                 .first_step = t == 1, .gated = 1, .clear = c ? gc : NULL};
        struct dt_adamw_args aw = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                   .weight_decay = 1e-2f, .t = t, .gated = 1,
                                   .clear = c ? gc : NULL};
        if (which < 2) {
            OK(o->sgd_update(be, p, gr, which == 1 ? m : NULL, n, &sg));
        } else {
            OK(o->adamw_update(be, p, gr, m, v, n, &aw));
        }
    }
    for (int a = 0; a < 3; a++)
        bad += memcmp(s[0][a], s[1][a], n * sizeof(float)) != 0;
    for (size_t i = 0; i < n; i++)
        bad += gc[i] != 0.0f || signbit(gc[i]);
    return bad;
}

static void test_optim_clear(void)
{
    const size_t sizes[] = {1, 15, 16, 17, 1037, 2 * DT_CPU_GRAIN + 21};
    dt_backend_t *t3 = NULL;
    struct dt_backend_opts to = {.threads = 3, .tiny_tasks = 1};
    OK(dt_backend_create("cpu", &to, &t3));
    dt_backend_t *bes[3] = {backends[REF], backends[FAST], t3};
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
        size_t n = sizes[z];
        float *g = fnew(n), *gc = fnew(n), *s[2][3];
        for (int c = 0; c < 2; c++)
            for (int a = 0; a < 3; a++)
                s[c][a] = fnew(n);
        for (int b = 0; b < 3; b++)
            for (int which = 0; which < 3; which++) {
                fill_uniform(s[0][0], n, -1, 1);
                fill_value(s[0][1], n, 0.0f);
                fill_value(s[0][2], n, 0.0f);
                for (int a = 0; a < 3; a++)
                    memcpy(s[1][a], s[0][a], n * sizeof(float));
                int bad = 0;
                for (int t = 1; t <= 3; t++) {
                    fill_uniform(g, n, -1, 1);
                    memcpy(gc, g, n * sizeof(float));
                    bad += optim_pair(dt_backend_ops(bes[b]), bes[b], which, n, t, s, g, gc);
                }
                /* skipped by the gate: p and the state stay, the copy is zeroed */
                float *before = fnew(n);
                memcpy(before, s[1][0], n * sizeof(float));
                memcpy(gc, g, n * sizeof(float));
                dt_cpu_set_gate(bes[b], 1);
                bad += optim_pair(dt_backend_ops(bes[b]), bes[b], which, n, 4, s, g, gc);
                dt_cpu_set_gate(bes[b], 0);
                bad += memcmp(before, s[1][0], n * sizeof(float)) != 0;
                free(before);
                if (bad)
                    printf("\n  clear: backend %d, update %d, n %zu: %d differences\n", b, which,
                           n, bad);
                CU_ASSERT_EQUAL(bad, 0);
            }
        for (int c = 0; c < 2; c++)
            for (int a = 0; a < 3; a++)
                free(s[c][a]);
        free(g);
        free(gc);
    }
    dt_backend_destroy(t3);
}

/* ---- reductions ------------------------------------------------------- */

static void test_sumsq(void)
{
    const size_t sizes[] = {0, 1, 15, 16, 17, 100003};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *x = fnew(n);
        fill_uniform(x, n, -2, 2);
        double expect = 0.0;
        for (size_t i = 0; i < n; i++)
            expect += (double)x[i] * x[i];
        for (int k = 0; k < NBACKENDS; k++) {
            double got = -1.0;
            OK(ops[k]->sumsq(backends[k], x, n, &got));
            CU_ASSERT(cu_rel_diff(got, expect, 1e-12) < 1e-12);
        }
        free(x);
    }
    for (int k = 0; k < NBACKENDS; k++) {
        float x[33];
        fill_uniform(x, 33, -1, 1);
        double got = 0.0;
        x[20] = NAN;
        OK(ops[k]->sumsq(backends[k], x, 33, &got));
        CU_ASSERT(isnan(got));
        x[20] = -INFINITY;
        OK(ops[k]->sumsq(backends[k], x, 33, &got));
        CU_ASSERT(isinf(got));
        x[20] = FLT_MAX; /* no overflow in double */
        OK(ops[k]->sumsq(backends[k], x, 33, &got));
        CU_ASSERT(isfinite(got) && got >= (double)FLT_MAX * FLT_MAX);
    }
}

static void test_all_finite(void)
{
    enum { N = 67 };
    const size_t where[] = {0, 15, 16, 31, 50, N - 1};
    const float bad[] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < NBACKENDS; k++) {
        float x[N];
        fill_uniform(x, N, -1, 1);
        x[3] = FLT_MAX, x[4] = -FLT_MAX, x[5] = FLT_MIN / 4; /* extremes, subnormal */
        int ok = -1;
        OK(ops[k]->all_finite(backends[k], x, N, &ok));
        CU_ASSERT_EQUAL(ok, 1);
        OK(ops[k]->all_finite(backends[k], x, 0, &ok));
        CU_ASSERT_EQUAL(ok, 1);
        for (size_t w = 0; w < sizeof where / sizeof where[0]; w++)
            for (int b = 0; b < 3; b++) {
                float keep = x[where[w]];
                x[where[w]] = bad[b];
                ok = -1;
                OK(ops[k]->all_finite(backends[k], x, N, &ok));
                CU_ASSERT_EQUAL(ok, 0);
                x[where[w]] = keep;
            }
    }
}

static void test_scale_fill(void)
{
    enum { N = 35 };
    for (int k = 0; k < NBACKENDS; k++) {
        float x[N], x0[N];
        fill_uniform(x0, N, -1, 1);
        memcpy(x, x0, sizeof x);
        OK(ops[k]->scale(backends[k], x, N, -0.5f));
        int bad = 0;
        for (int i = 0; i < N; i++)
            bad += x[i] != x0[i] * -0.5f;
        CU_ASSERT_EQUAL(bad, 0);
        OK(ops[k]->fill(backends[k], x, N - 1, 3.25f));
        bad = 0;
        for (int i = 0; i < N - 1; i++)
            bad += x[i] != 3.25f;
        CU_ASSERT_EQUAL(bad, 0);
        CU_ASSERT_EQUAL(x[N - 1], x0[N - 1] * -0.5f); /* n respected */
    }
}

/* ---- invalid arguments ------------------------------------------------ */

/* The BLAS kernels' rule (kernels/cpu/blas_info.c), against the CPU's
 * flags as /proc/cpuinfo lists them: kernels from before AVX2 are replaced
 * on a CPU with AVX2 and FMA, by the AVX-512 ones when it has the five
 * extensions they use; newer kernels and unknown names are left alone. */
static int cpu_flag(const char *flags, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = flags; (p = strstr(p, name)); p += n)
        if ((p == flags || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\n' || !p[n]))
            return 1;
    return 0;
}

static void test_blas_core_rule(void)
{
    char line[8192] = "";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return; /* not Linux: no flags to check the rule against */
    while (fgets(line, sizeof line, f) && strncmp(line, "flags", 5)) {
    }
    fclose(f);
    const char *want = NULL;
#if defined(__x86_64__)
    if (cpu_flag(line, "avx2") && cpu_flag(line, "fma"))
        want = cpu_flag(line, "avx512f") && cpu_flag(line, "avx512bw") && cpu_flag(line, "avx512dq") &&
                       cpu_flag(line, "avx512vl") && cpu_flag(line, "avx512cd")
                   ? "SkylakeX"
                   : "Haswell";
#endif
    const char *old[] = {"Prescott", "prescott", "Core2", "Nehalem", "Sandybridge", "Barcelona"};
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++) {
        const char *got = dt_blas_core_for(old[i]);
        CU_ASSERT((want == NULL) == (got == NULL));
        if (want && got)
            CU_ASSERT_STRING_EQUAL(got, want);
    }
    const char *fit[] = {"Haswell", "SkylakeX", "Cooperlake", "Zen", "SapphireRapids", "", "unknown"};
    for (size_t i = 0; i < sizeof fit / sizeof fit[0]; i++)
        CU_ASSERT_PTR_NULL(dt_blas_core_for(fit[i]));
    CU_ASSERT_PTR_NULL(dt_blas_core_for(NULL));
}

static void test_invalid_args(void)
{
    float x[16] = {0}, y[16] = {0}, z[16] = {0};
    int32_t lab[2] = {0, 5};
    double loss = 0.0;
    int64_t hits = 0;
    for (int k = 0; k < NBACKENDS; k++) {
        const struct dt_ops *o = ops[k];
        dt_backend_t *be = backends[k];
        int ran = 0;
        /* lab is {0, 5}: the shared cases are refused for other reasons */
        CU_ASSERT_EQUAL(dt_test_invalid_args(o, be, x, y, z, lab, &drop_key, &ran), 0);
        CU_ASSERT(ran > 40);
        /* label 5 is outside [0, 4), checked on the host; nothing is accumulated */
        CHECK_INVALID(o->softmax_xent_fwd(be, z, x, lab, 2, 4, 1, &loss, &hits),
                      "softmax_xent_fwd");
        CU_ASSERT(loss == 0.0 && hits == 0);
        CHECK_INVALID(o->softmax_xent_bwd(be, z, x, lab, 2, 4, 1.0f), "softmax_xent_bwd");
        /* the failed calls wrote nothing */
        int untouched = 1;
        for (int i = 0; i < 16; i++)
            untouched &= x[i] == 0.0f && y[i] == 0.0f && z[i] == 0.0f;
        CU_ASSERT(untouched);
    }
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite("cpu_backend", suite_init, suite_cleanup);
    CU_ADD(s, test_backend_create);
    CU_ADD(s, test_backend_caps);
    CU_ADD(s, test_backend_memory);

    s = CU_add_suite("linear", suite_init, suite_cleanup);
    CU_ADD(s, test_linear_grad);
    CU_ADD(s, test_linear_accumulates);
    CU_ADD(s, test_linear_fast_vs_ref);
    CU_ADD(s, test_linear_empty);
    CU_ADD(s, test_round_values);
    CU_ADD(s, test_bf16_cast);
    CU_ADD(s, test_linear_precision);
    CU_ADD(s, test_bias_grad);
    CU_ADD(s, test_bias_fast_vs_ref);

    s = CU_add_suite("activation", suite_init, suite_cleanup);
    CU_ADD(s, test_activation_grad);
    CU_ADD(s, test_activation_values);
    CU_ADD(s, test_activation_fast_vs_ref);
    CU_ADD(s, test_activation_extremes);
    CU_ADD(s, test_activation_keep);

    s = CU_add_suite("dropout", suite_init, suite_cleanup);
    CU_ADD(s, test_dropout_matches_spec);
    CU_ADD(s, test_threads_same_bits);
    CU_ADD(s, test_dropout_p0_is_copy);
    CU_ADD(s, test_dropout_fraction);
    CU_ADD(s, test_dropout_backward);
    CU_ADD(s, test_dropout_deterministic);
    CU_ADD(s, test_dropout_kept_mask);
    CU_ADD(s, test_dropout_fast_vs_ref);

    s = CU_add_suite("flatten", suite_init, suite_cleanup);
    CU_ADD(s, test_flatten);

    s = CU_add_suite("softmax_xent", suite_init, suite_cleanup);
    CU_ADD(s, test_xent_grad);
    CU_ADD(s, test_xent_values);
    CU_ADD(s, test_xent_stable);
    CU_ADD(s, test_xent_argmax_ties);
    CU_ADD(s, test_xent_fast_vs_ref);

    s = CU_add_suite("optim", suite_init, suite_cleanup);
    CU_ADD(s, test_sgd_vs_double);
    CU_ADD(s, test_sgd_one_step);
    CU_ADD(s, test_adamw_vs_double);
    CU_ADD(s, test_adamw_first_step);
    CU_ADD(s, test_optim_clear);
    CU_ADD(s, test_optim_fast_vs_ref);

    s = CU_add_suite("reduce", suite_init, suite_cleanup);
    CU_ADD(s, test_sumsq);
    CU_ADD(s, test_all_finite);
    CU_ADD(s, test_scale_fill);

    s = CU_add_suite("invalid_args", suite_init, suite_cleanup);
    CU_ADD(s, test_invalid_args);

    s = CU_add_suite("blas", NULL, NULL);
    CU_ADD(s, test_blas_core_rule);
    return cu_run_all();
}
