/*
 * csv.c - importing CSV files into a dtrain HDF5 dataset.
 *
 * One sample a line, fields separated by commas (spaces around a field
 * are ignored, blank lines skipped, CRLF line ends accepted; quoting is
 * not: a numeric CSV has no need of it). One column holds the label, an
 * integer class id; every other column is a feature, stored as float32,
 * so a sample has shape (features,).
 *
 * A file is read whole (its size is known and on disk) and parsed in two
 * passes: the first finds the header and the column count and counts the
 * rows, so the second fills arrays of exactly that size; nothing is
 * allocated from a count the file does not back. Every value is checked
 * as it is read, and the first bad one stops the import with its file,
 * line and column. Only when every file has been read is the dataset
 * written, through import.c's writer (temporary name, renamed into place).
 */
#define _GNU_SOURCE
#include "csv.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../runtime/core/util.h"
#include "dataset.h"
#include "import.h"

#define CSV_MAX_COLUMNS (1 << 20)

struct csv_file {
    const char *path;
    char *text; /* the whole file, NUL-terminated */
    int64_t bytes;
    int has_header;
    int columns;
    int label_col; /* 0-based */
    int64_t rows;
    float *x;
    int32_t *y;
};

/* A field: [b, e) trimmed of spaces. */
struct field {
    const char *b, *e;
};

static const char *line_end(const char *p)
{
    const char *e = strchr(p, '\n');
    return e ? e : p + strlen(p);
}

/* Splits [p, e) at commas; returns the number of fields (up to max stored
 * in f, the rest only counted). */
static int split_fields(const char *p, const char *e, struct field *f, int max)
{
    int n = 0;
    if (e > p && e[-1] == '\r')
        e--;
    for (;;) {
        const char *c = memchr(p, ',', (size_t)(e - p));
        const char *fe = c ? c : e;
        const char *b = p;
        while (b < fe && (*b == ' ' || *b == '\t'))
            b++;
        const char *t = fe;
        while (t > b && (t[-1] == ' ' || t[-1] == '\t'))
            t--;
        if (n < max) {
            f[n].b = b;
            f[n].e = t;
        }
        n++;
        if (!c)
            return n;
        p = c + 1;
    }
}

static int blank(const char *p, const char *e)
{
    for (; p < e; p++)
        if (*p != ' ' && *p != '\t' && *p != '\r')
            return 0;
    return 1;
}

/* A number filling the whole field; 0 if it is not one. */
static int parse_double(const struct field *f, double *v)
{
    char buf[128];
    size_t len = (size_t)(f->e - f->b);
    if (len == 0 || len >= sizeof buf)
        return 0;
    memcpy(buf, f->b, len);
    buf[len] = '\0';
    char *end;
    errno = 0;
    *v = strtod(buf, &end);
    return *end == '\0';
}

static void field_text(const struct field *f, char *buf, size_t len)
{
    size_t n = (size_t)(f->e - f->b);
    if (n >= len) {
        snprintf(buf, len, "%.*s...", (int)(len - 4), f->b);
        return;
    }
    memcpy(buf, f->b, n);
    buf[n] = '\0';
}

static dt_status csv_load_text(struct csv_file *c)
{
    dt_status st = DT_OK;
    int fd = -1;
    size_t got = 0;
    DT_CHECK(dt_input_open(c->path, "CSV file", &fd, &c->bytes));
    DT_CHECK(dt_malloc((size_t)c->bytes + 1, "CSV text", (void **)&c->text));
    while (got < (size_t)c->bytes) {
        ssize_t r = read(fd, c->text + got, (size_t)c->bytes - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            st = dt_set_error(DT_ERR_IO, "file %s: read failed: %s", c->path, strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    c->text[got] = '\0';
    if (memchr(c->text, '\0', got)) {
        st = dt_set_error(DT_ERR_BAD_DATA, "file %s: holds a NUL byte; not a text CSV file",
                          c->path);
        goto out;
    }
out:
    if (fd >= 0)
        close(fd);
    return st;
}

/* First pass: header, columns, label column, row count. */
static dt_status csv_scan(struct csv_file *c, const struct dt_csv_import_opts *o)
{
    const char *p = c->text;
    int64_t line = 0, first_line = 0;
    struct field *f = NULL;
    dt_status st = DT_OK;
    c->columns = 0;
    /* The first non-blank line. */
    while (*p) {
        const char *e = line_end(p);
        line++;
        if (!blank(p, e)) {
            c->columns = split_fields(p, e, NULL, 0);
            first_line = line;
            break;
        }
        p = *e ? e + 1 : e;
    }
    if (!c->columns) {
        return dt_set_error(DT_ERR_BAD_DATA, "file %s: holds no rows", c->path);
    }
    if (c->columns < 2 || c->columns > CSV_MAX_COLUMNS)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "file %s: line %lld has %d column(s); expected a label column and "
                            "1 to %d feature columns",
                            c->path, (long long)first_line, c->columns, CSV_MAX_COLUMNS - 1);
    DT_CHECK(dt_calloc((size_t)c->columns, sizeof *f, "CSV fields", (void **)&f));
    const char *e = line_end(p);
    split_fields(p, e, f, c->columns);
    if (o->header == DT_CSV_HEADER_AUTO) {
        c->has_header = 0;
        for (int k = 0; k < c->columns; k++) {
            double v;
            if (!parse_double(&f[k], &v))
                c->has_header = 1;
        }
    } else {
        c->has_header = o->header == DT_CSV_HEADER_YES;
    }
    c->label_col = 0;
    if (o->label_column) {
        char *end;
        long n = strtol(o->label_column, &end, 10);
        if (*o->label_column && *end == '\0') {
            if (n < 1 || n > c->columns) {
                st = dt_set_error(DT_ERR_USAGE,
                                  "file %s: --label-column %ld: the file has columns 1 to %d",
                                  c->path, n, c->columns);
                goto out;
            }
            c->label_col = (int)n - 1;
        } else {
            int found = -1;
            size_t len = strlen(o->label_column);
            for (int k = 0; k < c->columns && c->has_header; k++)
                if ((size_t)(f[k].e - f[k].b) == len && !memcmp(f[k].b, o->label_column, len))
                    found = k;
            if (found < 0) {
                st = dt_set_error(DT_ERR_USAGE, "file %s: --label-column '%s': %s", c->path,
                                  o->label_column,
                                  c->has_header ? "no header field has that name"
                                                : "the file has no header line to find it in "
                                                  "(give the column's number, counting from 1)");
                goto out;
            }
            c->label_col = found;
        }
    }
    /* Count the data rows, each with the same number of columns, so that
     * the arrays sized from them are backed by the file's bytes. */
    c->rows = 0;
    if (c->has_header) {
        p = *e ? e + 1 : e;
        line++;
    }
    while (*p) {
        e = line_end(p);
        if (!blank(p, e)) {
            int n = split_fields(p, e, NULL, 0);
            if (n != c->columns) {
                st = dt_set_error(DT_ERR_BAD_DATA, "file %s: line %lld has %d columns; expected %d",
                                  c->path, (long long)line, n, c->columns);
                goto out;
            }
            c->rows++;
        }
        p = *e ? e + 1 : e;
        line++;
    }
    if (c->rows == 0)
        st =
            dt_set_error(DT_ERR_BAD_DATA, "file %s: holds a header line but no data rows", c->path);
out:
    free(f);
    return st;
}

/* Second pass: every value, checked. */
static dt_status csv_parse(struct csv_file *c, const struct dt_class_list *cl, int *max_label)
{
    dt_status st = DT_OK;
    struct field *f = NULL;
    const char *p = c->text;
    int64_t line = 0, row = 0;
    int feats = c->columns - 1, header_left = c->has_header;
    int limit = cl->count ? cl->count : DT_DATASET_MAX_CLASSES;
    char text[48];
    DT_CHECK(dt_calloc((size_t)c->columns, sizeof *f, "CSV fields", (void **)&f));
    DT_CHECK(
        dt_malloc((size_t)c->rows * (size_t)feats * sizeof *c->x, "CSV features", (void **)&c->x));
    DT_CHECK(dt_malloc((size_t)c->rows * sizeof *c->y, "CSV labels", (void **)&c->y));
    while (*p) {
        const char *e = line_end(p);
        line++;
        if (blank(p, e)) {
            p = *e ? e + 1 : e;
            continue;
        }
        if (header_left) {
            header_left = 0;
            p = *e ? e + 1 : e;
            continue;
        }
        int n = split_fields(p, e, f, c->columns);
        if (n != c->columns) {
            st = dt_set_error(DT_ERR_BAD_DATA, "file %s: line %lld has %d columns; expected %d",
                              c->path, (long long)line, n, c->columns);
            goto out;
        }
        float *xr = c->x + (size_t)row * (size_t)feats;
        for (int k = 0, j = 0; k < c->columns; k++) {
            double v;
            int ok = parse_double(&f[k], &v);
            field_text(&f[k], text, sizeof text);
            if (k == c->label_col) {
                if (!ok || v != floor(v) || !isfinite(v)) {
                    st = dt_set_error(DT_ERR_BAD_DATA,
                                      "file %s: line %lld, column %d: label '%s' is not a whole "
                                      "number (labels are class ids 0, 1, ...)",
                                      c->path, (long long)line, k + 1, text);
                    goto out;
                }
                if (v < 0 || v >= limit) {
                    st = dt_set_error(DT_ERR_BAD_DATA,
                                      "file %s: line %lld, column %d: label %s is outside [0, "
                                      "%d)%s",
                                      c->path, (long long)line, k + 1, text, limit,
                                      cl->count ? " (the class names given)" : "");
                    goto out;
                }
                c->y[row] = (int32_t)v;
                if ((int)v > *max_label)
                    *max_label = (int)v;
                continue;
            }
            if (!ok) {
                st = dt_set_error(DT_ERR_BAD_DATA,
                                  "file %s: line %lld, column %d: '%s' is not a number", c->path,
                                  (long long)line, k + 1, text);
                goto out;
            }
            float fv = (float)v;
            if (!isfinite(v) || !isfinite(fv)) {
                st = dt_set_error(
                    DT_ERR_BAD_DATA, "file %s: line %lld, column %d: value '%s' is not finite%s",
                    c->path, (long long)line, k + 1, text, isfinite(v) ? " in float32" : "");
                goto out;
            }
            xr[j++] = fv;
        }
        row++;
        p = *e ? e + 1 : e;
    }
out:
    free(f);
    return st;
}

static void csv_free(struct csv_file *c)
{
    free(c->text);
    free(c->x);
    free(c->y);
}

dt_status dt_csv_import(const struct dt_csv_import_opts *o, FILE *progress)
{
    dt_status st = DT_OK;
    struct csv_file c[2];
    struct dt_import_split out[2];
    struct dt_class_list *cl = NULL;
    int nfiles = 1, max_label = 0;
    memset(c, 0, sizeof c);
    memset(out, 0, sizeof out);
    if (!o || !o->train)
        return dt_set_error(DT_ERR_USAGE, "CSV import needs a train file");
    DT_CHECK(dt_import_check_output(o->out_path, o->overwrite));
    DT_CHECK(dt_calloc(1, sizeof *cl, "class names", (void **)&cl));
    DT_CHECK(dt_import_parse_classes(o->class_names, cl));
    c[0].path = o->train;
    if (o->test) {
        c[1].path = o->test;
        nfiles = 2;
    }
    for (int i = 0; i < nfiles; i++) {
        DT_CHECK(csv_load_text(&c[i]));
        DT_CHECK(csv_scan(&c[i], o));
        if (i == 1 && c[1].columns != c[0].columns) {
            st = dt_set_error(DT_ERR_BAD_DATA,
                              "file %s: %d columns but the train file %s has %d; both must match",
                              c[1].path, c[1].columns, c[0].path, c[0].columns);
            goto out;
        }
        DT_CHECK(csv_parse(&c[i], cl, &max_label));
        free(c[i].text);
        c[i].text = NULL;
        out[i].name = i ? "test" : "train";
        out[i].source = c[i].path;
        out[i].dtype = DT_F32;
        out[i].ndim = 1;
        out[i].shape[0] = c[i].columns - 1;
        out[i].n = c[i].rows;
        out[i].x = c[i].x;
        out[i].y = c[i].y;
    }
    if (progress) {
        fprintf(progress, "importing CSV into %s (label: column %d%s)\n", o->out_path,
                c[0].label_col + 1, c[0].has_header ? ", header line skipped" : "");
        fflush(progress);
    }
    DT_CHECK(dt_import_write(o->out_path, out, nfiles, cl->count ? cl->count : max_label + 1, cl,
                             progress));
out:
    for (int i = 0; i < 2; i++)
        csv_free(&c[i]);
    free(cl);
    return st;
}
