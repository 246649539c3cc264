/*
 * test_op_table.c - every row of the op table (tests/common/op_table.c)
 * on the CPU backend: the finite-difference gradient check on the
 * reference table and on the fast table, fast against reference on the
 * same inputs, and the +=/= conventions of ops.h on both. Beside the
 * table: batch norm with a ReLU fused in against the two ops in turn,
 * the convolution's workspace contract, its reduced-precision
 * operands (the same as linear's), and invalid arguments of every op that
 * the table brought in, on both tables.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "tests/common/op_table.h"
#include "cu_util.h"

enum { REF = 0, FAST = 1, NBACKENDS = 2 };
static dt_backend_t *backends[NBACKENDS];
/* The fast table on three threads, every op cut into its smallest tasks. */
static dt_backend_t *threaded;

static int suite_init(void)
{
    for (int k = 0; k < NBACKENDS; k++) {
        struct dt_backend_opts o = {.threads = 1, .reference_kernels = k == REF};
        if (dt_backend_create("cpu", &o, &backends[k]) != DT_OK)
            return -1;
    }
    struct dt_backend_opts t = {.threads = 3, .tiny_tasks = 1};
    return dt_backend_create("cpu", &t, &threaded) == DT_OK ? 0 : -1;
}

static int suite_cleanup(void)
{
    dt_backend_destroy(threaded);
    threaded = NULL;
    for (int k = 0; k < NBACKENDS; k++) {
        dt_backend_destroy(backends[k]);
        backends[k] = NULL;
    }
    return 0;
}

/* ---- the table ---------------------------------------------------------- */

/* Ops with no row in the table: each is checked by the suite named beside
 * it instead. Every other op of DT_OP_LIST must be called by some row, so
 * a new op without a row fails here. */
#define KEEP_CASE(a, name, s, forward, gradient, cpu, doc) case DT_OP_##name##_fwd_keep:

static int tested_elsewhere(enum dt_op_id op)
{
    switch (op) {
        DT_UNARY_LIST(KEEP_CASE, _) /* test_ops: test_activation_keep; test_model, */
    case DT_OP_mul:                 /* test_kept_gradient (and test_gpu_ops) */
    case DT_OP_dropout_fwd: /* test_ops: test_dropout_* */
    case DT_OP_dropout_bwd:
    case DT_OP_flatten_fwd: /* test_ops: test_flatten */
    case DT_OP_flatten_bwd:
    case DT_OP_sgd_update: /* test_ops: test_sgd_*, test_adamw_* */
    case DT_OP_adamw_update:
    case DT_OP_attention_decode: /* test_model: test_gpt_decode; test_gpu_attention */
    case DT_OP_sumsq: /* test_ops: test_sumsq, test_scale_fill, */
    case DT_OP_step_gate: /* test_engine: test_clip; test_gpu_ops: test_step_gate */
    case DT_OP_scale:
    case DT_OP_fill:
    case DT_OP_all_finite: /* test_all_finite */
    case DT_OP_to_bf16:    /* test_ops: test_bf16_cast */
    case DT_OP_from_bf16:
        return 1;
    default:
        return 0;
    }
}

/* Every op of DT_OP_LIST is called by a row of the table (through the row
 * of its forward), or is one of the few tested elsewhere; every op is in
 * both CPU tables. */
static void test_table_covers_ops(void)
{
    for (int op = 0; op < DT_OP_COUNT; op++) {
        int rows = 0;
        for (int i = 0; i < dt_op_ncases; i++)
            rows += dt_op_case_calls(&dt_op_cases[i], (enum dt_op_id)op);
        if (!rows && !tested_elsewhere((enum dt_op_id)op))
            printf("\n  no op table row calls %s\n", dt_op_name((enum dt_op_id)op));
        CU_ASSERT(rows > 0 || tested_elsewhere((enum dt_op_id)op));
    }
    for (int k = 0; k < NBACKENDS; k++)
        for (int op = 0; op < DT_OP_COUNT; op++) {
            if (!dt_backend_supports(backends[k], (enum dt_op_id)op, DT_F32))
                printf("\n  cpu lacks %s\n", dt_op_name((enum dt_op_id)op));
            CU_ASSERT(dt_backend_supports(backends[k], (enum dt_op_id)op, DT_F32));
        }
}

static void gradcheck_all(int k)
{
    int checked = 0, kinked = 0;
    for (int i = 0; i < dt_op_ncases; i++) {
        int bad = dt_op_case_gradcheck(&dt_op_cases[i], backends[k]);
        CU_ASSERT_EQUAL(bad, 0);
        int kinks = dt_op_case_kinked(&dt_op_cases[i]);
        kinked += kinks;
        checked += dt_op_case_has_backward(&dt_op_cases[i]) && !kinks && bad == 0;
    }
    CU_ASSERT(kinked <= 3); /* test_batchnorm_relu checks those */
    /* add, accumulate, the batchnorm_infer rows: no backward */
    CU_ASSERT(checked >= dt_op_ncases - 6 - kinked);
}

static void test_gradcheck_ref(void) { gradcheck_all(REF); }
static void test_gradcheck_fast(void) { gradcheck_all(FAST); }

static void test_fast_vs_ref(void)
{
    for (int i = 0; i < dt_op_ncases; i++)
        CU_ASSERT_EQUAL(dt_op_case_compare(&dt_op_cases[i], backends[FAST], backends[REF]), 0);
}

/* Every row of op again (with a fast path turned off by the caller): fast
 * against reference, on three threads against one, the conventions.
 * Returns the number of rows. */
static int rerun_rows(enum dt_op_id op)
{
    int rows = 0;
    for (int i = 0; i < dt_op_ncases; i++) {
        if (dt_op_cases[i].op != op)
            continue;
        rows++;
        struct dt_op_case c = dt_op_cases[i];
        CU_ASSERT_EQUAL(dt_op_case_compare(&c, backends[FAST], backends[REF]), 0);
        c.tol = 0.0;
        CU_ASSERT_EQUAL(dt_op_case_compare(&c, threaded, backends[FAST]), 0);
        CU_ASSERT_EQUAL(dt_op_case_conventions(&c, backends[FAST]), 0);
    }
    return rows;
}

/* Where the CPU runs the direct convolution, the rows' convolutions again
 * with it turned off: the lowerings to BLAS products that other CPUs run
 * (and this one for other shapes). */
static void test_conv_lowered(void)
{
    if (!dt_cpu_conv_direct_pin(1))
        return;
    CU_ASSERT(dt_cpu_conv_direct_pin(0));
    CU_ASSERT(rerun_rows(DT_OP_conv2d_fwd) >= 30);
    CU_ASSERT(dt_cpu_conv_direct_pin(1));
}

/* Where the CPU runs the own product tiles, the rows' linear layers and
 * attention again with them turned off: the BLAS products that other
 * CPUs run (and this one for linear products of fewer rows). */
static void test_blas_products(void)
{
    if (!dt_cpu_gemm_tiles_pin(1))
        return;
    CU_ASSERT(dt_cpu_gemm_tiles_pin(0));
    CU_ASSERT(rerun_rows(DT_OP_linear_fwd) >= 11);
    CU_ASSERT(rerun_rows(DT_OP_attention_fwd) >= 12);
    CU_ASSERT(dt_cpu_gemm_tiles_pin(1));
}

/* Where the own tiles run: a short batch (the tiles with the product
 * transposed) gives each row the bits a long one (the tiles as they are)
 * gives it, so a row's output does not depend on the batch it came in,
 * on one thread and on three. */
static void test_short_batch_bits(void)
{
    enum { LONG = 530, SHORT = 40, I = 400, O = 389 };
    if (!dt_cpu_gemm_tiles_take(LONG, I) || !dt_cpu_gemm_tiles_ct_take(O, SHORT, I))
        return;
    CU_ASSERT(!dt_cpu_gemm_tiles_take(SHORT, I)); /* else nothing is compared */
    float *in = malloc(sizeof(float) * LONG * I), *w = malloc(sizeof(float) * O * I);
    float *bias = malloc(sizeof(float) * O), *full = malloc(sizeof(float) * LONG * O);
    float *part = malloc(sizeof(float) * LONG * O);
    CU_ASSERT_FATAL(in && w && bias && full && part);
    struct dt_rng_key key = {.seed = 20261207, .purpose = DT_RNG_TEST, .stream = 1};
    for (int i = 0; i < LONG * I; i++)
        in[i] = dt_rng_uniform(&key, (uint64_t)i) - 0.5f;
    for (int i = 0; i < O * I; i++)
        w[i] = dt_rng_uniform(&key, (uint64_t)(LONG * I + i)) - 0.5f;
    for (int i = 0; i < O; i++)
        bias[i] = 0.01f * (float)(i % 17) - 0.08f;
    dt_backend_t *bes[] = {backends[FAST], threaded};
    for (int k = 0; k < 2; k++) {
        const struct dt_ops *ops = dt_backend_ops(bes[k]);
        CU_ASSERT_EQUAL(ops->linear_fwd(bes[k], full, in, w, bias, LONG, I, O, NULL), DT_OK);
        memset(part, 0xff, sizeof(float) * LONG * O);
        /* the long batch in short ones: 13 of 40 rows and a last of 10 */
        for (int b0 = 0; b0 < LONG; b0 += SHORT) {
            int n = LONG - b0 < SHORT ? LONG - b0 : SHORT;
            CU_ASSERT_EQUAL(ops->linear_fwd(bes[k], part + (size_t)b0 * O, in + (size_t)b0 * I, w,
                                            bias, n, I, O, NULL),
                            DT_OK);
        }
        CU_ASSERT_EQUAL(memcmp(full, part, sizeof(float) * LONG * O), 0);
    }
    free(in), free(w), free(bias), free(full), free(part);
}

/* Three threads give the one-thread bits, for every row: the ops' own
 * sums use fixed partitions, and the matrix products are cut into blocks
 * only where OpenBLAS (the BLAS dtrain is built and tested with) gives
 * each block's elements the uncut product's bits (kernels/cpu/gemm.c;
 * "linear 128x512->10" is a product it would not). The gradient check and
 * the conventions hold on three threads too. */
static void test_threads_same_bits(void)
{
    for (int i = 0; i < dt_op_ncases; i++) {
        struct dt_op_case c = dt_op_cases[i];
        c.tol = 0.0;
        int bad = dt_op_case_compare(&c, threaded, backends[FAST]);
        if (bad)
            printf("\n  %s: 3 threads differ from 1\n", c.name);
        CU_ASSERT_EQUAL(bad, 0);
        CU_ASSERT_EQUAL(dt_op_case_conventions(&dt_op_cases[i], threaded), 0);
    }
}

static void test_conventions(void)
{
    for (int k = 0; k < NBACKENDS; k++)
        for (int i = 0; i < dt_op_ncases; i++)
            CU_ASSERT_EQUAL(dt_op_case_conventions(&dt_op_cases[i], backends[k]), 0);
}

/* A ReLU fused into batch norm (relu, y in ops.h) is, bit for bit, batch
 * norm then the relu op: forward, inference, and backward, whose input
 * gradient and parameter gradients equal batch norm's backward of the
 * relu op's input gradient. On both tables, at a plane size that is not a
 * multiple of the lanes. (The op-table rows with relu are kinked; this is
 * their gradient check.) */
static void test_batchnorm_relu(void)
{
    enum { N = 3, C = 4, HW = 37, E = N * C * HW };
    static float x[E], dy[E], y0[E], y1[E], yr[E], dyr[E], dx0[E], dx1[E];
    float gamma[C], beta[C], rm[C], rv[C], mean[C], invstd[C], dg0[C], db0[C], dg1[C], db1[C];
    double stats[2 * C], ds0[2 * C], ds1[2 * C];
    uint32_t seed = 12345u;
    for (int i = 0; i < E; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) / 16777216.0f * 4.0f - 1.5f;
        seed = seed * 1664525u + 1013904223u;
        dy[i] = (float)(seed >> 8) / 16777216.0f * 2.0f - 1.0f;
    }
    for (int c = 0; c < C; c++) {
        gamma[c] = 0.5f + 0.25f * (float)c;
        beta[c] = 0.3f * (float)c - 0.4f;
        rm[c] = 0.1f * (float)c;
        rv[c] = 0.5f + 0.5f * (float)c;
    }
    for (int k = 0; k < NBACKENDS; k++) {
        dt_backend_t *be = backends[k];
        const struct dt_ops *o = dt_backend_ops(be);
        double count = (double)N * HW;
        memset(dg0, 0, sizeof dg0), memset(db0, 0, sizeof db0);
        memset(dg1, 0, sizeof dg1), memset(db1, 0, sizeof db1);
        CU_ASSERT_EQUAL_FATAL(o->batchnorm_stats(be, stats, x, N, C, HW), DT_OK);
        CU_ASSERT_EQUAL(o->batchnorm_fwd(be, y0, mean, invstd, NULL, NULL, x, stats, count, gamma,
                                         beta, 1e-5f, 0.1f, N, C, HW, 0),
                        DT_OK);
        CU_ASSERT_EQUAL(o->relu_fwd(be, yr, y0, E), DT_OK);
        CU_ASSERT_EQUAL(o->batchnorm_fwd(be, y1, mean, invstd, NULL, NULL, x, stats, count, gamma,
                                         beta, 1e-5f, 0.1f, N, C, HW, 1),
                        DT_OK);
        CU_ASSERT(memcmp(y1, yr, sizeof y1) == 0);
        int cut = 0;
        for (int i = 0; i < E; i++)
            cut += y0[i] < 0.0f;
        CU_ASSERT(cut > E / 8 && cut < E - E / 8); /* the ReLU has work to do */

        CU_ASSERT_EQUAL(o->relu_bwd(be, dyr, dy, y0, E), DT_OK);
        CU_ASSERT_EQUAL(o->batchnorm_bwd_reduce(be, ds0, dyr, x, mean, invstd, NULL, N, C, HW),
                        DT_OK);
        CU_ASSERT_EQUAL(o->batchnorm_bwd(be, dx0, dg0, db0, dyr, x, mean, invstd, gamma, ds0, ds0,
                                         count, NULL, N, C, HW),
                        DT_OK);
        CU_ASSERT_EQUAL(o->batchnorm_bwd_reduce(be, ds1, dy, x, mean, invstd, y1, N, C, HW), DT_OK);
        CU_ASSERT_EQUAL(o->batchnorm_bwd(be, dx1, dg1, db1, dy, x, mean, invstd, gamma, ds1, ds1,
                                         count, y1, N, C, HW),
                        DT_OK);
        CU_ASSERT(memcmp(ds0, ds1, sizeof ds0) == 0);
        CU_ASSERT(memcmp(dx0, dx1, sizeof dx0) == 0);
        CU_ASSERT(memcmp(dg0, dg1, sizeof dg0) == 0);
        CU_ASSERT(memcmp(db0, db1, sizeof db0) == 0);

        CU_ASSERT_EQUAL(o->batchnorm_infer(be, y0, x, rm, rv, gamma, beta, 1e-5f, N, C, HW, 0),
                        DT_OK);
        CU_ASSERT_EQUAL(o->relu_fwd(be, yr, y0, E), DT_OK);
        CU_ASSERT_EQUAL(o->batchnorm_infer(be, y1, x, rm, rv, gamma, beta, 1e-5f, N, C, HW, 1),
                        DT_OK);
        CU_ASSERT(memcmp(y1, yr, sizeof y1) == 0);
    }
}

/* The machinery reports what it should: a row the op rejects fails, and
 * a comparison at a tolerance the numbers cannot meet (bf16 operands
 * against fp32) counts mismatches instead of passing. */
static void test_compare_detects(void)
{
    struct dt_op_case bad = {"conv whose filter does not fit",
                             DT_OP_conv2d_fwd,
                             {1, 1, 4, 4, 1, 5, 5, 1, 1, 0, 0, 1, 1, 1},
                             1e-5};
    printf("\n  (expected failures follow)\n");
    CU_ASSERT(dt_op_case_compare(&bad, backends[FAST], backends[REF]) > 0);
    CU_ASSERT(dt_op_case_gradcheck(&bad, backends[FAST]) > 0);

    struct dt_backend_opts o = {.threads = 1, .precision = DT_BF16};
    dt_backend_t *bf16 = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_backend_create("cpu", &o, &bf16), DT_OK);
    for (int i = 0; i < dt_op_ncases; i++)
        if (dt_op_cases[i].op == DT_OP_conv2d_fwd) {
            struct dt_op_case c = dt_op_cases[i];
            c.tol = 1e-6;
            CU_ASSERT(dt_op_case_compare(&c, bf16, backends[REF]) > 0);
            break;
        }
    dt_backend_destroy(bf16);
}

/* ---- convolution extras ------------------------------------------------ */

static struct dt_conv2d_shape conv_shape(int N, int C, int H, int W, int K, int R, int S, int st,
                                         int pad, int dil, int groups)
{
    struct dt_conv2d_shape s = {N, C, H, W, K, R, S, st, st, pad, pad, dil, dil, groups, 0, 0};
    s.P = dt_conv_out_dim(H, pad, dil, R, st);
    s.Q = dt_conv_out_dim(W, pad, dil, S, st);
    return s;
}

static void test_conv_workspace(void)
{
    const struct dt_ops *o = dt_backend_ops(backends[FAST]);
    struct dt_conv2d_shape s = conv_shape(2, 4, 9, 9, 6, 3, 3, 2, 1, 1, 2);
    size_t bytes = 1;
    CU_ASSERT_EQUAL(o->conv2d_workspace(backends[FAST], &s, &bytes), DT_OK);
    CU_ASSERT_EQUAL(bytes, (size_t)2 * 3 * 3 * s.P * s.Q * sizeof(float)); /* (C/g)RS PQ */
    struct dt_conv2d_shape pw = conv_shape(2, 4, 9, 9, 6, 1, 1, 1, 0, 1, 1);
    CU_ASSERT_EQUAL(o->conv2d_workspace(backends[FAST], &pw, &bytes), DT_OK);
    CU_ASSERT_EQUAL(bytes, 0); /* 1x1, stride 1, no padding: no columns */

    size_t nx = (size_t)2 * 4 * 81, nw = (size_t)6 * 2 * 9, ny = (size_t)2 * 6 * s.P * s.Q;
    float *x = calloc(nx, sizeof *x), *w = calloc(nw, sizeof *w), *y = calloc(ny, sizeof *y);
    size_t need = bytes = (size_t)2 * 9 * s.P * s.Q * sizeof(float);
    float *ws = malloc(need);
    CU_ASSERT_FATAL(x && w && y && ws);
    dt_clear_error();
    CU_ASSERT_EQUAL(o->conv2d_fwd(backends[FAST], y, x, w, &s, ws, need - 4), DT_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "workspace"));
    CU_ASSERT_EQUAL(o->conv2d_fwd(backends[FAST], y, x, w, &s, NULL, need), DT_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(o->conv2d_bwd_data(backends[FAST], x, y, w, &s, ws, 0), DT_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(o->conv2d_bwd_filter(backends[FAST], w, y, x, &s, ws, 8), DT_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(o->conv2d_fwd(backends[FAST], y, x, w, &s, ws, need), DT_OK);
    /* the reference needs none */
    const struct dt_ops *r = dt_backend_ops(backends[REF]);
    CU_ASSERT_EQUAL(r->conv2d_workspace(backends[REF], &s, &bytes), DT_OK);
    CU_ASSERT_EQUAL(bytes, 0);
    CU_ASSERT_EQUAL(r->conv2d_fwd(backends[REF], y, x, w, &s, NULL, 0), DT_OK);
    free(x), free(w), free(y), free(ws);
}

/* bf16/fp16: the conv's operands are rounded like linear's: a bf16
 * backend gives, bit for bit, what the fp32 backend gives on operands
 * rounded first, and differs from fp32 on unrounded ones. */
static void test_conv_precision(void)
{
    const enum dt_dtype prec[] = {DT_BF16, DT_F16};
    struct dt_conv2d_shape s = conv_shape(2, 3, 8, 7, 4, 3, 3, 1, 1, 1, 1);
    size_t nx = (size_t)2 * 3 * 56, nw = (size_t)4 * 3 * 9, ny = (size_t)2 * 4 * s.P * s.Q;
    size_t nws = (size_t)3 * 9 * s.P * s.Q;
    float *x = malloc(nx * 4), *w = malloc(nw * 4), *dy = malloc(ny * 4), *xr = malloc(nx * 4);
    float *wr = malloc(nw * 4), *dyr = malloc(ny * 4), *ws = malloc(nws * 4);
    float *y[3], *dx[3], *dw[3];
    for (int i = 0; i < 3; i++) {
        y[i] = malloc(ny * 4), dx[i] = malloc(nx * 4), dw[i] = calloc(nw, 4);
        CU_ASSERT_FATAL(y[i] && dx[i] && dw[i]);
    }
    CU_ASSERT_FATAL(x && w && dy && xr && wr && dyr && ws);
    for (size_t i = 0; i < nx; i++)
        x[i] = sinf(0.37f * (float)i) * 1.7f;
    for (size_t i = 0; i < nw; i++)
        w[i] = cosf(0.91f * (float)i) * 0.9f;
    for (size_t i = 0; i < ny; i++)
        dy[i] = sinf(1.3f * (float)i + 0.2f);
    for (int p = 0; p < 2; p++) {
        for (int k = 0; k < NBACKENDS; k++) {
            struct dt_backend_opts o = {
                .threads = 1, .reference_kernels = k == REF, .precision = prec[p]};
            dt_backend_t *be = NULL;
            CU_ASSERT_EQUAL_FATAL(dt_backend_create("cpu", &o, &be), DT_OK);
            float (*rnd)(float) = prec[p] == DT_BF16 ? dt_cpu_round_bf16 : dt_cpu_round_fp16;
            for (size_t i = 0; i < nx; i++)
                xr[i] = rnd(x[i]);
            for (size_t i = 0; i < nw; i++)
                wr[i] = rnd(w[i]);
            for (size_t i = 0; i < ny; i++)
                dyr[i] = rnd(dy[i]);
            const struct dt_ops *lo = dt_backend_ops(be), *f32 = dt_backend_ops(backends[k]);
            size_t wsb = nws * 4;
            memset(dw[0], 0, nw * 4), memset(dw[1], 0, nw * 4), memset(dw[2], 0, nw * 4);
            CU_ASSERT_EQUAL(lo->conv2d_fwd(be, y[0], x, w, &s, ws, wsb), DT_OK);
            CU_ASSERT_EQUAL(lo->conv2d_bwd_data(be, dx[0], dy, w, &s, ws, wsb), DT_OK);
            CU_ASSERT_EQUAL(lo->conv2d_bwd_filter(be, dw[0], dy, x, &s, ws, wsb), DT_OK);
            CU_ASSERT_EQUAL(f32->conv2d_fwd(backends[k], y[1], xr, wr, &s, ws, wsb), DT_OK);
            CU_ASSERT_EQUAL(f32->conv2d_bwd_data(backends[k], dx[1], dyr, wr, &s, ws, wsb), DT_OK);
            CU_ASSERT_EQUAL(f32->conv2d_bwd_filter(backends[k], dw[1], dyr, xr, &s, ws, wsb),
                            DT_OK);
            CU_ASSERT_EQUAL(f32->conv2d_fwd(backends[k], y[2], x, w, &s, ws, wsb), DT_OK);
            CU_ASSERT(memcmp(y[0], y[1], ny * 4) == 0);
            CU_ASSERT(memcmp(dx[0], dx[1], nx * 4) == 0);
            CU_ASSERT(memcmp(dw[0], dw[1], nw * 4) == 0);
            CU_ASSERT(memcmp(y[0], y[2], ny * 4) != 0);
            dt_backend_destroy(be);
        }
    }
    for (int i = 0; i < 3; i++)
        free(y[i]), free(dx[i]), free(dw[i]);
    free(x), free(w), free(dy), free(xr), free(wr), free(dyr), free(ws);
}

/* ---- invalid arguments ----------------------------------------------- */

#define CHECK_INVALID(expr, opname)                                                                \
    do {                                                                                           \
        dt_clear_error();                                                                          \
        dt_status st_ = (expr);                                                                    \
        CU_ASSERT_EQUAL(st_, DT_ERR_INVALID_ARG);                                                  \
        if (st_ == DT_ERR_INVALID_ARG)                                                             \
            CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), opname));                               \
    } while (0)

static void test_invalid_conv(void)
{
    /* the calls that must fail never touch the tensors; one buffer serves */
    static float buf[4096], x[144], w[72], y[144];
    for (int k = 0; k < NBACKENDS; k++) {
        dt_backend_t *be = backends[k];
        const struct dt_ops *o = dt_backend_ops(be);
        struct dt_conv2d_shape good = conv_shape(1, 4, 6, 6, 4, 3, 3, 1, 1, 1, 2), s;
        size_t wsb = sizeof buf;
        CU_ASSERT_EQUAL(o->conv2d_fwd(be, y, x, w, &good, buf, wsb), DT_OK);
        CHECK_INVALID(o->conv2d_fwd(be, NULL, buf, buf, &good, buf, wsb), "conv2d_fwd");
        CHECK_INVALID(o->conv2d_fwd(be, buf, buf, buf, NULL, buf, wsb), "conv2d_fwd");
        s = good, s.P = 5;
        CHECK_INVALID(o->conv2d_fwd(be, buf, buf, buf, &s, buf, wsb), "conv2d_fwd");
        s = good, s.groups = 3; /* 4 % 3 */
        CHECK_INVALID(o->conv2d_bwd_data(be, buf, buf, buf, &s, buf, wsb), "conv2d_bwd_data");
        s = good, s.K = 0;
        CHECK_INVALID(o->conv2d_bwd_filter(be, buf, buf, buf, &s, buf, wsb), "conv2d_bwd_filter");
        s = good, s.stride_h = 0;
        CHECK_INVALID(o->conv2d_fwd(be, buf, buf, buf, &s, buf, wsb), "conv2d_fwd");
        s = good, s.dil_w = 0;
        CHECK_INVALID(o->conv2d_fwd(be, buf, buf, buf, &s, buf, wsb), "conv2d_fwd");
        s = good, s.pad_h = -1;
        CHECK_INVALID(o->conv2d_fwd(be, buf, buf, buf, &s, buf, wsb), "conv2d_fwd");
        s = conv_shape(1, 1, 3, 3, 1, 5, 5, 1, 0, 1, 1); /* the filter does not fit */
        CHECK_INVALID(o->conv2d_workspace(be, &s, &wsb), "conv2d_workspace");
        CHECK_INVALID(o->conv2d_workspace(be, &good, NULL), "conv2d_workspace");
        CHECK_INVALID(o->conv2d_bwd_data(be, buf, NULL, buf, &good, buf, wsb), "conv2d_bwd_data");
        CHECK_INVALID(o->conv2d_bwd_filter(be, buf, buf, NULL, &good, buf, wsb),
                      "conv2d_bwd_filter");
    }
}

/* Ties: the gradient goes to the first maximum of each window in
 * row-major order, and overlapping windows add. */
static void test_maxpool_ties(void)
{
    float x[16], y[9], dy[9], dx[16];
    for (int i = 0; i < 16; i++)
        x[i] = 1.0f;
    for (int i = 0; i < 9; i++)
        dy[i] = (float)(i + 1);
    struct dt_pool2d_shape s = {1, 1, 4, 4, 2, 2, 2, 2, 0, 0, 2, 2};
    struct dt_pool2d_shape o3 = {1, 1, 4, 4, 2, 2, 1, 1, 0, 0, 3, 3};
    for (int k = 0; k < NBACKENDS; k++) {
        const struct dt_ops *o = dt_backend_ops(backends[k]);
        CU_ASSERT_EQUAL(o->maxpool2d_fwd(backends[k], y, x, &s), DT_OK);
        CU_ASSERT_EQUAL(o->maxpool2d_bwd(backends[k], dx, dy, x, y, &s), DT_OK);
        const float want[16] = {1, 0, 2, 0, 0, 0, 0, 0, 3, 0, 4, 0, 0, 0, 0, 0};
        CU_ASSERT(memcmp(dx, want, sizeof want) == 0);
        /* stride 1: window (p, q) starts at (p, q), its own first element */
        CU_ASSERT_EQUAL(o->maxpool2d_fwd(backends[k], y, x, &o3), DT_OK);
        CU_ASSERT_EQUAL(o->maxpool2d_bwd(backends[k], dx, dy, x, y, &o3), DT_OK);
        const float want3[16] = {1, 2, 3, 0, 4, 5, 6, 0, 7, 8, 9, 0, 0, 0, 0, 0};
        CU_ASSERT(memcmp(dx, want3, sizeof want3) == 0);
    }
}

/* 2x2 windows at stride 2 with ties in every place and NaN, on rows of 2
 * to 15 windows (the fast version's vector blocks, the block overlapping
 * the one before, and window by window): window q's four cells (a b / c
 * d) follow pattern q % 7. Its max ignores NaN (-inf when every cell is
 * NaN), and its gradient goes to the first cell equal to the max in that
 * order, 0 to the other cells (to none when every cell is NaN). */
static void test_maxpool_2x2_ties(void)
{
    const float nan = NAN;
    const float pattern[7][4] = {
        {2, 2, 2, 2},         /* all equal: a */
        {1, 3, 3, 3},         /* b */
        {1, 0, 3, 3},         /* c */
        {1, 0, -2, 4},        /* d */
        {5, 1, 1, 5},         /* a, tied with d */
        {nan, 1, 2, nan},     /* c: NaN never wins */
        {nan, nan, nan, nan}, /* -inf, no cell */
    };
    static const int first[7] = {0, 1, 2, 3, 0, 2, -1};
    static const int widths[] = {4, 10, 14, 16, 28, 30, 31};
    for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
        const int W = widths[w], Q = W / 2;
        float x[2 * 31], y[15], dy[15], dx[2 * 31], want[2 * 31], want_y[15];
        memset(want, 0, sizeof want);
        for (int i = 0; i < 2 * W; i++)
            x[i] = -9.0f; /* the odd edge, in no window */
        for (int q = 0; q < Q; q++) {
            const float *c = pattern[q % 7];
            x[2 * q] = c[0], x[2 * q + 1] = c[1], x[W + 2 * q] = c[2], x[W + 2 * q + 1] = c[3];
            dy[q] = (float)(q + 1);
            int k = first[q % 7];
            want_y[q] = k < 0 ? -INFINITY : c[k];
            if (k >= 0)
                want[(k / 2) * W + 2 * q + k % 2] = dy[q];
        }
        struct dt_pool2d_shape s = {1, 1, 2, W, 2, 2, 2, 2, 0, 0, 1, Q};
        for (int k = 0; k < NBACKENDS; k++) {
            const struct dt_ops *o = dt_backend_ops(backends[k]);
            for (int i = 0; i < 2 * W; i++)
                dx[i] = 7.0f; /* every cell must be written */
            CU_ASSERT_EQUAL(o->maxpool2d_fwd(backends[k], y, x, &s), DT_OK);
            CU_ASSERT_EQUAL(o->maxpool2d_bwd(backends[k], dx, dy, x, y, &s), DT_OK);
            if (memcmp(y, want_y, (size_t)Q * sizeof *y) != 0) {
                printf("\n  maxpool 2x2 ties, width %d, backend %d: y differs\n", W, k);
                CU_FAIL("maxpool 2x2 ties: y");
            }
            if (memcmp(dx, want, 2 * (size_t)W * sizeof *dx) != 0) {
                printf("\n  maxpool 2x2 ties, width %d, backend %d: dx differs\n", W, k);
                CU_FAIL("maxpool 2x2 ties: dx");
            }
        }
    }
}

static void test_invalid_pool(void)
{
    float buf[1024];
    for (int k = 0; k < NBACKENDS; k++) {
        dt_backend_t *be = backends[k];
        const struct dt_ops *o = dt_backend_ops(be);
        struct dt_pool2d_shape good = {2, 2, 6, 6, 2, 2, 2, 2, 0, 0, 3, 3}, s;
        CU_ASSERT_EQUAL(o->maxpool2d_fwd(be, buf, buf + 512, &good), DT_OK);
        CHECK_INVALID(o->maxpool2d_fwd(be, NULL, buf, &good), "maxpool2d_fwd");
        CHECK_INVALID(o->maxpool2d_bwd(be, buf, buf, NULL, buf, &good), "maxpool2d_bwd");
        CHECK_INVALID(o->maxpool2d_bwd(be, buf, buf, buf, NULL, &good), "maxpool2d_bwd");
        s = good, s.Q = 2;
        CHECK_INVALID(o->avgpool2d_fwd(be, buf, buf, &s), "avgpool2d_fwd");
        s = good, s.pad_h = 2; /* padding as large as the window */
        CHECK_INVALID(o->maxpool2d_fwd(be, buf, buf, &s), "maxpool2d_fwd");
        s = good, s.stride_w = 0;
        CHECK_INVALID(o->avgpool2d_bwd(be, buf, buf, &s), "avgpool2d_bwd");
        s = good, s.C = 0;
        CHECK_INVALID(o->avgpool2d_fwd(be, buf, buf, &s), "avgpool2d_fwd");
        CHECK_INVALID(o->avgpool2d_bwd(be, buf, buf, NULL), "avgpool2d_bwd");
    }
}

static void test_invalid_norm(void)
{
    float f[256];
    double d[64];
    for (int i = 0; i < 256; i++)
        f[i] = 1.0f;
    for (int k = 0; k < NBACKENDS; k++) {
        dt_backend_t *be = backends[k];
        const struct dt_ops *o = dt_backend_ops(be);
        CU_ASSERT_EQUAL(o->batchnorm_stats(be, d, f, 2, 3, 4), DT_OK);
        CHECK_INVALID(o->batchnorm_stats(be, NULL, f, 2, 3, 4), "batchnorm_stats");
        CHECK_INVALID(o->batchnorm_stats(be, d, f, 2, 0, 4), "batchnorm_stats");
        CU_ASSERT_EQUAL(o->batchnorm_fwd(be, f, f + 100, f + 110, f + 120, f + 130, f + 140, d, 8,
                                         f, f, 1e-5f, 0.1f, 2, 3, 4, 0),
                        DT_OK);
        /* count below this rank's N*HW */
        CHECK_INVALID(o->batchnorm_fwd(be, f, f + 100, f + 110, NULL, NULL, f + 140, d, 7, f, f,
                                       1e-5f, 0.1f, 2, 3, 4, 0),
                      "batchnorm_fwd");
        /* one running buffer without the other */
        CHECK_INVALID(o->batchnorm_fwd(be, f, f + 100, f + 110, f + 120, NULL, f + 140, d, 8, f, f,
                                       1e-5f, 0.1f, 2, 3, 4, 0),
                      "batchnorm_fwd");
        CHECK_INVALID(o->batchnorm_fwd(be, f, NULL, f + 110, NULL, NULL, f + 140, d, 8, f, f, 1e-5f,
                                       0.1f, 2, 3, 4, 0),
                      "batchnorm_fwd");
        CHECK_INVALID(o->batchnorm_fwd(be, f, f + 100, f + 110, NULL, NULL, f + 140, d, 8, f, f,
                                       -1.0f, 0.1f, 2, 3, 4, 0),
                      "batchnorm_fwd");
        CHECK_INVALID(o->batchnorm_infer(be, f, f, NULL, f, f, f, 1e-5f, 2, 3, 4, 0),
                      "batchnorm_infer");
        CHECK_INVALID(o->batchnorm_infer(be, f, f, f, f, f, f, 1e-5f, 2, 3, -4, 0), "batchnorm_infer");
        CHECK_INVALID(o->batchnorm_bwd_reduce(be, d, f, f, NULL, f, NULL, 2, 3, 4),
                      "batchnorm_bwd_reduce");
        CHECK_INVALID(o->batchnorm_bwd_reduce(be, d, f, f, f, f, NULL, 0, 3, 4), "batchnorm_bwd_reduce");
        CHECK_INVALID(o->batchnorm_bwd(be, f, f, f, f, f, f, f, f, d, NULL, 8, NULL, 2, 3, 4),
                      "batchnorm_bwd");
        CHECK_INVALID(o->batchnorm_bwd(be, f, f, f, f, f, f, f, f, d, d, 0, NULL, 2, 3, 4),
                      "batchnorm_bwd");
        CHECK_INVALID(o->layernorm_fwd(be, f, f, f, f, NULL, f, 1e-5f, 2, 3), "layernorm_fwd");
        CHECK_INVALID(o->layernorm_fwd(be, f, f, f, f, f, f, 1e-5f, 2, 0), "layernorm_fwd");
        CHECK_INVALID(o->layernorm_bwd(be, f, NULL, f, f, f, f, f, f, 2, 3), "layernorm_bwd");
        CHECK_INVALID(o->layernorm_bwd(be, f, f, f, f, f, f, f, f, -2, 3), "layernorm_bwd");
    }
}

static void test_invalid_elementwise(void)
{
    float f[64];
    for (int k = 0; k < NBACKENDS; k++) {
        dt_backend_t *be = backends[k];
        const struct dt_ops *o = dt_backend_ops(be);
        CHECK_INVALID(o->add(be, NULL, f, f, 3), "add");
        CHECK_INVALID(o->add(be, f, f, NULL, 3), "add");
        CHECK_INVALID(o->accumulate(be, f, NULL, 3), "accumulate");
        CHECK_INVALID(o->channel_bias_fwd(be, f, NULL, 1, 2, 3), "channel_bias_fwd");
        CHECK_INVALID(o->channel_bias_fwd(be, f, f, 1, -2, 3), "channel_bias_fwd");
        CHECK_INVALID(o->channel_bias_bwd(be, NULL, f, 1, 2, 3), "channel_bias_bwd");
        CHECK_INVALID(o->channel_bias_bwd(be, f, f, 1, 2, -3), "channel_bias_bwd");
        /* in place is allowed */
        for (int i = 0; i < 64; i++)
            f[i] = (float)i;
        CU_ASSERT_EQUAL(o->add(be, f, f, f, 64), DT_OK);
        CU_ASSERT_EQUAL(f[63], 126.0f);
    }
}

/* Token ids that are not whole numbers in [0, V) are refused, naming the
 * position and the value, before anything is read or written. */
static void test_invalid_embedding(void)
{
    float w[12], out[8], dw[12];
    for (int i = 0; i < 12; i++)
        w[i] = (float)i, dw[i] = 0.0f;
    const float bad[][2] = {
        {1.0f, 2.5f}, {-1.0f, 0.0f}, {0.0f, 3.0f}, {NAN, 1.0f}, {1.0f, INFINITY}};
    const char *want[] = {"id 2.5 at position 1", "id -1 at position 0", "id 3 at position 1",
                          "id nan at position 0", "id inf at position 1"};
    for (int k = 0; k < NBACKENDS; k++) {
        dt_backend_t *be = backends[k];
        const struct dt_ops *o = dt_backend_ops(be);
        const float good[2] = {2.0f, 0.0f};
        CU_ASSERT_EQUAL(o->embedding_fwd(be, out, good, w, 2, 3, 4), DT_OK);
        CU_ASSERT_EQUAL(out[0], 8.0f);
        CU_ASSERT_EQUAL(out[7], 3.0f);
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            CHECK_INVALID(o->embedding_fwd(be, out, bad[b], w, 2, 3, 4), "embedding_fwd");
            CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), want[b]));
            CHECK_INVALID(o->embedding_bwd(be, dw, out, bad[b], 2, 3, 4), "embedding_bwd");
            CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), want[b]));
        }
        for (int i = 0; i < 12; i++)
            CU_ASSERT_EQUAL(dw[i], 0.0f); /* nothing written by a refused call */
        CHECK_INVALID(o->embedding_fwd(be, NULL, good, w, 2, 3, 4), "embedding_fwd");
        CHECK_INVALID(o->embedding_fwd(be, out, good, w, 2, 0, 4), "embedding_fwd");
        CHECK_INVALID(o->embedding_bwd(be, dw, out, NULL, 2, 3, 4), "embedding_bwd");
        CHECK_INVALID(o->embedding_bwd(be, dw, out, good, 2, 3, 0), "embedding_bwd");
    }
}

/* Bytes of two blocks of 64 query rows of scores, three copies of a
 * head's keys or values and two of a block's queries, each rounded up to
 * 16 in both dimensions, and 6 rows of the longer of T and Dh. */
static size_t attn_ws_bound(int T, int Dh)
{
    size_t t = (size_t)T + 16, d = (size_t)Dh + 16;
    return ((2 * 64 + 3 * d) * t + (2 * 64 + 6) * d + 6 * (t + d)) * sizeof(float);
}

static void test_attention_workspace(void)
{
    enum { B = 2, T = 70, H = 2, Dh = 6 };
    size_t n = (size_t)B * T * H * Dh;
    float *qkv = calloc(3 * n, sizeof *qkv), *out = calloc(n, sizeof *out);
    float *lse = calloc((size_t)B * H * T, sizeof *lse), *dqkv = calloc(3 * n, sizeof *dqkv);
    CU_ASSERT_FATAL(qkv && out && lse && dqkv);
    for (int k = 0; k < NBACKENDS; k++) {
        dt_backend_t *be = backends[k];
        const struct dt_ops *o = dt_backend_ops(be);
        size_t need = 0;
        CU_ASSERT_EQUAL(o->attention_workspace(be, B, T, H, Dh, 1, &need), DT_OK);
        /* bounded by blocks of query rows and the head's keys and values:
         * linear in T and in Dh, not T x T */
        CU_ASSERT(need > 0 && need <= attn_ws_bound(T, Dh));
        size_t need_short = 0, need_long = 0, need_wide = 0;
        CU_ASSERT_EQUAL(o->attention_workspace(be, 1, T, 1, 4, 0, &need_short), DT_OK);
        CU_ASSERT_EQUAL(o->attention_workspace(be, 1, 8 * T, 1, 4, 0, &need_long), DT_OK);
        CU_ASSERT(need_long > 4 * need_short && need_long <= 8 * need_short);
        CU_ASSERT_EQUAL(o->attention_workspace(be, 1, T, 1, 128, 0, &need_wide), DT_OK);
        CU_ASSERT(need_wide > need_short && need_wide <= attn_ws_bound(T, 128));
        void *ws = malloc(need);
        CU_ASSERT_FATAL(ws != NULL);
        CU_ASSERT_EQUAL(o->attention_fwd(be, out, lse, qkv, B, T, H, Dh, 1, ws, need), DT_OK);
        CU_ASSERT_EQUAL(o->attention_bwd(be, dqkv, out, qkv, out, lse, B, T, H, Dh, 1, ws, need),
                        DT_OK);
        /* all-zero inputs: uniform attention, lse = log(number of keys) */
        CU_ASSERT(fabsf(lse[T - 1] - logf((float)T)) < 1e-5f);
        CU_ASSERT(fabsf(lse[0]) < 1e-6f);
        /* a NaN in the first key of sequence 0, head 0 reaches every query of that head */
        qkv[H * Dh] = NAN;
        CU_ASSERT_EQUAL(o->attention_fwd(be, out, lse, qkv, B, T, H, Dh, 1, ws, need), DT_OK);
        CU_ASSERT(isnan(out[0]) && isnan(out[(size_t)(T - 1) * H * Dh]) && isnan(lse[T - 1]));
        CU_ASSERT(!isnan(out[Dh]) && !isnan(out[(size_t)T * H * Dh])); /* head 1, sequence 1 */
        qkv[H * Dh] = 0.0f;
        CHECK_INVALID(o->attention_fwd(be, out, lse, qkv, B, T, H, Dh, 1, ws, need - 4),
                      "attention_fwd");
        CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "workspace"));
        CHECK_INVALID(o->attention_fwd(be, out, lse, qkv, B, T, H, Dh, 1, NULL, need),
                      "attention_fwd");
        CHECK_INVALID(o->attention_bwd(be, dqkv, out, qkv, out, lse, B, T, H, Dh, 1, ws, 0),
                      "attention_bwd");
        CHECK_INVALID(o->attention_fwd(be, NULL, lse, qkv, B, T, H, Dh, 1, ws, need),
                      "attention_fwd");
        CHECK_INVALID(o->attention_fwd(be, out, lse, qkv, B, 0, H, Dh, 1, ws, need),
                      "attention_fwd");
        CHECK_INVALID(o->attention_fwd(be, out, lse, qkv, B, T, H, Dh, 2, ws, need),
                      "attention_fwd");
        CHECK_INVALID(o->attention_bwd(be, dqkv, out, qkv, NULL, lse, B, T, H, Dh, 1, ws, need),
                      "attention_bwd");
        CHECK_INVALID(o->attention_bwd(be, dqkv, out, qkv, out, lse, B, T, H, -1, 1, ws, need),
                      "attention_bwd");
        CHECK_INVALID(o->attention_workspace(be, B, T, 0, Dh, 1, &need), "attention_workspace");
        CHECK_INVALID(o->attention_workspace(be, B, T, H, Dh, 1, NULL), "attention_workspace");
        free(ws);
    }
    free(qkv), free(out), free(lse), free(dqkv);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite("op_table", suite_init, suite_cleanup);
    CU_ADD(s, test_table_covers_ops);
    CU_ADD(s, test_gradcheck_ref);
    CU_ADD(s, test_gradcheck_fast);
    CU_ADD(s, test_fast_vs_ref);
    CU_ADD(s, test_conventions);
    CU_ADD(s, test_batchnorm_relu);
    CU_ADD(s, test_threads_same_bits);
    CU_ADD(s, test_conv_lowered);
    CU_ADD(s, test_blas_products);
    CU_ADD(s, test_short_batch_bits);
    CU_ADD(s, test_compare_detects);
    CU_ADD(s, test_conv_workspace);
    CU_ADD(s, test_conv_precision);
    CU_ADD(s, test_invalid_conv);
    CU_ADD(s, test_maxpool_ties);
    CU_ADD(s, test_maxpool_2x2_ties);
    CU_ADD(s, test_invalid_pool);
    CU_ADD(s, test_invalid_norm);
    CU_ADD(s, test_invalid_elementwise);
    CU_ADD(s, test_invalid_embedding);
    CU_ADD(s, test_attention_workspace);
    return cu_run_all();
}
