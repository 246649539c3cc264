/*
 * lm_import.h - importing language-model token streams into a dtrain HDF5
 * dataset (the "Language-model files" of dataset.h): plain text as byte
 * tokens, and token files as nanoGPT and llm.c write them.
 *
 * The output is written under a temporary name in the same directory and
 * renamed into place only when complete, so a failed import never leaves
 * a half-written dataset. Inputs are streamed in chunks, so a token file
 * of any size imports in a few MiB of memory.
 */
#ifndef DT_LM_IMPORT_H
#define DT_LM_IMPORT_H

#include <stdint.h>
#include <stdio.h>

#include "core/status.h"

#define DT_LM_DEFAULT_VAL_FRACTION 0.1
#define DT_LM_DEFAULT_VOCAB 50257 /* GPT-2's vocabulary */

struct dt_text_import_opts {
    const char *const *files; /* read in this order, their bytes concatenated */
    int nfiles;
    const char *out_path; /* the .h5 to create */
    double val_fraction;  /* in (0, 1): the end of the stream that becomes "val" */
    int overwrite;        /* replace an existing out_path */
    const char *tokenizer; /* NULL: bytes; else a directory with GPT-2's vocab.json and
                              merges.txt (io/bpe.h) */
};

/* Imports text files as one stream of byte tokens (tokenizer "byte",
 * vocab_size 256, uint16 tokens): split "train" is the first
 * 1 - val_fraction of the bytes (rounded down), "val" the rest. The cut is
 * at a byte, which may fall inside a line or a UTF-8 character.
 * Errors name the file: DT_ERR_NOT_FOUND (missing, unreadable, not a
 * regular file), DT_ERR_BAD_DATA (no bytes at all, or a split of fewer
 * than 2 tokens), DT_ERR_USAGE (val_fraction outside (0, 1), out_path
 * exists and overwrite is off), DT_ERR_IO (cannot read or write).
 * With a tokenizer the text is encoded by it instead (tokenizer "bpe",
 * vocab_size the tokenizer's), file by file, with <|endoftext|> after each
 * when the vocabulary has it; the token stream is held in memory (4 bytes
 * a token) and split by tokens; the dataset keeps the tokenizer's files
 * (io/dataset.h). The tokenizer's own errors (DT_ERR_BAD_DATA,
 * DT_ERR_NOT_FOUND) name its files.
 * Progress lines go to `progress` when not NULL. */
dt_status dt_text_import(const struct dt_text_import_opts *opts, FILE *progress);

struct dt_tokens_import_opts {
    const char *train;     /* required */
    const char *val;       /* optional */
    const char *out_path;  /* the .h5 to create */
    int64_t vocab_size;    /* 0: 50257, or 128256 for llm.c Llama 3 files */
    const char *tokenizer; /* "gpt2" or "none"; NULL: gpt2, or none for Llama 3 files */
    int overwrite;         /* replace an existing out_path */
};

/* Imports token files: raw little-endian uint16 tokens with no header
 * (nanoGPT's train.bin / val.bin), or llm.c's files (a header of 256
 * little-endian int32: magic, version, token count; then the tokens:
 * magic 20240520 version 1 is uint16 GPT-2 tokens, magic 20240801
 * version 7 uint32 Llama 3 tokens). A file is llm.c's when its first
 * int32 is one of those magics. Tokens are stored as uint16 when
 * vocab_size <= 65536, else int32; every token must be below vocab_size.
 * Errors name the file: DT_ERR_NOT_FOUND (missing, unreadable, not a
 * regular file), DT_ERR_BAD_DATA (an odd size for raw uint16, a header
 * version or token count that does not match, fewer than 2 tokens, a
 * token out of range: with its position and value), DT_ERR_USAGE (bad
 * vocab_size or tokenizer, out_path exists and overwrite is off),
 * DT_ERR_IO (cannot read or write). Progress lines go to `progress` when
 * not NULL. */
dt_status dt_tokens_import(const struct dt_tokens_import_opts *opts, FILE *progress);

#endif
