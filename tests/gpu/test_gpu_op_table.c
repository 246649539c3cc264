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
 * A case whose op the cuda backend lacks is counted and named as
 * unsupported, never as passed. In a build with cuDNN the backend must
 * have every op of kernels/ops.h; without cuDNN exactly the convolution
 * and pooling ops are missing, and the test checks both. The GPU runs
 * fp32 without TF32 here, so the table's fp32 tolerances apply.
 *
 * Without a usable GPU the program prints why and exits 77, which ctest
 * counts as skipped.
 */
#include <stdio.h>
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
    return cu_run_all();
}
