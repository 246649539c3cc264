/*
 * metrics.h - the run directory's metrics.jsonl: one JSON object per line,
 * appended and flushed as each record is complete so a crash loses at most
 * the line being written.
 */
#ifndef DT_METRICS_H
#define DT_METRICS_H

#include "status.h"

typedef struct dt_metrics dt_metrics_t;

/* Opens (appending) path; NULL path gives a sink that drops records. */
dt_status dt_metrics_open(const char *path, dt_metrics_t **out);
void dt_metrics_close(dt_metrics_t *m);

/* Writes one record: `fields` is the inside of a JSON object without braces,
 * printf-style, e.g. "\"type\":\"eval\",\"acc\":%.6f". A "time" field (Unix
 * seconds) is added first. */
dt_status dt_metrics_write(dt_metrics_t *m, const char *fields, ...)
    __attribute__((format(printf, 2, 3)));

#endif
