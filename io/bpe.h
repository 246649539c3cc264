/*
 * bpe.h - GPT-2's byte-level byte-pair encoding, from a vocab.json (token
 * string -> id) and a merges.txt (one merge "A B" per line, in rank
 * order), as OpenAI's GPT-2 encoder and Hugging Face tokenizers'
 * ByteLevel BPE (add_prefix_space false) compute it:
 *
 * - special tokens: every vocabulary entry of the form <|...|> (GPT-2's
 *   <|endoftext|>) found in the text is that token, before anything else;
 * - the rest is cut into pre-tokens by GPT-2's pattern
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   (letters and numbers by their Unicode general category, from utf8proc;
 *   \s is Unicode's White_Space); a byte that is not part of valid UTF-8
 *   counts as a character that is neither (it joins a run of punctuation);
 * - each pre-token's bytes become the symbols of GPT-2's byte-to-unicode
 *   table, and adjacent symbols are merged, lowest merge rank first
 *   (leftmost on ties), until no listed merge applies.
 * Decoding maps each token back through the table to the bytes it stands
 * for, so decode(encode(x)) == x for any bytes x.
 */
#ifndef DT_IO_BPE_H
#define DT_IO_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct dt_bpe dt_bpe_t;

/* DIR/vocab.json and DIR/merges.txt. DT_ERR_NOT_FOUND for a missing file,
 * DT_ERR_BAD_DATA (naming the file, the line or token, and what was
 * expected) for a malformed one. */
dt_status dt_bpe_load_dir(const char *dir, dt_bpe_t **out);
/* The same from the files' contents; `what` names their source in
 * messages ("dataset d.h5"). */
dt_status dt_bpe_load_mem(const char *vocab, size_t vlen, const char *merges, size_t mlen,
                          const char *what, dt_bpe_t **out);
/* The copy of the tokenizer's files a token dataset imported with
 * --tokenizer keeps (io/lm_import.h); DT_ERR_NOT_FOUND when it keeps none. */
dt_status dt_bpe_load_dataset(const char *h5path, dt_bpe_t **out);

/* The files it was loaded from (their bytes, kept by the tokenizer). */
void dt_bpe_files(const dt_bpe_t *b, const char **vocab, size_t *vlen, const char **merges,
                  size_t *mlen);

/* The largest id + 1. */
int64_t dt_bpe_vocab_size(const dt_bpe_t *b);
/* The id of <|endoftext|>, or -1. */
int32_t dt_bpe_eot(const dt_bpe_t *b);

/* Appends the tokens of text[0..len) to *ids (a malloc'd array of *cap,
 * *n used; grown as needed). */
dt_status dt_bpe_encode(dt_bpe_t *b, const char *text, size_t len, int32_t **ids, size_t *n,
                        size_t *cap);
/* The bytes token id stands for (*bytes points into b); 0 for an id
 * outside the vocabulary. */
size_t dt_bpe_token_bytes(const dt_bpe_t *b, int32_t id, const char **bytes);

/* NULL is a no-op. */
void dt_bpe_free(dt_bpe_t *b);

#endif
