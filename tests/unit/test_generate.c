/*
 * test_generate.c - text generation's pieces on the CPU: the pick of the
 * next token (greedy, temperature, top-k and its ties, the same draw for
 * the same seed and token number, the frequencies it draws with, refused
 * probabilities), and the reason a short context may be right-padded: in a
 * causal GPT model the tokens after a position do not change the
 * probabilities at it (bit for bit), while without the causal mask they do
 * (so the comparison can fail).
 */
#include <string.h>

#include "kernels/backend.h"
#include "runtime/config/config.h"
#include "core/rng.h"
#include "runtime/generate/generate.h"
#include "runtime/model/model.h"
#include "cu_util.h"

#define SEQ 16
#define VOCAB 256
#define REAL 5 /* real tokens before the padding */
#define DRAWS 40000

static dt_backend_t *be;

static void test_greedy(void)
{
    const float p[5] = {0.1f, 0.3f, 0.05f, 0.3f, 0.25f};
    double work[10];
    int64_t tok = -1;
    for (uint64_t seed = 0; seed < 4; seed++) {
        CU_ASSERT_EQUAL(dt_generate_pick(p, 5, 0.0, 0, seed, seed * 7, work, &tok), DT_OK);
        CU_ASSERT_EQUAL(tok, 1); /* the first of the two most likely */
    }
    /* top-k 1 is greedy at any temperature */
    for (uint64_t i = 0; i < 50; i++) {
        CU_ASSERT_EQUAL(dt_generate_pick(p, 5, 2.0, 1, 3, i, work, &tok), DT_OK);
        CU_ASSERT_EQUAL(tok, 1);
    }
}

/* Frequencies of DRAWS draws (token numbers 0..DRAWS-1) against want. */
static void check_frequencies(const float *p, int n, double t, int64_t k, const double *want)
{
    double work[16];
    int count[8] = {0};
    for (uint64_t i = 0; i < DRAWS; i++) {
        int64_t tok = -1;
        CU_ASSERT_EQUAL_FATAL(dt_generate_pick(p, n, t, k, 11, i, work, &tok), DT_OK);
        CU_ASSERT_FATAL(tok >= 0 && tok < n);
        count[tok]++;
    }
    for (int i = 0; i < n; i++) {
        double f = (double)count[i] / DRAWS;
        if (fabs(f - want[i]) > 0.01)
            printf("\n  T=%g k=%lld token %d: drawn %.4f, expected %.4f\n", t, (long long)k, i, f,
                   want[i]);
        CU_ASSERT(fabs(f - want[i]) <= 0.01);
    }
}

static void test_temperature_and_top_k(void)
{
    const float p[4] = {0.5f, 0.25f, 0.25f, 0.0f};
    const double t1[4] = {0.5, 0.25, 0.25, 0};
    const double t_half[4] = {4.0 / 6, 1.0 / 6, 1.0 / 6, 0}; /* p^2, normalised */
    double s = sqrt(0.5) + 2 * sqrt(0.25);
    const double t_two[4] = {sqrt(0.5) / s, 0.5 / s, 0.5 / s, 0}; /* sqrt(p), normalised */
    check_frequencies(p, 4, 1.0, 0, t1);
    check_frequencies(p, 4, 0.5, 0, t_half);
    check_frequencies(p, 4, 2.0, 0, t_two);
    /* top-2 of a tie at the cut keeps the lower id: 0.5 and the first 0.25 */
    const double k2[4] = {0.5 / 0.75, 0.25 / 0.75, 0, 0};
    check_frequencies(p, 4, 1.0, 2, k2);
    /* k at or above the vocabulary keeps everything */
    check_frequencies(p, 4, 1.0, 4, t1);
    check_frequencies(p, 4, 1.0, 9, t1);
}

static void test_same_draws(void)
{
    float p[VOCAB];
    double work[2 * VOCAB];
    for (int i = 0; i < VOCAB; i++)
        p[i] = 1.0f / VOCAB;
    int differ_seed = 0, differ_index = 0;
    for (uint64_t i = 0; i < 64; i++) {
        int64_t a, b, c, d;
        dt_generate_pick(p, VOCAB, 0.8, 0, 5, i, work, &a);
        dt_generate_pick(p, VOCAB, 0.8, 0, 5, i, work, &b);
        dt_generate_pick(p, VOCAB, 0.8, 0, 6, i, work, &c);
        dt_generate_pick(p, VOCAB, 0.8, 0, 5, i + 1, work, &d);
        CU_ASSERT_EQUAL(a, b);
        differ_seed += a != c;
        differ_index += a != d;
    }
    CU_ASSERT(differ_seed > 48); /* uniform over 256: another key rarely agrees */
    CU_ASSERT(differ_index > 48);
}

static void test_refused(void)
{
    const float nan_p[3] = {0.5f, NAN, 0.5f}, zero[3] = {0, 0, 0};
    double work[6];
    int64_t tok;
    CU_ASSERT_EQUAL(dt_generate_pick(nan_p, 3, 1.0, 0, 0, 0, work, &tok), DT_ERR_BAD_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "token 1"));
    CU_ASSERT_EQUAL(dt_generate_pick(zero, 3, 0.0, 0, 0, 0, work, &tok), DT_ERR_BAD_DATA);
    CU_ASSERT_EQUAL(dt_generate_pick(zero, 3, 1.0, 0, 0, 0, work, &tok), DT_ERR_BAD_DATA);
}

/* A small GPT, or with causal "false" the same layers without the mask. */
static dt_status lm_model(const char *causal, dt_model_t **m)
{
    static struct dt_job job;
    char text[2048];
    if (!causal)
        snprintf(text, sizeof text,
                 "model:\n  type: gpt\n  n_layer: 2\n  n_head: 2\n  n_embd: 16\n"
                 "data:\n  seq_len: %d\n",
                 SEQ);
    else
        snprintf(text, sizeof text,
                 "model:\n  type: layers\n  layers:\n"
                 "    - {name: wte, kind: embedding, dim: 16}\n"
                 "    - {name: wpe, kind: pos_embedding}\n"
                 "    - {name: ln, kind: layernorm}\n"
                 "    - {name: qkv, kind: linear, out: 48}\n"
                 "    - {name: attn, kind: attention, heads: 2, causal: %s}\n"
                 "    - {name: head, kind: linear, out: classes}\n"
                 "    - {name: loss, kind: softmax_xent}\n"
                 "data:\n  seq_len: %d\n",
                 causal, SEQ);
    dt_status st = dt_job_load_text("test.yaml", text, &job);
    if (st == DT_OK)
        st = dt_job_validate(&job);
    struct dt_model_io io = {.ndim = 1, .shape = {SEQ}, .num_classes = VOCAB};
    *m = NULL;
    if (st == DT_OK)
        st = dt_model_create(&job, &io, be, 1, m);
    if (st == DT_OK)
        st = dt_model_init_params(*m, 3);
    return st;
}

/* Largest difference at the first REAL positions between a window padded
 * with token 0 and one whose tail is other tokens. */
static double padding_effect(dt_model_t *m)
{
    static float a[SEQ * VOCAB], b[SEQ * VOCAB];
    float x[SEQ];
    int32_t y[SEQ] = {0};
    double loss = 0, worst = 0;
    int64_t correct = 0;
    struct dt_rng_key k = {.seed = 9, .purpose = DT_RNG_TEST};
    for (int i = 0; i < SEQ; i++)
        x[i] = i < REAL ? (float)(100 + i) : 0.0f;
    CU_ASSERT_EQUAL(dt_model_forward(m, x, y, 1, 0, 0, 0, 0, &loss, &correct), DT_OK);
    CU_ASSERT_EQUAL(dt_model_get_output(m, a), DT_OK);
    for (int i = REAL; i < SEQ; i++)
        x[i] = (float)dt_rng_below(&k, (uint64_t)i, VOCAB);
    CU_ASSERT_EQUAL(dt_model_forward(m, x, y, 1, 0, 0, 0, 0, &loss, &correct), DT_OK);
    CU_ASSERT_EQUAL(dt_model_get_output(m, b), DT_OK);
    for (int i = 0; i < REAL * VOCAB; i++)
        if (fabs((double)a[i] - b[i]) > worst)
            worst = fabs((double)a[i] - b[i]);
    return worst;
}

static void test_padding(void)
{
    dt_model_t *m = NULL;
    CU_ASSERT_EQUAL_FATAL(lm_model(NULL, &m), DT_OK);
    CU_ASSERT_EQUAL(padding_effect(m), 0.0);
    dt_model_destroy(m);
    CU_ASSERT_EQUAL_FATAL(lm_model("true", &m), DT_OK);
    CU_ASSERT_EQUAL(padding_effect(m), 0.0);
    dt_model_destroy(m);
    CU_ASSERT_EQUAL_FATAL(lm_model("false", &m), DT_OK);
    CU_ASSERT(padding_effect(m) > 1e-6); /* without the mask, later tokens are seen */
    dt_model_destroy(m);
}

int main(void)
{
    struct dt_backend_opts bo = {.threads = 1};
    if (dt_backend_create("cpu", &bo, &be) != DT_OK) {
        fprintf(stderr, "cannot create the cpu backend: %s\n", dt_last_error());
        return 1;
    }
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("generate", NULL, NULL);
    CU_ADD(s, test_greedy);
    CU_ADD(s, test_temperature_and_top_k);
    CU_ADD(s, test_same_draws);
    CU_ADD(s, test_refused);
    CU_ADD(s, test_padding);
    int rc = cu_run_all();
    dt_backend_destroy(be);
    return rc;
}
