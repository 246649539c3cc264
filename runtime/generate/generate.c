/*
 * generate.c - text from a trained language model (see generate.h).
 *
 * The model comes from runtime/train/infer.h (the evaluation's start-up
 * and checkpoint checks, without the training loop's state), from a
 * checkpoint or a run's model.h5. Each token is one full forward of the
 * context window: the model keeps no cache between calls, which keeps it
 * the same model that trains, at the cost of recomputing the window (small
 * at the sequence lengths dtrain trains on the CPU).
 *
 * The pick is a pure function of the probabilities and (seed, token
 * number): weights p^(1/T) as exp((log p - log p_max) / T) in double, the
 * top-k cut by sorting a copy, then one 53-bit uniform draw walked along
 * the cumulative weights in id order.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/rng.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "generate.h"
#include "runtime/train/infer.h"

/* The ids a byte tokenizer can decode. */
#define BYTE_VOCAB 256

static int desc_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Uniform double in [0, 1) from 53 bits of one Philox block. */
static double uniform53(uint64_t seed, uint64_t index)
{
    struct dt_rng_key key = {.seed = seed, .purpose = DT_RNG_SAMPLE, .stream = 0, .step = 0};
    uint32_t w[4];
    dt_rng_block(&key, index, 0, w);
    uint64_t bits = ((uint64_t)(w[0] >> 5) << 26) | (uint64_t)(w[1] >> 6);
    return (double)bits * (1.0 / 9007199254740992.0);
}

static int64_t argmax(const float *p, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (p[i] > p[best])
            best = i;
    return best;
}

/* Zeroes all but the k largest weights (ties at the cut: lower ids kept). */
static void keep_top_k(double *w, double *sorted, int64_t n, int64_t k)
{
    memcpy(sorted, w, (size_t)n * sizeof *w);
    qsort(sorted, (size_t)n, sizeof *sorted, desc_double);
    double cut = sorted[k - 1];
    int64_t above = 0;
    for (int64_t i = 0; i < n; i++)
        above += w[i] > cut;
    int64_t equal_left = k - above;
    for (int64_t i = 0; i < n; i++) {
        if (w[i] > cut)
            continue;
        if (w[i] == cut && equal_left > 0)
            equal_left--;
        else
            w[i] = 0;
    }
}

dt_status dt_generate_pick(const float *probs, int64_t n, double temperature, int64_t top_k,
                           uint64_t seed, uint64_t index, double *work, int64_t *out)
{
    double top = -INFINITY, total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(probs[i]))
            return dt_set_error(DT_ERR_BAD_DATA,
                                "the model's probability of token %lld is %g: the parameters are "
                                "not usable (the run that wrote them diverged)",
                                (long long)i, (double)probs[i]);
        work[i] = probs[i] > 0 ? log((double)probs[i]) : -INFINITY;
        if (work[i] > top)
            top = work[i];
    }
    if (top == -INFINITY)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "the model gives every one of the %lld tokens a "
                            "probability of zero: nothing to draw from",
                            (long long)n);
    if (temperature == 0) {
        *out = argmax(probs, n);
        return DT_OK;
    }
    for (int64_t i = 0; i < n; i++)
        work[i] = exp((work[i] - top) / temperature); /* exp(-inf) = 0 */
    if (top_k > 0 && top_k < n)
        keep_top_k(work, work + n, n, top_k);
    for (int64_t i = 0; i < n; i++)
        total += work[i];
    double u = uniform53(seed, index) * total, cum = 0;
    int64_t last = 0;
    for (int64_t i = 0; i < n; i++) {
        if (work[i] <= 0)
            continue;
        last = i;
        cum += work[i];
        if (u < cum)
            break;
    }
    *out = last; /* the last positive weight also takes what rounding left past the sum */
    return DT_OK;
}

/* Refuses what this generator cannot do with the job's dataset and model. */
static dt_status check_job(const struct dt_dataset_info *info, const struct dt_generate_opts *o)
{
    if (!info->lm)
        return dt_set_error(DT_ERR_USAGE,
                            "dataset %s (data.path) holds classification samples; dtrain "
                            "generate needs a language model trained on a token dataset",
                            info->path);
    if (strcmp(info->tokenizer, "byte") != 0)
        return dt_set_error(DT_ERR_USAGE,
                            "dataset %s (data.path) uses tokenizer '%s', which dtrain cannot "
                            "encode or decode (it has no GPT-2 byte-pair encoder); dtrain generate "
                            "works with byte-tokenized datasets ('dtrain data import text')",
                            info->path, info->tokenizer);
    if (o->tokens < 0 || !(o->temperature >= 0) || o->top_k < 0)
        return dt_set_error(DT_ERR_USAGE,
                            "generate: tokens (%lld), temperature (%g) and top-k (%lld) must not "
                            "be negative",
                            (long long)o->tokens, o->temperature, (long long)o->top_k);
    return DT_OK;
}

/* Right-padding is only harmless when no position sees a later one. */
static dt_status check_causal(const struct dt_job *job)
{
    struct dt_layer_spec *l = NULL;
    int n = 0;
    dt_status st;
    DT_CHECK(dt_calloc(DT_MODEL_MAX_LAYERS, sizeof *l, "the layer list", (void **)&l));
    DT_CHECK(dt_model_expand(job, l, DT_MODEL_MAX_LAYERS, &n));
    for (int i = 0; i < n; i++) {
        if (strcmp(l[i].kind, "attention") != 0)
            continue;
        for (int a = 0; a < l[i].nargs; a++) {
            const char *v = l[i].args[a].value;
            if (strcmp(l[i].args[a].key, "causal") == 0 &&
                (!strcmp(v, "false") || !strcmp(v, "False") || !strcmp(v, "no"))) {
                st = dt_set_error(DT_ERR_USAGE,
                                  "model layer '%s' is attention with causal: false; dtrain "
                                  "generate needs a causal model (each position sees only "
                                  "earlier ones)",
                                  l[i].name);
                goto out;
            }
        }
    }
out:
    free(l);
    return st;
}

struct gen {
    int64_t seq_len, vocab, draw_from;
    int32_t *ctx; /* every token so far */
    int64_t len;
    float *x, *probs;
    int32_t *y;
    double *work;
};

static dt_status gen_alloc(struct gen *g, const dt_infer_t *in, const struct dt_generate_opts *o)
{
    dt_status st;
    size_t cap = o->prompt_len + 1 + (size_t)o->tokens;
    dt_model_t *model = dt_infer_model(in);
    g->seq_len = dt_model_input_numel(model);
    /* the probabilities the model outputs per position: its classes */
    g->vocab = dt_infer_vocab(in);
    g->draw_from = dt_infer_dataset(in)->vocab_size;
    if (g->draw_from > BYTE_VOCAB)
        g->draw_from = BYTE_VOCAB;
    if (dt_model_labels_per_row(model) != g->seq_len)
        return dt_set_error(DT_ERR_USAGE,
                            "the job's model does not predict a token at each of its %lld "
                            "positions; dtrain generate needs a language model (model.type gpt)",
                            (long long)g->seq_len);
    DT_CHECK(dt_malloc(cap * sizeof *g->ctx, "the generated tokens", (void **)&g->ctx));
    DT_CHECK(dt_malloc((size_t)g->seq_len * sizeof *g->x, "the model input", (void **)&g->x));
    DT_CHECK(dt_calloc((size_t)g->seq_len, sizeof *g->y, "the model labels", (void **)&g->y));
    DT_CHECK(dt_malloc((size_t)(g->seq_len * g->vocab) * sizeof *g->probs,
                       "the model's probabilities", (void **)&g->probs));
    DT_CHECK(dt_malloc((size_t)(2 * g->vocab) * sizeof *g->work, "the sampling weights",
                       (void **)&g->work));
out:
    return st;
}

static void gen_free(struct gen *g)
{
    free(g->ctx);
    free(g->x);
    free(g->y);
    free(g->probs);
    free(g->work);
}

/* One new token from the last seq_len tokens of the context. */
static dt_status next_token(dt_model_t *model, struct gen *g, const struct dt_generate_opts *o,
                            uint64_t index, int64_t *tok)
{
    int64_t n = g->len < g->seq_len ? g->len : g->seq_len, first = g->len - n;
    double loss = 0;
    int64_t correct = 0;
    for (int64_t i = 0; i < g->seq_len; i++)
        g->x[i] = i < n ? (float)g->ctx[first + i] : 0.0f; /* right-padded with token 0 */
    dt_status st = dt_model_forward(model, g->x, g->y, 1, 0, o->seed, 0, 0, &loss, &correct);
    if (st == DT_OK) st = dt_model_get_output(model, g->probs);
    if (st == DT_OK)
        st = dt_generate_pick(g->probs + (n - 1) * g->vocab, g->draw_from, o->temperature, o->top_k,
                              o->seed, index, g->work, tok);
    return st;
}

static dt_status generate(const dt_infer_t *in, const struct dt_generate_opts *o)
{
    struct gen g = {0};
    dt_status st;
    DT_CHECK(gen_alloc(&g, in, o));
    for (size_t i = 0; i < o->prompt_len; i++)
        g.ctx[g.len++] = (unsigned char)o->prompt[i];
    if (g.len == 0)
        g.ctx[g.len++] = '\n';
    if (o->prompt_len > 0)
        DT_CHECK(o->emit(o->ctx, o->prompt, o->prompt_len));
    double t0 = dt_now();
    for (int64_t k = 0; k < o->tokens; k++) {
        int64_t tok;
        DT_CHECK(next_token(dt_infer_model(in), &g, o, (uint64_t)k, &tok));
        g.ctx[g.len++] = (int32_t)tok;
        char byte = (char)(unsigned char)tok;
        DT_CHECK(o->emit(o->ctx, &byte, 1));
    }
    double s = dt_now() - t0;
    DT_LOG_INFO("generate", "%lld tokens in %.2f s (%.1f tokens/s), window %lld, temperature %g%s",
                (long long)o->tokens, s, s > 0 ? (double)o->tokens / s : 0.0, (long long)g.seq_len,
                o->temperature, o->temperature == 0 ? " (greedy)" : "");
out:
    gen_free(&g);
    return st;
}

dt_status dt_generate_run(const struct dt_job *job, dt_comm_t *comm,
                          const struct dt_generate_opts *o)
{
    dt_status st;
    dt_infer_t *in = NULL;
    int world = dt_comm_size(comm);
    if (world != 1)
        return dt_set_error(DT_ERR_USAGE,
                            "dtrain generate runs on one rank, but it was started as %d ranks "
                            "(mpirun -np %d); run it without mpirun, or with -np 1",
                            world, world);
    DT_CHECK(dt_infer_open(job, comm, &in));
    DT_CHECK(check_job(dt_infer_dataset(in), o));
    DT_CHECK(check_causal(job));
    DT_CHECK(dt_infer_load(in, o->checkpoint));
    DT_CHECK(generate(in, o));
out:
    dt_infer_close(in, st);
    return st;
}
