/*
 * generate.c - text from a trained language model (see generate.h).
 *
 * The model comes from runtime/train/infer.h (the evaluation's start-up
 * and checkpoint checks, without the training loop's state), from a
 * checkpoint or a run's model.h5. The prompt runs through the model once,
 * filling each attention layer's key/value cache (dt_model_decode), and
 * each new token then runs one position. A model with a layer that cannot
 * decode position by position, or --no-cache, runs the whole window for
 * each token instead; both follow the same window (slide()), so both draw
 * the same tokens from the same probabilities, to float rounding.
 * Tokens are bytes, or the byte-pair tokenizer's (io/bpe.h) the dataset
 * was imported with.
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
#include "io/bpe.h"
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
    if (o->tokens < 0 || !(o->temperature >= 0) || o->top_k < 0)
        return dt_set_error(DT_ERR_USAGE,
                            "generate: tokens (%lld), temperature (%g) and top-k (%lld) must not "
                            "be negative",
                            (long long)o->tokens, o->temperature, (long long)o->top_k);
    return DT_OK;
}

/* The tokenizer: none for byte datasets; the byte-pair tokenizer of
 * --tokenizer DIR, else the copy a dataset imported with one keeps. */
static dt_status open_tokenizer(const struct dt_dataset_info *info,
                                const struct dt_generate_opts *o, dt_bpe_t **bpe)
{
    *bpe = NULL;
    if (!o->tokenizer && strcmp(info->tokenizer, "byte") == 0)
        return DT_OK;
    if (o->tokenizer)
        return dt_bpe_load_dir(o->tokenizer, bpe);
    dt_status st = dt_bpe_load_dataset(info->path, bpe);
    if (st == DT_ERR_NOT_FOUND)
        return dt_set_error(DT_ERR_USAGE,
                            "dataset %s (data.path) uses tokenizer '%s' and keeps no copy of its "
                            "files; give its vocab.json and merges.txt with --tokenizer DIR (for "
                            "GPT-2 tokens: a Hugging Face GPT-2 directory)",
                            info->path, info->tokenizer);
    return st;
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
    int32_t *ctx;   /* every token so far */
    int64_t len;    /* tokens in ctx */
    int64_t start;  /* the window: ctx[start..len) */
    int64_t cached; /* window tokens the key/value cache holds; -1: no cache */
    int begun;      /* a token was drawn: the window now slides by halves */
    float *x, *probs;
    int32_t *y;
    double *work;
    dt_bpe_t *bpe; /* NULL: token id = byte */
};

static dt_status gen_alloc(struct gen *g, const dt_infer_t *in, const struct dt_generate_opts *o,
                           size_t prompt_tokens)
{
    dt_status st;
    size_t cap = prompt_tokens + 1 + (size_t)o->tokens;
    dt_model_t *model = dt_infer_model(in);
    g->seq_len = dt_model_input_numel(model);
    /* the probabilities the model outputs per position: its classes */
    g->vocab = dt_infer_vocab(in);
    g->draw_from = dt_infer_dataset(in)->vocab_size;
    int64_t decodable = g->bpe ? dt_bpe_vocab_size(g->bpe) : BYTE_VOCAB;
    if (g->draw_from > decodable)
        g->draw_from = decodable;
    if (g->draw_from > g->vocab)
        g->draw_from = g->vocab;
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

/* The window for the next prediction: the whole context while it fits in
 * seq_len tokens (a longer prompt: its last seq_len); once generation has
 * begun, a context that outgrows the window moves it on to its last
 * seq_len/2 tokens, which the cache then runs again from position 0. */
static void slide(struct gen *g)
{
    if (g->len - g->start <= g->seq_len)
        return;
    int64_t keep = g->begun ? (g->seq_len / 2 > 0 ? g->seq_len / 2 : 1) : g->seq_len;
    g->start = g->len - keep;
    g->cached = g->cached < 0 ? -1 : 0;
}

/* The next-token probabilities after the window: the window's new tokens
 * through the cache, or the whole window through the model. */
static dt_status predict(dt_model_t *model, struct gen *g, const struct dt_generate_opts *o,
                         const float **p)
{
    int64_t n = g->len - g->start;
    dt_status st;
    if (g->cached >= 0) {
        int64_t k = n - g->cached;
        for (int64_t i = 0; i < k; i++)
            g->x[i] = (float)g->ctx[g->start + g->cached + i];
        st = dt_model_decode(model, g->x, k, g->cached, g->probs);
        g->cached = n;
        *p = g->probs;
        return st;
    }
    double loss = 0;
    int64_t correct = 0;
    for (int64_t i = 0; i < g->seq_len; i++)
        g->x[i] = i < n ? (float)g->ctx[g->start + i] : 0.0f; /* right-padded with token 0 */
    st = dt_model_forward(model, g->x, g->y, 1, 0, o->seed, 0, 0, &loss, &correct);
    if (st == DT_OK)
        st = dt_model_get_output(model, g->probs);
    *p = g->probs + (n - 1) * g->vocab;
    return st;
}

/* The bytes token id stands for. */
static dt_status emit_token(struct gen *g, const struct dt_generate_opts *o, int64_t id)
{
    if (!g->bpe) {
        char byte = (char)(unsigned char)id;
        return o->emit(o->ctx, &byte, 1);
    }
    const char *bytes;
    size_t n = dt_bpe_token_bytes(g->bpe, (int32_t)id, &bytes);
    return n ? o->emit(o->ctx, bytes, n) : DT_OK;
}

/* The prompt's tokens into g->ctx (an empty prompt: a newline, or the
 * tokenizer's <|endoftext|>). */
static dt_status encode_prompt(struct gen *g, const struct dt_generate_opts *o)
{
    dt_status st = DT_OK;
    if (!g->bpe) {
        for (size_t i = 0; i < o->prompt_len; i++)
            g->ctx[g->len++] = (unsigned char)o->prompt[i];
        if (g->len == 0)
            g->ctx[g->len++] = '\n';
        return DT_OK;
    }
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    if (o->prompt_len)
        DT_CHECK(dt_bpe_encode(g->bpe, o->prompt, o->prompt_len, &ids, &n, &cap));
    for (size_t i = 0; i < n; i++)
        g->ctx[g->len++] = ids[i];
    if (g->len == 0) {
        int32_t eot = dt_bpe_eot(g->bpe);
        if (eot >= 0)
            g->ctx[g->len++] = eot;
        else {
            DT_CHECK(dt_bpe_encode(g->bpe, "\n", 1, &ids, &n, &cap));
            g->ctx[g->len++] = ids[0];
        }
    }
out:
    free(ids);
    return st;
}

static dt_status generate(const dt_infer_t *in, const struct dt_generate_opts *o, dt_bpe_t *bpe)
{
    struct gen g = {.bpe = bpe};
    dt_status st;
    dt_model_t *model = dt_infer_model(in);
    size_t prompt_tokens = o->prompt_len + 1; /* BPE never gives more tokens than bytes */
    DT_CHECK(gen_alloc(&g, in, o, prompt_tokens));
    DT_CHECK(encode_prompt(&g, o));
    for (int64_t i = 0; i < g.len; i++)
        if (g.ctx[i] >= g.vocab) {
            st = dt_set_error(DT_ERR_USAGE,
                              "the prompt's token %lld (id %d) is not below the model's "
                              "vocabulary of %lld: the tokenizer does not fit the model",
                              (long long)i, g.ctx[i], (long long)g.vocab);
            goto out;
        }
    g.cached = -1;
    if (!o->no_cache) {
        st = dt_model_decode_open(model);
        if (st == DT_OK)
            g.cached = 0;
        else if (st == DT_ERR_USAGE)
            DT_LOG_INFO("generate", "without a key/value cache: %s", dt_last_error());
        else
            goto out;
    }
    if (o->prompt_len > 0)
        DT_CHECK(o->emit(o->ctx, o->prompt, o->prompt_len));
    double t0 = dt_now();
    for (int64_t k = 0; k < o->tokens; k++) {
        int64_t tok;
        const float *p;
        slide(&g);
        DT_CHECK(predict(model, &g, o, &p));
        DT_CHECK(dt_generate_pick(p, g.draw_from, o->temperature, o->top_k, o->seed, (uint64_t)k,
                                  g.work, &tok));
        g.ctx[g.len++] = (int32_t)tok;
        g.begun = 1;
        DT_CHECK(emit_token(&g, o, tok));
    }
    double s = dt_now() - t0;
    DT_LOG_INFO("generate",
                "%lld tokens in %.2f s (%.1f tokens/s), window %lld, %s, temperature %g%s",
                (long long)o->tokens, s, s > 0 ? (double)o->tokens / s : 0.0, (long long)g.seq_len,
                g.cached >= 0 ? "key/value cache" : "a full forward per token", o->temperature,
                o->temperature == 0 ? " (greedy)" : "");
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
    dt_bpe_t *bpe = NULL;
    DT_CHECK(dt_infer_open(job, comm, &in));
    DT_CHECK(check_job(dt_infer_dataset(in), o));
    DT_CHECK(open_tokenizer(dt_infer_dataset(in), o, &bpe));
    DT_CHECK(check_causal(job));
    DT_CHECK(dt_infer_load(in, o->checkpoint));
    DT_CHECK(generate(in, o, bpe));
out:
    dt_bpe_free(bpe);
    dt_infer_close(in, st);
    return st;
}
