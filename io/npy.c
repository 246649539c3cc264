/*
 * npy.c - importing NumPy .npy arrays into a dtrain HDF5 dataset.
 *
 * A .npy file (format versions 1.0, 2.0 and 3.0) is the magic "\x93NUMPY",
 * a major and a minor version byte, the header's length (a little-endian
 * u16 in 1.0, u32 in 2.0 and 3.0), then the header: a Python dict literal
 * with the keys 'descr' (the dtype, e.g. '<f4'), 'fortran_order' and
 * 'shape' (a tuple), padded with spaces and ended by a newline; the data
 * follows in the order the header says.
 *
 * The header is parsed here by a small reader of exactly that literal
 * (strings, True/False, tuples of integers), never by evaluating it, and
 * it is bounded in length. Everything the header declares is checked
 * before anything is allocated: the dtype is one dtrain stores or can
 * convert, the products of the shape fit, and the file holds exactly that
 * many bytes after the header. Each array is then read whole (its size is
 * that of the file, already on disk) and checked: inputs finite, labels
 * in range, counts agreeing. Only then is the dataset written, through
 * import.c's writer (temporary name, renamed into place when complete).
 */
#define _GNU_SOURCE
#include "npy.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/files.h"
#include "dataset.h"
#include "import.h"

#define NPY_MAX_HEADER 65536
#define NPY_MAX_NDIM (1 + DT_DATASET_MAX_DIMS)

struct npy_array {
    const char *path;
    const char *what; /* "inputs" or "labels" */
    char descr[64];   /* as written, e.g. "<f4" */
    char kind;        /* 'u', 'i', 'f' */
    int itemsize;
    int ndim;
    int64_t shape[NPY_MAX_NDIM];
    int64_t elems;
    void *data; /* elems * itemsize bytes */
};

/* ---- the header ------------------------------------------------------------ */

struct hdr_parser {
    const char *p, *end, *start;
    const char *path;
};

static void skip_ws(struct hdr_parser *h)
{
    while (h->p < h->end && (*h->p == ' ' || *h->p == '\t' || *h->p == '\n' || *h->p == '\r'))
        h->p++;
}

static dt_status hdr_error(const struct hdr_parser *h, const char *expected)
{
    return dt_set_error(DT_ERR_BAD_DATA,
                        "file %s: the .npy header does not parse: expected %s at character %ld "
                        "(a header is a dict like {'descr': '<f4', 'fortran_order': False, "
                        "'shape': (60000, 28, 28), })",
                        h->path, expected, (long)(h->p - h->start));
}

static int expect_char(struct hdr_parser *h, char c)
{
    skip_ws(h);
    if (h->p < h->end && *h->p == c) {
        h->p++;
        return 1;
    }
    return 0;
}

/* A quoted string into buf (len bytes); 0 if there is none. One longer
 * than buf holds is kept as its start and "...": no key or dtype dtrain
 * knows is that long, and the message about it names it so. */
static int parse_string(struct hdr_parser *h, char *buf, size_t len)
{
    int cut = 0;
    skip_ws(h);
    if (h->p >= h->end || (*h->p != '\'' && *h->p != '"'))
        return 0;
    char q = *h->p++;
    size_t n = 0;
    while (h->p < h->end && *h->p != q) {
        if (*h->p == '\\') return 0;
        if (n + 4 < len)
            buf[n++] = *h->p;
        else
            cut = 1;
        h->p++;
    }
    if (h->p >= h->end)
        return 0;
    h->p++;
    snprintf(buf + n, len - n, "%s", cut ? "..." : "");
    return 1;
}

static dt_status parse_shape(struct hdr_parser *h, struct npy_array *a)
{
    if (!expect_char(h, '('))
        return hdr_error(h, "a tuple for 'shape'");
    a->ndim = 0;
    for (;;) {
        skip_ws(h);
        if (expect_char(h, ')'))
            return DT_OK;
        if (h->p >= h->end || !isdigit((unsigned char)*h->p))
            return hdr_error(h, "a non-negative integer in 'shape'");
        int64_t v = 0;
        while (h->p < h->end && isdigit((unsigned char)*h->p)) {
            if (v > (INT64_MAX - 9) / 10)
                return dt_set_error(DT_ERR_BAD_DATA,
                                    "file %s: the .npy header declares a dimension larger than "
                                    "any file holds",
                                    h->path);
            v = v * 10 + (*h->p++ - '0');
        }
        if (h->p < h->end && *h->p == 'L')
            h->p++;
        if (a->ndim == NPY_MAX_NDIM)
            return dt_set_error(DT_ERR_BAD_DATA,
                                "file %s: the .npy array has more than %d dimensions; dtrain "
                                "takes (N, ...) with at most %d sample dimensions",
                                h->path, NPY_MAX_NDIM, DT_DATASET_MAX_DIMS);
        a->shape[a->ndim++] = v;
        if (!expect_char(h, ',')) {
            if (expect_char(h, ')'))
                return DT_OK;
            return hdr_error(h, "',' or ')' in 'shape'");
        }
    }
}

static dt_status parse_descr(const char *path, const char *descr, struct npy_array *a)
{
    char order = descr[0];
    a->kind = descr[0] ? descr[1] : 0;
    a->itemsize = 0;
    if (a->kind && descr[2] >= '1' && descr[2] <= '8' && descr[3] == '\0')
        a->itemsize = descr[2] - '0';
    int ints = (a->kind == 'u' || a->kind == 'i') &&
               (a->itemsize == 1 || a->itemsize == 2 || a->itemsize == 4 || a->itemsize == 8);
    int floats = a->kind == 'f' && (a->itemsize == 2 || a->itemsize == 4 || a->itemsize == 8);
    int known = ints || floats;
    if (!known || !(order == '<' || order == '>' || order == '|' || order == '='))
        return dt_set_error(DT_ERR_BAD_DATA,
                            "file %s: dtype '%s' is not supported; dtrain imports uint8, float16, "
                            "float32, float64 and integer arrays",
                            path, descr);
    if (order == '>' && a->itemsize > 1)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "file %s: dtype '%s' is big-endian; write it little-endian "
                            "(numpy: arr.astype(arr.dtype.newbyteorder('<')))",
                            path, descr);
    return DT_OK;
}

/* Parses the header dict in buf[0..len). */
static dt_status parse_header(const char *path, const char *buf, size_t len, struct npy_array *a)
{
    struct hdr_parser h = {buf, buf + len, buf, path};
    int have_descr = 0, have_order = 0, have_shape = 0, fortran = 0;
    char key[32], descr[64];
    if (!expect_char(&h, '{'))
        return hdr_error(&h, "'{'");
    for (;;) {
        if (expect_char(&h, '}'))
            break;
        if (!parse_string(&h, key, sizeof key))
            return hdr_error(&h, "a quoted key");
        if (!expect_char(&h, ':'))
            return hdr_error(&h, "':'");
        if (!strcmp(key, "descr")) {
            skip_ws(&h);
            if (h.p < h.end && *h.p == '[')
                return dt_set_error(DT_ERR_BAD_DATA,
                                    "file %s: a structured dtype (record array) is not supported; "
                                    "save one plain array per file",
                                    path);
            if (!parse_string(&h, descr, sizeof descr))
                return hdr_error(&h, "a dtype string for 'descr'");
            have_descr = 1;
        } else if (!strcmp(key, "fortran_order")) {
            skip_ws(&h);
            if (h.end - h.p >= 4 && !strncmp(h.p, "True", 4)) {
                fortran = 1;
                h.p += 4;
            } else if (h.end - h.p >= 5 && !strncmp(h.p, "False", 5)) {
                h.p += 5;
            } else {
                return hdr_error(&h, "True or False for 'fortran_order'");
            }
            have_order = 1;
        } else if (!strcmp(key, "shape")) {
            dt_status st = parse_shape(&h, a);
            if (st != DT_OK)
                return st;
            have_shape = 1;
        } else {
            return dt_set_error(DT_ERR_BAD_DATA,
                                "file %s: the .npy header has an unknown key '%s' (expected "
                                "'descr', 'fortran_order' and 'shape')",
                                path, key);
        }
        if (!expect_char(&h, ',')) {
            if (expect_char(&h, '}'))
                break;
            return hdr_error(&h, "',' or '}'");
        }
    }
    skip_ws(&h);
    if (h.p != h.end)
        return hdr_error(&h, "nothing but spaces after the dict");
    if (!have_descr || !have_order || !have_shape)
        return dt_set_error(DT_ERR_BAD_DATA, "file %s: the .npy header lacks '%s'", path,
                            !have_descr   ? "descr"
                            : !have_order ? "fortran_order"
                                          : "shape");
    if (fortran)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "file %s: the array is in Fortran (column-major) order; dtrain reads "
                            "C order (numpy: np.save(f, np.ascontiguousarray(arr)))",
                            path);
    snprintf(a->descr, sizeof a->descr, "%s", descr);
    return parse_descr(path, descr, a);
}

/* ---- reading an array ------------------------------------------------------ */

static dt_status read_full(int fd, const char *path, void *buf, size_t len, size_t *got_out)
{
    size_t got = 0;
    while (got < len) {
        ssize_t r = read(fd, (char *)buf + got, len - got > (1u << 30) ? (1u << 30) : len - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return dt_set_error(DT_ERR_IO, "file %s: read failed: %s", path, strerror(errno));
        if (r == 0)
            break;
        got += (size_t)r;
    }
    *got_out = got;
    return DT_OK;
}

static void shape_str(const struct npy_array *a, int from, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "(");
    for (int d = from; d < a->ndim && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", d > from ? ", " : "",
                              (long long)a->shape[d]);
    if (n < len)
        snprintf(buf + n, len - n, "%s)", a->ndim - from == 1 ? "," : "");
}

/* Opens, parses and reads a whole array; checks the file holds exactly
 * the data its header declares before allocating. */
static dt_status npy_read(const char *path, const char *what, struct npy_array *a)
{
    dt_status st = DT_OK;
    unsigned char pre[12];
    char *hdr = NULL;
    size_t got = 0, prefix;
    int64_t file_bytes = 0, total = 0;
    int fd = -1;
    memset(a, 0, sizeof *a);
    a->path = path;
    a->what = what;
    DT_CHECK(dt_input_open(path, what, &fd, &file_bytes));
    DT_CHECK(read_full(fd, path, pre, 10, &got));
    if (got < 10 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        int gz = got >= 2 && pre[0] == 0x1f && pre[1] == 0x8b;
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "file %s: not a .npy file (it does not start with \\x93NUMPY)%s", path,
                          gz ? "; it is gzip-compressed: decompress it first (gunzip -k)" : "");
        goto out;
    }
    uint32_t hlen;
    if (pre[6] == 1) {
        prefix = 10;
        hlen = (uint32_t)pre[8] | (uint32_t)pre[9] << 8;
    } else if (pre[6] == 2 || pre[6] == 3) {
        prefix = 12;
        DT_CHECK(read_full(fd, path, pre + 10, 2, &got));
        if (got < 2) {
            st = dt_set_error(DT_ERR_BAD_DATA, "file %s: truncated .npy header", path);
            goto out;
        }
        hlen = (uint32_t)pre[8] | (uint32_t)pre[9] << 8 | (uint32_t)pre[10] << 16 |
               (uint32_t)pre[11] << 24;
    } else {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "file %s: .npy format version %d.%d is not supported (1.0, 2.0 and "
                          "3.0 are)",
                          path, pre[6], pre[7]);
        goto out;
    }
    if (hlen > NPY_MAX_HEADER || (int64_t)(prefix + hlen) > file_bytes) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "file %s: the .npy header claims %u bytes; the file holds %lld in all "
                          "and a header may have at most %d",
                          path, hlen, (long long)file_bytes, NPY_MAX_HEADER);
        goto out;
    }
    DT_CHECK(dt_malloc(hlen + 1, "npy header", (void **)&hdr));
    DT_CHECK(read_full(fd, path, hdr, hlen, &got));
    if (got < hlen) {
        st = dt_set_error(DT_ERR_BAD_DATA, "file %s: truncated .npy header", path);
        goto out;
    }
    hdr[hlen] = '\0';
    if (memchr(hdr, '\0', hlen)) {
        st = dt_set_error(DT_ERR_BAD_DATA, "file %s: the .npy header holds a NUL byte", path);
        goto out;
    }
    DT_CHECK(parse_header(path, hdr, hlen, a));

    char shape[160];
    shape_str(a, 0, shape, sizeof shape);
    a->elems = 1;
    for (int d = 0; d < a->ndim; d++)
        if (!dt_mul_i64(a->elems, a->shape[d], &a->elems)) {
            st = dt_set_error(DT_ERR_BAD_DATA,
                              "file %s: the .npy header declares shape %s, more data than any "
                              "file holds",
                              path, shape);
            goto out;
        }
    if (!dt_mul_i64(a->elems, a->itemsize, &total)) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "file %s: the .npy header declares shape %s, more data than any file "
                          "holds",
                          path, shape);
        goto out;
    }
    int64_t room = file_bytes - (int64_t)(prefix + hlen);
    if (total != room) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "file %s: %s: the header declares shape %s of %s (%lld data bytes) but "
                          "the file holds %lld",
                          path, total > room ? "truncated" : "data after the array", shape,
                          a->descr, (long long)total, (long long)room);
        goto out;
    }
    DT_CHECK(dt_malloc(total ? (size_t)total : 1, what, &a->data));
    DT_CHECK(read_full(fd, path, a->data, (size_t)total, &got));
    if ((int64_t)got < total) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "file %s: truncated: the data ends after %zu of %lld bytes (did the "
                          "file change while being read?)",
                          path, got, (long long)total);
        goto out;
    }
out:
    if (fd >= 0)
        close(fd);
    free(hdr);
    if (st != DT_OK) {
        free(a->data);
        a->data = NULL;
    }
    return st;
}

/* Element i as an integer (kind 'u' or 'i'). */
static int64_t int_at(const struct npy_array *a, int64_t i, int *too_big)
{
    const unsigned char *p = (const unsigned char *)a->data + i * a->itemsize;
    uint64_t u = 0;
    for (int b = a->itemsize - 1; b >= 0; b--)
        u = u << 8 | p[b];
    *too_big = 0;
    if (a->kind == 'u') {
        if (u > INT64_MAX)
            *too_big = 1;
        return (int64_t)(u & INT64_MAX);
    }
    int shift = 64 - 8 * a->itemsize;
    return shift ? (int64_t)(u << shift) >> shift : (int64_t)u;
}

static double float_at(const struct npy_array *a, int64_t i)
{
    const unsigned char *p = (const unsigned char *)a->data + i * a->itemsize;
    if (a->kind == 'f' && a->itemsize == 2) {
        uint16_t h;
        memcpy(&h, p, 2);
        return dt_import_half_to_float(h);
    }
    if (a->kind == 'f' && a->itemsize == 4) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    if (a->kind == 'f') {
        double d;
        memcpy(&d, p, 8);
        return d;
    }
    int big;
    int64_t v = int_at(a, i, &big);
    return big ? (double)(uint64_t)v + 9223372036854775808.0 : (double)v;
}

/* ---- one split ------------------------------------------------------------- */

struct npy_split {
    struct npy_array x, y;
    int32_t *labels;
    struct dt_import_split out;
};

static void split_free(struct npy_split *s)
{
    free(s->x.data);
    free(s->y.data);
    free(s->labels);
    memset(s, 0, sizeof *s);
}

/* Checks the inputs and converts them to what the dataset stores (in place
 * or into a new buffer). */
static dt_status convert_x(struct npy_array *a, struct dt_import_split *out)
{
    dt_status st = DT_OK;
    int64_t per = a->elems / a->shape[0];
    if (a->kind == 'u' && a->itemsize == 1) {
        out->dtype = DT_U8;
        return DT_OK;
    }
    for (int64_t i = 0; i < a->elems; i++) {
        double v = float_at(a, i);
        if (!isfinite(v) || fabs(v) > 3.4028234663852886e38)
            return dt_set_error(DT_ERR_BAD_DATA,
                                "file %s: row %lld, element %lld: %s value %g; inputs must be "
                                "finite%s",
                                a->path, (long long)(i / per), (long long)(i % per), a->descr, v,
                                isfinite(v) ? " and fit in float32" : "");
    }
    if (a->kind == 'f' && a->itemsize == 2) {
        out->dtype = DT_F16;
        return DT_OK;
    }
    out->dtype = DT_F32;
    if (a->kind == 'f' && a->itemsize == 4)
        return DT_OK;
    float *f = NULL;
    DT_CHECK(dt_malloc((size_t)a->elems * sizeof *f, "converted inputs", (void **)&f));
    for (int64_t i = 0; i < a->elems; i++)
        f[i] = (float)float_at(a, i);
    free(a->data);
    a->data = f;
    a->kind = 'f';
    a->itemsize = 4;
out:
    return st;
}

static dt_status split_load(struct npy_split *s, const char *name, const char *xpath,
                            const char *ypath, const struct dt_class_list *cl, int *max_label)
{
    dt_status st = DT_OK;
    char shape[160];
    DT_CHECK(npy_read(xpath, "inputs", &s->x));
    DT_CHECK(npy_read(ypath, "labels", &s->y));
    shape_str(&s->x, 0, shape, sizeof shape);
    if (s->x.ndim < 2) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "file %s: inputs of shape %s; expected (N, ...) with 1 to %d sample "
                          "dimensions (one feature per sample: reshape to (N, 1))",
                          xpath, shape, DT_DATASET_MAX_DIMS);
        goto out;
    }
    for (int d = 0; d < s->x.ndim; d++)
        if (s->x.shape[d] == 0) {
            st = dt_set_error(DT_ERR_BAD_DATA, "file %s: inputs of shape %s hold no data", xpath,
                              shape);
            goto out;
        }
    shape_str(&s->y, 0, shape, sizeof shape);
    if (s->y.kind == 'f') {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "file %s: labels of dtype '%s'; labels must be an integer dtype "
                          "(numpy: y.astype(np.int64))",
                          ypath, s->y.descr);
        goto out;
    }
    if (s->y.ndim != 1) {
        st = dt_set_error(DT_ERR_BAD_DATA, "file %s: labels of shape %s; expected (N,)", ypath,
                          shape);
        goto out;
    }
    if (s->y.shape[0] != s->x.shape[0]) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "%s split: %s holds %lld samples but %s holds %lld labels", name, xpath,
                          (long long)s->x.shape[0], ypath, (long long)s->y.shape[0]);
        goto out;
    }
    DT_CHECK(dt_calloc((size_t)s->y.elems, sizeof *s->labels, "labels", (void **)&s->labels));
    for (int64_t i = 0; i < s->y.elems; i++) {
        int big;
        int64_t v = int_at(&s->y, i, &big);
        int limit = cl->count ? cl->count : DT_DATASET_MAX_CLASSES;
        if (big || v < 0 || v >= limit) {
            st = dt_set_error(DT_ERR_BAD_DATA, "file %s: row %lld: label %lld is outside [0, %d)%s",
                              ypath, (long long)i, big ? (long long)INT64_MAX : (long long)v, limit,
                              cl->count ? " (the class names given)" : " (labels are class ids)");
            goto out;
        }
        s->labels[i] = (int32_t)v;
        if (v > *max_label)
            *max_label = (int)v;
    }
    DT_CHECK(convert_x(&s->x, &s->out));
    s->out.name = name;
    s->out.source = xpath;
    s->out.ndim = s->x.ndim - 1;
    for (int d = 1; d < s->x.ndim; d++)
        s->out.shape[d - 1] = s->x.shape[d];
    s->out.n = s->x.shape[0];
    s->out.x = s->x.data;
    s->out.y = s->labels;
out:
    return st;
}

dt_status dt_npy_import(const struct dt_npy_import_opts *o, FILE *progress)
{
    dt_status st = DT_OK;
    struct npy_split s[2];
    struct dt_import_split out[2];
    struct dt_class_list *cl = NULL;
    int nsplits = 1, max_label = 0;
    memset(s, 0, sizeof s);
    if (!o || !o->train_x || !o->train_y)
        return dt_set_error(DT_ERR_USAGE, ".npy import needs both train inputs and train labels");
    if (!o->test_x != !o->test_y)
        return dt_set_error(DT_ERR_USAGE,
                            ".npy import: test inputs and test labels go together (got only %s)",
                            o->test_x ? o->test_x : o->test_y);
    DT_CHECK(dt_import_check_output(o->out_path, o->overwrite, progress));
    DT_CHECK(dt_calloc(1, sizeof *cl, "class names", (void **)&cl));
    DT_CHECK(dt_import_parse_classes(o->class_names, cl));
    DT_CHECK(split_load(&s[0], "train", o->train_x, o->train_y, cl, &max_label));
    if (o->test_x) {
        nsplits = 2;
        DT_CHECK(split_load(&s[1], "test", o->test_x, o->test_y, cl, &max_label));
        char a[160], b[160];
        shape_str(&s[0].x, 1, a, sizeof a);
        shape_str(&s[1].x, 1, b, sizeof b);
        if (strcmp(a, b) != 0 || s[0].out.dtype != s[1].out.dtype) {
            st = dt_set_error(DT_ERR_BAD_DATA,
                              "file %s: test samples are %s %s but the train samples (%s) are "
                              "%s %s; both must match",
                              o->test_x, b, dt_dtype_name(s[1].out.dtype), o->train_x, a,
                              dt_dtype_name(s[0].out.dtype));
            goto out;
        }
    }
    if (progress) {
        fprintf(progress, "importing .npy arrays into %s\n", o->out_path);
        fflush(progress);
    }
    for (int i = 0; i < nsplits; i++)
        out[i] = s[i].out;
    DT_CHECK(dt_import_write(o->out_path, out, nsplits, cl->count ? cl->count : max_label + 1, cl,
                             progress));
out:
    for (int i = 0; i < 2; i++)
        split_free(&s[i]);
    free(cl);
    return st;
}
