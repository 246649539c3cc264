/*
 * metrics.c - append-only JSON-lines writer for metrics.jsonl.
 */
#include "metrics.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

struct dt_metrics {
    FILE *fp;
    char path[4096];
};

dt_status dt_metrics_open(const char *path, dt_metrics_t **out)
{
    dt_metrics_t *m = calloc(1, sizeof *m);
    if (!m)
        return dt_set_error(DT_ERR_NOMEM, "out of memory opening metrics");
    if (path) {
        snprintf(m->path, sizeof m->path, "%s", path);
        m->fp = fopen(path, "a");
        if (!m->fp) {
            int e = errno;
            free(m);
            return dt_set_error(DT_ERR_IO, "cannot open metrics file '%s': %s", path, strerror(e));
        }
    }
    *out = m;
    return DT_OK;
}

void dt_metrics_close(dt_metrics_t *m)
{
    if (!m)
        return;
    if (m->fp)
        fclose(m->fp);
    free(m);
}

dt_status dt_metrics_write(dt_metrics_t *m, const char *fields, ...)
{
    if (!m || !m->fp)
        return DT_OK;
    char body[4096];
    va_list ap;
    va_start(ap, fields);
    vsnprintf(body, sizeof body, fields, ap);
    va_end(ap);
    struct timeval tv;
    gettimeofday(&tv, NULL);
    double now = (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
    if (fprintf(m->fp, "{\"time\":%.3f,%s}\n", now, body) < 0 || fflush(m->fp) != 0)
        return dt_set_error(DT_ERR_IO, "cannot write metrics file '%s': %s", m->path,
                            strerror(errno));
    return DT_OK;
}
