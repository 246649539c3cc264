/*
 * test_gpu_attention.c - the cuda backend's embedding and attention ops
 * (kernels/cuda/embedding.cu, attention.cu) against references written
 * here in plain C, in double for attention, so the suite does not depend
 * on any other backend's version of these ops (the shared op table and
 * test_gpu_op_table compare them with the CPU backend as well).
 *
 * Embedding: the forward is an exact gather; the backward must be
 * bit-identical to adding the rows of dout into dw one by one in the order
 * n = 0..N-1 (which also makes it the same bits on every run), with ids
 * repeated often, more ids than one shared-memory tile, more rows than the
 * kernel's row classes and more columns than one block. An id that is a
 * fraction, negative, >= V or NaN is DT_ERR_INVALID_ARG naming its
 * position.
 *
 * Attention: out, lse and dqkv against the double reference at a relative
 * error of ATT_TOL (max |gpu - ref| / max |ref| per tensor), causal and
 * not, for T = 1, T not a multiple of any tile, T = 1024 (256 under the
 * host emulation, whose time grows with T squared), Dh = 1, Dh not
 * a multiple of 32, and Dh = 128, the largest supported; dqkv starts as
 * NaN (it must be written everywhere) and a second backward must give the
 * same bits. Dh = 129 is DT_ERR_UNSUPPORTED; a short workspace and a bad
 * causal flag are DT_ERR_INVALID_ARG.
 *
 * Without a usable GPU the program prints why and exits 77, which ctest
 * counts as skipped.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "core/rng.h"
#include "tests/unit/cu_util.h"

#define SKIP_CODE 77
/* fp32 against a double reference, sums over up to T = 1024 terms */
#define ATT_TOL 5e-5

static dt_backend_t *gpu;
static const struct dt_ops *ops;
static uint64_t draws; /* distinct draws for every array in the run */

/* ---- helpers ---------------------------------------------------------- */

static float *hnew(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof *p);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    return p;
}

static float *hrand(size_t n, float lo, float hi)
{
    struct dt_rng_key key = {.seed = 1212, .purpose = DT_RNG_TEST, .stream = 12};
    struct dt_rng_stream s;
    dt_rng_stream_init(&key, 0, &s);
    float *x = hnew(n);
    for (size_t i = 0; i < n; i += 4) {
        uint32_t w[4];
        dt_rng_stream_block(&s, draws++, w);
        for (size_t k = 0; k < 4 && i + k < n; k++)
            x[i + k] = lo + (hi - lo) * dt_rng_u32_to_unit(w[k]);
    }
    return x;
}

/* A device copy of h(n). */
static float *dput(const float *h, size_t n)
{
    void *d = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_backend_alloc(gpu, (n ? n : 1) * sizeof(float), &d), DT_OK);
    CU_ASSERT_EQUAL_FATAL(dt_backend_copy(gpu, d, h, n * sizeof(float), DT_COPY_H2D), DT_OK);
    return d;
}

/* A host copy of d(n). */
static float *hget(const float *d, size_t n)
{
    float *h = hnew(n);
    CU_ASSERT_EQUAL_FATAL(dt_backend_copy(gpu, h, d, n * sizeof(float), DT_COPY_D2H), DT_OK);
    CU_ASSERT_EQUAL_FATAL(dt_backend_sync(gpu), DT_OK);
    return h;
}

/* max |got - ref| / max |ref|; a NaN in got is infinitely wrong. */
static double rel_err(const float *got, const double *ref, size_t n)
{
    double diff = 0.0, mag = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= diff))
            diff = d;
        if (fabs(ref[i]) > mag)
            mag = fabs(ref[i]);
    }
    return diff / mag;
}

#define OK(expr) CU_ASSERT_EQUAL_FATAL((expr), DT_OK)

/* The op failed with status `want` and its message contains `text`. */
#define CHECK_FAILS(expr, want, text)                                                              \
    do {                                                                                           \
        dt_clear_error();                                                                          \
        dt_status st_ = (expr);                                                                    \
        CU_ASSERT_EQUAL(st_, (want));                                                              \
        if (!strstr(dt_last_error(), (text)))                                                      \
            printf("\n  expected \"%s\" in: %s\n", (text), dt_last_error());                       \
        CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), (text)));                                   \
    } while (0)

static int suite_init(void)
{
    struct dt_backend_opts o = {.threads = 1, .device = 0, .allow_tf32 = 0, .precision = DT_F32};
    if (dt_backend_create("cuda", &o, &gpu) != DT_OK) {
        fprintf(stderr, "test_gpu_attention: cuda backend: %s\n", dt_last_error());
        return -1;
    }
    ops = dt_backend_ops(gpu);
    return 0;
}

static int suite_cleanup(void)
{
    if (gpu)
        dt_backend_destroy(gpu);
    gpu = NULL;
    return 0;
}

/* ---- embedding -------------------------------------------------------- */

/* ids(N): whole numbers in [0, V), every `hot`-th one the same id */
static float *make_ids(int N, int V, int hot)
{
    float *ids = hrand((size_t)N, 0.0f, (float)V);
    for (int n = 0; n < N; n++) {
        ids[n] = floorf(ids[n]);
        if (ids[n] >= (float)V)
            ids[n] = (float)(V - 1);
        if (hot && n % hot == 0)
            ids[n] = (float)(V / 2);
    }
    return ids;
}

static void embedding_case(int N, int V, int D, int hot)
{
    CU_ASSERT_PTR_NOT_NULL_FATAL(ops->embedding_fwd);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ops->embedding_bwd);
    const size_t nw = (size_t)V * D, no = (size_t)N * D;
    float *ids = make_ids(N, V, hot), *w = hrand(nw, -1.0f, 1.0f);
    float *dout = hrand(no, -1.0f, 1.0f), *dw0 = hrand(nw, -1.0f, 1.0f);
    float *d_ids = dput(ids, (size_t)N), *d_w = dput(w, nw), *d_dout = dput(dout, no);
    float *d_out = dput(dout, no); /* old values, to be overwritten */
    float *d_dw = dput(dw0, nw);

    OK(ops->embedding_fwd(gpu, d_out, d_ids, d_w, N, V, D));
    float *out = hget(d_out, no);
    int exact = 1;
    for (int n = 0; n < N; n++)
        exact &= memcmp(out + (size_t)n * D, w + (size_t)ids[n] * D, (size_t)D * sizeof *w) == 0;
    if (!exact)
        printf("\n  embedding_fwd N=%d V=%d D=%d: not an exact gather\n", N, V, D);
    CU_ASSERT(exact);

    /* dw starts at dw0 (it accumulates); the reference adds in order n */
    float *ref = hnew(nw);
    memcpy(ref, dw0, nw * sizeof *ref);
    for (int n = 0; n < N; n++)
        for (int d = 0; d < D; d++)
            ref[(size_t)ids[n] * D + d] += dout[(size_t)n * D + d];
    OK(ops->embedding_bwd(gpu, d_dw, d_dout, d_ids, N, V, D));
    float *dw = hget(d_dw, nw);
    int same = memcmp(dw, ref, nw * sizeof *ref) == 0;
    if (!same)
        printf("\n  embedding_bwd N=%d V=%d D=%d: not the bits of the in-order sum\n", N, V, D);
    CU_ASSERT(same);

    dt_backend_free(gpu, d_ids);
    dt_backend_free(gpu, d_w);
    dt_backend_free(gpu, d_dout);
    dt_backend_free(gpu, d_out);
    dt_backend_free(gpu, d_dw);
    free(ids);
    free(w);
    free(dout);
    free(dw0);
    free(out);
    free(ref);
    free(dw);
}

static void test_embedding(void)
{
    embedding_case(1, 1, 1, 0);
    embedding_case(37, 5, 7, 3);        /* fewer rows than row classes */
    embedding_case(5000, 300, 200, 4);  /* several id tiles, two column blocks */
    embedding_case(4096, 50257, 64, 2); /* a GPT-2 vocabulary, a hot id */
}

static void test_embedding_bad_ids(void)
{
    const int N = 16, V = 10, D = 3;
    const float bad[] = {2.5f, -1.0f, (float)V, NAN};
    float *w = hrand((size_t)V * D, -1.0f, 1.0f), *ids = hnew((size_t)N);
    float *d_w = dput(w, (size_t)V * D);
    void *d_ids = NULL, *out_big = NULL;
    OK(dt_backend_alloc(gpu, (size_t)N * sizeof(float), &d_ids));
    OK(dt_backend_alloc(gpu, (size_t)N * D * sizeof(float), &out_big));
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        for (int n = 0; n < N; n++)
            ids[n] = (float)(n % V);
        ids[7] = bad[k];
        ids[11] = bad[k]; /* the first bad position is the one named */
        OK(dt_backend_copy(gpu, d_ids, ids, (size_t)N * sizeof(float), DT_COPY_H2D));
        /* queued without a wait; the next wait for the device reports it */
        OK(ops->embedding_fwd(gpu, out_big, d_ids, d_w, N, V, D));
        CHECK_FAILS(dt_backend_sync(gpu), DT_ERR_INVALID_ARG, "position 7");
        /* reported once: good ids afterwards pass */
        ids[7] = ids[11] = 1.0f;
        OK(dt_backend_copy(gpu, d_ids, ids, (size_t)N * sizeof(float), DT_COPY_H2D));
        OK(ops->embedding_fwd(gpu, out_big, d_ids, d_w, N, V, D));
        OK(dt_backend_sync(gpu));
    }
    /* the first bad id of several forwards is the one named */
    ids[3] = 2.5f;
    OK(dt_backend_copy(gpu, d_ids, ids, (size_t)N * sizeof(float), DT_COPY_H2D));
    OK(ops->embedding_fwd(gpu, out_big, d_ids, d_w, N, V, D));
    ids[3] = 1.0f;
    ids[9] = -1.0f;
    OK(dt_backend_copy(gpu, d_ids, ids, (size_t)N * sizeof(float), DT_COPY_H2D));
    OK(ops->embedding_fwd(gpu, out_big, d_ids, d_w, N, V, D));
    CHECK_FAILS(dt_backend_sync(gpu), DT_ERR_INVALID_ARG, "token id 2.5 at position 3");
    OK(dt_backend_sync(gpu));
    CHECK_FAILS(ops->embedding_fwd(gpu, out_big, d_ids, d_w, N, 0, D), DT_ERR_INVALID_ARG,
                "embedding_fwd");
    CHECK_FAILS(ops->embedding_bwd(gpu, out_big, d_w, d_ids, N, V, 0), DT_ERR_INVALID_ARG,
                "embedding_bwd");
    dt_backend_free(gpu, d_ids);
    dt_backend_free(gpu, out_big);
    dt_backend_free(gpu, d_w);
    free(w);
    free(ids);
}

/* ---- attention -------------------------------------------------------- */

/* The double reference over qkv(B,T,3,H,Dh) and dout(B,T,H,Dh): out, lse
 * and dqkv (zeroed here), one query row at a time (s and p are T long). */
static void attention_ref(int B, int T, int H, int Dh, int causal, const float *qkv,
                          const float *dout, double *out, double *lse, double *dqkv)
{
    const size_t ld = (size_t)3 * H * Dh, nq = (size_t)B * T * ld;
    const double sc = 1.0 / sqrt((double)Dh);
    double *s = malloc((size_t)T * sizeof *s), *p = malloc((size_t)T * sizeof *p);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    memset(dqkv, 0, nq * sizeof *dqkv);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                const float *q = qkv + (size_t)(b * T + i) * ld + (size_t)h * Dh;
                const float *dO = dout + ((size_t)(b * T + i) * H + h) * Dh;
                double *o = out + ((size_t)(b * T + i) * H + h) * Dh;
                double *dq = dqkv + (size_t)(b * T + i) * ld + (size_t)h * Dh;
                const int kn = causal ? i + 1 : T;
                double m = -INFINITY, z = 0.0;
                for (int j = 0; j < kn; j++) {
                    const float *k = qkv + (size_t)(b * T + j) * ld + (size_t)(H + h) * Dh;
                    double a = 0.0;
                    for (int d = 0; d < Dh; d++)
                        a += (double)q[d] * k[d];
                    s[j] = a * sc;
                    if (s[j] > m)
                        m = s[j];
                }
                for (int j = 0; j < kn; j++)
                    z += exp(s[j] - m);
                lse[((size_t)b * H + h) * T + i] = m + log(z);
                for (int d = 0; d < Dh; d++)
                    o[d] = 0.0;
                for (int j = 0; j < kn; j++) {
                    const float *v = qkv + (size_t)(b * T + j) * ld + (size_t)(2 * H + h) * Dh;
                    p[j] = exp(s[j] - m) / z;
                    for (int d = 0; d < Dh; d++)
                        o[d] += p[j] * v[d];
                }
                double Di = 0.0;
                for (int d = 0; d < Dh; d++)
                    Di += (double)dO[d] * o[d];
                for (int j = 0; j < kn; j++) {
                    const float *k = qkv + (size_t)(b * T + j) * ld + (size_t)(H + h) * Dh;
                    const float *v = k + (size_t)H * Dh;
                    double *dk = dqkv + (size_t)(b * T + j) * ld + (size_t)(H + h) * Dh;
                    double *dv = dk + (size_t)H * Dh;
                    double dp = 0.0;
                    for (int d = 0; d < Dh; d++)
                        dp += (double)dO[d] * v[d];
                    const double ds = p[j] * (dp - Di);
                    for (int d = 0; d < Dh; d++) {
                        dq[d] += ds * k[d] * sc;
                        dk[d] += ds * q[d] * sc;
                        dv[d] += p[j] * dO[d];
                    }
                }
            }
    free(s);
    free(p);
}

static void attention_case(int B, int T, int H, int Dh, int causal)
{
    CU_ASSERT_PTR_NOT_NULL_FATAL(ops->attention_workspace);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ops->attention_fwd);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ops->attention_bwd);
    const size_t nq = (size_t)B * T * 3 * H * Dh, no = (size_t)B * T * H * Dh;
    const size_t nl = (size_t)B * H * T;
    float *qkv = hrand(nq, -2.0f, 2.0f), *dout = hrand(no, -1.0f, 1.0f), *nan = hnew(nq);
    for (size_t i = 0; i < nq; i++)
        nan[i] = NAN;
    double *r_out = malloc(no * sizeof *r_out), *r_lse = malloc(nl * sizeof *r_lse);
    double *r_dqkv = malloc(nq * sizeof *r_dqkv);
    CU_ASSERT_FATAL(r_out && r_lse && r_dqkv);
    attention_ref(B, T, H, Dh, causal, qkv, dout, r_out, r_lse, r_dqkv);

    size_t ws_bytes = 0;
    void *ws = NULL;
    OK(ops->attention_workspace(gpu, B, T, H, Dh, causal, &ws_bytes));
    OK(dt_backend_alloc(gpu, ws_bytes, &ws));
    float *d_qkv = dput(qkv, nq), *d_dout = dput(dout, no), *d_out = dput(nan, no);
    float *d_lse = dput(nan, nl), *d_dqkv = dput(nan, nq);
    OK(ops->attention_fwd(gpu, d_out, d_lse, d_qkv, B, T, H, Dh, causal, ws, ws_bytes));
    OK(ops->attention_bwd(gpu, d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, H, Dh, causal, ws,
                          ws_bytes));
    float *out = hget(d_out, no), *lse = hget(d_lse, nl), *dqkv = hget(d_dqkv, nq);
    OK(dt_backend_copy(gpu, d_dqkv, nan, nq * sizeof(float), DT_COPY_H2D));
    OK(ops->attention_bwd(gpu, d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, H, Dh, causal, ws,
                          ws_bytes));
    float *again = hget(d_dqkv, nq);

    const double e_out = rel_err(out, r_out, no), e_lse = rel_err(lse, r_lse, nl);
    const double e_dqkv = rel_err(dqkv, r_dqkv, nq);
    const int same = memcmp(dqkv, again, nq * sizeof *dqkv) == 0;
    printf("\n  B=%d T=%d H=%d Dh=%d causal=%d: out %.2g, lse %.2g, dqkv %.2g%s", B, T, H, Dh,
           causal, e_out, e_lse, e_dqkv, same ? "" : ", dqkv DIFFERS between runs");
    CU_ASSERT(e_out <= ATT_TOL);
    CU_ASSERT(e_lse <= ATT_TOL);
    CU_ASSERT(e_dqkv <= ATT_TOL);
    CU_ASSERT(same);

    dt_backend_free(gpu, ws);
    dt_backend_free(gpu, d_qkv);
    dt_backend_free(gpu, d_dout);
    dt_backend_free(gpu, d_out);
    dt_backend_free(gpu, d_lse);
    dt_backend_free(gpu, d_dqkv);
    free(qkv);
    free(dout);
    free(nan);
    free(r_out);
    free(r_lse);
    free(r_dqkv);
    free(out);
    free(lse);
    free(dqkv);
    free(again);
}

static void test_attention_vs_ref(void)
{
    static const int cases[][5] = {
        /* B, T, H, Dh, causal */
        {2, 1, 1, 5, 1},    {2, 1, 2, 5, 0},     {1, 37, 2, 24, 0},  {1, 37, 2, 24, 1},
        {2, 100, 3, 64, 1}, {1, 45, 3, 33, 1},   {1, 20, 1, 128, 0}, {1, 70, 2, 96, 1},
        {1, 64, 1, 1, 1},   {3, 17, 1, 32, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        attention_case(cases[c][0], cases[c][1], cases[c][2], cases[c][3], cases[c][4]);
    /* a long causal sequence: 1024 on a GPU; 256 (8 tiles) under the host
     * emulation, where 1024 alone takes nine tenths of the suite's time */
    int emulated = strstr(dt_backend_device(gpu), "emulation") != NULL;
    attention_case(1, emulated ? 256 : 1024, 2, 64, 1);
    printf("\n");
}

/* Decoding with a key/value cache: the first `pre` positions at once,
 * then one at a time; each new row's output against the reference's
 * causal attention over the whole sequence. */
static void decode_case(int T, int H, int Dh, int pre)
{
    CU_ASSERT_PTR_NOT_NULL_FATAL(ops->attention_decode);
    const size_t C = (size_t)H * Dh, nq = (size_t)T * 3 * C, no = (size_t)T * C;
    float *qkv = hrand(nq, -2.0f, 2.0f), *dout = hrand(no, -1.0f, 1.0f);
    double *r_out = malloc(no * sizeof *r_out), *r_lse = malloc((size_t)H * T * sizeof *r_lse);
    double *r_dqkv = malloc(nq * sizeof *r_dqkv);
    CU_ASSERT_FATAL(r_out && r_lse && r_dqkv);
    attention_ref(1, T, H, Dh, 1, qkv, dout, r_out, r_lse, r_dqkv);
    float *d_qkv = dput(qkv, nq), *d_out = dput(dout, no), *d_k = dput(dout, no);
    float *d_v = dput(dout, no), *out = hnew(no);
    OK(ops->attention_decode(gpu, d_out, d_k, d_v, d_qkv, 0, pre, T, H, Dh));
    float *got = hget(d_out, (size_t)pre * C);
    memcpy(out, got, (size_t)pre * C * sizeof *out);
    free(got);
    for (int t = pre; t < T; t++) {
        OK(ops->attention_decode(gpu, d_out, d_k, d_v, d_qkv + (size_t)t * 3 * C, t, 1, T, H, Dh));
        got = hget(d_out, C);
        memcpy(out + (size_t)t * C, got, C * sizeof *out);
        free(got);
    }
    const double e = rel_err(out, r_out, no);
    printf("\n  decode T=%d H=%d Dh=%d, %d at once: out %.2g", T, H, Dh, pre, e);
    CU_ASSERT(e <= ATT_TOL);
    CHECK_FAILS(ops->attention_decode(gpu, d_out, d_k, d_v, d_qkv, T - 1, 2, T, H, Dh),
                DT_ERR_INVALID_ARG, "inside the cache");
    dt_backend_free(gpu, d_qkv);
    dt_backend_free(gpu, d_out);
    dt_backend_free(gpu, d_k);
    dt_backend_free(gpu, d_v);
    free(qkv);
    free(dout);
    free(out);
    free(r_out);
    free(r_lse);
    free(r_dqkv);
}

static void test_attention_decode(void)
{
    decode_case(1, 1, 5, 1);
    decode_case(37, 2, 24, 5);
    decode_case(20, 1, 128, 20);
    /* more keys than one tile of scores (1024) */
    decode_case(1030, 1, 8, 1010);
    printf("\n");
}

static void test_attention_refusals(void)
{
    size_t bytes = 0;
    void *buf = NULL;
    const int B = 1, T = 8, H = 1;
    OK(dt_backend_alloc(gpu, (size_t)B * T * 3 * H * 129 * sizeof(float), &buf));
    float *f = buf;
    CHECK_FAILS(ops->attention_workspace(gpu, B, T, H, 129, 1, &bytes), DT_ERR_UNSUPPORTED,
                "Dh=129");
    CHECK_FAILS(ops->attention_fwd(gpu, f, f, f, B, T, H, 129, 1, f, 1 << 20), DT_ERR_UNSUPPORTED,
                "Dh=129");
    CHECK_FAILS(ops->attention_bwd(gpu, f, f, f, f, f, B, T, H, 129, 1, f, 1 << 20),
                DT_ERR_UNSUPPORTED, "Dh=129");
    CHECK_FAILS(ops->attention_workspace(gpu, B, T, H, 64, 2, &bytes), DT_ERR_INVALID_ARG,
                "causal");
    CHECK_FAILS(ops->attention_workspace(gpu, B, 0, H, 64, 1, &bytes), DT_ERR_INVALID_ARG,
                "attention_workspace");
    OK(ops->attention_workspace(gpu, B, T, H, 64, 1, &bytes));
    CU_ASSERT(bytes > 0);
    CHECK_FAILS(ops->attention_bwd(gpu, f, f, f, f, f, B, T, H, 64, 1, f, bytes - 1),
                DT_ERR_INVALID_ARG, "workspace");
    CHECK_FAILS(ops->attention_fwd(gpu, f, f, f, B, T, H, 64, 1, NULL, 0), DT_ERR_INVALID_ARG,
                "workspace");
    dt_backend_free(gpu, buf);
}

int main(void)
{
    char why[512];
    if (!dt_cuda_usable(why, sizeof why)) {
        printf("test_gpu_attention: SKIPPED: %s\n", why);
        return SKIP_CODE;
    }
    printf("test_gpu_attention: %s\n", why);
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite("cuda_attention", suite_init, suite_cleanup);
    CU_ADD(s, test_embedding);
    CU_ADD(s, test_embedding_bad_ids);
    CU_ADD(s, test_attention_vs_ref);
    CU_ADD(s, test_attention_refusals);
    CU_ADD(s, test_attention_decode);
    return cu_run_all();
}
