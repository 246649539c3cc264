/*
 * safetensors.c - the safetensors reader and writer (see safetensors.h).
 *
 * Reading: the 8-byte header length is checked against the file size and
 * HEADER_MAX, the header is parsed with Jansson (duplicate keys refused),
 * every tensor entry is checked alone (dtype, shape, offsets against its
 * bytes), then the entries are sorted by offset and must tile the data
 * exactly: the first at 0, each next one where the last ended, the last
 * at the end of the file. Tensor data is read on demand with pread.
 *
 * Writing: the header (compact JSON, padded with spaces to a multiple of
 * 8) and the data go to a temporary file beside the target, whose space
 * is reserved first, then synced and renamed into place (outfile.h).
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/files.h"
#include "outfile.h"

#define HEADER_MAX (100u << 20) /* the reference implementation's limit */
#define MAX_TENSORS 1000000

struct dt_safetensors {
    char path[4096];
    int fd;
    uint64_t data_start, data_bytes;
    int n;
    struct dt_st_tensor *t;
    json_t *meta; /* "__metadata__" (strings only), or NULL */
};

static const struct {
    const char *name;
    int size;  /* bytes per element */
    int taken; /* converted to float here */
    enum dt_st_dtype d;
} dtypes[] = {
    {"F32", 4, 1, DT_ST_F32},  {"F16", 2, 1, DT_ST_F16}, {"BF16", 2, 1, DT_ST_BF16},
    {"F64", 8, 1, DT_ST_F64},  {"I8", 1, 0, 0},          {"U8", 1, 0, 0},
    {"I16", 2, 0, 0},          {"U16", 2, 0, 0},         {"I32", 4, 0, 0},
    {"U32", 4, 0, 0},          {"I64", 8, 0, 0},         {"U64", 8, 0, 0},
    {"BOOL", 1, 0, 0},         {"F8_E4M3", 1, 0, 0},     {"F8_E5M2", 1, 0, 0},
};

const char *dt_st_dtype_name(enum dt_st_dtype d)
{
    switch (d) {
    case DT_ST_F32: return "F32";
    case DT_ST_F16: return "F16";
    case DT_ST_BF16: return "BF16";
    case DT_ST_F64: return "F64";
    }
    return "?";
}

static int dtype_size(enum dt_st_dtype d)
{
    return d == DT_ST_F64 ? 8 : d == DT_ST_F32 ? 4 : 2;
}

int64_t dt_st_numel(const struct dt_st_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

/* DT_ERR_BAD_DATA naming the file (and the tensor, when not NULL). */
static dt_status bad(const char *path, const char *name, const char *why)
{
    if (name)
        return dt_set_error(DT_ERR_BAD_DATA, "safetensors file %s: tensor '%.200s': %s", path,
                            name, why);
    return dt_set_error(DT_ERR_BAD_DATA, "safetensors file %s: %s", path, why);
}

/* A non-negative JSON integer, or -1. */
static int64_t json_count(const json_t *v)
{
    if (!json_is_integer(v))
        return -1;
    json_int_t x = json_integer_value(v);
    return x < 0 ? -1 : (int64_t)x;
}

/* One tensor entry of the header, checked alone. */
static dt_status parse_tensor(const char *path, const char *name, const json_t *v,
                              struct dt_st_tensor *t)
{
    char why[512];
    if (strlen(name) >= DT_ST_NAME) {
        snprintf(why, sizeof why, "a tensor name of %zu bytes (at most %d are taken)",
                 strlen(name), DT_ST_NAME - 1);
        return bad(path, NULL, why);
    }
    if (!name[0])
        return bad(path, NULL, "a tensor with an empty name");
    snprintf(t->name, sizeof t->name, "%s", name);
    if (!json_is_object(v))
        return bad(path, name, "its entry is not an object of dtype, shape and data_offsets");
    const json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
                 *off = json_object_get(v, "data_offsets");
    if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(off))
        return bad(path, name,
                   "needs \"dtype\" (a string), \"shape\" (a list) and \"data_offsets\" (a "
                   "list of two integers)");
    const char *d = json_string_value(dt);
    int found = -1;
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (!strcmp(d, dtypes[i].name))
            found = (int)i;
    if (found < 0) {
        snprintf(why, sizeof why, "unknown dtype '%.40s'", d);
        return bad(path, name, why);
    }
    if (!dtypes[found].taken) {
        snprintf(why, sizeof why,
                 "dtype %s, which dtrain cannot take (it reads F32, F16, BF16 and F64)", d);
        return bad(path, name, why);
    }
    t->dtype = dtypes[found].d;
    size_t nd = json_array_size(sh);
    if (nd > DT_ST_MAX_DIMS) {
        snprintf(why, sizeof why, "%zu dimensions (at most %d are taken)", nd, DT_ST_MAX_DIMS);
        return bad(path, name, why);
    }
    t->ndim = (int)nd;
    uint64_t bytes = (uint64_t)dtypes[found].size;
    for (size_t i = 0; i < nd; i++) {
        int64_t x = json_count(json_array_get(sh, i));
        if (x < 0)
            return bad(path, name, "its shape has an entry that is not a whole number >= 0");
        t->shape[i] = x;
        if (x && bytes > UINT64_MAX / (uint64_t)x)
            return bad(path, name, "its shape's size overflows 64 bits");
        bytes *= (uint64_t)x;
    }
    int64_t b = json_array_size(off) == 2 ? json_count(json_array_get(off, 0)) : -1;
    int64_t e = json_array_size(off) == 2 ? json_count(json_array_get(off, 1)) : -1;
    if (b < 0 || e < 0 || b > e)
        return bad(path, name,
                   "data_offsets must be two whole numbers [begin, end] with begin <= end");
    t->begin = (uint64_t)b;
    t->end = (uint64_t)e;
    if (t->end - t->begin != bytes) {
        char shape[160] = "";
        size_t k = 0;
        for (int i = 0; i < t->ndim && k < sizeof shape - 24; i++)
            k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%lld", i ? ", " : "",
                                  (long long)t->shape[i]);
        snprintf(why, sizeof why,
                 "data_offsets [%llu, %llu) hold %llu bytes, but %s of shape [%s] is %llu bytes",
                 (unsigned long long)t->begin, (unsigned long long)t->end,
                 (unsigned long long)(t->end - t->begin), d, shape, (unsigned long long)bytes);
        return bad(path, name, why);
    }
    return DT_OK;
}

static int by_begin(const void *a, const void *b)
{
    const struct dt_st_tensor *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* The entries must tile [0, data_bytes) in offset order. */
static dt_status check_tiling(dt_safetensors_t *f)
{
    char why[700];
    uint64_t at = 0;
    qsort(f->t, (size_t)f->n, sizeof *f->t, by_begin);
    for (int i = 0; i < f->n; i++) {
        const struct dt_st_tensor *t = &f->t[i];
        if (t->begin != at) {
            if (t->begin < at)
                snprintf(why, sizeof why,
                         "its data [%llu, %llu) overlaps the tensor before it, which ends at %llu",
                         (unsigned long long)t->begin, (unsigned long long)t->end,
                         (unsigned long long)at);
            else
                snprintf(why, sizeof why,
                         "its data starts at %llu, leaving a gap after the tensor before it, "
                         "which ends at %llu",
                         (unsigned long long)t->begin, (unsigned long long)at);
            return bad(f->path, t->name, why);
        }
        at = t->end;
    }
    if (at != f->data_bytes) {
        snprintf(why, sizeof why,
                 "the tensors' data ends at byte %llu of the data, but the file holds %llu bytes "
                 "of data after its header",
                 (unsigned long long)at, (unsigned long long)f->data_bytes);
        return bad(f->path, NULL, why);
    }
    return DT_OK;
}

static dt_status parse_meta(dt_safetensors_t *f, json_t *m)
{
    const char *k;
    json_t *v;
    if (!json_is_object(m))
        return bad(f->path, NULL, "__metadata__ is not an object of strings");
    json_object_foreach(m, k, v)
    {
        if (!json_is_string(v))
            return bad(f->path, NULL, "a __metadata__ value is not a string");
    }
    f->meta = json_incref(m);
    return DT_OK;
}

static dt_status parse_header(dt_safetensors_t *f, const char *text, size_t len)
{
    json_error_t err;
    dt_status st = DT_OK;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        char why[400];
        snprintf(why, sizeof why, "its header is not valid JSON (%s, at byte %d of it)", err.text,
                 err.position);
        return bad(f->path, NULL, why);
    }
    if (!json_is_object(root)) {
        st = bad(f->path, NULL, "its header is not a JSON object");
        goto out;
    }
    size_t count = json_object_size(root);
    if (count > MAX_TENSORS) {
        st = bad(f->path, NULL, "its header lists more than 1000000 tensors");
        goto out;
    }
    st = dt_calloc(count ? count : 1, sizeof *f->t, "the safetensors header", (void **)&f->t);
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v)
    {
        if (st != DT_OK)
            break;
        if (!strcmp(k, "__metadata__"))
            st = parse_meta(f, v);
        else
            st = parse_tensor(f->path, k, v, &f->t[f->n++]);
    }
    if (st == DT_OK)
        st = check_tiling(f);
out:
    json_decref(root);
    return st;
}

static int read_full(int fd, void *buf, size_t n, uint64_t at)
{
    char *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)at);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r == 0)
                errno = 0; /* the file ended */
            return -1;
        }
        p += r;
        n -= (size_t)r;
        at += (uint64_t)r;
    }
    return 0;
}

dt_status dt_safetensors_open(const char *path, dt_safetensors_t **out)
{
    dt_status st = DT_OK;
    dt_safetensors_t *f = NULL;
    char *text = NULL;
    int64_t fsize = 0;
    unsigned char len8[8];
    *out = NULL;
    DT_CHECK(dt_calloc(1, sizeof *f, "a safetensors reader", (void **)&f));
    f->fd = -1;
    snprintf(f->path, sizeof f->path, "%s", path);
    DT_CHECK(dt_input_open(path, "safetensors file", &f->fd, &fsize));
    uint64_t size = (uint64_t)fsize;
    if (size < 8 || read_full(f->fd, len8, 8, 0) != 0) {
        st = bad(path, NULL, "shorter than the 8-byte header length");
        goto out;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | len8[i];
    if (n > size - 8 || n > HEADER_MAX || n < 2) {
        char why[200];
        snprintf(why, sizeof why,
                 "its header length is %llu bytes, but the file holds %llu after it (and a "
                 "header is 2 to %u bytes)",
                 (unsigned long long)n, (unsigned long long)(size - 8), HEADER_MAX);
        st = bad(path, NULL, why);
        goto out;
    }
    DT_CHECK(dt_malloc((size_t)n, "the safetensors header", (void **)&text));
    if (read_full(f->fd, text, (size_t)n, 8) != 0) {
        st = dt_set_error(DT_ERR_IO, "safetensors file %s: cannot read its header: %s", path,
                          errno ? strerror(errno) : "the file ended");
        goto out;
    }
    f->data_start = 8 + n;
    f->data_bytes = size - 8 - n;
    DT_CHECK(parse_header(f, text, (size_t)n));
    *out = f;
    f = NULL;
out:
    free(text);
    dt_safetensors_close(f);
    return st;
}

int dt_safetensors_count(const dt_safetensors_t *f) { return f->n; }

const struct dt_st_tensor *dt_safetensors_tensor(const dt_safetensors_t *f, int i)
{
    return i >= 0 && i < f->n ? &f->t[i] : NULL;
}

const struct dt_st_tensor *dt_safetensors_find(const dt_safetensors_t *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name))
            return &f->t[i];
    return NULL;
}

const char *dt_safetensors_meta(const dt_safetensors_t *f, const char *key)
{
    return f->meta ? json_string_value(json_object_get(f->meta, key)) : NULL;
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0x1f)
        bits = sign | 0x7f800000u | (m << 13);
    else if (e)
        bits = sign | ((e + 112) << 23) | (m << 13);
    else if (!m)
        bits = sign;
    else { /* subnormal: normalise */
        e = 113;
        while (!(m & 0x400)) {
            m <<= 1;
            e--;
        }
        bits = sign | (e << 23) | ((m & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

dt_status dt_safetensors_read(dt_safetensors_t *f, const struct dt_st_tensor *t, float *dst)
{
    const int64_t n = dt_st_numel(t);
    const int es = dtype_size(t->dtype);
    enum { CHUNK = 1 << 16 };
    unsigned char *buf = NULL;
    dt_status st;
    DT_CHECK(dt_malloc((size_t)CHUNK * (size_t)es, "a safetensors read buffer", (void **)&buf));
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
        int64_t k = n - i0 < CHUNK ? n - i0 : CHUNK;
        if (read_full(f->fd, buf, (size_t)k * (size_t)es,
                      f->data_start + t->begin + (uint64_t)i0 * (uint64_t)es) != 0) {
            st = dt_set_error(DT_ERR_IO, "safetensors file %s: cannot read tensor '%s': %s",
                              f->path, t->name, errno ? strerror(errno) : "the file is shorter");
            goto out;
        }
        for (int64_t j = 0; j < k; j++) {
            const unsigned char *p = buf + j * es;
            uint32_t u32;
            uint64_t u64;
            float v;
            double d;
            switch (t->dtype) {
            case DT_ST_F32:
                u32 = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                      (uint32_t)p[3] << 24;
                memcpy(&v, &u32, 4);
                break;
            case DT_ST_F16:
                v = half_to_float((uint16_t)(p[0] | p[1] << 8));
                break;
            case DT_ST_BF16:
                u32 = ((uint32_t)p[0] | (uint32_t)p[1] << 8) << 16;
                memcpy(&v, &u32, 4);
                break;
            default:
                u64 = 0;
                for (int b = 7; b >= 0; b--)
                    u64 = u64 << 8 | p[b];
                memcpy(&d, &u64, 8);
                v = (float)d;
                break;
            }
            dst[i0 + j] = v;
        }
    }
out:
    free(buf);
    return st;
}

void dt_safetensors_close(dt_safetensors_t *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    json_decref(f->meta);
    free(f->t);
    free(f);
}

/* ---- writing ---------------------------------------------------------------- */

static dt_status build_header(const struct dt_st_out *t, int n, const char *const *meta, int m,
                              char **text, size_t *len, uint64_t *data_bytes)
{
    dt_status st = DT_OK;
    json_t *root = json_object(), *md = json_object();
    uint64_t at = 0;
    int has_format = 0;
    if (!root || !md) {
        st = dt_set_error(DT_ERR_NOMEM, "safetensors: no memory for the header");
        goto out;
    }
    for (int i = 0; i < m; i++) {
        if (!meta[2 * i] || !meta[2 * i + 1] ||
            json_object_set_new(md, meta[2 * i], json_string(meta[2 * i + 1])) != 0) {
            st = dt_set_error(DT_ERR_INVALID_ARG,
                              "safetensors: metadata pair %d is not two UTF-8 strings", i);
            goto out;
        }
        has_format |= !strcmp(meta[2 * i], "format");
    }
    if (!has_format && json_object_set_new(md, "format", json_string("pt")) != 0)
        goto nomem;
    int set_md = json_object_set(root, "__metadata__", md);
    if (set_md != 0)
        goto nomem;
    for (int i = 0; i < n; i++) {
        const struct dt_st_out *o = &t[i];
        if (!o->name || !o->name[0] || strlen(o->name) >= DT_ST_NAME ||
            !strcmp(o->name, "__metadata__") || o->ndim < 0 || o->ndim > DT_ST_MAX_DIMS ||
            json_object_get(root, o->name)) {
            st = dt_set_error(DT_ERR_INVALID_ARG,
                              "safetensors: tensor %d ('%.80s') has no valid, unique name or "
                              "shape",
                              i, o->name ? o->name : "");
            goto out;
        }
        json_t *shape = json_array();
        uint64_t bytes = 4;
        if (!shape)
            goto nomem;
        for (int d = 0; d < o->ndim; d++) {
            if (o->shape[d] < 0 || (o->shape[d] && bytes > (uint64_t)INT64_MAX / 2 /
                                                                (uint64_t)o->shape[d])) {
                json_decref(shape);
                st = dt_set_error(DT_ERR_INVALID_ARG,
                                  "safetensors: tensor '%s': a negative or too large dimension",
                                  o->name);
                goto out;
            }
            if (json_array_append_new(shape, json_integer(o->shape[d])) != 0) {
                json_decref(shape);
                goto nomem;
            }
            bytes *= (uint64_t)o->shape[d];
        }
        if (bytes && !o->data) {
            json_decref(shape);
            st = dt_set_error(DT_ERR_INVALID_ARG, "safetensors: tensor '%s' has no data", o->name);
            goto out;
        }
        if (at > (uint64_t)INT64_MAX / 2 - bytes) {
            json_decref(shape);
            st = dt_set_error(DT_ERR_INVALID_ARG, "safetensors: more data than a file can hold");
            goto out;
        }
        json_t *e = json_object();
        if (!e || json_object_set_new(e, "dtype", json_string("F32")) != 0) {
            json_decref(shape);
            json_decref(e);
            goto nomem;
        }
        if (json_object_set_new(e, "shape", shape) != 0 || /* shape is taken even then */
            json_object_set_new(e, "data_offsets",
                                json_pack("[II]", (json_int_t)at, (json_int_t)(at + bytes))) != 0) {
            json_decref(e);
            goto nomem;
        }
        if (json_object_set_new(root, o->name, e) != 0) {
            st = dt_set_error(DT_ERR_INVALID_ARG, "safetensors: tensor %d's name is not UTF-8", i);
            goto out;
        }
        at += bytes;
    }
    char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!s) {
        st = dt_set_error(DT_ERR_NOMEM, "safetensors: no memory for the header");
        goto out;
    }
    size_t l = strlen(s), padded = (l + 7) / 8 * 8;
    *text = realloc(s, padded + 1);
    if (!*text) {
        free(s);
        st = dt_set_error(DT_ERR_NOMEM, "safetensors: no memory for the header");
        goto out;
    }
    memset(*text + l, ' ', padded - l);
    (*text)[padded] = '\0';
    *len = padded;
    *data_bytes = at;
    goto out;
nomem:
    st = dt_set_error(DT_ERR_NOMEM, "safetensors: no memory for the header");
out:
    json_decref(md);
    json_decref(root);
    return st;
}

static dt_status write_all(FILE *fp, const void *p, size_t n, const char *path, const char *tmp)
{
    if (n && fwrite(p, 1, n, fp) != n) {
        char reason[256];
        dt_outfile_reason(errno, tmp, reason, sizeof reason);
        return dt_set_error(DT_ERR_IO, "safetensors file %s: cannot write %s: %s", path, tmp,
                            reason);
    }
    return DT_OK;
}

static dt_status write_file(const char *tmp, const char *path, const struct dt_st_out *t, int n,
                            const char *header, size_t hlen, uint64_t data_bytes)
{
    dt_status st = DT_OK;
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    FILE *fp = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!fp) {
        char reason[256];
        dt_outfile_reason(errno, tmp, reason, sizeof reason);
        if (fd >= 0)
            close(fd);
        return dt_set_error(DT_ERR_IO, "safetensors file %s: cannot create %s: %s", path, tmp,
                            reason);
    }
    uint64_t total = 8 + hlen + data_bytes;
    st = dt_outfile_check_limit("safetensors file", path, total);
    if (st == DT_OK)
        st = dt_outfile_reserve("safetensors file", tmp, total);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    if (st == DT_OK)
        st = write_all(fp, len8, 8, path, tmp);
    if (st == DT_OK)
        st = write_all(fp, header, hlen, path, tmp);
    for (int i = 0; i < n && st == DT_OK; i++) {
        size_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++)
            numel *= (size_t)t[i].shape[d];
        /* little-endian floats: the host's own order on every machine dtrain builds for */
        st = write_all(fp, t[i].data, numel * sizeof(float), path, tmp);
    }
    if (fclose(fp) != 0 && st == DT_OK) {
        char reason[256];
        dt_outfile_reason(errno, tmp, reason, sizeof reason);
        st = dt_set_error(DT_ERR_IO, "safetensors file %s: cannot finish %s: %s", path, tmp,
                          reason);
    }
    if (st == DT_OK)
        dt_outfile_release(tmp, total);
    return st;
}

dt_status dt_safetensors_save(const char *path, const struct dt_st_out *t, int n,
                              const char *const *meta, int m)
{
    char tmp[DT_OUTFILE_TMP_LEN] = "", *header = NULL;
    size_t hlen = 0;
    uint64_t data_bytes = 0;
    dt_status st;
    _Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
                   "safetensors data is little-endian: this writer stores host floats as they are");
    if (n < 0 || n > MAX_TENSORS || (n && !t) || m < 0 || (m && !meta))
        return dt_set_error(DT_ERR_INVALID_ARG, "safetensors: %d tensors, %d metadata pairs", n,
                            m);
    DT_CHECK(build_header(t, n, meta, m, &header, &hlen, &data_bytes));
    DT_CHECK(dt_outfile_tmp_begin("safetensors file", path, tmp, sizeof tmp));
    st = write_file(tmp, path, t, n, header, hlen, data_bytes);
    if (st == DT_OK)
        st = dt_outfile_commit("safetensors file", tmp, path);
    dt_outfile_tmp_end(tmp, st == DT_OK);
out:
    free(header);
    return st;
}
