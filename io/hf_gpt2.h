/*
 * hf_gpt2.h - the Hugging Face GPT-2 layout (transformers' GPT2LMHeadModel
 * as `save_pretrained` writes it: config.json + model.safetensors) and its
 * correspondence with dtrain's model.type gpt.
 *
 * Names: dtrain's `wte.weight`, `wpe.weight`, `h<i>.ln1.*`, `h<i>.qkv.*`,
 * `h<i>.proj.*`, `h<i>.ln2.*`, `h<i>.fc.*`, `h<i>.fc2.*`, `ln_f.*`,
 * `head.weight` are GPT-2's `transformer.wte.weight`, `transformer.wpe.weight`,
 * `transformer.h.<i>.ln_1.*`, `.attn.c_attn.*`, `.attn.c_proj.*`, `.ln_2.*`,
 * `.mlp.c_fc.*`, `.mlp.c_proj.*`, `transformer.ln_f.*`, `lm_head.weight`.
 * GPT-2's linear layers are Conv1D, whose weight is (in, out): the
 * transpose of dtrain's (out, in). The packed q, k, v of c_attn are in the
 * same order as dtrain's qkv ((3, heads, head_dim) along the output). With
 * tied embeddings GPT-2 stores no lm_head.weight (it is wte's).
 */
#ifndef DT_IO_HF_GPT2_H
#define DT_IO_HF_GPT2_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* What config.json says, as far as dtrain's gpt can follow it. */
struct dt_hf_gpt2 {
    int64_t n_layer, n_head, n_embd;
    int64_t n_positions; /* rows of wpe */
    int64_t vocab_size;  /* rows of wte */
    double layer_norm_epsilon;
    int tie_word_embeddings; /* 1: lm_head is wte */
    int gelu_tanh;           /* 0: "gelu" (exact); 1: "gelu_new" / "gelu_pytorch_tanh" */
    double dropout;          /* resid_pdrop = embd_pdrop (attn_pdrop is written as 0) */
    int64_t bos_token_id, eos_token_id; /* -1: none */
};

/* Reads DIR/config.json (path is the file). Refuses, as DT_ERR_BAD_DATA
 * naming the file and the field, a model_type other than gpt2, a missing
 * or non-positive shape, an activation_function other than gelu,
 * gelu_new or gelu_pytorch_tanh, n_inner other than null or 4 n_embd,
 * scale_attn_weights false, scale_attn_by_inverse_layer_idx true, and
 * n_embd not a multiple of n_head. Fields dtrain has no use for are
 * ignored. DT_ERR_NOT_FOUND for a missing file. */
dt_status dt_hf_gpt2_read_config(const char *path, struct dt_hf_gpt2 *out);

/* Writes config.json for c (architectures GPT2LMHeadModel, model_type
 * gpt2, the fields above), atomically. */
dt_status dt_hf_gpt2_write_config(const char *path, const struct dt_hf_gpt2 *c);

/* The GPT-2 name of dtrain tensor `name` and whether its data is the
 * transpose (a 2-D (out, in) weight becoming (in, out)). DT_ERR_NOT_FOUND
 * when GPT-2 has no such tensor. */
dt_status dt_hf_gpt2_to_hf(const char *name, char *hf, size_t len, int *transpose);

/* The dtrain name of GPT-2 tensor `hf` (with or without the
 * "transformer." prefix) and whether its data is transposed.
 * DT_ERR_NOT_FOUND for a name dtrain does not take; *skip is set for
 * tensors that carry no parameter (the causal-mask buffers attn.bias and
 * attn.masked_bias), which a reader passes over. */
dt_status dt_hf_gpt2_from_hf(const char *hf, char *name, size_t len, int *transpose, int *skip);

/* dst (cols x rows) = the transpose of src (rows x cols). */
void dt_hf_transpose(float *dst, const float *src, int64_t rows, int64_t cols);

#endif
