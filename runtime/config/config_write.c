/*
 * config_write.c - printing a job and the job-file reference from the schema.
 *
 * dt_job_write_yaml walks the key table in order and opens a nested mapping
 * whenever the section changes, so the output lists every key and
 * dt_job_load reads it back to an equal job: floats are printed with the
 * fewest digits that read back exactly, strings are quoted whenever a plain
 * scalar could be misread. dt_job_write_reference renders the same table as
 * Markdown; docs/config.md is its output and a unit test keeps them equal.
 */
#include "config.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config_impl.h"

#define INDENT 2 /* spaces per nesting level in the YAML dump */

/* ---- YAML -------------------------------------------------------------- */

/* Words a YAML 1.1 reader takes for a bool or null when plain. */
static int is_special_word(const char *s)
{
    static const char *const words[] = {"true", "false", "yes", "no",  "on", "off",
                                        "y",    "n",     "null", "~"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (!strcasecmp(s, words[i]))
            return 1;
    return 0;
}

/* Whether s must be quoted to read back as the same string. */
static int needs_quotes(const char *s)
{
    char *end;
    if (!s[0] || is_special_word(s))
        return 1;
    strtod(s, &end);
    if (*end == '\0')
        return 1; /* looks like a number */
    if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_/", s[0]))
        return 1; /* digits, signs and dots may start a number in some YAML reader */
    for (const char *p = s; *p; p++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./+-", *p))
            return 1;
    return 0;
}

/* Writes the escape a double-quoted YAML scalar needs for the character
 * at p and returns the bytes it stands for, or returns 0 for a character
 * printed as it is. Escaped besides '"' and '\\': what YAML does not allow
 * raw (C0 and C1 controls, U+FFFE, U+FFFF) and what a reader would fold as
 * a line break (NEL, U+2028, U+2029). Strings arrive as valid UTF-8. */
static int write_escape(FILE *out, const unsigned char *p)
{
    if (p[0] == '"' || p[0] == '\\')
        return fprintf(out, "\\%c", p[0]), 1;
    if (p[0] < 0x20 || p[0] == 0x7f)
        return fprintf(out, "\\x%02x", p[0]), 1;
    if (p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f)
        return fprintf(out, "\\x%02x", p[1]), 2;
    if ((p[0] & 0xf0) == 0xe0 && p[1] && p[2]) {
        unsigned cp = (p[0] & 0x0fu) << 12 | (p[1] & 0x3fu) << 6 | (p[2] & 0x3fu);
        if (cp == 0x2028 || cp == 0x2029 || cp == 0xfffe || cp == 0xffff)
            return fprintf(out, "\\u%04x", cp), 3;
    }
    return 0;
}

static void write_string(FILE *out, const char *s)
{
    if (!needs_quotes(s)) {
        fputs(s, out);
        return;
    }
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int n = write_escape(out, p);
        if (n == 0)
            fputc(*p, out);
        p += n ? n : 1;
    }
    fputc('"', out);
}

static void write_value(FILE *out, const struct dt_job *job, const struct dt_cfg_key *k)
{
    const char *field = (const char *)job + k->offset;
    char buf[64];
    int64_t i;
    double f;
    int b;
    switch (k->type) {
    case DT_CFG_INT:
        memcpy(&i, field, sizeof i);
        fprintf(out, "%" PRId64, i);
        return;
    case DT_CFG_FLOAT:
        memcpy(&f, field, sizeof f);
        dt_cfg_format_float(f, buf, sizeof buf);
        fputs(buf, out);
        return;
    case DT_CFG_BOOL:
        memcpy(&b, field, sizeof b);
        fputs(b ? "true" : "false", out);
        return;
    case DT_CFG_INT_LIST:
        memcpy(&b, (const char *)job + k->count_offset, sizeof b);
        fputc('[', out);
        for (int e = 0; e < b; e++) {
            memcpy(&i, field + (size_t)e * sizeof i, sizeof i);
            fprintf(out, "%s%" PRId64, e ? ", " : "", i);
        }
        fputc(']', out);
        return;
    case DT_CFG_PATHS:
        if (strchr(field, '\n')) {
            fputc('[', out);
            for (const char *p = field; *p;) {
                size_t len = strcspn(p, "\n");
                char one[sizeof job->data.path];
                snprintf(one, sizeof one, "%.*s", (int)len, p);
                if (p != field)
                    fputs(", ", out);
                write_string(out, one);
                p += len + (p[len] == '\n');
            }
            fputc(']', out);
            return;
        }
        write_string(out, field);
        return;
    default: write_string(out, field); return;
    }
}

/* One layer setting entry: plain when it is a simple word or number (the
 * value is text either way), else quoted. */
static void write_entry(FILE *out, const char *v)
{
    int plain = v[0] != '\0' && v[0] != '-';
    for (const char *p = v; *p && plain; p++)
        plain = isalnum((unsigned char)*p) || *p == '_' || *p == '.' || *p == '+' || *p == '-';
    if (plain)
        fputs(v, out);
    else
        write_string(out, v);
}

/* A layer setting: a scalar, or a flow list when it holds several entries. */
static void write_entries(FILE *out, const char *v)
{
    if (!strchr(v, ',')) {
        write_entry(out, v);
        return;
    }
    fputc('[', out);
    for (const char *p = v; *p;) {
        size_t len = strcspn(p, ",");
        char one[DT_LAYER_INPUTS];
        snprintf(one, sizeof one, "%.*s", (int)len, p);
        if (p != v)
            fputs(", ", out);
        write_entry(out, one);
        p += len + (p[len] == ',');
    }
    fputc(']', out);
}

void dt_job_write_layer_list(const struct dt_layer_spec *l, int n, const char *prefix, FILE *out)
{
    for (int i = 0; i < n; i++, l++) {
        fprintf(out, "\n%s- {", prefix);
        if (l->name[0]) {
            fputs("name: ", out);
            write_string(out, l->name);
            fputs(", ", out);
        }
        fputs("kind: ", out);
        write_string(out, l->kind);
        if (l->inputs[0]) {
            fputs(", inputs: ", out);
            write_entries(out, l->inputs);
        }
        for (int a = 0; a < l->nargs; a++) {
            fprintf(out, ", %s: ", l->args[a].key);
            write_entries(out, l->args[a].value);
        }
        fputc('}', out);
    }
}

/* model.layers: one flow mapping per line, indented under the key. */
static void write_layers(FILE *out, const struct dt_job *job, const struct dt_cfg_key *k,
                         int indent)
{
    int n;
    char prefix[32];
    memcpy(&n, (const char *)job + k->count_offset, sizeof n);
    if (n == 0) {
        fputs("[]", out);
        return;
    }
    snprintf(prefix, sizeof prefix, "%*s", indent < 30 ? indent : 30, "");
    dt_job_write_layer_list((const struct dt_layer_spec *)((const char *)job + k->offset), n,
                            prefix, out);
}

/* Components of a dotted section name; "" has none. */
static int depth(const char *section)
{
    int d = section[0] ? 1 : 0;
    for (const char *p = section; *p; p++)
        d += *p == '.';
    return d;
}

/* Opens the mappings of section that prev did not have open already. */
static void open_sections(FILE *out, const char *prev, const char *section)
{
    int d = depth(section), common = 0;
    const char *a = prev, *b = section;
    /* count leading components shared by prev and section */
    while (common < d) {
        size_t la = strcspn(a, "."), lb = strcspn(b, ".");
        if (!*a || la != lb || strncmp(a, b, la))
            break;
        common++;
        a += la + (a[la] == '.');
        b += lb + (b[lb] == '.');
    }
    for (int level = common; level < d; level++) {
        size_t n = strcspn(b, ".");
        fprintf(out, "%*s%.*s:\n", level * INDENT, "", (int)n, b);
        b += n + (b[n] == '.');
    }
}

void dt_job_write_yaml(const struct dt_job *job, FILE *out)
{
    char prev[DT_JOB_STR] = "", section[DT_JOB_STR];
    fputs("# dtrain job, fully resolved", out);
    if (job->source[0]) {
        fputs(" from ", out);
        write_string(out, job->source);
    }
    fputc('\n', out);
    for (size_t i = 0; i < dt_cfg_nkeys; i++) {
        const struct dt_cfg_key *k = &dt_cfg_keys[i];
        dt_cfg_parent(k->key, section, sizeof section);
        open_sections(out, prev, section);
        fprintf(out, "%*s%s:", depth(section) * INDENT, "", dt_cfg_leaf(k->key));
        int count = 0;
        if (k->type == DT_CFG_LAYERS)
            memcpy(&count, (const char *)job + k->count_offset, sizeof count);
        if (count == 0)
            fputc(' ', out);
        if (k->type == DT_CFG_LAYERS)
            write_layers(out, job, k, (depth(section) + 1) * INDENT);
        else
            write_value(out, job, k);
        fputc('\n', out);
        memcpy(prev, section, sizeof prev);
    }
}

/* ---- differences ------------------------------------------------------- */

/* A key's value as the YAML dump writes it (malloc'd; NULL when out of
 * memory). */
static char *value_text(const struct dt_job *job, const struct dt_cfg_key *k)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    if (k->type == DT_CFG_LAYERS)
        write_layers(f, job, k, 0);
    else
        write_value(f, job, k);
    fclose(f);
    return buf;
}

static int in_sections(const char *key, const char *const *sections)
{
    for (; *sections; sections++) {
        size_t n = strlen(*sections);
        if (!strncmp(key, *sections, n) && key[n] == '.') return 1;
    }
    return 0;
}

int dt_job_diff(const struct dt_job *a, const char *a_name, const struct dt_job *b,
                const char *b_name, const char *const *sections, char *out, size_t len)
{
    size_t used = 0;
    int n = 0;
    if (len) out[0] = '\0';
    for (size_t i = 0; i < dt_cfg_nkeys; i++) {
        const struct dt_cfg_key *k = &dt_cfg_keys[i];
        if (!in_sections(k->key, sections)) continue;
        char *va = value_text(a, k), *vb = value_text(b, k);
        int differ = !va || !vb || strcmp(va, vb) != 0;
        if (differ && used < len) {
            int w =
                k->type == DT_CFG_LAYERS || !va || !vb
                    ? snprintf(out + used, len - used, "%s%s (another list)", n ? "; " : "", k->key)
                    : snprintf(out + used, len - used, "%s%s: %s %s, %s %s", n ? "; " : "", k->key,
                               a_name, va, b_name, vb);
            used += w > 0 ? (size_t)w : 0;
        }
        n += differ;
        free(va);
        free(vb);
    }
    if (len && used >= len && len > 4) memcpy(out + len - 4, "...", 4);
    return n;
}

/* ---- reference page ---------------------------------------------------- */

static const char intro[] =
    "# Job file reference\n"
    "\n"
    "<!-- Generated by dt_job_write_reference from the schema in runtime/config/config_schema.c;\n"
    "     do not edit by hand. tests/unit/test_config.c checks that this page matches. -->\n"
    "\n"
    "A job file is YAML: one mapping per section below, keys nested inside. Every key\n"
    "is optional; a key left out takes its default. A file without keys (empty, only\n"
    "comments or a null document) is refused, so that a job lost on the way never runs\n"
    "as the default job; `{}` is the job of defaults alone. Unknown keys, values out of\n"
    "range and duplicate keys are errors that name the file, line and column.\n"
    "\n"
    "Any key can be overridden on the command line with its dotted name, after the\n"
    "file is read, e.g. `--set train.optimizer.lr=0.01` or `--set model.hidden=[256,128]`\n"
    "(the value is read as YAML, so lists use the flow form). To see the job a run\n"
    "will use, with every key resolved, run `dtrain train JOB --print-config`; its\n"
    "output is itself a valid job file.\n"
    "\n"
    "Booleans accept `true`/`false`, `yes`/`no`, `on`/`off` and `1`/`0`.\n";

static void write_section(FILE *out, const struct dt_cfg_section *s)
{
    char allowed[512];
    fprintf(out, "\n## %s\n\n%s\n\n", s->name, s->doc);
    fputs("| key | type | default | allowed | meaning |\n", out);
    fputs("|---|---|---|---|---|\n", out);
    for (size_t i = 0; i < dt_cfg_nkeys; i++) {
        const struct dt_cfg_key *k = &dt_cfg_keys[i];
        char parent[DT_JOB_STR];
        dt_cfg_parent(k->key, parent, sizeof parent);
        if (strcmp(parent, s->name) != 0)
            continue;
        dt_cfg_allowed(k, allowed, sizeof allowed);
        fprintf(out, "| `%s` | %s | `%s` | %s | %s |\n", k->key, dt_cfg_type_name(k->type),
                k->def, allowed, k->doc);
    }
}

void dt_job_write_reference(FILE *out)
{
    fputs(intro, out);
    for (size_t s = 0; s < dt_cfg_nsections; s++)
        write_section(out, &dt_cfg_sections[s]);
    fputs("\n## Checks across keys\n\n", out);
    fputs("Checked after the file and every `--set` are applied:\n\n", out);
    for (size_t r = 0; r < dt_cfg_nrelations; r++)
        fprintf(out, "- %s\n", dt_cfg_relations[r].doc);
}
