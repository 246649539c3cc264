/*
 * model_expand.c - the model families as layer lists: model.type mlp, cnn
 * and resnet are shorthands for lists a user could write in model.layers
 * (--print-config shows them), so every family runs through the one graph
 * builder in model.c.
 *
 *   mlp:    flatten; per model.hidden entry i: fc<i> (linear), <act><i>,
 *           dropout<i> (when model.dropout > 0); fc<n+1> to the classes;
 *           loss. The names and order are those of every earlier version,
 *           so their checkpoints load.
 *   cnn:    per model.channels entry i: stage<i>.conv (3x3, padding 1, no
 *           bias), stage<i>.bn, stage<i>.<act>, stage<i>.pool (2x2 max);
 *           then flatten and the mlp's fully connected part.
 *   resnet: stem.conv (3x3), stem.bn, stem.<act>; per stage s and block b,
 *           stage<s>.block<b> (residual; the first block of every stage
 *           after the first has stride 2); pool (global average); fc to
 *           the classes; loss.
 *   gpt:    wte (embedding), wpe (pos_embedding), drop; per block i of
 *           model.n_layer: h<i>.ln1, h<i>.qkv (linear 3C), h<i>.attn,
 *           h<i>.proj, [h<i>.drop1], h<i>.res1 (add), h<i>.ln2, h<i>.fc
 *           (linear 4C), h<i>.gelu (kind gelu, or gelu_tanh with model.gelu
 *           tanh), h<i>.fc2, [h<i>.drop2], h<i>.res2; ln_f;
 *           head (linear to the vocabulary, no bias, tied to wte.weight
 *           with model.tie_embeddings); loss. Weights start normal(0,
 *           0.02), the residual projections (proj, fc2) normal(0,
 *           0.02/sqrt(2 n_layer)), as GPT-2; each block is recomputable.
 *           ln1, ln2 and ln_f are of the kind model.norm names (layernorm
 *           or rmsnorm).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "model.h"

struct list {
    struct dt_layer_spec *l;
    int n, max;
    int full;
    struct dt_layer_spec spare; /* absorbs entries past max; reported by full */
};

static struct dt_layer_spec *add(struct list *s, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static struct dt_layer_spec *add(struct list *s, const char *kind, const char *fmt, ...)
{
    struct dt_layer_spec *e = s->n < s->max ? &s->l[s->n] : &s->spare;
    if (s->n >= s->max)
        s->full = 1;
    else
        s->n++;
    memset(e, 0, sizeof *e);
    snprintf(e->kind, sizeof e->kind, "%s", kind);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->name, sizeof e->name, fmt, ap);
    va_end(ap);
    return e;
}

static void classifier(struct list *s, const struct dt_job *job)
{
    const char *act = job->model.activation;
    for (int i = 0; i < job->model.nhidden; i++) {
        dt_layer_spec_arg(add(s, "linear", "fc%d", i + 1), "out", "%lld",
                          (long long)job->model.hidden[i]);
        add(s, act, "%s%d", act, i + 1);
        if (job->model.dropout > 0)
            dt_layer_spec_arg(add(s, "dropout", "dropout%d", i + 1), "p", "%.17g",
                              job->model.dropout);
    }
    dt_layer_spec_arg(add(s, "linear", "fc%d", job->model.nhidden + 1), "out", "classes");
}

static void gpt(struct list *s, const struct dt_job *job)
{
    const long long C = (long long)job->model.n_embd, L = (long long)job->model.n_layer;
    const double p = job->model.dropout, proj_std = 0.02 / sqrt(2.0 * (double)L);
    const char *norm = job->model.norm;
    char prev[DT_LAYER_NAME];
    struct dt_layer_spec *e = add(s, "embedding", "wte");
    dt_layer_spec_arg(e, "dim", "%lld", C);
    if (job->model.vocab_size > 0)
        dt_layer_spec_arg(e, "vocab", "%lld", (long long)job->model.vocab_size);
    add(s, "pos_embedding", "wpe");
    snprintf(prev, sizeof prev, "wpe");
    if (p > 0) {
        dt_layer_spec_arg(add(s, "dropout", "drop"), "p", "%.17g", p);
        snprintf(prev, sizeof prev, "drop");
    }
    for (long long i = 0; i < L; i++) {
        add(s, norm, "h%lld.ln1", i);
        e = add(s, "linear", "h%lld.qkv", i);
        dt_layer_spec_arg(e, "out", "%lld", 3 * C);
        dt_layer_spec_arg(e, "init_std", "0.02");
        dt_layer_spec_arg(add(s, "attention", "h%lld.attn", i), "heads", "%lld",
                          (long long)job->model.n_head);
        e = add(s, "linear", "h%lld.proj", i);
        dt_layer_spec_arg(e, "out", "%lld", C);
        dt_layer_spec_arg(e, "init_std", "%.17g", proj_std);
        if (p > 0)
            dt_layer_spec_arg(add(s, "dropout", "h%lld.drop1", i), "p", "%.17g", p);
        e = add(s, "add", "h%lld.res1", i);
        snprintf(e->inputs, sizeof e->inputs, "%s,h%lld.%s", prev, i, p > 0 ? "drop1" : "proj");
        add(s, norm, "h%lld.ln2", i);
        e = add(s, "linear", "h%lld.fc", i);
        dt_layer_spec_arg(e, "out", "%lld", 4 * C);
        dt_layer_spec_arg(e, "init_std", "0.02");
        add(s, strcmp(job->model.gelu, "tanh") == 0 ? "gelu_tanh" : "gelu", "h%lld.gelu", i);
        e = add(s, "linear", "h%lld.fc2", i);
        dt_layer_spec_arg(e, "out", "%lld", C);
        dt_layer_spec_arg(e, "init_std", "%.17g", proj_std);
        if (p > 0)
            dt_layer_spec_arg(add(s, "dropout", "h%lld.drop2", i), "p", "%.17g", p);
        e = add(s, "add", "h%lld.res2", i);
        snprintf(e->inputs, sizeof e->inputs, "h%lld.res1,h%lld.%s", i, i, p > 0 ? "drop2" : "fc2");
        snprintf(prev, sizeof prev, "h%lld.res2", i);
    }
    add(s, norm, "ln_f");
    e = add(s, "linear", "head");
    dt_layer_spec_arg(e, "out", "classes");
    dt_layer_spec_arg(e, "bias", "false");
    if (job->model.tie_embeddings)
        dt_layer_spec_arg(e, "tie", "wte");
    else
        dt_layer_spec_arg(e, "init_std", "0.02");
    add(s, "softmax_xent", "loss");
}

dt_status dt_model_expand(const struct dt_job *job, struct dt_layer_spec *out, int max, int *n)
{
    struct list s = {.l = out, .max = max};
    const char *type = job->model.type, *act = job->model.activation;
    if (strcmp(type, "layers") == 0) {
        for (int i = 0; i < job->model.nlayers; i++)
            *add(&s, "", "%s", "") = job->model.layers[i];
    } else if (strcmp(type, "mlp") == 0) {
        add(&s, "flatten", "flatten");
        classifier(&s, job);
        add(&s, "softmax_xent", "loss");
    } else if (strcmp(type, "cnn") == 0) {
        for (int i = 0; i < job->model.nchannels; i++) {
            struct dt_layer_spec *c = add(&s, "conv2d", "stage%d.conv", i + 1);
            dt_layer_spec_arg(c, "out", "%lld", (long long)job->model.channels[i]);
            dt_layer_spec_arg(c, "kernel", "3");
            dt_layer_spec_arg(c, "padding", "1");
            dt_layer_spec_arg(c, "bias", "false");
            add(&s, "batchnorm", "stage%d.bn", i + 1);
            add(&s, act, "stage%d.%s", i + 1, act);
            dt_layer_spec_arg(add(&s, "maxpool2d", "stage%d.pool", i + 1), "kernel", "2");
        }
        add(&s, "flatten", "flatten");
        classifier(&s, job);
        add(&s, "softmax_xent", "loss");
    } else if (strcmp(type, "resnet") == 0) {
        struct dt_layer_spec *c = add(&s, "conv2d", "stem.conv");
        dt_layer_spec_arg(c, "out", "%lld", (long long)job->model.channels[0]);
        dt_layer_spec_arg(c, "kernel", "3");
        dt_layer_spec_arg(c, "padding", "1");
        dt_layer_spec_arg(c, "bias", "false");
        add(&s, "batchnorm", "stem.bn");
        add(&s, act, "stem.%s", act);
        for (int st = 0; st < job->model.nchannels && st < job->model.nblocks; st++)
            for (int b = 0; b < job->model.blocks[st]; b++) {
                struct dt_layer_spec *r = add(&s, "residual", "stage%d.block%d", st + 1, b + 1);
                dt_layer_spec_arg(r, "out", "%lld", (long long)job->model.channels[st]);
                if (st > 0 && b == 0)
                    dt_layer_spec_arg(r, "stride", "2");
            }
        add(&s, "global_avgpool", "pool");
        dt_layer_spec_arg(add(&s, "linear", "fc"), "out", "classes");
        add(&s, "softmax_xent", "loss");
    } else if (strcmp(type, "gpt") == 0) {
        gpt(&s, job);
    } else {
        return dt_set_error(DT_ERR_USAGE,
                            "model.type '%s' is not implemented in this version (available: mlp, "
                            "cnn, resnet, gpt, layers)",
                            type);
    }
    if (s.full) /* a caller's shorter list: the job's bounds keep each family within the graph */
        return dt_set_error(DT_ERR_USAGE, "model.type %s expands into more than %d layers", type,
                            max);
    *n = s.n;
    return DT_OK;
}
