/*
 * csv.c - importing CSV files into a dtrain HDF5 dataset.
 *
 * One sample a line, fields separated by commas (spaces around a field
 * are ignored, blank lines skipped; a line ends at LF, CRLF or a lone CR,
 * as old Mac tools write it; quoting is not accepted: a numeric CSV has
 * no need of it). A UTF-8 byte-order mark at the start (Excel writes one)
 * is skipped. One column holds the label, an integer class id; every
 * other column is a feature, stored as float32, so a sample has shape
 * (features,). A number may have any number of digits; one beyond
 * float32's range is refused as such.
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
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/files.h"
#include "dataset.h"
#include "import.h"

#define CSV_MAX_COLUMNS (1 << 20)
#define CSV_HEADER_SHOWN 80 /* bytes of a header line the summary shows */
#define CSV_MATCHES_SHOWN 8 /* columns an ambiguous --label-column lists */
#define UTF8_BOM "\xef\xbb\xbf"

struct csv_file {
    const char *path;
    char *text; /* the whole file, NUL-terminated */
    const char *body; /* text after a byte-order mark */
    int bom;          /* there was one */
    int64_t bytes;
    int has_header;
    int64_t header_line;               /* its line number, when has_header */
    char header[CSV_HEADER_SHOWN + 8]; /* its start, for the summary */
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

/* The end of the line at p: its LF, CR (of a CRLF too) or the NUL. */
static const char *line_end(const char *p)
{
    return p + strcspn(p, "\r\n");
}

/* The start of the line after the one ending at e. */
static const char *next_line(const char *e)
{
    return e[0] == '\r' && e[1] == '\n' ? e + 2 : e[0] ? e + 1 : e;
}

/* Splits [p, e) at commas; returns the number of fields (up to max stored
 * in f, the rest only counted). */
static int split_fields(const char *p, const char *e, struct field *f, int max)
{
    int n = 0;
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

/* A number filling the whole field, of any length; 0 if it is not one.
 * *huge says it is beyond double's range (*v is then +-HUGE_VAL). The
 * field ends at a comma, a space, a line end or the text's NUL, none of
 * which continues a number, so strtod reads it in place. */
static int parse_double(const struct field *f, double *v, int *huge)
{
    char *end;
    *huge = 0;
    if (f->e == f->b) return 0;
    errno = 0;
    *v = strtod(f->b, &end);
    *huge = errno == ERANGE && isinf(*v);
    return end == f->e;
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
    c->body = c->text;
    c->bom = got >= 3 && !memcmp(c->text, UTF8_BOM, 3);
    c->body += c->bom ? 3 : 0;
    if (got >= 2 && ((unsigned char)c->text[0] == 0xff || (unsigned char)c->text[0] == 0xfe) &&
        (unsigned char)c->text[1] == ((unsigned char)c->text[0] ^ 1)) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "file %s: UTF-16 text (it starts with a UTF-16 byte-order mark); save "
                          "it as UTF-8",
                          c->path);
        goto out;
    }
    if (got >= 2 && (unsigned char)c->text[0] == 0x1f && (unsigned char)c->text[1] == 0x8b) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "file %s: gzip-compressed (it starts with gzip's magic); decompress it "
                          "first (gunzip -k %s)",
                          c->path, c->path);
        goto out;
    }
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

/* The start of the header line [p, e) for the summary: at most
 * CSV_HEADER_SHOWN bytes, cut at a UTF-8 character, control bytes as '?'. */
static void keep_header(struct csv_file *c, const char *p, const char *e)
{
    size_t n = (size_t)(e - p), cut = n > CSV_HEADER_SHOWN ? CSV_HEADER_SHOWN : n;
    while (cut < n && cut > 0 && ((unsigned char)p[cut] & 0xc0) == 0x80)
        cut--; /* not inside a UTF-8 character */
    for (size_t i = 0; i < cut; i++)
        c->header[i] = (unsigned char)p[i] < 0x20 || p[i] == 0x7f ? '?' : p[i];
    snprintf(c->header + cut, sizeof c->header - cut, "%s", cut < n ? "..." : "");
}

/* --label-column as a number (counting from 1) or a header name, into
 * c->label_col; a name that two columns have is DT_ERR_USAGE. */
static dt_status find_label_column(struct csv_file *c, const char *name, const struct field *f)
{
    char *end;
    c->label_col = 0;
    if (!name) return DT_OK;
    errno = 0;
    long n = strtol(name, &end, 10);
    if (*name && *end == '\0') {
        if (errno == ERANGE || n < 1 || n > c->columns)
            return dt_set_error(DT_ERR_USAGE,
                                "file %s: --label-column %s: the file has columns 1 to %d", c->path,
                                name, c->columns);
        c->label_col = (int)n - 1;
        return DT_OK;
    }
    int found[CSV_MATCHES_SHOWN], nfound = 0;
    size_t len = strlen(name);
    for (int k = 0; k < c->columns && c->has_header; k++)
        if ((size_t)(f[k].e - f[k].b) == len && !memcmp(f[k].b, name, len)) {
            if (nfound < CSV_MATCHES_SHOWN) found[nfound] = k;
            nfound++;
        }
    if (nfound == 0)
        return dt_set_error(DT_ERR_USAGE, "file %s: --label-column '%s': %s", c->path, name,
                            c->has_header ? "no header field has that name"
                                          : "the file has no header line to find it in (give "
                                            "the column's number, counting from 1)");
    if (nfound > 1) {
        char cols[CSV_MATCHES_SHOWN * 12 + 8] = "";
        size_t k = 0;
        for (int i = 0; i < nfound && i < CSV_MATCHES_SHOWN; i++)
            k += (size_t)snprintf(cols + k, sizeof cols - k, "%s%d", i ? ", " : "", found[i] + 1);
        if (nfound > CSV_MATCHES_SHOWN) snprintf(cols + k, sizeof cols - k, ", ...");
        return dt_set_error(DT_ERR_USAGE,
                            "file %s: --label-column '%s' is ambiguous: %d header fields have "
                            "that name (columns %s); give the column's number, counting from 1",
                            c->path, name, nfound, cols);
    }
    c->label_col = found[0];
    return DT_OK;
}

/* First pass: header, columns, label column, row count. */
static dt_status csv_scan(struct csv_file *c, const struct dt_csv_import_opts *o)
{
    const char *p = c->body;
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
        p = next_line(e);
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
            int huge;
            if (!parse_double(&f[k], &v, &huge)) c->has_header = 1;
        }
    } else {
        c->has_header = o->header == DT_CSV_HEADER_YES;
    }
    c->header_line = first_line;
    if (c->has_header) keep_header(c, p, e);
    DT_CHECK(find_label_column(c, o->label_column, f));
    /* Count the data rows, each with the same number of columns, so that
     * the arrays sized from them are backed by the file's bytes. */
    c->rows = 0;
    if (c->has_header) {
        p = next_line(e);
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
        p = next_line(e);
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
    const char *p = c->body;
    int64_t line = 0, row = 0;
    int feats = c->columns - 1, header_left = c->has_header;
    int limit = cl->count ? cl->count : DT_DATASET_MAX_CLASSES;
    char text[48];
    DT_CHECK(dt_calloc((size_t)c->columns, sizeof *f, "CSV fields", (void **)&f));
    DT_CHECK(
        dt_malloc((size_t)c->rows * (size_t)feats * sizeof *c->x, "CSV features", (void **)&c->x));
    DT_CHECK(dt_malloc((size_t)c->rows * sizeof *c->y, "CSV labels", (void **)&c->y));
    for (const char *e; *p; p = next_line(e)) {
        e = line_end(p);
        line++;
        if (blank(p, e)) continue;
        if (header_left) {
            header_left = 0;
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
            double v = 0;
            int huge, ok = parse_double(&f[k], &v, &huge);
            if (k == c->label_col) {
                /* NaN is no whole number; an infinity is outside the range */
                if (!ok || v != floor(v)) {
                    field_text(&f[k], text, sizeof text);
                    st = dt_set_error(DT_ERR_BAD_DATA,
                                      "file %s: line %lld, column %d: label '%s' is not a whole "
                                      "number (labels are class ids 0, 1, ...)",
                                      c->path, (long long)line, k + 1, text);
                    goto out;
                }
                if (v < 0 || v >= limit) {
                    field_text(&f[k], text, sizeof text);
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
            float fv = (float)v;
            if (!ok || (!huge && !isfinite(v)) || !isfinite(fv)) {
                field_text(&f[k], text, sizeof text);
                if (!ok)
                    st = dt_set_error(DT_ERR_BAD_DATA,
                                      "file %s: line %lld, column %d: '%s' is not a number",
                                      c->path, (long long)line, k + 1, text);
                else if (!huge && !isfinite(v))
                    st = dt_set_error(DT_ERR_BAD_DATA,
                                      "file %s: line %lld, column %d: value '%s' is not finite",
                                      c->path, (long long)line, k + 1, text);
                else
                    st = dt_set_error(DT_ERR_BAD_DATA,
                                      "file %s: line %lld, column %d: value '%s' is outside "
                                      "float32's range (features are stored as float32, whose "
                                      "largest magnitude is %.8g)",
                                      c->path, (long long)line, k + 1, text, (double)FLT_MAX);
                goto out;
            }
            xr[j++] = fv;
        }
        row++;
    }
out:
    free(f);
    return st;
}

/* The summary's line on a file's header: the line taken, or why none. */
static void report_header(FILE *progress, const struct csv_file *c, enum dt_csv_header mode)
{
    const char *bom = c->bom ? " (its UTF-8 byte-order mark skipped)" : "";
    if (c->has_header)
        fprintf(progress, "  %s: header line %lld taken%s: %s\n", c->path,
                (long long)c->header_line, bom, c->header);
    else
        fprintf(progress, "  %s: no header line: line %lld is data (%s)%s\n", c->path,
                (long long)c->header_line,
                mode == DT_CSV_HEADER_NO ? "--header no" : "every field of it is a number", bom);
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
    DT_CHECK(dt_import_check_output(o->out_path, o->overwrite, progress));
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
        fprintf(progress, "importing CSV into %s (label: column %d)\n", o->out_path,
                c[0].label_col + 1);
        for (int i = 0; i < nfiles; i++)
            report_header(progress, &c[i], o->header);
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
