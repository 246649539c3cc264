/*
 * generate.h - text from a trained language model (`dtrain generate`).
 *
 * The job's model is built for one row and gets the parameters of a
 * checkpoint; the job's dataset names the vocabulary and the tokenizer:
 * bytes (token id = UTF-8 byte), or GPT-2's byte-level BPE from the copy
 * of vocab.json and merges.txt a dataset imported with --tokenizer keeps
 * (or from a directory the caller names). Each new token is drawn from the
 * model's next-token probabilities at the last position of the window,
 * after a temperature and a top-k cut. The window is the whole context
 * while it fits in data.seq_len tokens; once a context outgrows it, the
 * window moves on to the context's last seq_len/2 tokens (the cache is
 * filled again from them), so with or without the key/value cache the
 * model sees the same tokens at the same positions. The draw is keyed by (seed, DT_RNG_SAMPLE,
 * token number), so one seed gives one text on any machine that computes
 * the same probabilities.
 */
#ifndef DT_GENERATE_H
#define DT_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/comm.h"
#include "runtime/config/config.h"
#include "core/status.h"

struct dt_generate_opts {
    const char *checkpoint; /* a checkpoint file (as dtrain eval --checkpoint takes), or a
                               run's model.h5 */
    const char *prompt;     /* its bytes are the first tokens; "" starts from a newline */
    size_t prompt_len;
    int64_t tokens;     /* new tokens to generate (>= 0) */
    double temperature; /* > 0; 0 takes the most likely token (greedy) */
    int64_t top_k;      /* draw among the k most likely tokens; 0: all */
    uint64_t seed;
    int no_cache;          /* 1: a full forward of the window per token */
    const char *tokenizer; /* NULL, or a directory with vocab.json and merges.txt */
    /* Receives the prompt once the model is ready, then each new token's
     * bytes as it is drawn; a non-OK status stops the generation. */
    dt_status (*emit)(void *ctx, const char *bytes, size_t n);
    void *ctx;
};

/* Generates o->tokens tokens after the prompt. comm must have one rank
 * (DT_ERR_USAGE otherwise). Errors: DT_ERR_USAGE for a model that is not a
 * causal language model, bad options, or a dataset whose tokenizer has no
 * files to be found; the tokenizer files' errors (DT_ERR_BAD_DATA,
 * DT_ERR_NOT_FOUND); the checkpoint's own errors (DT_ERR_NOT_FOUND for a
 * missing file, DT_ERR_BAD_DATA for one of another model). */
dt_status dt_generate_run(const struct dt_job *job, dt_comm_t *comm,
                          const struct dt_generate_opts *o);

/* Picks the next token from probs[0..n) (probabilities, need not sum to
 * one): with temperature 0 the first most likely; otherwise each weight is
 * p^(1/temperature) (in double, through logs), only the top_k largest are
 * kept (0: all; ties at the cut go to the lower ids), and one draw of
 * (seed, DT_RNG_SAMPLE, index) picks among them in id order. work holds
 * 2 n doubles. DT_ERR_BAD_DATA when a probability is not finite or none is
 * positive. */
dt_status dt_generate_pick(const float *probs, int64_t n, double temperature, int64_t top_k,
                           uint64_t seed, uint64_t index, double *work, int64_t *out);

#endif
