/*
 * test_gpu_ops.c - every op of kernels/ops.h on the cuda backend, against
 * the CPU backend's plain C reference (reference_kernels = 1) on the same
 * random inputs (dt_rng, DT_RNG_TEST), forward and backward.
 *
 * Errors are measured as max |gpu - cpu| / max |cpu| over a tensor. The
 * GEMMs of linear run on all four GPU configurations, each against a CPU
 * reference of the same precision: bf16 and fp16 against the CPU backend
 * that rounds its operands the same way (products of rounded operands are
 * exact in fp32, so only the order of the fp32 sums differs: 1e-5, and a
 * GPU "bf16" that never rounds fails by orders of magnitude; the test also
 * checks the result differs from plain fp32), fp32 at 1e-5, and TF32 against
 * CPU references whose inputs are reduced to TF32 both ways a tensor core
 * may do it, rounded to nearest even and truncated (tests/common/tf32.c),
 * at TF32_TOL; the one it matched is printed. The other ops are fp32
 * whatever the precision and run on the fp32 configuration at 1e-5. Dropout, flatten, fill and
 * scale must match bit for bit, and the softmax loss and sumsq must come
 * out the same bits on every run. The bf16 casts of gradients for the wire
 * must match the CPU bit for bit and a table of known bits (ties, overflow,
 * subnormals, signed zeros, infinities, NaN payloads), and from_bf16 is
 * checked on all 65536 bf16 values. Shapes are odd (B=37, In=129, Out=65),
 * sizes are not multiples of 4, and some tensors have more elements than
 * one grid of DT_CUDA_MAX_BLOCKS x DT_CUDA_THREADS threads covers, so the
 * grid-stride loops go round. Also checked: parameter gradients
 * accumulate and activation gradients are written (buffers start with old
 * values or NaN), ops in place, non-finite values in the reductions, bad
 * labels and bad arguments, and an allocation larger than the device.
 *
 * Without a usable GPU the program prints why and exits 77, which ctest
 * counts as skipped.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/ops.h"
#include "kernels/backend.h"
#include "core/rng.h"
#include "tests/common/op_args.h"
#include "tests/common/tf32.h"
#include "tests/unit/cu_util.h"

#define SKIP_CODE 77

/* More elements than DT_CUDA_MAX_BLOCKS (4096) blocks of DT_CUDA_THREADS
 * (256) threads cover, four times over, and not a multiple of 4. */
#define BIG_N (4u * 4096u * 256u + 3u)

/* Tolerance of the ops that do no GEMM, on every backend. */
#define ELEM_TOL 1e-5
/* Activations work on O(1) values: their error is measured against at
 * least this magnitude, so an output that is all tiny numbers (one input
 * far below zero) does not turn erff's last-ulp differences into a large
 * relative error. */
#define ACT_FLOOR 1.0

enum { FP32, TF32, BF16, FP16, NCFG };
static const struct gpu_cfg {
    const char *name;
    enum dt_dtype precision;
    int allow_tf32;
    double tol; /* for linear */
} cfgs[NCFG] = {
    {"fp32", DT_F32, 0, 1e-5},
    {"tf32", DT_F32, 1, 1e-5}, /* TF32_TOL, against the TF32 references */
    {"bf16", DT_BF16, 0, 1e-5},
    {"fp16", DT_F16, 0, 1e-5},
};
/* A reduced-precision GEMM must differ from the fp32 one by at least this
 * much on random inputs (rounding to bf16 or fp16 moves each operand by up
 * to 2^-9 or 2^-12 relative), or it did not round. */
#define ROUNDED_MIN_DIFF 1e-5
/* A TF32 GEMM against a CPU GEMM on the same inputs reduced to TF32: each
 * reduced input has 11 significant bits, so every product (22 bits) is
 * exact in fp32 and both sides add the same numbers; only the fp32
 * rounding of the sums differs with their order. That error is a random
 * walk of K roundings of 2^-24 of the partial sums, about
 * sqrt(K) 2^-24 sqrt(K/9) for K products of inputs uniform in [-1, 1],
 * while the measure divides by max |out|, about 3 sqrt(K/9): under 1e-6
 * for the largest K here (784); a CPU GEMM that adds the same products in
 * reversed blocks of 8 came within 8e-7 on these shapes. 1e-5 is the bound
 * of the fp32 configuration too. The two ways of reducing move each input
 * by up to 2^-11 (rounding) or 2^-10 (truncation, always toward zero), which
 * put their results 6e-4 to 1e-3 apart on these shapes, so one tolerance
 * tells them apart. cuBLAS may also leave a GEMM in full fp32
 * (TF32 is allowed, not required): that result is accepted, and said. */
#define TF32_TOL 1e-5

static dt_backend_t *cpu, *gpu[NCFG];
/* CPU references per configuration: the reference kernels at that
 * precision (fp32 for TF32) */
static dt_backend_t *cpu_ref[NCFG];
static const struct dt_ops *cops, *gops[NCFG];

/* ---- helpers ---------------------------------------------------------- */

static uint64_t draws; /* distinct draws for every array in the run */

static void fill_uniform(float *x, size_t n, float lo, float hi)
{
    struct dt_rng_key key = {.seed = 4242, .purpose = DT_RNG_TEST, .stream = 11};
    struct dt_rng_stream s;
    dt_rng_stream_init(&key, 0, &s);
    for (size_t i = 0; i < n; i += 4) {
        uint32_t w[4];
        dt_rng_stream_block(&s, draws++, w);
        for (size_t k = 0; k < 4 && i + k < n; k++)
            x[i + k] = lo + (hi - lo) * dt_rng_u32_to_unit(w[k]);
    }
}

static void fill_value(float *x, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        x[i] = v;
}

static float *hnew(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof *p);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    return p;
}

static float *hrand(size_t n, float lo, float hi)
{
    float *p = hnew(n);
    fill_uniform(p, n, lo, hi);
    return p;
}

static float *hconst(size_t n, float v)
{
    float *p = hnew(n);
    fill_value(p, n, v);
    return p;
}

static void *dnew(dt_backend_t *be, size_t bytes)
{
    void *p = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_backend_alloc(be, bytes ? bytes : sizeof(float), &p), DT_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    return p;
}

static void up(dt_backend_t *be, void *d, const void *h, size_t bytes)
{
    if (bytes)
        CU_ASSERT_EQUAL_FATAL(dt_backend_copy(be, d, h, bytes, DT_COPY_H2D), DT_OK);
}

/* Device to host, then waits, so h can be read. */
static void down(dt_backend_t *be, void *h, const void *d, size_t bytes)
{
    if (bytes)
        CU_ASSERT_EQUAL_FATAL(dt_backend_copy(be, h, d, bytes, DT_COPY_D2H), DT_OK);
    CU_ASSERT_EQUAL_FATAL(dt_backend_sync(be), DT_OK);
}

/* A device copy of h(n). */
static float *dput(dt_backend_t *be, const float *h, size_t n)
{
    float *d = dnew(be, n * sizeof *d);
    up(be, d, h, n * sizeof *d);
    return d;
}

/* A host copy of d(n). */
static float *hget(dt_backend_t *be, const float *d, size_t n)
{
    float *h = hnew(n);
    down(be, h, d, n * sizeof *h);
    return h;
}

/* max |got - ref| / max(max |ref|, floor); NaN in the same place in both
 * counts as equal, NaN in one only as infinitely wrong. */
static double norm_err(const float *got, const float *ref, size_t n, double floor_)
{
    double diff = 0.0, mag = floor_;
    for (size_t i = 0; i < n; i++) {
        if (isnan(ref[i]) || isnan(got[i])) {
            if (!(isnan(ref[i]) && isnan(got[i])))
                return INFINITY;
            continue;
        }
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= diff))
            diff = d; /* also takes an infinite difference */
        if (fabs(ref[i]) > mag)
            mag = fabs(ref[i]);
    }
    return diff / mag;
}

#define TINY 1e-30 /* the magnitude floor of a plain relative error */

#define CHECK_CLOSE(what, cfg, got, ref, n, floor_, tol)                                          \
    do {                                                                                           \
        double e_ = norm_err((got), (ref), (n), (floor_));                                         \
        if (!(e_ <= (tol)))                                                                        \
            printf("\n  %s (%s, n=%zu): error %.3g > %.3g\n", (what), (cfg), (size_t)(n), e_,    \
                   (double)(tol));                                                                 \
        CU_ASSERT(e_ <= (tol));                                                                    \
    } while (0)

#define CHECK_SAME_BITS(what, got, ref, n)                                                         \
    do {                                                                                           \
        int same_ = memcmp((got), (ref), (size_t)(n) * sizeof *(ref)) == 0;                       \
        if (!same_)                                                                                \
            printf("\n  %s (n=%zu): not bit-identical to the CPU\n", (what), (size_t)(n));        \
        CU_ASSERT(same_);                                                                          \
    } while (0)

#define OK(expr) CU_ASSERT_EQUAL_FATAL((expr), DT_OK)

static int suite_init(void)
{
    struct dt_backend_opts ref = {.threads = 1, .reference_kernels = 1};
    if (dt_backend_create("cpu", &ref, &cpu) != DT_OK) {
        fprintf(stderr, "test_gpu_ops: cpu backend: %s\n", dt_last_error());
        return -1;
    }
    cops = dt_backend_ops(cpu);
    for (int c = 0; c < NCFG; c++) {
        struct dt_backend_opts r = {.threads = 1, .reference_kernels = 1,
                                    .precision = cfgs[c].precision};
        if (dt_backend_create("cpu", &r, &cpu_ref[c]) != DT_OK) {
            fprintf(stderr, "test_gpu_ops: cpu backend (%s): %s\n", cfgs[c].name,
                    dt_last_error());
            return -1;
        }
    }
    for (int c = 0; c < NCFG; c++) {
        struct dt_backend_opts o = {.threads = 1, .device = 0,
                                    .allow_tf32 = cfgs[c].allow_tf32,
                                    .precision = cfgs[c].precision};
        if (dt_backend_create("cuda", &o, &gpu[c]) != DT_OK) {
            fprintf(stderr, "test_gpu_ops: cuda backend (%s): %s\n", cfgs[c].name,
                    dt_last_error());
            return -1;
        }
        gops[c] = dt_backend_ops(gpu[c]);
    }
    return 0;
}

static int suite_cleanup(void)
{
    for (int c = 0; c < NCFG; c++) {
        if (gpu[c])
            dt_backend_destroy(gpu[c]);
        gpu[c] = NULL;
        if (cpu_ref[c])
            dt_backend_destroy(cpu_ref[c]);
        cpu_ref[c] = NULL;
    }
    if (cpu)
        dt_backend_destroy(cpu);
    cpu = NULL;
    return 0;
}

/* ---- backend ---------------------------------------------------------- */

static void test_backend_basics(void)
{
    for (int c = 0; c < NCFG; c++) {
        CU_ASSERT_STRING_EQUAL(dt_backend_name(gpu[c]), "cuda");
        CU_ASSERT(strncmp(dt_backend_device(gpu[c]), "cuda:0", 6) == 0);
        CU_ASSERT_PTR_NOT_NULL(dt_backend_stream(gpu[c]));
        const struct dt_ops *o = gops[c];
        CU_ASSERT_FATAL(o != NULL);
        CU_ASSERT(o->linear_fwd && o->linear_bwd && o->bias_fwd && o->bias_bwd);
        CU_ASSERT(o->relu_fwd && o->relu_bwd && o->gelu_fwd && o->gelu_bwd);
        CU_ASSERT(o->tanh_fwd && o->tanh_bwd && o->dropout_fwd && o->dropout_bwd);
        CU_ASSERT(o->flatten_fwd && o->flatten_bwd && o->softmax_xent_fwd &&
                  o->softmax_xent_bwd);
        CU_ASSERT(o->sgd_update && o->adamw_update && o->sumsq && o->scale && o->fill &&
                  o->all_finite);
        CU_ASSERT(o->to_bf16 && o->from_bf16);
    }
    /* zeroed, aligned, and a round trip H2D, D2D, D2H */
    dt_backend_t *be = gpu[FP32];
    const size_t sizes[] = {1, 3, 1000, 1 << 20};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *a = dnew(be, n * sizeof(float)), *b = dnew(be, n * sizeof(float));
        CU_ASSERT_EQUAL((uintptr_t)a % 64, 0);
        float *h = hget(be, a, n);
        size_t nonzero = 0;
        for (size_t i = 0; i < n; i++)
            nonzero += h[i] != 0.0f;
        CU_ASSERT_EQUAL(nonzero, 0);
        float *src = hrand(n, -1, 1);
        up(be, a, src, n * sizeof(float));
        CU_ASSERT_EQUAL(dt_backend_copy(be, b, a, n * sizeof(float), DT_COPY_D2D), DT_OK);
        down(be, h, b, n * sizeof(float));
        CU_ASSERT_EQUAL(memcmp(h, src, n * sizeof(float)), 0);
        dt_backend_free(be, a);
        dt_backend_free(be, b);
        free(h), free(src);
    }
    dt_backend_free(be, NULL); /* no-op */
}

/* More than any device has: DT_ERR_NOMEM, a message with the free memory,
 * and a backend that still works afterwards. */
static void test_backend_oom(void)
{
    dt_backend_t *be = gpu[FP32];
    void *p = NULL;
    dt_clear_error();
    CU_ASSERT_EQUAL(dt_backend_alloc(be, (size_t)1 << 46, &p), DT_ERR_NOMEM);
    CU_ASSERT_PTR_NULL(p);
    if (!strstr(dt_last_error(), "free"))
        printf("\n  out-of-memory message: %s\n", dt_last_error());
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "free"));

    enum { N = 1000 };
    float *in = hrand(N, -1, 1), *ref = hnew(N);
    float *d = dput(be, in, N);
    OK(cops->relu_fwd(cpu, ref, in, N));
    OK(gops[FP32]->relu_fwd(be, d, d, N));
    float *got = hget(be, d, N);
    CHECK_SAME_BITS("relu after an out-of-memory", got, ref, N);
    dt_backend_free(be, d);
    free(in), free(ref), free(got);
}

/* ---- linear ----------------------------------------------------------- */

/* The four results of linear_case on the fp32 CPU reference, from inputs
 * in, w, dout and the old dw as given (all fp32): out, din, dw (+= old),
 * dw twice from zero. */
static void linear_ref(int B, int I, int O, const float *in, const float *w, const float *dout,
                       const float *old, float *res[4])
{
    dt_backend_t *ref = cpu_ref[FP32];
    const struct dt_ops *rops = dt_backend_ops(ref);
    memcpy(res[2], old, (size_t)O * I * sizeof *old);
    memset(res[3], 0, (size_t)O * I * sizeof *old);
    OK(rops->linear_fwd(ref, res[0], in, w, NULL, B, I, O, NULL));
    OK(rops->linear_bwd(ref, res[1], res[2], dout, in, w, B, I, O, NULL));
    OK(rops->linear_bwd(ref, NULL, res[3], dout, in, w, B, I, O, NULL));
    OK(rops->linear_bwd(ref, res[1], res[3], dout, in, w, B, I, O, NULL));
}

/* The TF32 GEMMs' four results gots (out, din, dw, dw2) against three CPU
 * references: inputs rounded to TF32, inputs truncated, and plain fp32
 * (fp32s, already computed). The old values of dw are added in fp32 by
 * cuBLAS (beta), so they are not reduced. Each result must match one of
 * them within TF32_TOL; which one is printed. */
static void linear_tf32_check(int B, int I, int O, const float *in, const float *w,
                              const float *dout, const float *old, const float *gots[4],
                              const float *fp32s[4])
{
    static const char *const names[4] = {"out", "din", "dw (+= old)", "dw (twice from 0)"};
    static const char *const how[3] = {"rounded", "truncated", "fp32, not reduced"};
    const size_t nin = (size_t)B * I, nw = (size_t)O * I, nout = (size_t)B * O;
    const size_t sizes[4] = {nout, nin, nw, nw};
    float *r_in = hnew(nin), *r_w = hnew(nw), *r_dout = hnew(nout);
    float *res[2][4];
    for (int m = 0; m < 2; m++) { /* 0: round to nearest even, 1: truncate */
        for (int k = 0; k < 4; k++)
            res[m][k] = hnew(sizes[k]);
        dt_test_tf32_reduce(r_in, in, nin, m == 0);
        dt_test_tf32_reduce(r_w, w, nw, m == 0);
        dt_test_tf32_reduce(r_dout, dout, nout, m == 0);
        linear_ref(B, I, O, r_in, r_w, r_dout, old, res[m]);
    }
    printf("\n  linear %dx%dx%d (tf32):", B, I, O);
    for (int k = 0; k < 4; k++) {
        const float *refs[3] = {res[0][k], res[1][k], fp32s[k]};
        double e[3];
        int best = 0;
        for (int m = 0; m < 3; m++) {
            e[m] = norm_err(gots[k], refs[m], sizes[k], TINY);
            if (e[m] < e[best]) best = m;
        }
        if (e[best] <= TF32_TOL)
            printf(" %s %s (%.2g)%s", names[k], how[best], e[best], k < 3 ? "," : "");
        else
            printf("\n  linear %dx%dx%d %s (tf32): matches no reference: error %.3g rounded, "
                   "%.3g truncated, %.3g fp32 > %.3g",
                   B, I, O, names[k], e[0], e[1], e[2], TF32_TOL);
        CU_ASSERT(e[best] <= TF32_TOL);
    }
    for (int m = 0; m < 2; m++)
        for (int k = 0; k < 4; k++)
            free(res[m][k]);
    free(r_in), free(r_w), free(r_dout);
}

/* out, din and dw (+= onto old values) against the CPU; then dw from zero
 * by two backward calls, one without din. TF32 against the TF32
 * references (linear_tf32_check). */
static void linear_case(int c, int B, int I, int O)
{
    dt_backend_t *g = gpu[c];
    const struct dt_ops *go = gops[c];
    const size_t nin = (size_t)B * I, nw = (size_t)O * I, nout = (size_t)B * O;
    float *in = hrand(nin, -1, 1), *w = hrand(nw, -1, 1), *dout = hrand(nout, -1, 1);
    float *old = hrand(nw, -1, 1), *nan_in = hconst(nin, NAN);
    float *out_c = hnew(nout), *din_c = hnew(nin), *dw_c = hnew(nw), *dw2_c = hnew(nw);
    dt_backend_t *ref = cpu_ref[c];
    const struct dt_ops *rops = dt_backend_ops(ref);
    memcpy(dw_c, old, nw * sizeof *old);
    OK(rops->linear_fwd(ref, out_c, in, w, NULL, B, I, O, NULL));
    OK(rops->linear_bwd(ref, din_c, dw_c, dout, in, w, B, I, O, NULL));
    OK(rops->linear_bwd(ref, NULL, dw2_c, dout, in, w, B, I, O, NULL));
    OK(rops->linear_bwd(ref, din_c, dw2_c, dout, in, w, B, I, O, NULL));

    float *d_in = dput(g, in, nin), *d_w = dput(g, w, nw), *d_dout = dput(g, dout, nout);
    float *d_out = dnew(g, nout * sizeof(float)), *d_din = dput(g, nan_in, nin);
    float *d_dw = dput(g, old, nw), *d_dw2 = dnew(g, nw * sizeof(float));
    OK(go->linear_fwd(g, d_out, d_in, d_w, NULL, B, I, O, NULL));
    OK(go->linear_bwd(g, d_din, d_dw, d_dout, d_in, d_w, B, I, O, NULL));
    OK(go->linear_bwd(g, NULL, d_dw2, d_dout, d_in, d_w, B, I, O, NULL));
    OK(go->linear_bwd(g, d_din, d_dw2, d_dout, d_in, d_w, B, I, O, NULL));
    float *out = hget(g, d_out, nout), *din = hget(g, d_din, nin);
    float *dw = hget(g, d_dw, nw), *dw2 = hget(g, d_dw2, nw);

    char what[96];
    const double tol = cfgs[c].tol;
    if (c == TF32) {
        const float *gots[4] = {out, din, dw, dw2}, *fp32s[4] = {out_c, din_c, dw_c, dw2_c};
        linear_tf32_check(B, I, O, in, w, dout, old, gots, fp32s);
        goto out;
    }
    snprintf(what, sizeof what, "linear %dx%dx%d out", B, I, O);
    CHECK_CLOSE(what, cfgs[c].name, out, out_c, nout, TINY, tol);
    snprintf(what, sizeof what, "linear %dx%dx%d din (written)", B, I, O);
    CHECK_CLOSE(what, cfgs[c].name, din, din_c, nin, TINY, tol);
    snprintf(what, sizeof what, "linear %dx%dx%d dw (+= old)", B, I, O);
    CHECK_CLOSE(what, cfgs[c].name, dw, dw_c, nw, TINY, tol);
    snprintf(what, sizeof what, "linear %dx%dx%d dw (twice from 0)", B, I, O);
    CHECK_CLOSE(what, cfgs[c].name, dw2, dw2_c, nw, TINY, tol);
    if (cfgs[c].precision != DT_F32) { /* it rounded: not the fp32 result */
        float *out32 = hnew(nout);
        OK(cops->linear_fwd(cpu, out32, in, w, NULL, B, I, O, NULL));
        double e32 = norm_err(out, out32, nout, TINY);
        if (!(e32 >= ROUNDED_MIN_DIFF))
            printf("\n  linear %dx%dx%d (%s) is within %.3g of fp32: operands not rounded\n", B,
                   I, O, cfgs[c].name, e32);
        CU_ASSERT(e32 >= ROUNDED_MIN_DIFF);
        free(out32);
    }

out:
    dt_backend_free(g, d_in), dt_backend_free(g, d_w), dt_backend_free(g, d_dout);
    dt_backend_free(g, d_out), dt_backend_free(g, d_din);
    dt_backend_free(g, d_dw), dt_backend_free(g, d_dw2);
    free(in), free(w), free(dout), free(old), free(nan_in);
    free(out_c), free(din_c), free(dw_c), free(dw2_c);
    free(out), free(din), free(dw), free(dw2);
}

static void test_linear_vs_cpu(void)
{
    const int shapes[][3] = {{1, 1, 1}, {3, 7, 5}, {37, 129, 65}, {64, 256, 128}, {128, 784, 10}};
    for (int c = 0; c < NCFG; c++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            linear_case(c, shapes[s][0], shapes[s][1], shapes[s][2]);
}

/* Empty sums: I == 0 gives out = 0, O == 0 gives din = 0; B == 0 adds
 * nothing to dw. */
static void test_linear_empty(void)
{
    for (int c = 0; c < NCFG; c++) {
        dt_backend_t *g = gpu[c];
        const struct dt_ops *go = gops[c];
        float nan6[6], seven[6], x[6] = {1, 2, 3, 4, 5, 6}, h[6];
        fill_value(nan6, 6, NAN);
        fill_value(seven, 6, 7.0f);
        float *dx = dput(g, x, 6), *dout = dput(g, nan6, 6);
        OK(go->linear_fwd(g, dout, dx, dx, NULL, 2, 0, 3, NULL));
        down(g, h, dout, sizeof h);
        int bad = 0;
        for (int i = 0; i < 6; i++)
            bad += h[i] != 0.0f;
        CU_ASSERT_EQUAL(bad, 0);

        float *din = dput(g, nan6, 6), *dw = dput(g, seven, 6);
        OK(go->linear_bwd(g, din, dw, dx, dx, dx, 2, 3, 0, NULL));
        down(g, h, din, sizeof h);
        bad = 0;
        for (int i = 0; i < 6; i++)
            bad += h[i] != 0.0f;
        CU_ASSERT_EQUAL(bad, 0);
        OK(go->linear_bwd(g, din, dw, dx, dx, dx, 0, 3, 2, NULL));
        down(g, h, dw, sizeof h);
        CU_ASSERT_EQUAL(memcmp(h, seven, sizeof h), 0);
        dt_backend_free(g, dx), dt_backend_free(g, dout);
        dt_backend_free(g, din), dt_backend_free(g, dw);
    }
}

/* x += b in place; db += (twice) */
static void test_bias_vs_cpu(void)
{
    const int shapes[][2] = {{1, 1}, {37, 65}, {129, 1000}, {3, 4097}};
    dt_backend_t *g = gpu[FP32];
    const struct dt_ops *go = gops[FP32];
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], C = shapes[s][1];
        size_t n = (size_t)B * C;
        float *x = hrand(n, -1, 1), *b = hrand(C, -1, 1), *dout = hrand(n, -1, 1);
        float *db_c = hrand(C, -1, 1);
        float *d_x = dput(g, x, n), *d_b = dput(g, b, C), *d_dout = dput(g, dout, n);
        float *d_db = dput(g, db_c, C);
        OK(cops->bias_fwd(cpu, x, b, B, C));
        OK(cops->bias_bwd(cpu, db_c, dout, B, C));
        OK(cops->bias_bwd(cpu, db_c, dout, B, C));
        OK(go->bias_fwd(g, d_x, d_b, B, C));
        OK(go->bias_bwd(g, d_db, d_dout, B, C));
        OK(go->bias_bwd(g, d_db, d_dout, B, C));
        float *xg = hget(g, d_x, n), *dbg = hget(g, d_db, C);
        char what[64];
        snprintf(what, sizeof what, "bias_fwd %dx%d", B, C);
        CHECK_CLOSE(what, "fp32", xg, x, n, TINY, ELEM_TOL);
        snprintf(what, sizeof what, "bias_bwd %dx%d (+= twice)", B, C);
        CHECK_CLOSE(what, "fp32", dbg, db_c, (size_t)C, TINY, ELEM_TOL);
        dt_backend_free(g, d_x), dt_backend_free(g, d_b);
        dt_backend_free(g, d_dout), dt_backend_free(g, d_db);
        free(x), free(b), free(dout), free(db_c), free(xg), free(dbg);
    }
}

/* ---- activations ------------------------------------------------------ */

/* Forward and backward (din written over 1e30), separate buffers and in
 * place, against the CPU. The backward gets the CPU's x (input, or output
 * for tanh) so it is checked on its own. */
static void act_case(int a, size_t n)
{
    dt_backend_t *g = gpu[FP32];
    const struct dt_ops *go = gops[FP32];
    float *in = hrand(n, -4, 4), *dout = hrand(n, -1, 1);
    if (n >= 3)
        in[n / 2] = NAN; /* passes through (relu: din 0) */
    float *out_c = hnew(n), *din_c = hnew(n), *big = hconst(n, 1e30f);
    OK(dt_test_act_fwd(cops, cpu, a, out_c, in, n));
    const float *x = dt_test_act_takes_output(a) ? out_c : in;
    OK(dt_test_act_bwd(cops, cpu, a, din_c, dout, in, out_c, n));

    float *d_in = dput(g, in, n), *d_out = dnew(g, n * sizeof(float));
    float *d_x = dput(g, x, n), *d_dout = dput(g, dout, n), *d_din = dput(g, big, n);
    OK(dt_test_act_fwd(go, g, a, d_out, d_in, n));
    OK(dt_test_act_bwd(go, g, a, d_din, d_dout, d_x, d_x, n));
    float *out = hget(g, d_out, n), *din = hget(g, d_din, n);
    char what[64];
    snprintf(what, sizeof what, "%s_fwd", dt_test_act_name(a));
    CHECK_CLOSE(what, "fp32", out, out_c, n, ACT_FLOOR, ELEM_TOL);
    snprintf(what, sizeof what, "%s_bwd", dt_test_act_name(a));
    CHECK_CLOSE(what, "fp32", din, din_c, n, ACT_FLOOR, ELEM_TOL);
    if (n >= 3 && a == DT_TEST_ACT_relu) CU_ASSERT(isnan(out[n / 2]));

    /* in place: out == in, din == dout */
    OK(dt_test_act_fwd(go, g, a, d_in, d_in, n));
    OK(dt_test_act_bwd(go, g, a, d_dout, d_dout, d_x, d_x, n));
    down(g, out, d_in, n * sizeof(float));
    down(g, din, d_dout, n * sizeof(float));
    snprintf(what, sizeof what, "%s_fwd in place", dt_test_act_name(a));
    CHECK_CLOSE(what, "fp32", out, out_c, n, ACT_FLOOR, ELEM_TOL);
    snprintf(what, sizeof what, "%s_bwd in place", dt_test_act_name(a));
    CHECK_CLOSE(what, "fp32", din, din_c, n, ACT_FLOOR, ELEM_TOL);

    /* the forward that keeps its gradient over its input, and the
     * backward as dout times that */
    float *d_kept = dput(g, in, n), *d_dy = dput(g, dout, n);
    OK(dt_test_act_keep(go, g, a, d_out, d_kept, n));
    OK(go->mul(g, d_din, d_dy, d_kept, n));
    down(g, out, d_out, n * sizeof(float));
    down(g, din, d_din, n * sizeof(float));
    snprintf(what, sizeof what, "%s_fwd_keep", dt_test_act_name(a));
    CHECK_CLOSE(what, "fp32", out, out_c, n, ACT_FLOOR, ELEM_TOL);
    snprintf(what, sizeof what, "%s_fwd_keep, mul", dt_test_act_name(a));
    CHECK_CLOSE(what, "fp32", din, din_c, n, ACT_FLOOR, ELEM_TOL);
    dt_backend_free(g, d_kept), dt_backend_free(g, d_dy);

    dt_backend_free(g, d_in), dt_backend_free(g, d_out), dt_backend_free(g, d_x);
    dt_backend_free(g, d_dout), dt_backend_free(g, d_din);
    free(in), free(dout), free(out_c), free(din_c), free(big), free(out), free(din);
}

static void test_activations_vs_cpu(void)
{
    const size_t sizes[] = {1, 3, 1021, 4099, BIG_N};
    for (int a = 0; a < DT_TEST_NACT; a++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            act_case(a, sizes[s]);
}

/* Exact values: relu is max(x, 0) with NaN through, its gradient passes
 * nothing at 0; GELU and tanh match torch (double) closely. */
static void test_activation_values(void)
{
    const float x[] = {-2.0f, -1.0f, 0.0f, 0.5f, 1.0f, 3.0f, NAN};
    enum { N = sizeof x / sizeof x[0] };
    const double gelu[] = {-0.04550026389635842, -0.15865525393145707, 0.0, 0.34573123063700656,
                           0.8413447460685429, 2.99595030590511};
    dt_backend_t *g = gpu[FP32];
    const struct dt_ops *go = gops[FP32];
    float ones[N], out[N];
    fill_value(ones, N, 1.0f);
    float *dx = dput(g, x, N), *d1 = dput(g, ones, N), *dy = dnew(g, sizeof out);
    OK(go->relu_fwd(g, dy, dx, N));
    down(g, out, dy, sizeof out);
    CU_ASSERT(out[0] == 0.0f && out[1] == 0.0f && out[2] == 0.0f && out[3] == 0.5f &&
              out[5] == 3.0f);
    CU_ASSERT(isnan(out[6]));
    OK(go->relu_bwd(g, dy, d1, dx, N));
    down(g, out, dy, sizeof out);
    CU_ASSERT(out[0] == 0.0f && out[2] == 0.0f && out[3] == 1.0f && out[5] == 1.0f);
    OK(go->gelu_fwd(g, dy, dx, N));
    down(g, out, dy, sizeof out);
    for (int i = 0; i < N - 1; i++)
        CU_ASSERT(fabs(out[i] - gelu[i]) < 1e-6);
    OK(go->tanh_fwd(g, dy, dx, N));
    down(g, out, dy, sizeof out);
    for (int i = 0; i < N - 1; i++)
        CU_ASSERT(fabs(out[i] - tanh(x[i])) < 1e-6);
    dt_backend_free(g, dx), dt_backend_free(g, d1), dt_backend_free(g, dy);
}

/* ---- dropout ---------------------------------------------------------- */

static const struct dt_rng_key drop_key = {
    .seed = 2024, .purpose = DT_RNG_DROPOUT, .stream = 3, .step = 17};

/* Forward and backward bit for bit against the CPU, in place too, and
 * the block in two calls (row0, row0 + k) equal to one. */
static void dropout_case(int rows, int cols, uint64_t row0, float p)
{
    dt_backend_t *g = gpu[FP32];
    const struct dt_ops *go = gops[FP32];
    const size_t n = (size_t)rows * cols;
    float *in = hrand(n, 0.5f, 1.5f), *dout = hrand(n, 0.5f, 1.5f); /* never 0 */
    float *out_c = hnew(n), *din_c = hnew(n), *nan_n = hconst(n, NAN);
    OK(cops->dropout_fwd(cpu, out_c, in, rows, cols, p, &drop_key, row0));
    OK(cops->dropout_bwd(cpu, din_c, dout, rows, cols, p, &drop_key, row0));

    float *d_in = dput(g, in, n), *d_dout = dput(g, dout, n);
    float *d_out = dput(g, nan_n, n), *d_din = dput(g, nan_n, n);
    OK(go->dropout_fwd(g, d_out, d_in, rows, cols, p, &drop_key, row0));
    OK(go->dropout_bwd(g, d_din, d_dout, rows, cols, p, &drop_key, row0));
    float *out = hget(g, d_out, n), *din = hget(g, d_din, n);
    size_t zeros_differ = 0;
    for (size_t i = 0; i < n; i++)
        zeros_differ += (out[i] == 0.0f) != (out_c[i] == 0.0f);
    CU_ASSERT_EQUAL(zeros_differ, 0);
    char what[96];
    snprintf(what, sizeof what, "dropout_fwd %dx%d row0=%llu p=%g", rows, cols,
             (unsigned long long)row0, (double)p);
    CHECK_SAME_BITS(what, out, out_c, n);
    snprintf(what, sizeof what, "dropout_bwd %dx%d row0=%llu p=%g", rows, cols,
             (unsigned long long)row0, (double)p);
    CHECK_SAME_BITS(what, din, din_c, n);

    /* in place */
    OK(go->dropout_fwd(g, d_in, d_in, rows, cols, p, &drop_key, row0));
    down(g, out, d_in, n * sizeof(float));
    CHECK_SAME_BITS("dropout_fwd in place", out, out_c, n);

    /* rows [0, k) and [k, rows) in two calls */
    if (rows >= 2) {
        int k = rows / 2 + 1;
        size_t nk = (size_t)k * cols;
        up(g, d_out, nan_n, n * sizeof(float));
        OK(go->dropout_bwd(g, d_out, d_dout, k, cols, p, &drop_key, row0));
        OK(go->dropout_bwd(g, d_out + nk, d_dout + nk, rows - k, cols, p, &drop_key,
                           row0 + (uint64_t)k));
        down(g, din, d_out, n * sizeof(float));
        CHECK_SAME_BITS("dropout_bwd in two calls", din, din_c, n);
    }
    dt_backend_free(g, d_in), dt_backend_free(g, d_dout);
    dt_backend_free(g, d_out), dt_backend_free(g, d_din);
    free(in), free(dout), free(out_c), free(din_c), free(nan_n), free(out), free(din);
}

static void test_dropout_bitwise(void)
{
    const struct {
        int rows, cols;
        uint64_t row0;
    } cases[] = {
        {37, 129, 5},
        {1, 3, 0},
        {5, 7, 2},                   /* Philox blocks straddle rows */
        {7, 13, (1ull << 33) + 1},   /* element indices past 2^32 (x 13) */
        {3, 1, 1ull << 40},          /* block index past 2^32 */
        {2048, 2051, 7},             /* more Philox blocks than one grid */
    };
    const float ps[] = {0.1f, 0.5f, 0.9f};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t j = 0; j < sizeof ps / sizeof ps[0]; j++)
            dropout_case(cases[c].rows, cases[c].cols, cases[c].row0, ps[j]);
}

/* p == 0 copies (the key may be NULL), in place it changes nothing. */
static void test_dropout_p0(void)
{
    enum { ROWS = 3, COLS = 1021, N = ROWS * COLS };
    dt_backend_t *g = gpu[FP32];
    const struct dt_ops *go = gops[FP32];
    float *in = hrand(N, -1, 1), *nan_n = hconst(N, NAN);
    float *d_in = dput(g, in, N), *d_out = dput(g, nan_n, N);
    OK(go->dropout_fwd(g, d_out, d_in, ROWS, COLS, 0.0f, NULL, 9));
    float *out = hget(g, d_out, N);
    CHECK_SAME_BITS("dropout_fwd p=0", out, in, N);
    up(g, d_out, nan_n, N * sizeof(float));
    OK(go->dropout_bwd(g, d_out, d_in, ROWS, COLS, 0.0f, &drop_key, 9));
    down(g, out, d_out, N * sizeof(float));
    CHECK_SAME_BITS("dropout_bwd p=0", out, in, N);
    OK(go->dropout_fwd(g, d_in, d_in, ROWS, COLS, 0.0f, NULL, 0));
    down(g, out, d_in, N * sizeof(float));
    CHECK_SAME_BITS("dropout_fwd p=0 in place", out, in, N);
    OK(go->dropout_fwd(g, d_out, d_in, 0, COLS, 0.5f, &drop_key, 0)); /* empty */
    dt_backend_free(g, d_in), dt_backend_free(g, d_out);
    free(in), free(nan_n), free(out);
}

/* ---- flatten ---------------------------------------------------------- */

static void test_flatten(void)
{
    const size_t sizes[] = {1, 1021, BIG_N};
    dt_backend_t *g = gpu[FP32];
    const struct dt_ops *go = gops[FP32];
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *in = hrand(n, -1, 1), *dout = hrand(n, -1, 1), *nan_n = hconst(n, NAN);
        float *d_in = dput(g, in, n), *d_dout = dput(g, dout, n);
        float *d_out = dput(g, nan_n, n), *d_din = dput(g, nan_n, n);
        OK(go->flatten_fwd(g, d_out, d_in, n));
        OK(go->flatten_bwd(g, d_din, d_dout, n));
        OK(go->flatten_fwd(g, d_in, d_in, n)); /* in place: nothing to do */
        float *out = hget(g, d_out, n), *din = hget(g, d_din, n), *same = hget(g, d_in, n);
        CHECK_SAME_BITS("flatten_fwd", out, in, n);
        CHECK_SAME_BITS("flatten_bwd", din, dout, n);
        CHECK_SAME_BITS("flatten_fwd in place", same, in, n);
        dt_backend_free(g, d_in), dt_backend_free(g, d_dout);
        dt_backend_free(g, d_out), dt_backend_free(g, d_din);
        free(in), free(dout), free(nan_n), free(out), free(din), free(same);
    }
}

/* ---- softmax cross-entropy -------------------------------------------- */

static int32_t *random_labels(int B, int C)
{
    int32_t *l = calloc((size_t)B, sizeof *l);
    CU_ASSERT_PTR_NOT_NULL_FATAL(l);
    struct dt_rng_key key = {.seed = 5, .purpose = DT_RNG_TEST, .stream = 12};
    for (int b = 0; b < B; b++)
        l[b] = (int32_t)dt_rng_below(&key, draws++, (uint64_t)C);
    return l;
}

static int32_t *dlabels(dt_backend_t *be, const int32_t *l, int B)
{
    int32_t *d = dnew(be, (size_t)B * sizeof *d);
    up(be, d, l, (size_t)B * sizeof *d);
    return d;
}

/* Forward (loss and count added to old totals, probs), the same bits on a
 * second run, and backward against the CPU. Rows 0 and 1 hold ties. */
static void xent_case(int B, int C)
{
    dt_backend_t *g = gpu[FP32];
    const struct dt_ops *go = gops[FP32];
    const size_t n = (size_t)B * C;
    float *logits = hrand(n, -8, 8), *nan_n = hconst(n, NAN);
    int32_t *labels = random_labels(B, C);
    if (C >= 3) {
        logits[1] = logits[2] = 20.0f; /* row 0: tie at 1 and 2, label 1: a hit */
        labels[0] = 1;
        if (B >= 2) { /* row 1: tie at 0 and C-1, label C-1: a miss */
            logits[C] = logits[2 * (size_t)C - 1] = 20.0f;
            labels[1] = C - 1;
        }
    }
    float *probs_c = hnew(n), *d_c = hnew(n);
    double loss_c = 100.0;
    int64_t hits_c = 7;
    OK(cops->softmax_xent_fwd(cpu, probs_c, logits, labels, B, C, 1, &loss_c, &hits_c));
    OK(cops->softmax_xent_bwd(cpu, d_c, probs_c, labels, B, C, 1.0f / B));

    float *d_logits = dput(g, logits, n), *d_probs = dput(g, nan_n, n);
    float *d_d = dput(g, nan_n, n), *d_pc = dput(g, probs_c, n);
    int32_t *d_labels = dlabels(g, labels, B);
    double loss = 100.0, loss2 = 100.0;
    int64_t hits = 7, hits2 = 7;
    OK(go->softmax_xent_fwd(g, d_probs, d_logits, d_labels, B, C, 1, &loss, &hits));
    float *probs = hget(g, d_probs, n);
    OK(go->softmax_xent_fwd(g, d_probs, d_logits, d_labels, B, C, 1, &loss2, &hits2));
    float *probs2 = hget(g, d_probs, n);
    OK(go->softmax_xent_bwd(g, d_d, d_pc, d_labels, B, C, 1.0f / B));
    float *dl = hget(g, d_d, n);

    char what[64];
    snprintf(what, sizeof what, "softmax_xent_fwd %dx%d probs", B, C);
    CHECK_CLOSE(what, "fp32", probs, probs_c, n, TINY, ELEM_TOL);
    double e = cu_rel_diff(loss - 100.0, loss_c - 100.0, 1.0);
    if (!(e < ELEM_TOL) || hits != hits_c)
        printf("\n  softmax_xent_fwd %dx%d: loss %.17g vs %.17g, correct %lld vs %lld\n", B, C,
               loss, loss_c, (long long)hits, (long long)hits_c);
    CU_ASSERT(e < ELEM_TOL);
    CU_ASSERT_EQUAL(hits, hits_c);
    CU_ASSERT_EQUAL(memcmp(&loss, &loss2, sizeof loss), 0); /* same bits every run */
    CU_ASSERT_EQUAL(hits2, hits);
    CU_ASSERT_EQUAL(memcmp(probs, probs2, n * sizeof *probs), 0);
    snprintf(what, sizeof what, "softmax_xent_bwd %dx%d", B, C);
    CHECK_CLOSE(what, "fp32", dl, d_c, n, TINY, ELEM_TOL);

    dt_backend_free(g, d_logits), dt_backend_free(g, d_probs), dt_backend_free(g, d_d);
    dt_backend_free(g, d_pc), dt_backend_free(g, d_labels);
    free(logits), free(nan_n), free(labels), free(probs_c), free(d_c);
    free(probs), free(probs2), free(dl);
}

static void test_xent_vs_cpu(void)
{
    /* C above the block size, B above the grid */
    const int shapes[][2] = {{1, 1},   {3, 2},    {37, 65},  {128, 10},
                             {5, 1001}, {7, 4097}, {5000, 10}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        xent_case(shapes[s][0], shapes[s][1]);
}

static void test_xent_stable(void)
{
    enum { B = 3, C = 4 };
    const float logits[B * C] = {1e4f,  1e4f - 1.0f, -1e4f, 0.0f,
                                 -1e4f, -1e4f,       -1e4f, -1e4f + 2.0f,
                                 3e4f,  -3e4f,       0.0f,  1.0f};
    const int32_t labels[B] = {1, 3, 1};
    dt_backend_t *g = gpu[FP32];
    const struct dt_ops *go = gops[FP32];
    float probs_c[B * C], probs[B * C], d[B * C];
    double loss_c = 0.0, loss = 0.0;
    int64_t hits_c = 0, hits = 0;
    OK(cops->softmax_xent_fwd(cpu, probs_c, logits, labels, B, C, 1, &loss_c, &hits_c));
    float *d_logits = dput(g, logits, B * C), *d_probs = dnew(g, sizeof probs);
    float *d_d = dnew(g, sizeof d);
    int32_t *d_labels = dlabels(g, labels, B);
    OK(go->softmax_xent_fwd(g, d_probs, d_logits, d_labels, B, C, 1, &loss, &hits));
    OK(go->softmax_xent_bwd(g, d_d, d_probs, d_labels, B, C, 1.0f));
    down(g, probs, d_probs, sizeof probs);
    down(g, d, d_d, sizeof d);
    CU_ASSERT(isfinite(loss));
    CU_ASSERT(fabs(loss - loss_c) < 1e-3);
    CU_ASSERT_EQUAL(hits, hits_c);
    CHECK_CLOSE("softmax_xent_fwd extreme logits", "fp32", probs, probs_c, B * C, TINY,
                ELEM_TOL);
    int nans = 0;
    for (int i = 0; i < B * C; i++)
        nans += isnan(d[i]);
    CU_ASSERT_EQUAL(nans, 0);
    dt_backend_free(g, d_logits), dt_backend_free(g, d_probs), dt_backend_free(g, d_d);
    dt_backend_free(g, d_labels);
}

/* dt_backend_reserve at build time: a bf16 linear_bwd and a bias_bwd whose
 * scratch (rounded operands, column partials) is larger than the first
 * grain wait for the device to grow it on a new backend, and do not once
 * their shapes were reserved. */
static void scratch_case(int reserve)
{
    enum { B = 2, IN = 1024, OUT = 1024, ROWS = 4, COLS = 500000 }; /* 2.1 and 4 MB */
    dt_backend_t *g = NULL;
    struct dt_backend_opts o = {.threads = 1, .device = 0, .precision = DT_BF16};
    OK(dt_backend_create("cuda", &o, &g));
    const struct dt_ops *go = dt_backend_ops(g);
    float *x = hrand((size_t)B * IN, -1, 1), *w = hrand((size_t)OUT * IN, -1, 1);
    float *dy = hrand((size_t)B * OUT, -1, 1), *a = hrand((size_t)ROWS * COLS, -1, 1);
    float *d_x = dput(g, x, (size_t)B * IN), *d_w = dput(g, w, (size_t)OUT * IN);
    float *d_dy = dput(g, dy, (size_t)B * OUT), *d_a = dput(g, a, (size_t)ROWS * COLS);
    float *d_dx = dnew(g, (size_t)B * IN * sizeof(float));
    float *d_dw = dnew(g, (size_t)OUT * IN * sizeof(float));
    float *d_db = dnew(g, (size_t)COLS * sizeof(float));
    OK(dt_backend_sync(g));
    struct dt_backend_waits w0, w1;
    if (reserve) /* each op's own reservation, so neither covers the other */
        OK(dt_backend_reserve(g, DT_OP_linear_bwd, B, IN, OUT));
    dt_backend_waits(g, &w0);
    OK(go->linear_bwd(g, d_dx, d_dw, d_dy, d_x, d_w, B, IN, OUT, NULL));
    dt_backend_waits(g, &w1);
    CU_ASSERT_EQUAL(w1.count - w0.count, reserve ? 0u : 1u);
    if (reserve) OK(dt_backend_reserve(g, DT_OP_bias_bwd, ROWS, COLS, 0));
    dt_backend_waits(g, &w1);
    OK(go->bias_bwd(g, d_db, d_a, ROWS, COLS));
    dt_backend_waits(g, &w0);
    CU_ASSERT_EQUAL(w0.count - w1.count, reserve ? 0u : 1u);
    OK(dt_backend_sync(g));
    CU_ASSERT_EQUAL(dt_backend_reserve(g, DT_OP_bias_bwd, -1, 1, 0), DT_ERR_INVALID_ARG);
    dt_backend_free(g, d_x), dt_backend_free(g, d_w), dt_backend_free(g, d_dy);
    dt_backend_free(g, d_a), dt_backend_free(g, d_dx), dt_backend_free(g, d_dw);
    dt_backend_free(g, d_db);
    dt_backend_destroy(g);
    free(x), free(w), free(dy), free(a);
}

static void test_scratch_reserved(void)
{
    scratch_case(0); /* the growth this guards against happens */
    scratch_case(1);
}

/* Bad labels: DT_ERR_INVALID_ARG naming the op, the first bad row and its
 * label, from the next wait for the device (the forward itself only
 * queues); nothing added; the next call works. Forwards in a row share
 * one wait and add up as on the cpu. */
static void test_xent_invalid_label(void)
{
    enum { B = 8, C = 5 };
    dt_backend_t *g = gpu[FP32];
    const struct dt_ops *go = gops[FP32];
    float *logits = hrand(B * C, -2, 2);
    int32_t labels[B] = {0, 1, 2, 5, 4, 3, -1, 0};
    float *d_logits = dput(g, logits, B * C), *d_probs = dnew(g, B * C * sizeof(float));
    int32_t *d_labels = dlabels(g, labels, B);
    double loss = 1.5;
    int64_t hits = 3;
    dt_clear_error();
    struct dt_backend_waits w0, w1;
    dt_backend_waits(g, &w0);
    OK(go->softmax_xent_fwd(g, d_probs, d_logits, d_labels, B, C, 1, &loss, &hits));
    dt_backend_waits(g, &w1);
    CU_ASSERT_EQUAL(w1.count, w0.count); /* queued, not waited for */
    CU_ASSERT(loss == 1.5 && hits == 3);
    CU_ASSERT_EQUAL(dt_backend_sync(g), DT_ERR_INVALID_ARG);
    const char *msg = dt_last_error();
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, "softmax_xent_fwd"));
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, "label 5 of row 3"));
    CU_ASSERT(loss == 1.5 && hits == 3);

    labels[3] = 4, labels[6] = 0;
    up(g, d_labels, labels, sizeof labels);
    double loss_c = 0.0;
    int64_t hits_c = 0;
    float *probs_c = hnew(B * C);
    OK(cops->softmax_xent_fwd(cpu, probs_c, logits, labels, B, C, 1, &loss_c, &hits_c));
    loss = 0.0, hits = 0;
    OK(go->softmax_xent_fwd(g, d_probs, d_logits, d_labels, B, C, 1, &loss, &hits));
    OK(dt_backend_sync(g));
    CU_ASSERT(cu_rel_diff(loss, loss_c, 1.0) < ELEM_TOL);
    CU_ASSERT_EQUAL(hits, hits_c);
    /* three forwards, one wait: the totals add up as three cpu calls do */
    OK(cops->softmax_xent_fwd(cpu, probs_c, logits, labels, B, C, 1, &loss_c, &hits_c));
    OK(cops->softmax_xent_fwd(cpu, probs_c, logits, labels, B, C, 1, &loss_c, &hits_c));
    const double loss1 = loss;
    const int64_t hits1 = hits;
    for (int k = 0; k < 2; k++)
        OK(go->softmax_xent_fwd(g, d_probs, d_logits, d_labels, B, C, 1, &loss, &hits));
    CU_ASSERT(loss == loss1 && hits == hits1); /* not before the wait */
    dt_backend_waits(g, &w0);
    OK(dt_backend_sync(g));
    dt_backend_waits(g, &w1);
    CU_ASSERT_EQUAL(w1.count, w0.count + 1);
    CU_ASSERT(cu_rel_diff(loss, loss_c, 1.0) < ELEM_TOL);
    CU_ASSERT_EQUAL(hits, hits_c);
    dt_backend_free(g, d_logits), dt_backend_free(g, d_probs), dt_backend_free(g, d_labels);
    free(logits), free(probs_c);
}

/* ---- optimizers ------------------------------------------------------- */

static void sgd_case(const struct dt_sgd_args *cfg, size_t n, int steps)
{
    dt_backend_t *g = gpu[FP32];
    const struct dt_ops *go = gops[FP32];
    const int mom = cfg->momentum != 0.0f;
    float *p_c = hrand(n, -1, 1), *buf_c = hconst(n, NAN); /* holds nothing yet */
    float *d_p = dput(g, p_c, n), *d_buf = dput(g, buf_c, n), *d_g = dnew(g, n * sizeof(float));
    for (int t = 0; t < steps; t++) {
        struct dt_sgd_args a = *cfg;
        a.first_step = t == 0;
        float *grad = hrand(n, -1, 1);
        up(g, d_g, grad, n * sizeof(float));
        OK(cops->sgd_update(cpu, p_c, grad, mom ? buf_c : NULL, n, &a));
        OK(go->sgd_update(g, d_p, d_g, mom ? d_buf : NULL, n, &a));
        CU_ASSERT_EQUAL_FATAL(dt_backend_sync(g), DT_OK); /* before grad is freed */
        free(grad);
    }
    float *p = hget(g, d_p, n), *buf = hget(g, d_buf, n);
    char what[96];
    snprintf(what, sizeof what, "sgd_update p (momentum %g, nesterov %d)",
             (double)cfg->momentum, cfg->nesterov);
    CHECK_CLOSE(what, "fp32", p, p_c, n, TINY, ELEM_TOL);
    if (mom) {
        snprintf(what, sizeof what, "sgd_update buf (momentum %g, nesterov %d)",
                 (double)cfg->momentum, cfg->nesterov);
        CHECK_CLOSE(what, "fp32", buf, buf_c, n, TINY, ELEM_TOL);
    }
    dt_backend_free(g, d_p), dt_backend_free(g, d_buf), dt_backend_free(g, d_g);
    free(p_c), free(buf_c), free(p), free(buf);
}

static void test_sgd_vs_cpu(void)
{
    const struct dt_sgd_args cfg[] = {
        {.lr = 0.1f},
        {.lr = 0.05f, .weight_decay = 1e-2f},
        {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-2f},
        {.lr = 0.05f, .momentum = 0.8f, .weight_decay = 1e-3f, .nesterov = 1},
    };
    const size_t sizes[] = {3, 1037, BIG_N};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            sgd_case(&cfg[c], sizes[s], 5);
}

static void adamw_case(const struct dt_adamw_args *cfg, size_t n, int steps)
{
    dt_backend_t *g = gpu[FP32];
    const struct dt_ops *go = gops[FP32];
    float *p_c = hrand(n, -1, 1), *m_c = hnew(n), *v_c = hnew(n);
    float *d_p = dput(g, p_c, n), *d_m = dput(g, m_c, n), *d_v = dput(g, v_c, n);
    float *d_g = dnew(g, n * sizeof(float));
    for (int t = 1; t <= steps; t++) {
        struct dt_adamw_args a = *cfg;
        a.t = t;
        float *grad = hrand(n, -1, 1);
        up(g, d_g, grad, n * sizeof(float));
        OK(cops->adamw_update(cpu, p_c, grad, m_c, v_c, n, &a));
        OK(go->adamw_update(g, d_p, d_g, d_m, d_v, n, &a));
        CU_ASSERT_EQUAL_FATAL(dt_backend_sync(g), DT_OK);
        free(grad);
    }
    float *p = hget(g, d_p, n), *m = hget(g, d_m, n), *v = hget(g, d_v, n);
    char what[64];
    snprintf(what, sizeof what, "adamw_update p (wd %g)", (double)cfg->weight_decay);
    CHECK_CLOSE(what, "fp32", p, p_c, n, TINY, ELEM_TOL);
    snprintf(what, sizeof what, "adamw_update m (wd %g)", (double)cfg->weight_decay);
    CHECK_CLOSE(what, "fp32", m, m_c, n, TINY, ELEM_TOL);
    snprintf(what, sizeof what, "adamw_update v (wd %g)", (double)cfg->weight_decay);
    CHECK_CLOSE(what, "fp32", v, v_c, n, TINY, ELEM_TOL);
    dt_backend_free(g, d_p), dt_backend_free(g, d_m), dt_backend_free(g, d_v);
    dt_backend_free(g, d_g);
    free(p_c), free(m_c), free(v_c), free(p), free(m), free(v);
}

static void test_adamw_vs_cpu(void)
{
    const struct dt_adamw_args cfg[] = {
        {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 1e-2f},
        {.lr = 1e-2f, .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-6f, .weight_decay = 0.0f},
    };
    const size_t sizes[] = {3, 1037, BIG_N};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            adamw_case(&cfg[c], sizes[s], 6);
}

/* args' clear: the updates zero the device's gradients as they read them
 * and give the CPU's parameters; a gated update the gate skipped (a NaN
 * gradient) changes nothing and still zeroes every gradient. */
static int all_zero(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (x[i] != 0.0f || signbit(x[i])) return 0;
    return 1;
}

static void test_optim_clear_vs_cpu(void)
{
    dt_backend_t *g = gpu[FP32];
    const struct dt_ops *go = gops[FP32];
    const size_t sizes[] = {3, 1037, BIG_N};
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
        size_t n = sizes[z];
        for (int adam = 0; adam < 2; adam++)
            for (int skip = 0; skip < 2; skip++) {
                float *grad = hrand(n, -1, 1), *p_c = hrand(n, -1, 1), *m_c = hconst(n, 0);
                float *v_c = hconst(n, 0), *p0 = hnew(n);
                memcpy(p0, p_c, n * sizeof *p0);
                if (skip) grad[n / 2] = NAN;
                float *d_g = dput(g, grad, n), *d_p = dput(g, p_c, n), *d_m = dput(g, m_c, n);
                float *d_v = dput(g, v_c, n);
                size_t lo = 0, hi = n;
                struct dt_gate_args ga = {.lo = &lo, .hi = &hi, .count = 1, .decide = 1,
                                          .unscale = 1.0f};
                struct dt_gate ref, got;
                OK(cops->step_gate(cpu, grad, &ga, &ref));
                OK(go->step_gate(g, d_g, &ga, &got));
                struct dt_sgd_args sa = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-2f,
                                         .first_step = 1, .gated = 1};
                struct dt_adamw_args aa = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f,
                                           .eps = 1e-8f, .weight_decay = 1e-2f, .t = 1,
                                           .gated = 1};
                if (adam) {
                    OK(cops->adamw_update(cpu, p_c, grad, m_c, v_c, n, &aa));
                    aa.clear = d_g;
                    OK(go->adamw_update(g, d_p, d_g, d_m, d_v, n, &aa));
                } else {
                    OK(cops->sgd_update(cpu, p_c, grad, m_c, n, &sa));
                    sa.clear = d_g;
                    OK(go->sgd_update(g, d_p, d_g, d_m, n, &sa));
                }
                OK(dt_backend_settle(g));
                CU_ASSERT_EQUAL(got.skip, skip);
                float *gg = hget(g, d_g, n), *pg = hget(g, d_p, n);
                CU_ASSERT(all_zero(gg, n));
                CHECK_CLOSE(adam ? "adamw_update p (clear)" : "sgd_update p (clear)", "fp32", pg,
                            p_c, n, TINY, ELEM_TOL);
                if (skip) CU_ASSERT_EQUAL(memcmp(pg, p0, n * sizeof *pg), 0);
                dt_backend_free(g, d_g), dt_backend_free(g, d_p), dt_backend_free(g, d_m),
                    dt_backend_free(g, d_v);
                free(grad), free(p_c), free(m_c), free(v_c), free(p0), free(gg), free(pg);
            }
    }
}

/* ---- reductions ------------------------------------------------------- */

static void test_sumsq(void)
{
    const size_t sizes[] = {0, 1, 1021, BIG_N};
    dt_backend_t *g = gpu[FP32];
    const struct dt_ops *go = gops[FP32];
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *x = hrand(n, -2, 2);
        float *d_x = dput(g, x, n);
        double ref = -1.0, got = -1.0, again = -2.0;
        OK(cops->sumsq(cpu, x, n, &ref));
        OK(go->sumsq(g, d_x, n, &got));
        OK(go->sumsq(g, d_x, n, &again));
        if (!(cu_rel_diff(got, ref, TINY) < 1e-10))
            printf("\n  sumsq n=%zu: %.17g vs %.17g\n", n, got, ref);
        CU_ASSERT(cu_rel_diff(got, ref, TINY) < 1e-10);
        CU_ASSERT_EQUAL(memcmp(&got, &again, sizeof got), 0); /* same bits every run */
        dt_backend_free(g, d_x);
        free(x);
    }
    /* non-finite values, last element of a big buffer and early */
    float *x = hrand(BIG_N, -1, 1);
    float *d_x = dput(g, x, BIG_N);
    double got = 0.0;
    x[BIG_N - 1] = NAN;
    up(g, d_x + BIG_N - 1, x + BIG_N - 1, sizeof(float));
    OK(go->sumsq(g, d_x, BIG_N, &got));
    CU_ASSERT(isnan(got));
    x[BIG_N - 1] = -INFINITY;
    up(g, d_x + BIG_N - 1, x + BIG_N - 1, sizeof(float));
    OK(go->sumsq(g, d_x, BIG_N, &got));
    CU_ASSERT(isinf(got) && got > 0);
    x[7] = NAN; /* NaN wins over inf */
    up(g, d_x + 7, x + 7, sizeof(float));
    OK(go->sumsq(g, d_x, BIG_N, &got));
    CU_ASSERT(isnan(got));
    x[7] = FLT_MAX, x[BIG_N - 1] = FLT_MAX; /* no overflow in double */
    up(g, d_x, x, BIG_N * sizeof(float));
    OK(go->sumsq(g, d_x, BIG_N, &got));
    CU_ASSERT(isfinite(got) && got >= 2.0 * (double)FLT_MAX * FLT_MAX);
    dt_backend_free(g, d_x);
    free(x);
}

/* The step gate: the sum over ranges as the CPU's (to double rounding),
 * the clip factor and fp16's unscale applied on the device, a gated
 * update queued before the host has the gate, one wait (settle) for it
 * all, the same bits every run, and a skip that leaves the update alone. */
static void gate_case(size_t n, float unscale, double clip, size_t bad_at)
{
    dt_backend_t *g = gpu[FP32];
    const struct dt_ops *go = gops[FP32];
    float *grad = hrand(n, -3, 3), *p_c = hrand(n, -1, 1), *m_c = hconst(n, 0), *v_c = hconst(n, 0);
    if (bad_at < n) grad[bad_at] = NAN;
    float *orig = hnew(n);
    memcpy(orig, grad, n * sizeof *orig);
    float *d_g = dput(g, grad, n), *d_p = dput(g, p_c, n), *d_m = dput(g, m_c, n);
    float *d_v = dput(g, v_c, n);
    size_t lo = 0, hi = n;
    struct dt_gate_args a = {
        .lo = &lo, .hi = &hi, .count = 1, .decide = 1, .unscale = unscale, .clip_norm = clip};
    struct dt_adamw_args opt = {
        .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .t = 1, .gated = 1};
    struct dt_gate ref, got = {.sumsq = -1.0, .skip = -1, .factor = -1.0f}, again;
    OK(cops->step_gate(cpu, grad, &a, &ref));
    OK(cops->adamw_update(cpu, p_c, grad, m_c, v_c, n, &opt));
    struct dt_backend_waits w0, w1;
    dt_backend_waits(g, &w0);
    OK(go->step_gate(g, d_g, &a, &got));
    OK(go->adamw_update(g, d_p, d_g, d_m, d_v, n, &opt));
    dt_backend_waits(g, &w1);
    CU_ASSERT_EQUAL(w1.count, w0.count);            /* queued, nothing waited */
    CU_ASSERT(got.sumsq == -1.0 && got.skip == -1); /* not before the wait */
    OK(dt_backend_settle(g));
    dt_backend_waits(g, &w1);
    CU_ASSERT_EQUAL(w1.count, w0.count + 1);
    CU_ASSERT_EQUAL(got.skip, ref.skip);
    if (ref.skip) {
        CU_ASSERT(isnan(got.sumsq));
    } else {
        if (!(cu_rel_diff(got.sumsq, ref.sumsq, TINY) < 1e-10 &&
              cu_rel_diff(got.factor, ref.factor, TINY) < 1e-6))
            printf("\n  step_gate n=%zu: sumsq %.17g vs %.17g, factor %.9g vs %.9g\n", n, got.sumsq,
                   ref.sumsq, (double)got.factor, (double)ref.factor);
        CU_ASSERT(cu_rel_diff(got.sumsq, ref.sumsq, TINY) < 1e-10);
        CU_ASSERT(cu_rel_diff(got.factor, ref.factor, TINY) < 1e-6);
        CU_ASSERT_EQUAL(clip > 0 && sqrt(ref.sumsq) * unscale > clip, ref.factor != 1.0f);
    }
    float *gg = hget(g, d_g, n), *pg = hget(g, d_p, n), *mg = hget(g, d_m, n);
    CHECK_CLOSE("step_gate gradients", "fp32", gg, grad, n, TINY, ELEM_TOL);
    CHECK_CLOSE("gated adamw_update p", "fp32", pg, p_c, n, TINY, ELEM_TOL);
    CHECK_CLOSE("gated adamw_update m", "fp32", mg, m_c, n, TINY, ELEM_TOL);
    if (ref.skip) { /* nothing moved, bit for bit */
        float *p0 = hget(g, d_p, n);
        CU_ASSERT_EQUAL(memcmp(pg, p_c, n * sizeof *pg), 0);
        CU_ASSERT_EQUAL(memcmp(mg, m_c, n * sizeof *mg), 0);
        opt.gated = 0; /* an ungated update still runs */
        up(g, d_g, p_c, n * sizeof(float));
        OK(go->adamw_update(g, d_p, d_g, d_m, d_v, n, &opt));
        free(pg);
        pg = hget(g, d_p, n);
        CU_ASSERT(memcmp(pg, p0, n * sizeof *pg) != 0);
        free(p0);
    } else { /* the same input gives the same bits */
        up(g, d_g, orig, n * sizeof(float));
        OK(go->step_gate(g, d_g, &a, &again));
        OK(dt_backend_settle(g));
        CU_ASSERT_EQUAL(memcmp(&again.sumsq, &got.sumsq, sizeof got.sumsq), 0);
        CU_ASSERT_EQUAL(memcmp(&again.factor, &got.factor, sizeof got.factor), 0);
        float *gg2 = hget(g, d_g, n);
        CU_ASSERT_EQUAL(memcmp(gg2, gg, n * sizeof *gg), 0);
        free(gg2);
    }
    dt_backend_free(g, d_g), dt_backend_free(g, d_p), dt_backend_free(g, d_m),
        dt_backend_free(g, d_v);
    free(grad), free(orig), free(p_c), free(m_c), free(v_c), free(gg), free(pg), free(mg);
}

static void test_step_gate(void)
{
    gate_case(1021, 1.0f, 0.0, SIZE_MAX);     /* no clipping */
    gate_case(1021, 1.0f, 1.0, SIZE_MAX);     /* clipped */
    gate_case(BIG_N, 0.25f, 100.0, SIZE_MAX); /* unscaled, then clipped */
    gate_case(BIG_N, 0.25f, 1e9, SIZE_MAX);   /* unscaled only */
    gate_case(BIG_N, 1.0f, 1.0, BIG_N - 1);   /* not finite: skipped */
    gate_case(3, 1.0f, 1.0, 0);
    /* ranges without a decision: their sum, in order, and nothing changes */
    dt_backend_t *g = gpu[FP32];
    const struct dt_ops *go = gops[FP32];
    float *x = hrand(BIG_N, -1, 1);
    float *d_x = dput(g, x, BIG_N);
    size_t lo[3] = {0, 1000, 5000}, hi[3] = {10, 1000, BIG_N};
    struct dt_gate_args a = {.lo = lo, .hi = hi, .count = 3};
    struct dt_gate ref, got;
    OK(cops->step_gate(cpu, x, &a, &ref));
    OK(go->step_gate(g, d_x, &a, &got));
    OK(dt_backend_settle(g));
    CU_ASSERT(cu_rel_diff(got.sumsq, ref.sumsq, TINY) < 1e-10);
    CU_ASSERT(got.skip == 0 && got.factor == 1.0f);
    float *xg = hget(g, d_x, BIG_N);
    CU_ASSERT_EQUAL(memcmp(xg, x, BIG_N * sizeof *x), 0);
    dt_backend_free(g, d_x);
    free(x), free(xg);
}

/* Pinned batch buffers (dt_backend_host_alloc): zero-filled, an upload
 * out of one (whole or a piece) queues without a host wait, even one too
 * large for the staging ring (which pageable memory copies waiting), host_idle
 * returns once it has been read, and the device gets the data. */
static void test_pinned_upload(void)
{
    dt_backend_t *g = gpu[FP32];
    /* over the 64 MiB above which an upload from pageable memory waits */
    const size_t n = ((size_t)64 << 20) / sizeof(float) + 3;
    float *h = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_backend_host_alloc(g, n * sizeof *h, (void **)&h), DT_OK);
    size_t zeros = 0;
    for (size_t i = 0; i < n; i++)
        zeros += h[i] == 0.0f;
    CU_ASSERT_EQUAL(zeros, n);
    float *ref = hrand(n, -1, 1), *d = dnew(g, n * sizeof *d);
    memcpy(h, ref, n * sizeof *h);
    struct dt_backend_waits w0, w1;
    OK(dt_backend_sync(g));
    dt_backend_waits(g, &w0);
    OK(dt_backend_copy(g, d, h, n * sizeof *h, DT_COPY_H2D));
    OK(dt_backend_copy(g, d + 10, h + 10, 77 * sizeof *h, DT_COPY_H2D)); /* a piece of it */
    dt_backend_waits(g, &w1);
    CU_ASSERT_EQUAL(w1.count, w0.count); /* no staging, no wait */
    OK(dt_backend_host_idle(g, h));
    OK(dt_backend_host_idle(g, h + n - 1));
    memset(h, 0, n * sizeof *h); /* idle: the copy has read it */
    float *got = hget(g, d, n);
    CU_ASSERT_EQUAL(memcmp(got, ref, n * sizeof *got), 0);
    int other = 0;
    OK(dt_backend_host_idle(g, &other)); /* not a pinned buffer: nothing to wait for */
    dt_backend_host_free(g, h);
    dt_backend_free(g, d);
    free(ref), free(got);
}

/* The parameters' rounded copy (bf16, fp16; dt_backend_set_params): a
 * linear op whose weight lies in the registered parameters gives the bits
 * of the same op on an unregistered copy of the weight, before and after
 * every kind of write into the parameters (an update, an upload, a device
 * copy, fill, scale, step_gate), and after the parameters are forgotten. */
static int same_linear(dt_backend_t *g, const struct dt_ops *go, const float *w, float *w2,
                       const float *x, int B, int In, int Out)
{
    const size_t nw = (size_t)Out * In, ny = (size_t)B * Out, nx = (size_t)B * In;
    float *y1 = dnew(g, ny * sizeof(float)), *y2 = dnew(g, ny * sizeof(float));
    float *d1 = dnew(g, nx * sizeof(float)), *d2 = dnew(g, nx * sizeof(float));
    float *dw = dnew(g, nw * sizeof(float));
    OK(dt_backend_copy(g, w2, w, nw * sizeof(float), DT_COPY_D2D));
    OK(go->linear_fwd(g, y1, x, w, NULL, B, In, Out, NULL));
    OK(go->linear_fwd(g, y2, x, w2, NULL, B, In, Out, NULL));
    OK(go->linear_bwd(g, d1, dw, y1, x, w, B, In, Out, NULL));
    OK(go->linear_bwd(g, d2, dw, y1, x, w2, B, In, Out, NULL));
    float *h1 = hget(g, y1, ny), *h2 = hget(g, y2, ny), *e1 = hget(g, d1, nx),
          *e2 = hget(g, d2, nx);
    int same = memcmp(h1, h2, ny * sizeof *h1) == 0 && memcmp(e1, e2, nx * sizeof *e1) == 0;
    dt_backend_free(g, y1), dt_backend_free(g, y2), dt_backend_free(g, d1), dt_backend_free(g, d2),
        dt_backend_free(g, dw);
    free(h1), free(h2), free(e1), free(e2);
    return same;
}

static void test_params_copy(void)
{
    const int B = 7, In = 33, Out = 20, at = 64;
    const size_t nw = (size_t)Out * In, np = at + nw + 16;
    for (int c = BF16; c <= FP16; c++) {
        dt_backend_t *g = gpu[c];
        const struct dt_ops *go = gops[c];
        float *hp = hrand(np, -1, 1), *hx = hrand((size_t)B * In, -1, 1);
        float *p = dput(g, hp, np), *x = dput(g, hx, (size_t)B * In);
        float *w2 = dnew(g, nw * sizeof(float)), *m = dnew(g, np * sizeof(float));
        float *v = dnew(g, np * sizeof(float)), *grad = dput(g, hx, (size_t)B * In);
        const float *w = p + at;
        OK(dt_backend_set_params(g, p, np));
        const char *step[] = {"registered", "adamw_update", "upload",    "device copy",
                              "fill",       "scale",        "step_gate", "forgotten"};
        for (int k = 0; k < 8; k++) {
            if (k == 1) {
                struct dt_adamw_args a = {
                    .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .t = 1};
                OK(go->adamw_update(g, p, grad, m, v, (size_t)B * In, &a));
            } else if (k == 2) {
                float *h = hrand(nw, -2, 2);
                up(g, p + at, h, nw * sizeof(float));
                OK(dt_backend_sync(g));
                free(h);
            } else if (k == 3) {
                OK(dt_backend_copy(g, p + at + 5, x, 100 * sizeof(float), DT_COPY_D2D));
            } else if (k == 4) {
                OK(go->fill(g, p + at + nw - 50, 50, 0.25f));
            } else if (k == 5) {
                OK(go->scale(g, p, np, 0.5f));
            } else if (k == 6) {
                size_t lo = at, hi = at + nw;
                struct dt_gate_args a = {.lo = &lo,
                                         .hi = &hi,
                                         .count = 1,
                                         .decide = 1,
                                         .unscale = 0.5f,
                                         .clip_norm = 0.0};
                struct dt_gate out;
                OK(go->step_gate(g, p, &a, &out));
                OK(dt_backend_settle(g));
            } else if (k == 7) {
                OK(dt_backend_set_params(g, NULL, 0));
                OK(go->scale(g, p, np, 3.0f));
            }
            if (k == 0 && strstr(dt_backend_device(g), "emulation")) {
                /* device memory is host memory here: a write that does not
                 * go through the backend is not seen, so the copy is what
                 * the op reads */
                CU_ASSERT(same_linear(g, go, w, w2, x, B, In, Out));
                p[at + 3] += 1.0f;
                CU_ASSERT(!same_linear(g, go, w, w2, x, B, In, Out));
                up(g, p + at + 3, &p[at + 3], sizeof(float)); /* now through the backend */
            }
            int same = same_linear(g, go, w, w2, x, B, In, Out);
            if (!same)
                printf("\n  %s: a linear op on a registered weight after '%s' differs from the "
                       "same op on a copy\n",
                       cfgs[c].name, step[k]);
            CU_ASSERT(same);
        }
        dt_backend_free(g, p), dt_backend_free(g, x), dt_backend_free(g, w2), dt_backend_free(g, m),
            dt_backend_free(g, v), dt_backend_free(g, grad);
        free(hp), free(hx);
    }
}

/* linear_fwd's in_kept (bf16, fp16): the forward that keeps the rounded
 * input gives the bits of the one that does not, and a backward handed
 * that copy gives the bits of the ordinary backward even with its fp32
 * input overwritten by NaN in between, so it reads the copy and nothing
 * else. Where operands are not rounded (fp32 on cuda, every cpu backend)
 * nothing is kept. */
static void test_linear_kept_input(void)
{
    const int B = 37, In = 129, Out = 65;
    const size_t nx = (size_t)B * In, nw = (size_t)Out * In, ny = (size_t)B * Out;
    CU_ASSERT_EQUAL(dt_backend_kept_operand_bytes(gpu[FP32]), 0);
    CU_ASSERT_EQUAL(dt_backend_kept_operand_bytes(gpu[TF32]), 0);
    CU_ASSERT_EQUAL(dt_backend_kept_operand_bytes(cpu_ref[BF16]), 0);
    CU_ASSERT_EQUAL(dt_backend_kept_operand_bytes(NULL), 0);
    for (int c = BF16; c <= FP16; c++) {
        dt_backend_t *g = gpu[c];
        const struct dt_ops *go = gops[c];
        CU_ASSERT_EQUAL_FATAL(dt_backend_kept_operand_bytes(g), 2);
        float *hx = hrand(nx, -1, 1), *hw = hrand(nw, -1, 1), *hd = hrand(ny, -1, 1);
        float *x = dput(g, hx, nx), *w = dput(g, hw, nw), *dy = dput(g, hd, ny);
        void *kept = dnew(g, nx * 2);
        float *y[2], *dx[2], *dw[2];
        for (int k = 0; k < 2; k++) {
            y[k] = dnew(g, ny * sizeof(float));
            dx[k] = dnew(g, nx * sizeof(float));
            dw[k] = dnew(g, nw * sizeof(float));
        }
        OK(go->linear_fwd(g, y[0], x, w, NULL, B, In, Out, NULL));
        OK(go->linear_bwd(g, dx[0], dw[0], dy, x, w, B, In, Out, NULL));
        OK(go->linear_fwd(g, y[1], x, w, NULL, B, In, Out, kept));
        OK(go->fill(g, x, nx, NAN));
        OK(go->linear_bwd(g, dx[1], dw[1], dy, x, w, B, In, Out, kept));
        float *h[2][3];
        for (int k = 0; k < 2; k++) {
            h[k][0] = hget(g, y[k], ny);
            h[k][1] = hget(g, dx[k], nx);
            h[k][2] = hget(g, dw[k], nw);
        }
        const char *what[3] = {"out", "din", "dw"};
        const size_t n[3] = {ny, nx, nw};
        for (int t = 0; t < 3; t++) {
            int same = memcmp(h[0][t], h[1][t], n[t] * sizeof(float)) == 0;
            if (!same)
                printf("\n  %s: linear's %s with the kept input differs from the plain op\n",
                       cfgs[c].name, what[t]);
            CU_ASSERT(same);
        }
        for (int k = 0; k < 2; k++) {
            for (int t = 0; t < 3; t++)
                free(h[k][t]);
            dt_backend_free(g, y[k]), dt_backend_free(g, dx[k]), dt_backend_free(g, dw[k]);
        }
        dt_backend_free(g, x), dt_backend_free(g, w), dt_backend_free(g, dy),
            dt_backend_free(g, kept);
        free(hx), free(hw), free(hd);
    }
}

static void test_all_finite(void)
{
    const size_t where[] = {0, 1021, BIG_N / 2, BIG_N - 1};
    const float bad[] = {NAN, INFINITY, -INFINITY};
    dt_backend_t *g = gpu[FP32];
    const struct dt_ops *go = gops[FP32];
    float *x = hrand(BIG_N, -1, 1);
    x[3] = FLT_MAX, x[4] = -FLT_MAX, x[5] = FLT_MIN / 4; /* extremes, subnormal */
    float *d_x = dput(g, x, BIG_N);
    int ok = -1;
    OK(go->all_finite(g, d_x, BIG_N, &ok));
    CU_ASSERT_EQUAL(ok, 1);
    ok = -1;
    OK(go->all_finite(g, d_x, 0, &ok));
    CU_ASSERT_EQUAL(ok, 1);
    for (size_t w = 0; w < sizeof where / sizeof where[0]; w++)
        for (int b = 0; b < 3; b++) {
            up(g, d_x + where[w], &bad[b], sizeof(float));
            ok = -1;
            OK(go->all_finite(g, d_x, BIG_N, &ok));
            CU_ASSERT_EQUAL(ok, 0);
            up(g, d_x + where[w], x + where[w], sizeof(float));
        }
    ok = -1;
    OK(go->all_finite(g, d_x, BIG_N, &ok)); /* clean again */
    CU_ASSERT_EQUAL(ok, 1);
    dt_backend_free(g, d_x);
    free(x);
}

static void test_scale_fill(void)
{
    dt_backend_t *g = gpu[FP32];
    const struct dt_ops *go = gops[FP32];
    float *x0 = hrand(BIG_N, -1, 1), *expect = hnew(BIG_N);
    float *d_x = dput(g, x0, BIG_N);
    OK(go->scale(g, d_x, BIG_N, -0.37f));
    OK(cops->scale(cpu, x0, BIG_N, -0.37f));
    float *x = hget(g, d_x, BIG_N);
    CHECK_SAME_BITS("scale", x, x0, BIG_N);
    OK(go->fill(g, d_x, BIG_N - 1, 3.25f)); /* n respected: the last one stays */
    memcpy(expect, x0, BIG_N * sizeof(float));
    OK(cops->fill(cpu, expect, BIG_N - 1, 3.25f));
    down(g, x, d_x, BIG_N * sizeof(float));
    CHECK_SAME_BITS("fill", x, expect, BIG_N);
    dt_backend_free(g, d_x);
    free(x0), free(expect), free(x);
}

/* ---- bf16 casts ------------------------------------------------------- */

/* Float bits and the bf16 bits the wire must carry: nearest, ties to even,
 * overflow to infinity, subnormals kept, NaN quiet with its sign and the
 * top of its payload (the CPU reference's rule, not cvt's canonical NaN). */
static const struct bf16_case {
    uint32_t in;
    uint16_t want;
} bf16_cases[] = {
    {0x3f800000u, 0x3f80}, /* 1 */
    {0x3f808000u, 0x3f80}, /* tie: down to even */
    {0x3f818000u, 0x3f82}, /* tie: up to even */
    {0xbf808000u, 0xbf80}, /* negative tie */
    {0xbf818000u, 0xbf82}, /* negative tie, up */
    {0x3f808001u, 0x3f81}, /* just past a tie */
    {0x3f807fffu, 0x3f80}, /* just short of one */
    {0x7f7f7fffu, 0x7f7f}, /* largest finite bf16 */
    {0x7f7e8000u, 0x7f7e}, /* tie below it, stays */
    {0x7f7f8000u, 0x7f80}, /* tie above it: overflows to inf */
    {0x7f7fffffu, 0x7f80}, /* FLT_MAX */
    {0xff7fffffu, 0xff80}, /* -FLT_MAX */
    {0x00800000u, 0x0080}, /* FLT_MIN */
    {0x007fffffu, 0x0080}, /* largest subnormal rounds up to FLT_MIN */
    {0x807fffffu, 0x8080}, /* the same, negative */
    {0x00400000u, 0x0040}, /* subnormal, exact */
    {0x00000001u, 0x0000}, /* smallest subnormal */
    {0x80000001u, 0x8000}, /* to -0 */
    {0x00008000u, 0x0000}, /* subnormal tie, to even */
    {0x00018000u, 0x0002}, /* subnormal tie, up to even */
    {0x80018000u, 0x8002}, /* the same, negative */
    {0x00000000u, 0x0000}, /* +0 */
    {0x80000000u, 0x8000}, /* -0 */
    {0x7f800000u, 0x7f80}, /* +inf */
    {0xff800000u, 0xff80}, /* -inf */
    {0x7fc00000u, 0x7fc0}, /* quiet NaN */
    {0xffc00000u, 0xffc0}, /* negative quiet NaN */
    {0x7f800001u, 0x7fc0}, /* signalling NaN, payload in the low half only */
    {0x7fa00000u, 0x7fe0}, /* signalling NaN, payload kept */
    {0xff812345u, 0xffc1}, /* negative signalling NaN */
    {0x7fffffffu, 0x7fff}, /* NaN, every payload bit */
    {0xffffffffu, 0xffff}, /* the same, negative */
};
#define NBF16_CASES (sizeof bf16_cases / sizeof bf16_cases[0])
#define BF16_TIE 0x8000u         /* low half of a float halfway between two bf16s */
#define BF16_SENTINEL 0xabcdu    /* past the end of dst: must survive */
#define F32_SENTINEL 0x7f80abcdu /* the same for a float dst (a NaN) */

/* x(n) as float bits: the known cases first, then alternately any 32 bits
 * (every exponent, NaN payloads, subnormals) and exact ties. */
static void fill_bf16_inputs(float *x, size_t n)
{
    struct dt_rng_key key = {.seed = 4243, .purpose = DT_RNG_TEST, .stream = 12};
    struct dt_rng_stream s;
    dt_rng_stream_init(&key, 0, &s);
    size_t i = 0;
    for (; i < n && i < NBF16_CASES; i++)
        memcpy(&x[i], &bf16_cases[i].in, sizeof x[i]);
    for (; i < n; i += 4) {
        uint32_t w[4];
        dt_rng_stream_block(&s, draws++, w);
        for (size_t k = 0; k < 4 && i + k < n; k++) {
            uint32_t u = (i + k) % 2 ? (w[k] & 0xffff0000u) | BF16_TIE : w[k];
            memcpy(&x[i + k], &u, sizeof u);
        }
    }
}

/* to_bf16 and then from_bf16 of n inputs on the GPU against the CPU, bit
 * for bit, and against the table; nothing written past n. */
static void bf16_case(dt_backend_t *g, const struct dt_ops *go, const char *cfg, size_t n)
{
    float *x = hnew(n), *rt_ref = hnew(n), *rt = hnew(n + 1);
    uint16_t *ref = calloc(n + 1, sizeof *ref), *b = calloc(n + 1, sizeof *b);
    CU_ASSERT_FATAL(ref && b);
    fill_bf16_inputs(x, n);
    OK(cops->to_bf16(cpu, ref, x, n));
    OK(cops->from_bf16(cpu, rt_ref, ref, n));
    for (size_t i = 0; i <= n; i++) {
        b[i] = BF16_SENTINEL;
        memcpy(&rt[i], &(uint32_t){F32_SENTINEL}, sizeof rt[i]);
    }
    float *d_x = dput(g, x, n), *d_rt = dnew(g, (n + 1) * sizeof *d_rt);
    uint16_t *d_b = dnew(g, (n + 1) * sizeof *d_b);
    up(g, d_b, b, (n + 1) * sizeof *b);
    up(g, d_rt, rt, (n + 1) * sizeof *rt);
    OK(go->to_bf16(g, d_b, d_x, n));
    OK(go->from_bf16(g, d_rt, d_b, n));
    down(g, b, d_b, (n + 1) * sizeof *b);
    down(g, rt, d_rt, (n + 1) * sizeof *rt);
    if (memcmp(b, ref, n * sizeof *b) != 0 || memcmp(rt, rt_ref, n * sizeof *rt) != 0)
        printf("\n  bf16 casts on the %s backend:", cfg);
    CHECK_SAME_BITS("to_bf16", b, ref, n);
    CHECK_SAME_BITS("from_bf16(to_bf16)", rt, rt_ref, n);
    CU_ASSERT_EQUAL(b[n], BF16_SENTINEL);
    uint32_t last;
    memcpy(&last, &rt[n], sizeof last);
    CU_ASSERT_EQUAL(last, F32_SENTINEL);
    for (size_t i = 0; i < n && i < NBF16_CASES; i++) {
        if (b[i] != bf16_cases[i].want)
            printf("\n  cuda to_bf16(%08x) = %04x, want %04x (%s)\n", bf16_cases[i].in, b[i],
                   bf16_cases[i].want, cfg);
        CU_ASSERT_EQUAL(b[i], bf16_cases[i].want);
    }
    dt_backend_free(g, d_x), dt_backend_free(g, d_rt), dt_backend_free(g, d_b);
    free(x), free(rt_ref), free(rt), free(ref), free(b);
}

static void test_bf16_vs_cpu(void)
{
    /* the known cases alone on every backend configuration (the casts do
     * not depend on train.precision), then sizes: none, one, odd ones and
     * more than one grid covers */
    for (int c = 0; c < NCFG; c++)
        bf16_case(gpu[c], gops[c], cfgs[c].name, NBF16_CASES);
    const size_t sizes[] = {0, 1, 1021, 4099, BIG_N};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        bf16_case(gpu[FP32], gops[FP32], "fp32", sizes[s]);
    /* n == 0 needs no buffers */
    OK(gops[FP32]->to_bf16(gpu[FP32], NULL, NULL, 0));
    OK(gops[FP32]->from_bf16(gpu[FP32], NULL, NULL, 0));
}

/* Every bf16 value widened (the bits move to the top half, NaN payloads
 * included) and narrowed again: back to itself, except that a signalling
 * NaN comes back quiet, as on the CPU. */
static void test_bf16_all_values(void)
{
    enum { NB = 1 << 16 };
    dt_backend_t *g = gpu[FP32];
    const struct dt_ops *go = gops[FP32];
    uint16_t *b = calloc(NB, sizeof *b), *back = calloc(NB, sizeof *back);
    uint16_t *back_ref = calloc(NB, sizeof *back_ref);
    CU_ASSERT_FATAL(b && back && back_ref);
    float *f_ref = hnew(NB), *f = hnew(NB);
    for (uint32_t i = 0; i < NB; i++)
        b[i] = (uint16_t)i;
    OK(cops->from_bf16(cpu, f_ref, b, NB));
    OK(cops->to_bf16(cpu, back_ref, f_ref, NB));
    uint16_t *d_b = dnew(g, NB * sizeof *d_b);
    float *d_f = dnew(g, NB * sizeof *d_f);
    up(g, d_b, b, NB * sizeof *b);
    OK(go->from_bf16(g, d_f, d_b, NB));
    OK(go->to_bf16(g, d_b, d_f, NB));
    down(g, f, d_f, NB * sizeof *f);
    down(g, back, d_b, NB * sizeof *back);
    CHECK_SAME_BITS("from_bf16, every value", f, f_ref, NB);
    CHECK_SAME_BITS("to_bf16(from_bf16), every value", back, back_ref, NB);
    size_t wrong = 0;
    for (uint32_t i = 0; i < NB; i++) {
        uint32_t u;
        memcpy(&u, &f[i], sizeof u);
        int nan = (i & 0x7fffu) > 0x7f80u;
        wrong += u != i << 16;
        wrong += back[i] != (nan ? (uint16_t)(i | 0x0040u) : (uint16_t)i);
    }
    CU_ASSERT_EQUAL(wrong, 0);
    dt_backend_free(g, d_b), dt_backend_free(g, d_f);
    free(b), free(back), free(back_ref), free(f_ref), free(f);
}

/* ---- invalid arguments ------------------------------------------------ */

static void test_invalid_args(void)
{
    dt_backend_t *be = gpu[FP32];
    const struct dt_ops *o = gops[FP32];
    const int32_t lab_h[2] = {0, 1};
    float *x = dnew(be, 16 * sizeof(float)), *y = dnew(be, 16 * sizeof(float));
    float *z = dnew(be, 16 * sizeof(float));
    int32_t *lab = dlabels(be, lab_h, 2);
    const struct dt_rng_key *key = &drop_key;
    int ran = 0;
    CU_ASSERT_EQUAL(dt_test_invalid_args(o, be, x, y, z, lab, key, &ran), 0);
    CU_ASSERT(ran > 40);
    /* the failed calls wrote nothing */
    float h[3][16];
    down(be, h[0], x, sizeof h[0]);
    down(be, h[1], y, sizeof h[1]);
    down(be, h[2], z, sizeof h[2]);
    int untouched = 1;
    for (int i = 0; i < 16; i++)
        untouched &= h[0][i] == 0.0f && h[1][i] == 0.0f && h[2][i] == 0.0f;
    CU_ASSERT(untouched);
    dt_backend_free(be, x), dt_backend_free(be, y), dt_backend_free(be, z);
    dt_backend_free(be, lab);
}

int main(void)
{
    char why[512];
    if (!dt_cuda_usable(why, sizeof why)) {
        printf("test_gpu_ops: SKIPPED: %s\n", why);
        return SKIP_CODE;
    }
    printf("test_gpu_ops: %s\n", why);
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite("cuda_backend", suite_init, suite_cleanup);
    CU_ADD(s, test_backend_basics);
    CU_ADD(s, test_backend_oom);

    s = CU_add_suite("cuda_linear", suite_init, suite_cleanup);
    CU_ADD(s, test_linear_vs_cpu);
    CU_ADD(s, test_linear_empty);
    CU_ADD(s, test_bias_vs_cpu);

    s = CU_add_suite("cuda_activation", suite_init, suite_cleanup);
    CU_ADD(s, test_activations_vs_cpu);
    CU_ADD(s, test_activation_values);

    s = CU_add_suite("cuda_dropout", suite_init, suite_cleanup);
    CU_ADD(s, test_dropout_bitwise);
    CU_ADD(s, test_dropout_p0);

    s = CU_add_suite("cuda_flatten", suite_init, suite_cleanup);
    CU_ADD(s, test_flatten);

    s = CU_add_suite("cuda_softmax_xent", suite_init, suite_cleanup);
    CU_ADD(s, test_xent_vs_cpu);
    CU_ADD(s, test_xent_stable);
    CU_ADD(s, test_xent_invalid_label);
    CU_ADD(s, test_scratch_reserved);

    s = CU_add_suite("cuda_optim", suite_init, suite_cleanup);
    CU_ADD(s, test_sgd_vs_cpu);
    CU_ADD(s, test_adamw_vs_cpu);
    CU_ADD(s, test_optim_clear_vs_cpu);

    s = CU_add_suite("cuda_reduce", suite_init, suite_cleanup);
    CU_ADD(s, test_sumsq);
    CU_ADD(s, test_all_finite);
    CU_ADD(s, test_step_gate);
    CU_ADD(s, test_pinned_upload);
    CU_ADD(s, test_params_copy);
    CU_ADD(s, test_linear_kept_input);
    CU_ADD(s, test_scale_fill);

    s = CU_add_suite("cuda_cast", suite_init, suite_cleanup);
    CU_ADD(s, test_bf16_vs_cpu);
    CU_ADD(s, test_bf16_all_values);

    s = CU_add_suite("cuda_invalid_args", suite_init, suite_cleanup);
    CU_ADD(s, test_invalid_args);
    return cu_run_all();
}
