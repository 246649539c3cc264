/*
 * weights.c - parameters from elsewhere (see weights.h).
 *
 * The source becomes a list of tensors under dtrain's names, in host
 * memory (transposed where GPT-2's layout says so); then each tensor of
 * the model is looked up in it. Problems are collected in a text, not
 * returned at the first, so one run names them all.
 */
#include "weights.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/log.h"
#include "io/hf_gpt2.h"
#include "io/model_file.h"
#include "io/safetensors.h"

#define MAX_LISTED 8 /* problems named in the message; the rest counted */

struct problems {
    char text[2048];
    size_t len;
    int n;
};

static void problem(struct problems *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(struct problems *p, const char *fmt, ...)
{
    if (p->n++ >= MAX_LISTED)
        return;
    va_list ap;
    va_start(ap, fmt);
    if (p->len < sizeof p->text) {
        if (p->n > 1)
            p->len += (size_t)snprintf(p->text + p->len, sizeof p->text - p->len, "; ");
        if (p->len < sizeof p->text)
            p->len += (size_t)vsnprintf(p->text + p->len, sizeof p->text - p->len, fmt, ap);
    }
    va_end(ap);
}

struct src {
    struct dt_named_tensor *t;
    int *used;
    int n, cap;
};

static void src_free(struct src *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->t[i].data);
    free(s->t);
    free(s->used);
}

static dt_status src_add(struct src *s, const char *name, const struct dt_shape *shape, float *data)
{
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        struct dt_named_tensor *t = realloc(s->t, (size_t)cap * sizeof *t);
        if (!t)
            return dt_set_error(DT_ERR_NOMEM, "no memory for the tensor list");
        s->t = t;
        s->cap = cap;
    }
    struct dt_named_tensor *t = &s->t[s->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->shape = *shape;
    t->data = data;
    return DT_OK;
}

int dt_weights_is_external(const char *path)
{
    struct stat sb;
    size_t n = strlen(path);
    return (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) ||
           (n > 12 && !strcmp(path + n - 12, ".safetensors"));
}

/* A safetensors file's tensors; gpt2: mapped from GPT-2's names. */
static dt_status read_safetensors(const char *file, int gpt2, int tied, struct src *s,
                                  struct problems *p)
{
    dt_safetensors_t *f = NULL;
    dt_status st;
    DT_CHECK(dt_safetensors_open(file, &f));
    for (int i = 0; i < dt_safetensors_count(f); i++) {
        const struct dt_st_tensor *t = dt_safetensors_tensor(f, i);
        char name[DT_TENSOR_NAME] = "";
        int transpose = 0, skip = 0;
        if (gpt2) {
            if (dt_hf_gpt2_from_hf(t->name, name, sizeof name, &transpose, &skip) != DT_OK) {
                problem(p, "tensor %s is not one of GPT-2's", t->name);
                continue;
            }
            if (skip || (tied && !strcmp(name, "head.weight")))
                continue; /* mask buffers; a tied head is wte */
        } else if (strlen(t->name) >= sizeof name) {
            problem(p, "tensor name %.60s... is longer than dtrain's names", t->name);
            continue;
        } else
            memcpy(name, t->name, strlen(t->name) + 1);
        if (t->ndim < 1 || t->ndim > DT_MAX_DIMS) {
            problem(p, "tensor %s has %d dimensions", t->name, t->ndim);
            continue;
        }
        struct dt_shape shape = {.ndim = t->ndim};
        for (int d = 0; d < t->ndim; d++)
            shape.dim[d] = t->shape[d];
        int64_t numel = dt_st_numel(t);
        float *data = NULL, *tmp = NULL;
        DT_CHECK(dt_malloc((size_t)(numel ? numel : 1) * sizeof(float), "a tensor", (void **)&data));
        st = dt_safetensors_read(f, t, data);
        if (st == DT_OK && transpose && t->ndim == 2) {
            st = dt_malloc((size_t)(numel ? numel : 1) * sizeof(float), "a tensor", (void **)&tmp);
            if (st == DT_OK) {
                dt_hf_transpose(tmp, data, t->shape[0], t->shape[1]);
                free(data);
                data = tmp;
                shape.dim[0] = t->shape[1];
                shape.dim[1] = t->shape[0];
            }
        }
        if (st == DT_OK)
            st = src_add(s, name, &shape, data);
        if (st != DT_OK) {
            free(data);
            goto out;
        }
    }
out:
    dt_safetensors_close(f);
    return st;
}

/* Whether a safetensors file uses GPT-2's names. */
static int has_gpt2_names(const char *file)
{
    dt_safetensors_t *f = NULL;
    int yes = 0;
    if (dt_safetensors_open(file, &f) != DT_OK)
        return 0;
    for (int i = 0; i < dt_safetensors_count(f) && !yes; i++) {
        const char *n = dt_safetensors_tensor(f, i)->name;
        yes = !strncmp(n, "transformer.", 12) || !strncmp(n, "h.", 2) || strstr(n, ".ln_1.") ||
              strstr(n, ".c_attn.");
    }
    dt_safetensors_close(f);
    return yes;
}

/* config.json against the job: every field that differs. */
static void check_config(const struct dt_hf_gpt2 *c, const struct dt_job *job, const char *cfg,
                         struct problems *p)
{
    if (strcmp(job->model.type, "gpt") != 0) {
        problem(p, "%s is a GPT-2, the job's model.type is %s", cfg, job->model.type);
        return;
    }
    if (c->n_layer != job->model.n_layer)
        problem(p, "%s n_layer is %lld, the job's model.n_layer is %lld", cfg,
                (long long)c->n_layer, (long long)job->model.n_layer);
    if (c->n_head != job->model.n_head)
        problem(p, "%s n_head is %lld, the job's model.n_head is %lld", cfg, (long long)c->n_head,
                (long long)job->model.n_head);
    if (c->n_embd != job->model.n_embd)
        problem(p, "%s n_embd is %lld, the job's model.n_embd is %lld", cfg, (long long)c->n_embd,
                (long long)job->model.n_embd);
    if (c->n_positions < job->data.seq_len)
        problem(p, "%s n_positions is %lld, fewer than the job's data.seq_len %lld", cfg,
                (long long)c->n_positions, (long long)job->data.seq_len);
    if (strcmp(job->model.norm, "layernorm") != 0)
        problem(p, "%s has layer norms, the job's model.norm is %s", cfg, job->model.norm);
    if (fabs(c->layer_norm_epsilon - 1e-5) > 1e-12)
        problem(p, "%s layer_norm_epsilon is %g; dtrain's layer norm uses 1e-5", cfg,
                c->layer_norm_epsilon);
    if (c->gelu_tanh != !strcmp(job->model.gelu, "tanh"))
        problem(p, "%s activation_function is %s: set model.gelu: %s", cfg,
                c->gelu_tanh ? "the tanh GELU (gelu_new)" : "gelu (exact)",
                c->gelu_tanh ? "tanh" : "exact");
    if (c->tie_word_embeddings != job->model.tie_embeddings)
        problem(p, "%s tie_word_embeddings is %s: set model.tie_embeddings: %s", cfg,
                c->tie_word_embeddings ? "true" : "false",
                c->tie_word_embeddings ? "true" : "false");
}

static dt_status read_source(const char *path, const struct dt_job *job, struct src *s,
                             struct problems *p, int64_t *wpe_rows)
{
    struct stat sb;
    dt_status st = DT_OK;
    if (stat(path, &sb) != 0)
        return dt_set_error(DT_ERR_NOT_FOUND, "%s: no such file or directory", path);
    if (S_ISDIR(sb.st_mode)) {
        char cfg[4200], file[4200];
        struct dt_hf_gpt2 c;
        snprintf(cfg, sizeof cfg, "%s/config.json", path);
        snprintf(file, sizeof file, "%s/model.safetensors", path);
        DT_CHECK(dt_hf_gpt2_read_config(cfg, &c));
        check_config(&c, job, "config.json", p);
        *wpe_rows = c.n_positions;
        return read_safetensors(file, 1, c.tie_word_embeddings, s, p);
    }
    size_t n = strlen(path);
    if (n > 12 && !strcmp(path + n - 12, ".safetensors"))
        return read_safetensors(path, has_gpt2_names(path), job->model.tie_embeddings, s, p);
    struct dt_named_tensor *t = NULL;
    int nt = 0;
    DT_CHECK(dt_model_file_load(path, &t, &nt));
    for (int i = 0; i < nt && st == DT_OK; i++) {
        st = src_add(s, t[i].name, &t[i].shape, t[i].data);
        if (st == DT_OK)
            t[i].data = NULL;
    }
    dt_model_file_free(t, nt);
out:
    return st;
}

static int find(const struct src *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->t[i].name, name))
            return i;
    return -1;
}

/* Copies source tensor j into dst as the model's tensor p: the same
 * shape, or wpe's first rows. 0, or 1 with a problem noted. */
static int take(const struct src *s, int j, const struct dt_param_info *p, float *dst,
                struct problems *pr)
{
    const struct dt_named_tensor *t = &s->t[j];
    char want[DT_MAX_DIMS * 21 + 8], have[DT_MAX_DIMS * 21 + 8];
    if (dt_shape_equal(&t->shape, &p->shape)) {
        memcpy(dst, t->data, p->numel * sizeof(float));
        return 0;
    }
    if (!strcmp(p->name, "wpe.weight") && t->shape.ndim == 2 && p->shape.ndim == 2 &&
        t->shape.dim[1] == p->shape.dim[1] && t->shape.dim[0] > p->shape.dim[0]) {
        memcpy(dst, t->data, p->numel * sizeof(float));
        return 0;
    }
    problem(pr, "tensor %s is %s in the file, %s in the model", p->name,
            dt_shape_format(&t->shape, have, sizeof have),
            dt_shape_format(&p->shape, want, sizeof want));
    return 1;
}

dt_status dt_weights_load(dt_model_t *m, const struct dt_job *job, const char *path,
                          const char *what)
{
    struct src s = {0};
    struct problems pr = {.len = 0};
    float *host = NULL;
    int64_t wpe_rows = 0;
    dt_status st;
    const size_t np = dt_model_num_params(m), nb = dt_model_num_buffer_elems(m);
    st = read_source(path, job, &s, &pr, &wpe_rows);
    if (st != DT_OK)
        return dt_error_context(st, "%s %s", what, path);
    DT_CHECK(dt_calloc(np + nb + 1, sizeof(float), "the parameters", (void **)&host));
    DT_CHECK(dt_model_get_params(m, host));
    if (nb)
        DT_CHECK(dt_model_get_buffers(m, host + np));
    DT_CHECK(dt_calloc((size_t)(s.n ? s.n : 1), sizeof *s.used, "the tensor list",
                       (void **)&s.used));
    int buffers = 0;
    for (int i = 0; i < dt_model_param_count(m) + dt_model_buffer_count(m); i++) {
        int is_param = i < dt_model_param_count(m);
        const struct dt_param_info *p =
            is_param ? dt_model_param(m, i) : dt_model_buffer(m, i - dt_model_param_count(m));
        int j = find(&s, p->name);
        if (j < 0) {
            if (is_param)
                problem(&pr, "tensor %s is missing from the file", p->name);
            continue;
        }
        s.used[j] = 1;
        buffers += !is_param;
        take(&s, j, p, host + (is_param ? 0 : np) + p->offset, &pr);
    }
    int extra = 0;
    for (int j = 0; j < s.n; j++)
        if (!s.used[j]) {
            if (extra < 3)
                problem(&pr, "tensor %s of the file is not in the job's model", s.t[j].name);
            extra++;
        }
    if (pr.n) {
        char more[48] = "";
        if (pr.n > MAX_LISTED)
            snprintf(more, sizeof more, "; and %d more", pr.n - MAX_LISTED);
        st = dt_set_error(DT_ERR_BAD_DATA, "%s %s does not fit the job's model: %s%s", what, path,
                          pr.text, more);
        goto out;
    }
    DT_CHECK(dt_model_set_params(m, host));
    if (nb)
        DT_CHECK(dt_model_set_buffers(m, host + np));
    DT_LOG_INFO("init", "parameters from %s (%s): %d tensors%s%s", path, what, s.n,
                buffers ? ", with the buffers" : "",
                wpe_rows > job->data.seq_len ? "; wpe's first data.seq_len rows" : "");
out:
    free(host);
    src_free(&s);
    return st;
}
