/*
 * metrics.h - the run directory's metrics.jsonl: one JSON object per line,
 * each appended whole as it is complete, so a crash or a full disk loses
 * at most the record being written and never leaves half a line for the
 * next record to continue.
 *
 * Records are built field by field, so every line is valid JSON whatever
 * the values: strings are escaped, and a number that is not finite (a
 * diverged loss) is written as null, since JSON has no NaN or infinity.
 */
#ifndef DT_METRICS_H
#define DT_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct dt_metrics dt_metrics_t;

/* One record being built (in memory that grows as fields are added);
 * dt_metrics_put writes and releases it. */
struct dt_metrics_rec {
    char *buf;
    size_t len;
    void *stream; /* the memory stream being written */
};

/* Starts a record {"time":<Unix seconds>,"type":"<type>"}. Out of memory
 * here or in a field makes dt_metrics_put fail. */
void dt_metrics_begin(struct dt_metrics_rec *r, const char *type);
/* Fields: a string (escaped), an integer, a number printed with `digits`
 * significant digits (null when not finite), a boolean, and a list of
 * unsigned integers. */
void dt_metrics_str(struct dt_metrics_rec *r, const char *key, const char *value);
void dt_metrics_int(struct dt_metrics_rec *r, const char *key, int64_t value);
void dt_metrics_num(struct dt_metrics_rec *r, const char *key, double value, int digits);
void dt_metrics_u64_list(struct dt_metrics_rec *r, const char *key, const uint64_t *v, int n);

/* Opens (appending) path; NULL path gives a sink that drops records. An
 * incomplete last line (from a run killed inside a write) is removed,
 * with a warning. */
dt_status dt_metrics_open(const char *path, dt_metrics_t **out);
void dt_metrics_close(dt_metrics_t *m);

/* Writes one finished record as a line, flushes it, and releases the
 * record (whether or not the write succeeded). */
dt_status dt_metrics_put(dt_metrics_t *m, struct dt_metrics_rec *r);

#endif
