/*
 * config.c - reading job files and --set overrides into struct dt_job.
 *
 * Both go through libyaml's document API, so a value on the command line is
 * read exactly like the same text in a file, and the schema's defaults are
 * read exactly like user input too (the table stores them as text). Nodes
 * keep their marks, so an error names file:line:column, the dotted key and
 * what was expected. A load or a --set either succeeds whole or leaves the
 * job as it was.
 */
#define _GNU_SOURCE
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "config_impl.h"
#include "core/alloc.h"
#include "core/files.h"

#define KEY_MAX 512  /* longest dotted key reported as such */
#define GOT_MAX 60   /* bytes of a bad value quoted back in a message */
#define MSG_MAX 1536 /* one error message before its location */
#define LIST_MAX 256 /* entries of the largest int list field */
#define WHY_MAX 160  /* " (beyond a 64-bit integer)" and the like */
/* Bounds checked before libyaml sees a text: its parser is quadratic in
 * nesting depth (200,000 nested brackets take minutes), and a job is a few
 * KiB nested a few levels. */
#define JOB_MAX_BYTES (1u << 20)
#define JOB_MAX_DEPTH 32

/* What is being parsed and where it came from, for messages. */
struct ctx {
    struct dt_job *job;
    yaml_document_t *doc;
    const char *file;  /* job file; NULL for --set and defaults */
    const char *where; /* "--set k=v" or "default" when file is NULL */
};

/* Records "file:line:col: key: message" (or "--set k=v: key: message"). */
__attribute__((format(printf, 4, 5))) static dt_status
fail(const struct ctx *c, const yaml_mark_t *mark, const char *key, const char *fmt, ...)
{
    char msg[MSG_MAX], loc[DT_JOB_PATH + 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->file && mark)
        snprintf(loc, sizeof loc, "%s:%zu:%zu", c->file, mark->line + 1, mark->column + 1);
    else
        snprintf(loc, sizeof loc, "%s", c->file ? c->file : c->where);
    return dt_set_error(DT_ERR_USAGE, "%s: %s%s%s", loc, key, key[0] ? ": " : "", msg);
}

/* ---- nodes ------------------------------------------------------------- */

static yaml_node_t *node(const struct ctx *c, int id) { return yaml_document_get_node(c->doc, id); }

/* A plain empty, "~" or "null" scalar: YAML's null. */
static int is_null(const yaml_node_t *n)
{
    if (!n)
        return 1;
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return 0;
    const char *s = (const char *)n->data.scalar.value;
    return !s[0] || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
           !strcmp(s, "NULL");
}

/* A scalar quoted back to the user: at most GOT_MAX bytes, control
 * characters shown as '?', so the message stays one line. */
static void quote_value(const yaml_node_t *n, char *buf, size_t len)
{
    char text[GOT_MAX + 1];
    size_t l = n->data.scalar.length, shown = l > GOT_MAX ? GOT_MAX : l;
    for (size_t i = 0; i < shown; i++) {
        unsigned char ch = n->data.scalar.value[i];
        text[i] = ch < 0x20 || ch == 0x7f ? '?' : (char)ch;
    }
    text[shown] = '\0';
    snprintf(buf, len, "'%s%s'", text, l > GOT_MAX ? "..." : "");
}

/* What a node is, for "got ...": "'abc'", "a mapping", "no value". */
static void describe(const yaml_node_t *n, char *buf, size_t len)
{
    if (is_null(n)) {
        snprintf(buf, len, "no value");
    } else if (n->type == YAML_MAPPING_NODE) {
        snprintf(buf, len, "a mapping");
    } else if (n->type == YAML_SEQUENCE_NODE) {
        snprintf(buf, len, "a sequence");
    } else {
        quote_value(n, buf, len);
    }
}

static const yaml_mark_t *mark_of(const yaml_node_t *n) { return n ? &n->start_mark : NULL; }

static dt_status bad_value(const struct ctx *c, const char *key, const yaml_node_t *n,
                           const char *want, const char *why)
{
    char got[GOT_MAX + 16];
    describe(n, got, sizeof got);
    return fail(c, mark_of(n), key, "expected %s, got %s%s", want, got, why);
}

/* ---- scalars ----------------------------------------------------------- */

static int parse_int(const char *s, size_t n, int64_t *out, char *why)
{
    char *end;
    if (n == 0 || isspace((unsigned char)s[0]))
        return 0;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end != s + n)
        return 0;
    if (errno == ERANGE) {
        snprintf(why, WHY_MAX, " (beyond a 64-bit integer)");
        return 0;
    }
    *out = v;
    return 1;
}

static int parse_float(const char *s, size_t n, double *out, char *why)
{
    char *end;
    if (n == 0 || isspace((unsigned char)s[0]))
        return 0;
    errno = 0;
    double v = strtod(s, &end);
    if (end != s + n)
        return 0;
    if (!isfinite(v) || (errno == ERANGE && fabs(v) > 1)) {
        snprintf(why, WHY_MAX,
                 errno == ERANGE ? " (beyond the largest double, %.2g)" : " (not a finite number)",
                 DBL_MAX);
        return 0;
    }
    /* underflow reads as the nearest double; said in case a range then refuses it */
    if (errno == ERANGE && v == 0)
        snprintf(why, WHY_MAX, " (below the smallest double, %.2g: it reads as 0)", DBL_TRUE_MIN);
    *out = v;
    return 1;
}

static int parse_bool(const char *s, int *out)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        if (!strcasecmp(s, yes[i]) || !strcasecmp(s, no[i])) {
            *out = !strcasecmp(s, yes[i]);
            return 1;
        }
    }
    return 0;
}

static int in_range(const struct dt_cfg_key *k, double x)
{
    unsigned r = k->range;
    if ((r & DT_CFG_LO) && (x < k->lo || ((r & DT_CFG_LO_EXCL) && x == k->lo)))
        return 0;
    if ((r & DT_CFG_HI) && (x > k->hi || ((r & DT_CFG_HI_EXCL) && x == k->hi)))
        return 0;
    return 1;
}

static int is_choice(const struct dt_cfg_key *k, const char *s)
{
    for (const char *const *c = k->choices; *c; c++)
        if (!strcmp(*c, s))
            return 1;
    return 0;
}

/* Text fields: non-empty, no NUL inside, fits with its terminator. */
static int check_text(const struct dt_cfg_key *k, const char *s, size_t n, char *why)
{
    if (n == 0 || strlen(s) != n)
        return 0;
    if (n >= k->size) {
        snprintf(why, WHY_MAX, " (%zu bytes; at most %zu)", n, k->size - 1);
        return 0;
    }
    return k->type != DT_CFG_ENUM || is_choice(k, s);
}

/* Parses scalar text for a non-list key and stores it into the job. */
static int store_scalar(struct dt_job *job, const struct dt_cfg_key *k, const char *s, size_t n,
                        char *why)
{
    char *field = (char *)job + k->offset;
    int64_t i;
    double f;
    int b;
    switch (k->type) {
    case DT_CFG_INT:
        if (!parse_int(s, n, &i, why)) return 0;
        if (!in_range(k, (double)i)) {
            if (k->bound_why && (k->range & DT_CFG_HI) && (double)i >= k->hi)
                snprintf(why, WHY_MAX, " (%s)", k->bound_why);
            return 0;
        }
        memcpy(field, &i, sizeof i);
        return 1;
    case DT_CFG_FLOAT:
        if (!parse_float(s, n, &f, why) || !in_range(k, f))
            return 0;
        memcpy(field, &f, sizeof f);
        return 1;
    case DT_CFG_BOOL:
        if (!parse_bool(s, &b))
            return 0;
        memcpy(field, &b, sizeof b);
        return 1;
    default:
        if (!check_text(k, s, n, why))
            return 0;
        memset(field, 0, k->size);
        memcpy(field, s, n);
        return 1;
    }
}

static dt_status apply_scalar(const struct ctx *c, const struct dt_cfg_key *k,
                              const yaml_node_t *n)
{
    char want[512], why[WHY_MAX] = "";
    dt_cfg_expect(k, want, sizeof want);
    if (is_null(n) || n->type != YAML_SCALAR_NODE)
        return bad_value(c, k->key, n, want, "");
    const char *s = (const char *)n->data.scalar.value;
    if (!store_scalar(c->job, k, s, n->data.scalar.length, why))
        return bad_value(c, k->key, n, want, why);
    return DT_OK;
}

/* ---- int lists --------------------------------------------------------- */

static dt_status list_entry(const struct ctx *c, const struct dt_cfg_key *k, size_t idx,
                            const yaml_node_t *n, int64_t *out)
{
    char key[KEY_MAX], want[128], why[WHY_MAX] = "";
    snprintf(key, sizeof key, "%s[%zu]", k->key, idx);
    dt_cfg_expect_entry(k, want, sizeof want);
    if (is_null(n) || n->type != YAML_SCALAR_NODE)
        return bad_value(c, key, n, want, "");
    if (!parse_int((const char *)n->data.scalar.value, n->data.scalar.length, out, why) ||
        !in_range(k, (double)*out))
        return bad_value(c, key, n, want, why);
    return DT_OK;
}

static dt_status apply_list(const struct ctx *c, const struct dt_cfg_key *k, const yaml_node_t *n)
{
    char want[512];
    int64_t vals[LIST_MAX];
    size_t max = k->size / sizeof(int64_t);
    dt_cfg_expect(k, want, sizeof want);
    DT_ASSERT(max <= LIST_MAX);
    if (is_null(n) || n->type != YAML_SEQUENCE_NODE)
        return bad_value(c, k->key, n, want, "");
    size_t count = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (count < (size_t)k->min_count || count > max)
        return fail(c, mark_of(n), k->key, "expected %s, got %zu %s", want, count,
                    count == 1 ? "entry" : "entries");
    for (size_t i = 0; i < count; i++) {
        dt_status st = list_entry(c, k, i, node(c, n->data.sequence.items.start[i]), &vals[i]);
        if (st != DT_OK)
            return st;
    }
    char *field = (char *)c->job + k->offset;
    int ncount = (int)count;
    memset(field, 0, k->size);
    memcpy(field, vals, count * sizeof vals[0]);
    memcpy((char *)c->job + k->count_offset, &ncount, sizeof ncount);
    return DT_OK;
}

/* A sequence of paths, stored joined by newlines. */
static dt_status apply_paths(const struct ctx *c, const struct dt_cfg_key *k, const yaml_node_t *n)
{
    char want[512], why[WHY_MAX] = "";
    char *field = (char *)c->job + k->offset;
    char joined[sizeof c->job->data.path];
    size_t len = 0;
    dt_cfg_expect(k, want, sizeof want);
    DT_ASSERT(k->size <= sizeof joined);
    size_t count = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (count == 0)
        return fail(c, mark_of(n), k->key, "expected %s, got an empty list", want);
    for (size_t i = 0; i < count; i++) {
        const yaml_node_t *e = node(c, n->data.sequence.items.start[i]);
        if (is_null(e) || e->type != YAML_SCALAR_NODE)
            return bad_value(c, k->key, e, "a path in each list entry", "");
        const char *s = (const char *)e->data.scalar.value;
        size_t m = e->data.scalar.length;
        if (m == 0 || strlen(s) != m || memchr(s, '\n', m))
            return bad_value(c, k->key, e, "a non-empty path on one line in each list entry", "");
        if (len + m + 1 >= k->size) {
            snprintf(why, WHY_MAX, " (the list is more than %zu bytes)", k->size - 1);
            return bad_value(c, k->key, e, want, why);
        }
        if (i)
            joined[len++] = '\n';
        memcpy(joined + len, s, m);
        len += m;
    }
    memset(field, 0, k->size);
    memcpy(field, joined, len);
    return DT_OK;
}

/* ---- layer lists ------------------------------------------------------- */

static dt_status check_duplicate(const struct ctx *c, const yaml_node_t *map,
                                 const yaml_node_pair_t *pair, const char *dotted);

/* Layer names and setting keys: letters, digits, '_', '-' and '.'. */
static int plain_name(const char *s, size_t n)
{
    if (n == 0 || strlen(s) != n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-' && s[i] != '.')
            return 0;
    return 1;
}

/* A scalar, or a sequence of scalars joined by `sep`, into buf (cap bytes). */
static dt_status layer_text(const struct ctx *c, const char *key, const yaml_node_t *n, char sep,
                            int names, char *buf, size_t cap)
{
    const char *want = names ? "a layer name or a list of them (letters, digits, _ - .)"
                             : "a value or a list of values";
    size_t len = 0, count = 1;
    const yaml_node_item_t *items = NULL;
    if (is_null(n))
        return bad_value(c, key, n, want, "");
    if (n->type == YAML_SEQUENCE_NODE) {
        items = n->data.sequence.items.start;
        count = (size_t)(n->data.sequence.items.top - items);
        if (count == 0)
            return bad_value(c, key, n, want, " (an empty list)");
    } else if (n->type != YAML_SCALAR_NODE) {
        return bad_value(c, key, n, want, "");
    }
    for (size_t i = 0; i < count; i++) {
        const yaml_node_t *e = items ? node(c, items[i]) : n;
        if (is_null(e) || e->type != YAML_SCALAR_NODE)
            return bad_value(c, key, e, want, "");
        const char *v = (const char *)e->data.scalar.value;
        size_t m = e->data.scalar.length;
        if (m == 0 || strlen(v) != m || memchr(v, sep, m) || (names && !plain_name(v, m)))
            return bad_value(c, key, e, want, "");
        if (len + m + 1 >= cap) {
            char why[WHY_MAX];
            snprintf(why, sizeof why, " (longer than %zu bytes)", cap - 1);
            return bad_value(c, key, e, want, why);
        }
        if (i)
            buf[len++] = sep;
        memcpy(buf + len, v, m);
        len += m;
    }
    buf[len] = '\0';
    return DT_OK;
}

static dt_status layer_entry(const struct ctx *c, const struct dt_cfg_key *k, size_t idx,
                             const yaml_node_t *n, struct dt_layer_spec *out)
{
    char key[64], sub[KEY_MAX];
    dt_status st = DT_OK;
    snprintf(key, sizeof key, "%s[%zu]", k->key, idx);
    memset(out, 0, sizeof *out);
    if (is_null(n) || n->type != YAML_MAPPING_NODE)
        return bad_value(c, key, n, "a mapping with a kind (e.g. {kind: linear, out: 10})", "");
    for (const yaml_node_pair_t *p = n->data.mapping.pairs.start;
         st == DT_OK && p < n->data.mapping.pairs.top; p++) {
        const yaml_node_t *kn = node(c, p->key), *vn = node(c, p->value);
        if (kn->type != YAML_SCALAR_NODE ||
            !plain_name((const char *)kn->data.scalar.value, kn->data.scalar.length))
            return bad_value(c, key, kn, "a setting name", "");
        const char *name = (const char *)kn->data.scalar.value;
        if (kn->data.scalar.length >= 64)
            return bad_value(c, key, kn, "a setting name", " (too long)");
        snprintf(sub, sizeof sub, "%.64s.%.63s", key, name);
        DT_CHECK(check_duplicate(c, n, p, sub));
        if (strcmp(name, "name") == 0) {
            DT_CHECK(layer_text(c, sub, vn, ',', 1, out->name, sizeof out->name));
            if (strchr(out->name, ',') || strcmp(out->name, "x") == 0)
                return bad_value(c, sub, vn, "one layer name other than x", "");
        } else if (strcmp(name, "kind") == 0) {
            if (is_null(vn) || vn->type != YAML_SCALAR_NODE)
                return bad_value(c, sub, vn, "a layer kind", "");
            DT_CHECK(layer_text(c, sub, vn, ',', 1, out->kind, sizeof out->kind));
        } else if (strcmp(name, "inputs") == 0) {
            DT_CHECK(layer_text(c, sub, vn, ',', 1, out->inputs, sizeof out->inputs));
        } else {
            if (out->nargs == DT_LAYER_MAX_ARGS)
                return fail(c, mark_of(kn), sub, "a layer takes at most %d settings besides "
                            "name, kind and inputs", DT_LAYER_MAX_ARGS);
            if (kn->data.scalar.length >= DT_LAYER_ARG_KEY)
                return bad_value(c, key, kn, "a setting name", " (too long)");
            snprintf(out->args[out->nargs].key, DT_LAYER_ARG_KEY, "%s", name);
            DT_CHECK(layer_text(c, sub, vn, ',', 0, out->args[out->nargs].value,
                                DT_LAYER_ARG_VALUE));
            out->nargs++;
        }
    }
    if (!out->kind[0])
        return fail(c, mark_of(n), key, "no kind: every layer says what it is (e.g. kind: linear)");
out:
    return st;
}

/* A sequence of layer mappings; names must be unique. */
static dt_status apply_layers(const struct ctx *c, const struct dt_cfg_key *k, const yaml_node_t *n)
{
    size_t max = k->size / sizeof(struct dt_layer_spec);
    char want[256];
    dt_status st = DT_OK;
    dt_cfg_expect(k, want, sizeof want);
    if (is_null(n) || n->type != YAML_SEQUENCE_NODE)
        return bad_value(c, k->key, n, want, "");
    size_t count = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (count > max)
        return fail(c, mark_of(n), k->key, "expected %s, got %zu", want, count);
    struct dt_layer_spec *specs = NULL;
    if (count && (st = dt_calloc(count, sizeof *specs, "the layer list", (void **)&specs)) != DT_OK)
        return st;
    for (size_t i = 0; i < count && st == DT_OK; i++) {
        const yaml_node_t *e = node(c, n->data.sequence.items.start[i]);
        st = layer_entry(c, k, i, e, &specs[i]);
        for (size_t j = 0; j < i && st == DT_OK; j++)
            if (specs[i].name[0] && strcmp(specs[i].name, specs[j].name) == 0) {
                char key[KEY_MAX];
                snprintf(key, sizeof key, "%s[%zu].name", k->key, i);
                st = fail(c, mark_of(e), key, "'%s' names layer %zu already; names are unique",
                          specs[i].name, j);
            }
    }
    if (st == DT_OK) {
        int ncount = (int)count;
        char *field = (char *)c->job + k->offset;
        memset(field, 0, k->size);
        if (count)
            memcpy(field, specs, count * sizeof *specs);
        memcpy((char *)c->job + k->count_offset, &ncount, sizeof ncount);
    }
    free(specs);
    return st;
}

static dt_status apply_leaf(const struct ctx *c, const struct dt_cfg_key *k, const yaml_node_t *n)
{
    if (k->type == DT_CFG_LAYERS)
        return apply_layers(c, k, n);
    if (k->type == DT_CFG_PATHS && !is_null(n) && n->type == YAML_SEQUENCE_NODE)
        return apply_paths(c, k, n);
    return k->type == DT_CFG_INT_LIST ? apply_list(c, k, n) : apply_scalar(c, k, n);
}

/* ---- keys and sections ------------------------------------------------- */

static dt_status unknown_key(const struct ctx *c, const yaml_mark_t *mark, const char *dotted)
{
    char hint[KEY_MAX], parent[KEY_MAX], kids[1024];
    if (dt_cfg_suggest(dotted, hint, sizeof hint))
        return fail(c, mark, dotted, "unknown key; did you mean '%s'?", hint);
    dt_cfg_parent(dotted, parent, sizeof parent);
    while (parent[0] && !dt_cfg_find_section(parent))
        dt_cfg_parent(parent, parent, sizeof parent);
    dt_cfg_children(parent, kids, sizeof kids);
    if (!parent[0])
        return fail(c, mark, dotted, "unknown key; the sections are %s", kids);
    return fail(c, mark, dotted, "unknown key; the keys of %s are %s", parent, kids);
}

/* The first leaf key inside a section, for an example. */
static const char *first_key_in(const char *section)
{
    size_t n = strlen(section);
    for (size_t i = 0; i < dt_cfg_nkeys; i++)
        if (!strncmp(dt_cfg_keys[i].key, section, n) && dt_cfg_keys[i].key[n] == '.')
            return dt_cfg_keys[i].key;
    return section;
}

static dt_status walk_mapping(const struct ctx *c, const yaml_node_t *map, const char *section);

static dt_status apply_section(const struct ctx *c, const char *dotted, const yaml_node_t *v)
{
    char kids[1024], got[GOT_MAX + 16];
    if (is_null(v))
        return DT_OK; /* "runtime:" with every key commented out */
    if (v->type == YAML_MAPPING_NODE)
        return walk_mapping(c, v, dotted);
    dt_cfg_children(dotted, kids, sizeof kids);
    describe(v, got, sizeof got);
    return fail(c, mark_of(v), dotted, "expected a mapping (a section with keys %s), got %s", kids,
                got);
}

/* The dotted name of a mapping key under section; an error unless a plain name. */
static dt_status key_text(const struct ctx *c, const char *section, const yaml_node_t *kn,
                          char *dotted, size_t len)
{
    char got[GOT_MAX + 16];
    describe(kn, got, sizeof got);
    if (kn->type != YAML_SCALAR_NODE)
        return fail(c, mark_of(kn), section, "expected a key name, got %s", got);
    const char *k = (const char *)kn->data.scalar.value;
    snprintf(dotted, len, "%s%s%s", section, section[0] ? "." : "", k);
    if (strchr(k, '.'))
        return fail(c, mark_of(kn), dotted,
                    "dotted names are for --set; in a job file nest each part as a mapping");
    return DT_OK;
}

static dt_status check_duplicate(const struct ctx *c, const yaml_node_t *map,
                                 const yaml_node_pair_t *pair, const char *dotted)
{
    const yaml_node_t *kn = node(c, pair->key);
    for (const yaml_node_pair_t *p = map->data.mapping.pairs.start; p < pair; p++) {
        const yaml_node_t *prev = node(c, p->key);
        if (prev->type == YAML_SCALAR_NODE && prev->data.scalar.length == kn->data.scalar.length &&
            !memcmp(prev->data.scalar.value, kn->data.scalar.value, kn->data.scalar.length))
            return fail(c, mark_of(kn), dotted, "duplicate key (first given at line %zu)",
                        prev->start_mark.line + 1);
    }
    return DT_OK;
}

static dt_status walk_mapping(const struct ctx *c, const yaml_node_t *map, const char *section)
{
    dt_status st = DT_OK;
    for (const yaml_node_pair_t *p = map->data.mapping.pairs.start;
         st == DT_OK && p < map->data.mapping.pairs.top; p++) {
        char dotted[KEY_MAX];
        const yaml_node_t *kn = node(c, p->key), *vn = node(c, p->value);
        const struct dt_cfg_key *k;
        DT_CHECK(key_text(c, section, kn, dotted, sizeof dotted));
        DT_CHECK(check_duplicate(c, map, p, dotted));
        if ((k = dt_cfg_find(dotted)))
            st = apply_leaf(c, k, vn);
        else if (dt_cfg_find_section(dotted))
            st = apply_section(c, dotted, vn);
        else
            st = unknown_key(c, mark_of(kn), dotted);
    }
out:
    return st;
}

static dt_status apply_document(const struct ctx *c)
{
    char kids[256], got[GOT_MAX + 16];
    const yaml_node_t *root = yaml_document_get_root_node(c->doc);
    if (is_null(root)) /* an empty file, or one whose job was lost: never a silent default job */
        return dt_set_error(DT_ERR_USAGE,
                            "job file %s is empty (no keys: only blanks, comments or a null "
                            "document): write the keys that differ from the defaults ('dtrain "
                            "config defaults' prints them all), or {} for a job of defaults alone",
                            c->file);
    if (root->type == YAML_MAPPING_NODE)
        return walk_mapping(c, root, "");
    dt_cfg_children("", kids, sizeof kids);
    describe(root, got, sizeof got);
    return fail(c, mark_of(root), "", "expected a mapping of sections (%s), got %s", kids, got);
}

/* ---- libyaml ----------------------------------------------------------- */

/* libyaml's own words for a syntax error, at the place it points to. key is
 * the key a --set value was meant for ("" for a file). */
static dt_status yaml_failure(const struct ctx *c, const yaml_parser_t *p, const char *key)
{
    char ctxt[256] = "";
    const char *what = c->file ? c->file : c->where;
    if (p->error == YAML_MEMORY_ERROR)
        return dt_set_error(DT_ERR_NOMEM, "%s: out of memory while parsing YAML", what);
    const char *problem = p->problem ? p->problem : "invalid YAML";
    if (p->error == YAML_READER_ERROR)
        return dt_set_error(DT_ERR_USAGE, "%s: byte %zu: %s", what, p->problem_offset, problem);
    if (p->context && c->file)
        snprintf(ctxt, sizeof ctxt, " (%s at line %zu, column %zu)", p->context,
                 p->context_mark.line + 1, p->context_mark.column + 1);
    else if (p->context)
        snprintf(ctxt, sizeof ctxt, " (%s)", p->context);
    if (c->file)
        return dt_set_error(DT_ERR_USAGE, "%s:%zu:%zu: invalid YAML: %s%s", c->file,
                            p->problem_mark.line + 1, p->problem_mark.column + 1, problem, ctxt);
    return dt_set_error(DT_ERR_USAGE, "%s: %s: invalid YAML value: %s%s", what, key, problem,
                        ctxt);
}

/* A job is one YAML document; a second one is an error, not ignored. */
static dt_status check_single_document(const struct ctx *c, yaml_parser_t *p, const char *key)
{
    yaml_document_t next;
    if (!yaml_parser_load(p, &next))
        return yaml_failure(c, p, key);
    yaml_node_t *root = yaml_document_get_root_node(&next);
    int empty = is_null(root); /* a stray "---" at the end is harmless */
    yaml_mark_t mark = next.start_mark;
    yaml_document_delete(&next);
    if (empty)
        return DT_OK;
    return fail(c, &mark, key, "found a second YAML document; a job is one document");
}

/* ---- bounds before parsing ---------------------------------------------- */

/* Whether a quote at text[i] opens a quoted scalar: YAML quotes start a
 * token; inside a plain scalar ("it's") they are ordinary characters. */
static int opens_quote(const char *text, size_t i)
{
    if (i == 0)
        return 1;
    char p = text[i - 1];
    return p == ' ' || p == '\t' || p == '\n' || p == '\r' || p == ':' || p == ',' || p == '[' ||
           p == '{' || p == '-';
}

/* Refuses flow collections nested deeper than JOB_MAX_DEPTH, in one pass
 * over the text (quoted scalars and comments skipped; brackets inside
 * plain or block scalars are counted, which only errs on the safe side). */
static dt_status check_nesting(const struct ctx *c, const char *text, size_t len, const char *key)
{
    size_t line = 1, col = 1;
    int depth = 0;
    char quote = 0, comment = 0;
    for (size_t i = 0; i < len; i++, col++) {
        char ch = text[i];
        if (ch == '\n') {
            line++;
            col = 0;
            comment = 0;
            continue;
        }
        if (comment)
            continue;
        if (quote) {
            if (ch == '\\' && quote == '"' && i + 1 < len)
                i++, col++;
            else if (ch == quote)
                quote = 0;
            continue;
        }
        if ((ch == '\'' || ch == '"') && opens_quote(text, i))
            quote = ch;
        else if (ch == '#' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\t'))
            comment = 1;
        else if ((ch == '[' || ch == '{') && ++depth > JOB_MAX_DEPTH) {
            yaml_mark_t m = {.line = line - 1, .column = col - 1};
            return fail(c, &m, key, "nested deeper than %d levels; a job is a few levels deep",
                        JOB_MAX_DEPTH);
        } else if ((ch == ']' || ch == '}') && depth > 0)
            depth--;
    }
    return DT_OK;
}

/* Parses the parser's input and applies it to c->job (c->doc is set here). */
static dt_status parse_input(struct ctx *c, yaml_parser_t *p, const struct dt_cfg_key *leaf)
{
    yaml_document_t doc;
    dt_status st;
    const char *key = leaf ? leaf->key : "";
    if (!yaml_parser_load(p, &doc))
        return yaml_failure(c, p, key);
    c->doc = &doc;
    st = check_single_document(c, p, key); /* first, so a failed --set changes nothing */
    if (st == DT_OK && leaf)
        st = apply_leaf(c, leaf, yaml_document_get_root_node(&doc));
    else if (st == DT_OK)
        st = apply_document(c);
    yaml_document_delete(&doc);
    c->doc = NULL;
    return st;
}

/* Parses YAML text (a whole job, or one key's value when leaf is set) and
 * applies it to c->job, after the size and nesting bounds. */
static dt_status parse_text(struct ctx *c, const char *text, size_t len,
                            const struct dt_cfg_key *leaf)
{
    yaml_parser_t p;
    const char *key = leaf ? leaf->key : "";
    if (len > JOB_MAX_BYTES)
        return fail(c, NULL, key, "%zu bytes; a job is at most %u bytes", len, JOB_MAX_BYTES);
    dt_status st = check_nesting(c, text, len, key);
    if (st != DT_OK)
        return st;
    if (!yaml_parser_initialize(&p))
        return dt_set_error(DT_ERR_NOMEM, "%s: out of memory starting the YAML parser",
                            c->file ? c->file : c->where);
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    st = parse_input(c, &p, leaf);
    yaml_parser_delete(&p);
    return st;
}

/* Reads value text (a YAML scalar or flow sequence) into one key. */
static dt_status apply_text(struct ctx *c, const struct dt_cfg_key *k, const char *text)
{
    return parse_text(c, text, strlen(text), k);
}

/* ---- public ------------------------------------------------------------ */

void dt_job_defaults(struct dt_job *job)
{
    DT_ASSERT(job);
    dt_cfg_check_schema();
    memset(job, 0, sizeof *job);
    for (size_t i = 0; i < dt_cfg_nkeys; i++) {
        struct ctx c = {.job = job, .where = "schema default"};
        if (apply_text(&c, &dt_cfg_keys[i], dt_cfg_keys[i].def) != DT_OK) {
            fprintf(stderr, "dtrain: internal error: %s\n", dt_last_error());
            DT_ASSERT(!"every schema default parses");
        }
    }
}

/* Reads a job file whole (it goes through dtrain's one input check, so a
 * directory or a FIFO is refused at once), at most JOB_MAX_BYTES. */
static dt_status read_job(const char *path, char **text, size_t *len)
{
    int fd;
    int64_t size;
    dt_status st = dt_input_open(path, "job file", &fd, &size);
    if (st != DT_OK)
        return st;
    *text = NULL;
    if (size > (int64_t)JOB_MAX_BYTES) {
        close(fd);
        return dt_set_error(DT_ERR_USAGE, "job file %s: %lld bytes; a job is at most %u bytes",
                            path, (long long)size, JOB_MAX_BYTES);
    }
    char *buf = malloc(JOB_MAX_BYTES + 1);
    size_t got = 0;
    ssize_t r = 1;
    while (buf && got <= JOB_MAX_BYTES && r > 0) {
        r = read(fd, buf + got, JOB_MAX_BYTES + 1 - got);
        if (r > 0)
            got += (size_t)r;
        else if (r < 0 && errno == EINTR)
            r = 1;
    }
    int err = errno;
    close(fd);
    if (!buf)
        return dt_set_error(DT_ERR_NOMEM, "job file %s: out of memory reading it", path);
    if (r < 0) {
        free(buf);
        return dt_set_error(DT_ERR_IO, "cannot read job file '%s': %s", path, strerror(err));
    }
    if (got > JOB_MAX_BYTES) {
        free(buf);
        return dt_set_error(DT_ERR_USAGE,
                            "job file %s: more than %u bytes; a job is at most %u "
                            "bytes",
                            path, JOB_MAX_BYTES, JOB_MAX_BYTES);
    }
    buf[got] = '\0';
    *text = buf;
    *len = got;
    return DT_OK;
}

/* Defaults, then the job text on top, into *job only when all of it applies. */
static dt_status load_text(const char *name, const char *text, size_t len, struct dt_job *job)
{
    dt_status st = DT_OK;
    struct dt_job *tmp = NULL;
    struct ctx c = {.file = name};
    if (strlen(name) >= sizeof job->source)
        return dt_set_error(DT_ERR_USAGE, "job file path is too long (%zu bytes; at most %zu)",
                            strlen(name), sizeof job->source - 1);
    DT_CHECK(dt_malloc(sizeof *tmp, "the job", (void **)&tmp));
    dt_job_defaults(tmp);
    snprintf(tmp->source, sizeof tmp->source, "%s", name);
    c.job = tmp;
    DT_CHECK(parse_text(&c, text, len, NULL));
    memcpy(job, tmp, sizeof *job);
out:
    free(tmp);
    return st;
}

dt_status dt_job_load(const char *path, struct dt_job *job)
{
    DT_ASSERT(path && job);
    char *text = NULL;
    size_t len = 0;
    if (strlen(path) >= sizeof job->source)
        return dt_set_error(DT_ERR_USAGE, "job file path is too long (%zu bytes; at most %zu)",
                            strlen(path), sizeof job->source - 1);
    dt_status st = read_job(path, &text, &len);
    if (st == DT_OK)
        st = load_text(path, text, len, job);
    free(text);
    return st;
}

dt_status dt_job_load_text(const char *name, const char *text, struct dt_job *job)
{
    DT_ASSERT(name && text && job);
    return load_text(name, text, strlen(text), job);
}

/* The key part of "key=value" with surrounding blanks removed. */
static void assignment_key(const char *a, const char *eq, char *buf, size_t len)
{
    while (a < eq && isspace((unsigned char)*a))
        a++;
    while (eq > a && isspace((unsigned char)eq[-1]))
        eq--;
    snprintf(buf, len, "%.*s", (int)(eq - a), a);
}

dt_status dt_job_set(struct dt_job *job, const char *assignment)
{
    DT_ASSERT(job && assignment);
    char where[KEY_MAX + 64], key[KEY_MAX], kids[1024];
    struct ctx c = {.job = job, .where = where};
    snprintf(where, sizeof where, "--set %s", assignment);
    const char *eq = strchr(assignment, '=');
    if (!eq)
        return dt_set_error(DT_ERR_USAGE, "%s: expected key=value, e.g. train.optimizer.lr=0.01",
                            where);
    assignment_key(assignment, eq, key, sizeof key);
    if (!key[0])
        return dt_set_error(DT_ERR_USAGE, "%s: no key before '='", where);
    const struct dt_cfg_key *k = dt_cfg_find(key);
    if (k)
        return apply_text(&c, k, eq + 1);
    if (!dt_cfg_find_section(key))
        return unknown_key(&c, NULL, key);
    dt_cfg_children(key, kids, sizeof kids);
    return fail(&c, NULL, key, "is a section with keys %s; set one key in it, e.g. --set %s=...",
                kids, first_key_in(key));
}

dt_status dt_job_validate(const struct dt_job *job)
{
    DT_ASSERT(job);
    char msg[MSG_MAX];
    for (size_t i = 0; i < dt_cfg_nrelations; i++) {
        if (!dt_cfg_relations[i].check(job, msg, sizeof msg))
            continue;
        if (job->source[0])
            return dt_set_error(DT_ERR_USAGE, "%s: %s", job->source, msg);
        return dt_set_error(DT_ERR_USAGE, "%s", msg);
    }
    return DT_OK;
}
