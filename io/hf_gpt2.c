/*
 * hf_gpt2.c - the Hugging Face GPT-2 layout (see hf_gpt2.h): config.json
 * read and written with Jansson, and the table of tensor names.
 */
#include "hf_gpt2.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "outfile.h"

/* dtrain's per-block suffix, GPT-2's, and whether the data is transposed. */
static const struct {
    const char *dt, *hf;
    int transpose;
} block_names[] = {
    {"ln1.weight", "ln_1.weight", 0},           {"ln1.bias", "ln_1.bias", 0},
    {"qkv.weight", "attn.c_attn.weight", 1},    {"qkv.bias", "attn.c_attn.bias", 0},
    {"proj.weight", "attn.c_proj.weight", 1},   {"proj.bias", "attn.c_proj.bias", 0},
    {"ln2.weight", "ln_2.weight", 0},           {"ln2.bias", "ln_2.bias", 0},
    {"fc.weight", "mlp.c_fc.weight", 1},        {"fc.bias", "mlp.c_fc.bias", 0},
    {"fc2.weight", "mlp.c_proj.weight", 1},     {"fc2.bias", "mlp.c_proj.bias", 0},
};

static const struct {
    const char *dt, *hf;
} top_names[] = {
    {"wte.weight", "transformer.wte.weight"}, {"wpe.weight", "transformer.wpe.weight"},
    {"ln_f.weight", "transformer.ln_f.weight"}, {"ln_f.bias", "transformer.ln_f.bias"},
    {"head.weight", "lm_head.weight"},
};

dt_status dt_hf_gpt2_to_hf(const char *name, char *hf, size_t len, int *transpose)
{
    *transpose = 0;
    for (size_t i = 0; i < sizeof top_names / sizeof *top_names; i++)
        if (!strcmp(name, top_names[i].dt)) {
            snprintf(hf, len, "%s", top_names[i].hf);
            return DT_OK;
        }
    unsigned long blk;
    int used = 0;
    if (name[0] == 'h' && name[1] >= '0' && name[1] <= '9' &&
        sscanf(name, "h%lu.%n", &blk, &used) == 1 && used > 0)
        for (size_t i = 0; i < sizeof block_names / sizeof *block_names; i++)
            if (!strcmp(name + used, block_names[i].dt)) {
                snprintf(hf, len, "transformer.h.%lu.%s", blk, block_names[i].hf);
                *transpose = block_names[i].transpose;
                return DT_OK;
            }
    return dt_set_error(DT_ERR_NOT_FOUND, "tensor %s has no place in GPT-2's layout", name);
}

dt_status dt_hf_gpt2_from_hf(const char *hf, char *name, size_t len, int *transpose, int *skip)
{
    *transpose = 0;
    *skip = 0;
    const char *s = hf;
    if (!strncmp(s, "transformer.", 12))
        s += 12;
    for (size_t i = 0; i < sizeof top_names / sizeof *top_names; i++) {
        const char *h = top_names[i].hf;
        if (!strncmp(h, "transformer.", 12))
            h += 12;
        if (!strcmp(s, h)) {
            snprintf(name, len, "%s", top_names[i].dt);
            return DT_OK;
        }
    }
    unsigned long blk;
    int used = 0;
    if (sscanf(s, "h.%lu.%n", &blk, &used) == 1 && used > 0) {
        const char *rest = s + used;
        if (!strcmp(rest, "attn.bias") || !strcmp(rest, "attn.masked_bias")) {
            *skip = 1;
            return DT_OK;
        }
        for (size_t i = 0; i < sizeof block_names / sizeof *block_names; i++)
            if (!strcmp(rest, block_names[i].hf)) {
                snprintf(name, len, "h%lu.%s", blk, block_names[i].dt);
                *transpose = block_names[i].transpose;
                return DT_OK;
            }
    }
    return dt_set_error(DT_ERR_NOT_FOUND, "tensor %s is not one of GPT-2's", hf);
}

void dt_hf_transpose(float *dst, const float *src, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            dst[c * rows + r] = src[r * cols + c];
}

/* ---- config.json ---------------------------------------------------------------- */

static dt_status bad_field(const char *path, const char *field, const char *want)
{
    return dt_set_error(DT_ERR_BAD_DATA, "%s: %s %s", path, field, want);
}

/* A positive integer field, or 0 with the error set. */
static int64_t need_int(const json_t *root, const char *path, const char *field, dt_status *st)
{
    const json_t *v = json_object_get(root, field);
    if (*st != DT_OK)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 1) {
        *st = bad_field(path, field, "must be a positive whole number (GPT2Config's field)");
        return 0;
    }
    return (int64_t)json_integer_value(v);
}

static int64_t opt_id(const json_t *root, const char *field)
{
    const json_t *v = json_object_get(root, field);
    return json_is_integer(v) && json_integer_value(v) >= 0 ? (int64_t)json_integer_value(v) : -1;
}

static int opt_bool(const json_t *root, const char *field, int def)
{
    const json_t *v = json_object_get(root, field);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

static dt_status read_fields(const json_t *root, const char *path, struct dt_hf_gpt2 *c)
{
    dt_status st = DT_OK;
    const json_t *mt = json_object_get(root, "model_type");
    if (!json_is_string(mt) || strcmp(json_string_value(mt), "gpt2") != 0)
        return bad_field(path, "model_type",
                         "must be \"gpt2\" (dtrain takes GPT-2's layout: GPT2LMHeadModel)");
    c->n_layer = need_int(root, path, "n_layer", &st);
    c->n_head = need_int(root, path, "n_head", &st);
    c->n_embd = need_int(root, path, "n_embd", &st);
    c->n_positions = need_int(root, path, "n_positions", &st);
    c->vocab_size = need_int(root, path, "vocab_size", &st);
    if (st != DT_OK)
        return st;
    if (c->n_embd % c->n_head)
        return dt_set_error(DT_ERR_BAD_DATA, "%s: n_embd %lld is not a multiple of n_head %lld",
                            path, (long long)c->n_embd, (long long)c->n_head);
    const json_t *eps = json_object_get(root, "layer_norm_epsilon");
    c->layer_norm_epsilon = json_is_number(eps) ? json_number_value(eps) : 1e-5;
    const json_t *act = json_object_get(root, "activation_function");
    const char *a = json_is_string(act) ? json_string_value(act) : "gelu_new";
    if (!strcmp(a, "gelu"))
        c->gelu_tanh = 0;
    else if (!strcmp(a, "gelu_new") || !strcmp(a, "gelu_pytorch_tanh"))
        c->gelu_tanh = 1;
    else
        return dt_set_error(DT_ERR_BAD_DATA,
                            "%s: activation_function is \"%s\"; dtrain's gpt takes gelu (exact) "
                            "or gelu_new / gelu_pytorch_tanh (the tanh approximation)",
                            path, a);
    const json_t *inner = json_object_get(root, "n_inner");
    if (inner && !json_is_null(inner) &&
        !(json_is_integer(inner) && json_integer_value(inner) == 4 * c->n_embd))
        return bad_field(path, "n_inner", "must be null or 4 * n_embd (dtrain's MLP width)");
    if (!opt_bool(root, "scale_attn_weights", 1))
        return bad_field(path, "scale_attn_weights",
                         "is false; dtrain's attention scales by 1/sqrt(head size)");
    if (opt_bool(root, "scale_attn_by_inverse_layer_idx", 0))
        return bad_field(path, "scale_attn_by_inverse_layer_idx",
                         "is true; dtrain's attention does not scale by layer");
    c->tie_word_embeddings = opt_bool(root, "tie_word_embeddings", 1);
    const json_t *p = json_object_get(root, "resid_pdrop");
    c->dropout = json_is_number(p) ? json_number_value(p) : 0.1;
    c->bos_token_id = opt_id(root, "bos_token_id");
    c->eos_token_id = opt_id(root, "eos_token_id");
    return DT_OK;
}

dt_status dt_hf_gpt2_read_config(const char *path, struct dt_hf_gpt2 *out)
{
    json_error_t err;
    memset(out, 0, sizeof *out);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return dt_set_error(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO, "%s: cannot open it: %s",
                            path, strerror(errno));
    json_t *root = json_loadf(fp, 0, &err);
    fclose(fp);
    if (!root)
        return dt_set_error(DT_ERR_BAD_DATA, "%s: not valid JSON (%s, line %d)", path, err.text,
                            err.line);
    dt_status st = json_is_object(root) ? read_fields(root, path, out)
                                        : bad_field(path, "the file", "must hold a JSON object");
    json_decref(root);
    return st;
}

dt_status dt_hf_gpt2_write_config(const char *path, const struct dt_hf_gpt2 *c)
{
    char tmp[4200];
    json_t *root = json_pack(
        "{s:[s], s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:n, s:s, s:f, s:f, s:f, s:f, s:f, s:b, "
        "s:b, s:b, s:b, s:f, s:s}",
        "architectures", "GPT2LMHeadModel", "model_type", "gpt2", "n_layer",
        (json_int_t)c->n_layer, "n_head", (json_int_t)c->n_head, "n_embd", (json_int_t)c->n_embd,
        "n_positions", (json_int_t)c->n_positions, "n_ctx", (json_int_t)c->n_positions,
        "vocab_size", (json_int_t)c->vocab_size, "n_inner", "activation_function",
        c->gelu_tanh ? "gelu_new" : "gelu", "layer_norm_epsilon", c->layer_norm_epsilon,
        "resid_pdrop", c->dropout, "embd_pdrop", c->dropout, "attn_pdrop", 0.0,
        "summary_first_dropout", c->dropout, "tie_word_embeddings", c->tie_word_embeddings,
        "scale_attn_weights", 1, "scale_attn_by_inverse_layer_idx", 0, "reorder_and_upcast_attn",
        0, "initializer_range", 0.02, "torch_dtype", "float32");
    if (!root)
        return dt_set_error(DT_ERR_NOMEM, "%s: no memory for the config", path);
    if (c->bos_token_id >= 0)
        json_object_set_new(root, "bos_token_id", json_integer(c->bos_token_id));
    if (c->eos_token_id >= 0)
        json_object_set_new(root, "eos_token_id", json_integer(c->eos_token_id));
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text)
        return dt_set_error(DT_ERR_NOMEM, "%s: no memory for the config", path);
    size_t len = strlen(text);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    char *withnl = malloc(len + 2);
    dt_status st;
    if (!withnl)
        st = dt_set_error(DT_ERR_NOMEM, "%s: no memory for the config", path);
    else {
        memcpy(withnl, text, len);
        withnl[len] = '\n';
        st = dt_outfile_write_small("config", tmp, path, withnl, len + 1);
    }
    free(withnl);
    free(text);
    return st;
}
