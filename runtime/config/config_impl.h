/*
 * config_impl.h - the job schema shared by the config sources.
 *
 * config_schema.c holds the one table of keys (plus the sections they sit in
 * and the checks across keys) and the queries on it: lookup, children of a
 * section, nearest-key hints, and the words used to describe a key's values.
 * config.c parses job files and --set overrides against it; config_write.c
 * prints the resolved job and the reference page from it. Nothing here is
 * public API.
 */
#ifndef DT_CONFIG_IMPL_H
#define DT_CONFIG_IMPL_H

#include <stddef.h>

#include "config.h"

enum dt_cfg_type {
    DT_CFG_INT,      /* int64_t */
    DT_CFG_FLOAT,    /* double, finite */
    DT_CFG_BOOL,     /* int 0/1 */
    DT_CFG_STRING,   /* char[size], non-empty */
    DT_CFG_ENUM,     /* char[size], one of choices */
    DT_CFG_INT_LIST, /* int64_t[size / 8] plus an int count at count_offset */
    DT_CFG_PATH,     /* char[size], non-empty, taken as written */
    DT_CFG_PATHS,    /* char[size]: a path or glob pattern, or a YAML sequence of paths
                        stored joined by newlines; no entry empty or holding a newline */
    DT_CFG_LAYERS,   /* struct dt_layer_spec[size / sizeof], count at count_offset: a
                        sequence of mappings (name, kind, inputs, settings) */
};

/* Range flags; the bounds apply to each entry of an int list. */
#define DT_CFG_LO 1u      /* has a lower bound lo */
#define DT_CFG_HI 2u      /* has an upper bound hi */
#define DT_CFG_LO_EXCL 4u /* lower bound excluded: > lo */
#define DT_CFG_HI_EXCL 8u /* upper bound excluded: < hi */

struct dt_cfg_key {
    const char *key;            /* dotted: "train.optimizer.lr" */
    enum dt_cfg_type type;
    size_t offset;              /* into struct dt_job */
    size_t size;                /* bytes of the field */
    size_t count_offset;        /* int lists: the int holding the count */
    int min_count;              /* int lists: fewest entries */
    const char *def;            /* default, as a user would write it */
    unsigned range;             /* DT_CFG_* flags */
    double lo, hi;
    const char *bound_why;      /* or NULL: why the range ends at hi, said for a value above */
    const char *const *choices; /* enums: NULL-terminated */
    const char *doc;            /* one line for the reference page */
};

struct dt_cfg_section {
    const char *name; /* dotted, e.g. "train.optimizer" */
    const char *doc;
};

/* A relation between keys that a single key's range cannot express.
 * check returns 0 when the job is fine, else writes why into msg. */
struct dt_cfg_relation {
    const char *doc;
    int (*check)(const struct dt_job *job, char *msg, size_t len);
};

extern const struct dt_cfg_key dt_cfg_keys[];
extern const size_t dt_cfg_nkeys;
extern const struct dt_cfg_section dt_cfg_sections[];
extern const size_t dt_cfg_nsections;
extern const struct dt_cfg_relation dt_cfg_relations[];
extern const size_t dt_cfg_nrelations;

/* Aborts (DT_ASSERT) if the table is inconsistent: sizes vs types, keys
 * outside a listed section, a section's keys not contiguous. */
void dt_cfg_check_schema(void);

/* The key or section with this dotted name, or NULL. "" is not a section. */
const struct dt_cfg_key *dt_cfg_find(const char *dotted);
const struct dt_cfg_section *dt_cfg_find_section(const char *dotted);

/* Direct children of a section ("" = the top level), in table order,
 * joined by ", ": "epochs, steps, ..., optimizer, schedule". */
void dt_cfg_children(const char *section, char *buf, size_t len);

/* The known key or section nearest to an unknown dotted name, if close
 * enough to be a likely typo. Returns 1 and writes it into buf, else 0. */
int dt_cfg_suggest(const char *dotted, char *buf, size_t len);

/* What a value must be, as a noun phrase: "a positive integer",
 * "a number in [0, 1)", "one of relu, gelu, tanh". */
void dt_cfg_expect(const struct dt_cfg_key *k, char *buf, size_t len);

/* The same for one entry of an int list. */
void dt_cfg_expect_entry(const struct dt_cfg_key *k, char *buf, size_t len);

/* Allowed values for the reference page: ">= 1", "[0, 1)", "`relu`, `gelu`". */
void dt_cfg_allowed(const struct dt_cfg_key *k, char *buf, size_t len);

/* "int", "float", "bool", "string", "enum", "int list", "path". */
const char *dt_cfg_type_name(enum dt_cfg_type t);

/* Shortest text that reads back to exactly v, always with a '.'
 * ("0.001", "1.0e-08", "0.0") so every YAML reader sees a float. */
void dt_cfg_format_float(double v, char *buf, size_t len);

/* The section part of a dotted key ("train.optimizer" for
 * "train.optimizer.lr", "" for "train"), written into buf. */
void dt_cfg_parent(const char *dotted, char *buf, size_t len);

/* The last component of a dotted key. */
const char *dt_cfg_leaf(const char *dotted);

#endif
