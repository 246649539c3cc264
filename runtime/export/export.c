/*
 * export.c - a trained model written for other tools (see export.h).
 *
 * The parameters come to the host as one flat buffer (dt_model_get_params)
 * and each tensor is a slice of it. For GPT-2's layout every linear
 * weight is transposed into Conv1D's (in, out), the names mapped by
 * io/hf_gpt2.h, and a tied head is left out (GPT-2 ties it to wte). The
 * directory is written under a temporary name beside its target and
 * renamed into place when both files are complete.
 */
#include "export.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "io/bpe.h"
#include "io/hf_gpt2.h"
#include "io/safetensors.h"
#include "runtime/train/infer.h"

struct tensors {
    struct dt_st_out *t;
    char (*names)[DT_ST_NAME];
    float **owned; /* transposed copies */
    int n, cap;
};

static void tensors_free(struct tensors *ts)
{
    for (int i = 0; i < ts->n; i++)
        free(ts->owned[i]);
    free(ts->t);
    free(ts->names);
    free(ts->owned);
}

static dt_status tensors_alloc(struct tensors *ts, int cap)
{
    dt_status st;
    ts->cap = cap;
    DT_CHECK(dt_calloc((size_t)cap, sizeof *ts->t, "the export's tensor list", (void **)&ts->t));
    DT_CHECK(dt_calloc((size_t)cap, sizeof *ts->names, "the export's names", (void **)&ts->names));
    DT_CHECK(dt_calloc((size_t)cap, sizeof *ts->owned, "the export's copies", (void **)&ts->owned));
out:
    return st;
}

/* Adds tensor `name` of shape s at data; hf: GPT-2's name and layout. */
static dt_status add(struct tensors *ts, const char *name, const struct dt_shape *s,
                     const float *data, int hf)
{
    struct dt_st_out *o = &ts->t[ts->n];
    char *nm = ts->names[ts->n];
    int transpose = 0;
    dt_status st = DT_OK;
    if (hf) {
        st = dt_hf_gpt2_to_hf(name, nm, DT_ST_NAME, &transpose);
        if (st != DT_OK)
            return dt_error_context(st, "export to GPT-2's layout");
    } else
        snprintf(nm, DT_ST_NAME, "%s", name);
    o->name = nm;
    o->ndim = s->ndim;
    for (int d = 0; d < s->ndim; d++)
        o->shape[d] = s->dim[d];
    o->data = data;
    if (transpose && s->ndim == 2) {
        float *t = NULL;
        DT_CHECK(dt_malloc((size_t)(s->dim[0] * s->dim[1]) * sizeof *t, "a transposed weight",
                           (void **)&t));
        dt_hf_transpose(t, data, s->dim[0], s->dim[1]);
        ts->owned[ts->n] = t;
        o->data = t;
        o->shape[0] = s->dim[1];
        o->shape[1] = s->dim[0];
    }
    ts->n++;
out:
    return st;
}

static dt_status check_out(const struct dt_export_opts *o)
{
    struct stat sb;
    if (lstat(o->out, &sb) == 0 && !o->force)
        return dt_set_error(DT_ERR_USAGE,
                            "export: %s exists; choose another path, or add --force to replace "
                            "it once the new one is complete",
                            o->out);
    return DT_OK;
}

static dt_status refuse_hf(const struct dt_job *job)
{
    if (strcmp(job->model.type, "gpt") != 0)
        return dt_set_error(DT_ERR_USAGE,
                            "export: --format hf writes GPT-2's layout, for model.type gpt; this "
                            "job's model is %s: use --format safetensors (dtrain's names)",
                            job->model.type);
    if (strcmp(job->model.norm, "layernorm") != 0)
        return dt_set_error(DT_ERR_USAGE,
                            "export: GPT-2 has no %s (model.norm); use --format safetensors "
                            "(dtrain's names)",
                            job->model.norm);
    return DT_OK;
}

/* Writes n bytes to path (inside the temporary directory). */
static dt_status write_bytes(const char *path, const char *data, size_t n)
{
    FILE *fp = fopen(path, "wb");
    int ok = fp && fwrite(data, 1, n, fp) == n;
    if (fp && fclose(fp) != 0)
        ok = 0;
    return ok ? DT_OK : dt_set_error(DT_ERR_IO, "export: cannot write %s: %s", path, strerror(errno));
}

/* The dataset's tokenizer files beside the model (GPT2TokenizerFast reads
 * them), and its <|endoftext|> as bos and eos; nothing for a dataset
 * without them. */
static dt_status write_tokenizer(const char *dir, const char *dataset, struct dt_hf_gpt2 *c,
                                 int *written)
{
    dt_bpe_t *b = NULL;
    char path[4300];
    const char *v, *m;
    size_t vl, ml;
    *written = 0;
    dt_status st = dt_bpe_load_dataset(dataset, &b);
    if (st == DT_ERR_NOT_FOUND) {
        dt_clear_error();
        return DT_OK;
    }
    DT_CHECK(st);
    dt_bpe_files(b, &v, &vl, &m, &ml);
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    DT_CHECK(write_bytes(path, v, vl));
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    DT_CHECK(write_bytes(path, m, ml));
    c->bos_token_id = c->eos_token_id = dt_bpe_eot(b);
    *written = 1;
out:
    dt_bpe_free(b);
    return st;
}

/* Writes dir/config.json and dir/model.safetensors (and the dataset's
 * tokenizer files) under a temporary directory, then puts it in place
 * (replacing an old one only now). */
static dt_status write_hf_dir(const struct dt_job *job, const struct dt_export_opts *o,
                              const struct tensors *ts, int64_t vocab, const char *dataset)
{
    char tmp[4200], old[4200], cfg[4300], st_path[4300];
    dt_status st = DT_OK;
    struct dt_hf_gpt2 c = {.n_layer = job->model.n_layer,
                           .n_head = job->model.n_head,
                           .n_embd = job->model.n_embd,
                           .n_positions = job->data.seq_len,
                           .vocab_size = vocab,
                           .layer_norm_epsilon = 1e-5,
                           .tie_word_embeddings = job->model.tie_embeddings,
                           .gelu_tanh = strcmp(job->model.gelu, "tanh") == 0,
                           .dropout = job->model.dropout,
                           .bos_token_id = -1,
                           .eos_token_id = -1};
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", o->out, (long)getpid());
    snprintf(old, sizeof old, "%s.old.%ld", o->out, (long)getpid());
    snprintf(cfg, sizeof cfg, "%s/config.json", tmp);
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", tmp);
    if (mkdir(tmp, 0755) != 0)
        return dt_set_error(DT_ERR_IO, "export: cannot create %s: %s", tmp, strerror(errno));
    const char *meta[] = {"format", "pt", "producer", "dtrain"};
    int tok = 0;
    st = write_tokenizer(tmp, dataset, &c, &tok);
    if (st == DT_OK)
        st = dt_hf_gpt2_write_config(cfg, &c);
    if (st == DT_OK)
        st = dt_safetensors_save(st_path, ts->t, ts->n, meta, 2);
    if (st == DT_OK && tok)
        DT_LOG_INFO("export", "with the dataset's tokenizer (vocab.json, merges.txt)");
    int had_old = 0;
    if (st == DT_OK && o->force && access(o->out, F_OK) == 0) {
        if (rename(o->out, old) != 0)
            st = dt_set_error(DT_ERR_IO, "export: cannot move the old %s aside: %s", o->out,
                              strerror(errno));
        had_old = st == DT_OK;
    }
    if (st == DT_OK && rename(tmp, o->out) != 0) {
        st = dt_set_error(DT_ERR_IO, "export: cannot rename %s to %s: %s", tmp, o->out,
                          strerror(errno));
        if (had_old)
            rename(old, o->out);
        had_old = 0;
    }
    static const char *const files[] = {"config.json", "model.safetensors", "vocab.json",
                                        "merges.txt"};
    if (st != DT_OK) {
        for (int i = 0; i < 4; i++) {
            char f[4400];
            snprintf(f, sizeof f, "%s/%s", tmp, files[i]);
            unlink(f);
        }
        rmdir(tmp);
    } else if (had_old) {
        for (int i = 0; i < 4; i++) {
            char f[4400];
            snprintf(f, sizeof f, "%s/%s", old, files[i]);
            unlink(f);
        }
        if (rmdir(old) != 0)
            DT_LOG_WARN("export", "the old %s was replaced; its other files stay in %s", o->out,
                        old);
    }
    return st;
}

static dt_status export_model(const struct dt_job *job, const dt_infer_t *in,
                              const struct dt_export_opts *o)
{
    dt_model_t *m = dt_infer_model(in);
    struct tensors ts = {0};
    float *params = NULL, *bufs = NULL;
    dt_status st;
    const int hf = o->format == DT_EXPORT_HF;
    const int np = dt_model_param_count(m), nb = hf ? 0 : dt_model_buffer_count(m);
    DT_CHECK(dt_malloc((dt_model_num_params(m) ? dt_model_num_params(m) : 1) * sizeof(float),
                       "the parameters", (void **)&params));
    DT_CHECK(dt_malloc((dt_model_num_buffer_elems(m) ? dt_model_num_buffer_elems(m) : 1) *
                           sizeof(float),
                       "the buffers", (void **)&bufs));
    DT_CHECK(dt_model_get_params(m, params));
    if (nb)
        DT_CHECK(dt_model_get_buffers(m, bufs));
    DT_CHECK(tensors_alloc(&ts, np + nb));
    int64_t vocab = 0;
    for (int i = 0; i < np; i++) {
        const struct dt_param_info *p = dt_model_param(m, i);
        if (!strcmp(p->name, "wte.weight"))
            vocab = p->shape.dim[0];
        DT_CHECK(add(&ts, p->name, &p->shape, params + p->offset, hf));
    }
    for (int i = 0; i < nb; i++) {
        const struct dt_param_info *b = dt_model_buffer(m, i);
        DT_CHECK(add(&ts, b->name, &b->shape, bufs + b->offset, 0));
    }
    if (hf)
        st = write_hf_dir(job, o, &ts, vocab, dt_infer_dataset(in)->path);
    else {
        const char *meta[] = {"format", "pt", "producer", "dtrain", "dtrain_model_type",
                              job->model.type};
        st = dt_safetensors_save(o->out, ts.t, ts.n, meta, 3);
    }
    if (st == DT_OK)
        DT_LOG_INFO("export", "%s: %d tensors (%s)", o->out, ts.n,
                    hf ? "GPT-2's layout: config.json, model.safetensors" : "safetensors");
out:
    tensors_free(&ts);
    free(params);
    free(bufs);
    return st;
}

dt_status dt_export_run(const struct dt_job *job, dt_comm_t *comm, const struct dt_export_opts *o)
{
    dt_status st;
    dt_infer_t *in = NULL;
    if (dt_comm_size(comm) != 1)
        return dt_set_error(DT_ERR_USAGE, "dtrain export runs on one rank, not %d",
                            dt_comm_size(comm));
    DT_CHECK(check_out(o));
    if (o->format == DT_EXPORT_HF)
        DT_CHECK(refuse_hf(job));
    DT_CHECK(dt_infer_open(job, comm, &in));
    DT_CHECK(dt_infer_load(in, o->checkpoint));
    DT_CHECK(export_model(job, in, o));
out:
    dt_infer_close(in, st);
    return st;
}
