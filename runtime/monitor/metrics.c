/*
 * metrics.c - append-only JSON-lines writer for metrics.jsonl, and the
 * field-by-field record builder that keeps every line valid JSON.
 *
 * A record goes to the file in one write of the whole line; when that
 * fails part way (a full disk) the file is cut back to its end before, and
 * a file that ends in half a line anyway (the process was killed inside
 * the write) loses that half line when it is opened next, so a new record
 * never continues a broken one.
 */
#define _GNU_SOURCE
#include "metrics.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "core/log.h"
#include "core/files.h"

struct dt_metrics {
    FILE *fp;
    char path[4096];
};

/* ---- records ------------------------------------------------------------ */

/* A JSON string literal of s: quotes, backslashes and control characters
 * escaped; bytes >= 0x80 pass through (UTF-8 stays UTF-8). */
static void put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* The stream of a record, after its key; NULL when the record failed. */
static FILE *field(struct dt_metrics_rec *r, const char *key)
{
    FILE *f = r->stream;
    if (!f)
        return NULL;
    fputc(',', f);
    put_string(f, key);
    fputc(':', f);
    return f;
}

void dt_metrics_begin(struct dt_metrics_rec *r, const char *type)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    r->buf = NULL;
    r->len = 0;
    r->stream = open_memstream(&r->buf, &r->len);
    if (r->stream)
        fprintf(r->stream, "{\"time\":%.3f", (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec);
    dt_metrics_str(r, "type", type);
}

void dt_metrics_str(struct dt_metrics_rec *r, const char *key, const char *value)
{
    FILE *f = field(r, key);
    if (f)
        put_string(f, value);
}

void dt_metrics_int(struct dt_metrics_rec *r, const char *key, int64_t value)
{
    FILE *f = field(r, key);
    if (f)
        fprintf(f, "%lld", (long long)value);
}

void dt_metrics_num(struct dt_metrics_rec *r, const char *key, double value, int digits)
{
    FILE *f = field(r, key);
    if (f && isfinite(value))
        fprintf(f, "%.*g", digits, value);
    else if (f)
        fputs("null", f);
}

void dt_metrics_u64_list(struct dt_metrics_rec *r, const char *key, const uint64_t *v, int n)
{
    FILE *f = field(r, key);
    if (!f)
        return;
    fputc('[', f);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%llu", i ? "," : "", (unsigned long long)v[i]);
    fputc(']', f);
}

/* ---- the file ------------------------------------------------------------ */

dt_status dt_metrics_open(const char *path, dt_metrics_t **out)
{
    dt_metrics_t *m = calloc(1, sizeof *m);
    if (!m)
        return dt_set_error(DT_ERR_NOMEM, "out of memory opening metrics");
    if (path) {
        int64_t cut = 0;
        snprintf(m->path, sizeof m->path, "%s", path);
        dt_status st = dt_output_open(path, "metrics file", 1, &m->fp);
        if (st == DT_OK) st = dt_output_end_line(m->fp, path, "metrics file", 1, &cut);
        if (st != DT_OK) {
            if (m->fp) fclose(m->fp);
            free(m);
            return st;
        }
        if (cut > 0)
            DT_LOG_WARN("metrics",
                        "%s ended in an incomplete record (%lld bytes that a write which did not "
                        "finish left): removed, so that every line is a whole record",
                        path, (long long)cut);
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

/* Appends len bytes as one record: all of them, or, when the write fails
 * part way (a full disk), none: the file is cut back to where it ended. */
static dt_status append_whole(dt_metrics_t *m, const char *buf, size_t len)
{
    int fd = fileno(m->fp);
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return dt_set_error(DT_ERR_IO, "cannot write metrics file '%s': %s", m->path,
                            strerror(errno));
    if (dt_write_all(fd, buf, len)) return DT_OK;
    int err = errno;
    int cut = ftruncate(fd, sb.st_size) == 0;
    return dt_set_error(DT_ERR_IO, "cannot write metrics file '%s': %s (%s)", m->path,
                        strerror(err),
                        cut ? "the record was left out whole"
                            : "the record's start may remain; the next run removes it");
}

dt_status dt_metrics_put(dt_metrics_t *m, struct dt_metrics_rec *r)
{
    dt_status st = DT_OK;
    FILE *f = r->stream;
    int bad = !f || fputs("}\n", f) == EOF || ferror(f);
    if (f && fclose(f) != 0)
        bad = 1;
    r->stream = NULL;
    if (bad)
        st = dt_set_error(DT_ERR_NOMEM, "out of memory writing a metrics record");
    else if (m && m->fp)
        st = append_whole(m, r->buf, r->len);
    free(r->buf);
    r->buf = NULL;
    return st;
}
