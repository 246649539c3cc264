/*
 * test_gpu_op_table.c - every case of the shared op table
 * (tests/common/op_table.c: the op, its shapes, its inputs, which outputs
 * are written and which accumulate) run on the cuda backend and compared
 * with the CPU backend's plain C reference (reference_kernels = 1),
 * through dt_op_case_compare. The table is the one the CPU suites
 * gradient-check, so the GPU ops are held to the same cases: convolution
 * (cuDNN), pooling, batch and layer norm, channel bias, add, accumulate
 * and the older ops alike.
 *
 * One convolution outside the table: a batch smaller than the one its
 * workspace was sized for (the short last piece of an evaluation) runs
 * within that workspace in every direction, and within none at all
 * wherever cuDNN has an algorithm that needs none (else it is refused as
 * unsupported, in words).
 *
 * A case whose op the cuda backend lacks is counted and named as
 * unsupported, never as passed. In a build with cuDNN the backend must
 * have every op of kernels/ops.h; without cuDNN exactly the convolution
 * and pooling ops are missing, and the test checks both. The GPU runs
 * fp32 without TF32 here, so the table's fp32 tolerances apply.
 *
 * Without a usable GPU the program prints why and exits 77, which ctest
 * counts as skipped.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "tests/common/op_table.h"
#include "tests/unit/cu_util.h"

#define SKIP_CODE 77

#ifdef DT_HAVE_CUDNN
#define HAVE_CUDNN 1
#else
#define HAVE_CUDNN 0
#endif

static dt_backend_t *cpu, *gpu;

static int suite_init(void)
{
    struct dt_backend_opts ref = {.threads = 1, .reference_kernels = 1, .precision = DT_F32};
    if (dt_backend_create("cpu", &ref, &cpu) != DT_OK) {
        fprintf(stderr, "test_gpu_op_table: cpu backend: %s\n", dt_last_error());
        return -1;
    }
    struct dt_backend_opts o = {.threads = 1, .device = 0, .allow_tf32 = 0, .precision = DT_F32};
    if (dt_backend_create("cuda", &o, &gpu) != DT_OK) {
        fprintf(stderr, "test_gpu_op_table: cuda backend: %s\n", dt_last_error());
        return -1;
    }
    return 0;
}

static int suite_cleanup(void)
{
    if (gpu)
        dt_backend_destroy(gpu);
    if (cpu)
        dt_backend_destroy(cpu);
    gpu = cpu = NULL;
    return 0;
}

/* 1 for the ops that need cuDNN on the cuda backend. */
static int needs_cudnn(enum dt_op_id op)
{
    switch (op) {
    case DT_OP_conv2d_workspace:
    case DT_OP_conv2d_fwd:
    case DT_OP_conv2d_bwd_data:
    case DT_OP_conv2d_bwd_filter:
    case DT_OP_maxpool2d_fwd:
    case DT_OP_maxpool2d_bwd:
    case DT_OP_avgpool2d_fwd:
    case DT_OP_avgpool2d_bwd:
        return 1;
    default:
        return 0;
    }
}

/* The cuda backend's op table: every op, less the cuDNN ones in a build
 * without cuDNN. */
static void test_ops_present(void)
{
    int missing = 0;
    for (int op = 0; op < DT_OP_COUNT; op++) {
        const int has = dt_backend_supports(gpu, (enum dt_op_id)op, DT_F32);
        const int want = HAVE_CUDNN || !needs_cudnn((enum dt_op_id)op);
        if (has != want) {
            printf("\n  cuda %s: %s", dt_op_name((enum dt_op_id)op),
                   has ? "present in a build without cuDNN" : "missing");
            missing++;
        }
    }
    CU_ASSERT_EQUAL(missing, 0);
}

/* Every table case the backend supports: GPU against the CPU reference. */
static void test_cases_vs_cpu(void)
{
    int compared = 0, failed = 0, unsupported = 0;
    CU_ASSERT_FATAL(dt_op_ncases > 0);
    for (int i = 0; i < dt_op_ncases; i++) {
        const struct dt_op_case *c = &dt_op_cases[i];
        const char *name = dt_op_name(c->op);
        if (!dt_backend_supports(gpu, c->op, DT_F32)) {
            printf("\n  case %d (%s): UNSUPPORTED on cuda", i, name);
            unsupported++;
            continue;
        }
        compared++;
        if (dt_op_case_compare(c, gpu, cpu) != 0) {
            printf("\n  case %d (%s): cuda differs from the CPU reference", i, name);
            failed++;
        }
    }
    printf("\n  %d cases: %d compared, %d differ, %d unsupported on cuda\n", dt_op_ncases, compared,
           failed, unsupported);
    CU_ASSERT(compared > 0);
    CU_ASSERT_EQUAL(failed, 0);
    if (HAVE_CUDNN)
        CU_ASSERT_EQUAL(unsupported, 0);
}

/* The largest relative difference of a from b (against max(|b|, 1)). */
static double worst_diff(const float *a, const float *b, size_t n)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / fmax(fabs((double)b[i]), 1.0);
        worst = d > worst || d != d ? d : worst;
    }
    return worst;
}

/* Runs the three convolution directions of s on the GPU with ws_bytes of
 * workspace (none when 0) and compares each with the CPU reference's
 * y, dx and dw (dw accumulates into zeros on both). Returns the number of
 * directions that failed or differ; with may_refuse, a direction that
 * cuDNN cannot run within the workspace may be refused as unsupported
 * (said, not counted). */
static int conv_within(const struct dt_conv2d_shape *s, size_t ws_bytes, int may_refuse,
                       const float *x, const float *w, const float *dy, const float *y_ref,
                       const float *dx_ref, const float *dw_ref)
{
    size_t nx = (size_t)s->N * s->C * s->H * s->W, ny = (size_t)s->N * s->K * s->P * s->Q;
    size_t nw = (size_t)s->K * (s->C / s->groups) * s->R * s->S;
    size_t n_out = nx > ny ? nx : ny;
    n_out = n_out > nw ? n_out : nw;
    float *dx = NULL, *dw = NULL, *dyy = NULL, *dws = NULL, *dout = NULL;
    float *host = malloc(n_out * sizeof *host);
    int bad = 0;
    const struct dt_ops *g = dt_backend_ops(gpu);
    CU_ASSERT_FATAL(host != NULL);
    CU_ASSERT_FATAL(dt_backend_alloc(gpu, nx * sizeof(float), (void **)&dx) == DT_OK);
    CU_ASSERT_FATAL(dt_backend_alloc(gpu, nw * sizeof(float), (void **)&dw) == DT_OK);
    CU_ASSERT_FATAL(dt_backend_alloc(gpu, ny * sizeof(float), (void **)&dyy) == DT_OK);
    CU_ASSERT_FATAL(dt_backend_alloc(gpu, n_out * sizeof(float), (void **)&dout) == DT_OK);
    if (ws_bytes > 0) CU_ASSERT_FATAL(dt_backend_alloc(gpu, ws_bytes, (void **)&dws) == DT_OK);
    CU_ASSERT_FATAL(dt_backend_copy(gpu, dx, x, nx * sizeof(float), DT_COPY_H2D) == DT_OK);
    CU_ASSERT_FATAL(dt_backend_copy(gpu, dw, w, nw * sizeof(float), DT_COPY_H2D) == DT_OK);
    CU_ASSERT_FATAL(dt_backend_copy(gpu, dyy, dy, ny * sizeof(float), DT_COPY_H2D) == DT_OK);
    const char *dir[3] = {"forward", "backward data", "backward filter"};
    for (int d = 0; d < 3; d++) {
        size_t n = d == 0 ? ny : d == 1 ? nx : nw;
        const float *want = d == 0 ? y_ref : d == 1 ? dx_ref : dw_ref;
        dt_status st = DT_OK;
        if (d == 2) st = g->fill(gpu, dout, nw, 0.0f);
        if (st == DT_OK)
            st = d == 0   ? g->conv2d_fwd(gpu, dout, dx, dw, s, dws, ws_bytes)
                 : d == 1 ? g->conv2d_bwd_data(gpu, dout, dyy, dw, s, dws, ws_bytes)
                          : g->conv2d_bwd_filter(gpu, dout, dyy, dx, s, dws, ws_bytes);
        if (st == DT_OK) st = dt_backend_copy(gpu, host, dout, n * sizeof(float), DT_COPY_D2H);
        if (st != DT_OK) {
            printf("\n  N=%d, %zu bytes of workspace, %s: %s", s->N, ws_bytes, dir[d],
                   dt_last_error());
            if (!(may_refuse && st == DT_ERR_UNSUPPORTED)) bad++;
            continue;
        }
        double worst = worst_diff(host, want, n);
        if (!(worst <= 1e-4)) {
            printf("\n  N=%d, %zu bytes of workspace, %s: differs from the CPU by %g", s->N,
                   ws_bytes, dir[d], worst);
            bad++;
        }
    }
    dt_backend_free(gpu, dx);
    dt_backend_free(gpu, dw);
    dt_backend_free(gpu, dyy);
    dt_backend_free(gpu, dout);
    if (dws) dt_backend_free(gpu, dws);
    free(host);
    return bad;
}

/* A short batch of a shape whose workspace was sized for a larger one:
 * each direction runs within that workspace, and within none. */
static void test_conv_short_batch(void)
{
    if (!HAVE_CUDNN) return;
    struct dt_conv2d_shape big = {.N = 16,
                                  .C = 16,
                                  .H = 14,
                                  .W = 14,
                                  .K = 32,
                                  .R = 3,
                                  .S = 3,
                                  .stride_h = 1,
                                  .stride_w = 1,
                                  .pad_h = 1,
                                  .pad_w = 1,
                                  .dil_h = 1,
                                  .dil_w = 1,
                                  .groups = 1};
    big.P = dt_conv_out_dim(big.H, big.pad_h, big.dil_h, big.R, big.stride_h);
    big.Q = dt_conv_out_dim(big.W, big.pad_w, big.dil_w, big.S, big.stride_w);
    struct dt_conv2d_shape s = big;
    s.N = 3;
    size_t ws = 0, cpu_ws = 0;
    CU_ASSERT_FATAL(dt_backend_ops(gpu)->conv2d_workspace(gpu, &big, &ws) == DT_OK);
    CU_ASSERT_FATAL(dt_backend_ops(cpu)->conv2d_workspace(cpu, &s, &cpu_ws) == DT_OK);
    size_t nx = (size_t)s.N * s.C * s.H * s.W, ny = (size_t)s.N * s.K * s.P * s.Q;
    size_t nw = (size_t)s.K * s.C * s.R * s.S;
    float *buf = calloc(2 * nx + 2 * ny + 2 * nw, sizeof *buf);
    void *cws = cpu_ws ? malloc(cpu_ws) : NULL;
    CU_ASSERT_FATAL(buf != NULL && (cpu_ws == 0 || cws != NULL));
    float *x = buf, *dx_ref = x + nx, *y_ref = dx_ref + nx, *dy = y_ref + ny, *w = dy + ny,
          *dw_ref = w + nw;
    srand(7);
    for (size_t i = 0; i < nx; i++)
        x[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t i = 0; i < ny; i++)
        dy[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t i = 0; i < nw; i++)
        w[i] = ((float)rand() / RAND_MAX - 0.5f) * 0.2f;
    const struct dt_ops *c = dt_backend_ops(cpu);
    CU_ASSERT_FATAL(c->conv2d_fwd(cpu, y_ref, x, w, &s, cws, cpu_ws) == DT_OK);
    CU_ASSERT_FATAL(c->conv2d_bwd_data(cpu, dx_ref, dy, w, &s, cws, cpu_ws) == DT_OK);
    CU_ASSERT_FATAL(c->conv2d_bwd_filter(cpu, dw_ref, dy, x, &s, cws, cpu_ws) == DT_OK);
    printf("\n  workspace for N=%d: %zu bytes", big.N, ws);
    CU_ASSERT_EQUAL(conv_within(&s, ws, 0, x, w, dy, y_ref, dx_ref, dw_ref), 0);
    CU_ASSERT_EQUAL(conv_within(&s, 0, 1, x, w, dy, y_ref, dx_ref, dw_ref), 0);
    free(cws);
    free(buf);
}

int main(void)
{
    char why[512];
    if (!dt_cuda_usable(why, sizeof why)) {
        printf("test_gpu_op_table: SKIPPED: %s\n", why);
        return SKIP_CODE;
    }
    printf("test_gpu_op_table: %s\n", why);
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite("cuda_op_table", suite_init, suite_cleanup);
    CU_ADD(s, test_ops_present);
    CU_ADD(s, test_cases_vs_cpu);
    CU_ADD(s, test_conv_short_batch);
    return cu_run_all();
}
