/*
 * registry.c - the list of layer kinds, and the setting readers every kind
 * uses, so each setting is checked and reported the same way.
 */
#include "layer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const struct dt_layer_kind dt_layer_linear, dt_layer_conv2d, dt_layer_maxpool2d,
    dt_layer_avgpool2d, dt_layer_global_avgpool, dt_layer_batchnorm, dt_layer_layernorm,
    dt_layer_relu, dt_layer_gelu, dt_layer_tanh, dt_layer_dropout, dt_layer_flatten,
    dt_layer_add, dt_layer_softmax_xent;

static const struct dt_layer_kind *const kinds[] = {
    &dt_layer_linear,    &dt_layer_conv2d,    &dt_layer_maxpool2d, &dt_layer_avgpool2d,
    &dt_layer_global_avgpool, &dt_layer_batchnorm, &dt_layer_layernorm, &dt_layer_relu,
    &dt_layer_gelu,      &dt_layer_tanh,      &dt_layer_dropout,   &dt_layer_flatten,
    &dt_layer_add,       &dt_layer_softmax_xent,
};
#define NKINDS ((int)(sizeof kinds / sizeof kinds[0]))

const struct dt_layer_kind *dt_layer_kind_find(const char *name)
{
    for (int i = 0; i < NKINDS; i++)
        if (strcmp(kinds[i]->name, name) == 0)
            return kinds[i];
    return NULL;
}

void dt_layer_kind_names(char *buf, size_t len)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < NKINDS && k < len; i++) {
        int w = snprintf(buf + k, len - k, "%s%s", i ? ", " : "", kinds[i]->name);
        if (w < 0)
            break;
        k += (size_t)w;
    }
}

int dt_layer_kind_count(void) { return NKINDS; }

const struct dt_layer_kind *dt_layer_kind_at(int i) { return i >= 0 && i < NKINDS ? kinds[i] : NULL; }

const char *dt_decay_group_name(enum dt_decay_group g)
{
    switch (g) {
    case DT_GROUP_WEIGHT: return "weight";
    case DT_GROUP_BIAS: return "bias";
    case DT_GROUP_NORM: return "norm";
    }
    return "unknown";
}

/* ---- settings ------------------------------------------------------------ */

static const char *find(const struct dt_layer_spec *spec, const char *key)
{
    for (int i = 0; i < spec->nargs; i++)
        if (strcmp(spec->args[i].key, key) == 0)
            return spec->args[i].value;
    return NULL;
}

static int parse_i64(const char *s, size_t n, int64_t *out)
{
    char buf[DT_LAYER_ARG_VALUE], *end;
    if (n == 0 || n >= sizeof buf)
        return 0;
    memcpy(buf, s, n);
    buf[n] = '\0';
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno || *end || end == buf)
        return 0;
    *out = v;
    return 1;
}

static dt_status bad(const struct dt_layer *l, const char *key, const char *want, const char *got)
{
    return dt_set_error(DT_ERR_USAGE, "%s: %s: expected %s, got '%s'", l->where, key, want, got);
}

dt_status dt_layer_int(const struct dt_layer *l, const struct dt_layer_spec *spec,
                       const char *key, int64_t def, int64_t lo, int64_t hi, int64_t *out)
{
    const char *v = find(spec, key);
    char want[96];
    snprintf(want, sizeof want, "an integer from %lld to %lld", (long long)lo, (long long)hi);
    if (!v) {
        *out = def;
        return DT_OK;
    }
    if (!parse_i64(v, strlen(v), out) || *out < lo || *out > hi)
        return bad(l, key, want, v);
    return DT_OK;
}

dt_status dt_layer_int2(const struct dt_layer *l, const struct dt_layer_spec *spec,
                        const char *key, int64_t def, int64_t lo, int64_t hi, int64_t out[2])
{
    const char *v = find(spec, key);
    char want[128];
    snprintf(want, sizeof want, "an integer from %lld to %lld, or a list of two (height, width)",
             (long long)lo, (long long)hi);
    if (!v) {
        out[0] = out[1] = def;
        return DT_OK;
    }
    const char *comma = strchr(v, ',');
    if (!comma) {
        if (!parse_i64(v, strlen(v), &out[0]))
            return bad(l, key, want, v);
        out[1] = out[0];
    } else if (strchr(comma + 1, ',') || !parse_i64(v, (size_t)(comma - v), &out[0]) ||
               !parse_i64(comma + 1, strlen(comma + 1), &out[1])) {
        return bad(l, key, want, v);
    }
    if (out[0] < lo || out[0] > hi || out[1] < lo || out[1] > hi)
        return bad(l, key, want, v);
    return DT_OK;
}

dt_status dt_layer_float(const struct dt_layer *l, const struct dt_layer_spec *spec,
                         const char *key, double def, double lo, double hi, int hi_excl,
                         double *out)
{
    const char *v = find(spec, key);
    char want[96], *end;
    snprintf(want, sizeof want, "a number in [%g, %g%s", lo, hi, hi_excl ? ")" : "]");
    if (!v) {
        *out = def;
        return DT_OK;
    }
    errno = 0;
    *out = strtod(v, &end);
    if (errno || *end || end == v || !isfinite(*out) || *out < lo || *out > hi ||
        (hi_excl && *out >= hi))
        return bad(l, key, want, v);
    return DT_OK;
}

dt_status dt_layer_bool(const struct dt_layer *l, const struct dt_layer_spec *spec,
                        const char *key, int def, int *out)
{
    const char *v = find(spec, key);
    if (!v) {
        *out = def;
        return DT_OK;
    }
    if (strcmp(v, "true") == 0 || strcmp(v, "True") == 0 || strcmp(v, "yes") == 0)
        *out = 1;
    else if (strcmp(v, "false") == 0 || strcmp(v, "False") == 0 || strcmp(v, "no") == 0)
        *out = 0;
    else
        return bad(l, key, "true or false", v);
    return DT_OK;
}

dt_status dt_layer_known(const struct dt_layer *l, const struct dt_layer_spec *spec,
                         const char *const *known)
{
    for (int i = 0; i < spec->nargs; i++) {
        int ok = 0;
        for (const char *const *k = known; *k && !ok; k++)
            ok = strcmp(*k, spec->args[i].key) == 0;
        if (ok)
            continue;
        char list[256] = "";
        size_t at = 0;
        for (const char *const *k = known; *k && at < sizeof list; k++) {
            int w = snprintf(list + at, sizeof list - at, "%s%s", k == known ? "" : ", ", *k);
            at += w > 0 ? (size_t)w : 0;
        }
        return dt_set_error(DT_ERR_USAGE, "%s: %s has no setting '%s' (its settings: %s)", l->where,
                            l->kind->name, spec->args[i].key, known[0] ? list : "none");
    }
    return DT_OK;
}

dt_status dt_layer_want_image(const struct dt_layer *l)
{
    char s[64];
    if (l->in.ndim == 3)
        return DT_OK;
    return dt_set_error(DT_ERR_USAGE,
                        "%s: %s takes images (channels, height, width), but its input is %s; "
                        "put it before the flatten layer",
                        l->where, l->kind->name, dt_shape_format(&l->in, s, sizeof s));
}

static void decl(struct dt_tensor_decl *d, const char *what, struct dt_shape shape,
                 enum dt_init init, enum dt_decay_group group, int64_t fan_in, int64_t fan_out)
{
    memset(d, 0, sizeof *d);
    snprintf(d->what, sizeof d->what, "%s", what);
    d->shape = shape;
    d->init = init;
    d->group = group;
    d->fan_in = fan_in;
    d->fan_out = fan_out;
}

void dt_layer_param(struct dt_layer *l, const char *what, struct dt_shape shape,
                    enum dt_init init, enum dt_decay_group group, int64_t fan_in,
                    int64_t fan_out)
{
    DT_ASSERT(l->nparams < DT_LAYER_MAX_PARAMS);
    decl(&l->params[l->nparams++], what, shape, init, group, fan_in, fan_out);
}

void dt_layer_buffer(struct dt_layer *l, const char *what, struct dt_shape shape,
                     enum dt_init init)
{
    DT_ASSERT(l->nbuffers < DT_LAYER_MAX_BUFFERS);
    decl(&l->buffers[l->nbuffers++], what, shape, init, DT_GROUP_NORM, 0, 0);
}
