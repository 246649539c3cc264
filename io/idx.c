/*
 * idx.c - importing IDX files (MNIST, Fashion-MNIST) into a dtrain HDF5
 * dataset (format v1, see dataset.h).
 *
 * IDX: a 4-byte big-endian magic (two zero bytes, an element type byte,
 * 0x08 = unsigned byte, and a dimension count), one big-endian u32 per
 * dimension, then the data. A file that starts with gzip's magic is read
 * through zlib's inflate, member after member as gzip reads them, and
 * always to its end: each member's CRC-32 and length are checked only when
 * its end is read, so a file is read on past the data its header declares
 * and must end there (no more data, no bytes that are not gzip); any
 * other file is read as it is, and must hold exactly the declared data.
 *
 * All headers and both label files are checked before anything is
 * written: counts agree, labels fit the class names, and the data a
 * header declares could be in its file (a raw file holds it, a gzipped
 * one is large enough at deflate's best ratio), so nothing is allocated
 * from a size the file cannot back. Inputs are opened with dt_input_open
 * (a FIFO or a directory is refused, never waited on). Images are then
 * streamed chunk by chunk into /<split>/x (uint8, chunked by about 1 MiB,
 * no compression: dataset.c explains why random row reads want
 * uncompressed chunks), and the normalisation statistics are summed
 * exactly in integers on the way. The file is written through outfile.h
 * as "<out>.tmp.<host>.<pid>" in the output's directory: its space
 * reserved first, then closed, fsynced and renamed into place; the
 * temporary file is removed on any failure (a damaged gzip file is found
 * at its end, after the temporary exists).
 */
#define _GNU_SOURCE
#include "idx.h"

#include <errno.h>
#include <hdf5.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/files.h"
#include "core/text.h"
#include "dataset.h"
#include "hdf5_lock.h"
#include "import.h"
#include "outfile.h"

#define IDX_TYPE_U8 0x08
#define IDX_MAX_DIMS (1 + DT_DATASET_MAX_DIMS)
#define IDX_GZ_BUFFER (256 * 1024)
#define CHUNK_TARGET_BYTES (1u << 20) /* x chunk size aimed at */
#define CHUNK_MAX_ROWS 1024
/* One image at most: a chunk holds at least one, and the importer keeps a
 * chunk in memory. */
#define IDX_MAX_SAMPLE_BYTES ((uint64_t)64 << 20)
/* deflate's best ratio is 1032:1 (258-byte matches in 2-bit codes); a
 * gzipped file cannot hold more than this many bytes per byte. */
#define GZ_MAX_RATIO 1032

struct idx_file {
    const char *path; /* NULL: not open */
    const char *what; /* "images" or "labels" */
    int fd;
    int gz;             /* gzip members; else the IDX bytes as they are */
    z_stream z;         /* next_in/avail_in: the unread input in `in`, either way */
    int z_init;         /* inflateInit2 done */
    int in_member;      /* gz: inside a member, its end not read yet */
    int cut;            /* gz: the file ended inside a member */
    int64_t junk;       /* gz: bytes after the last member that are not gzip; -1: none seen */
    int eof;            /* the file has no more bytes */
    unsigned char *in;  /* IDX_GZ_BUFFER bytes of input */
    int64_t read_bytes; /* bytes of the file read into `in` so far */
    int ndims;
    uint64_t dims[IDX_MAX_DIMS];
    uint64_t count;        /* dims[0] */
    uint64_t sample_bytes; /* product of dims[1..] */
    uint64_t got;          /* data bytes read so far */
    int64_t file_bytes;    /* size of the file */
};

struct split_src {
    const char *name; /* "train" or "test" */
    struct idx_file img, lab;
    unsigned char *labels;
};

/* ---- reading IDX --------------------------------------------------------- */

static const char *idx_type_name(int t)
{
    switch (t) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    }
    return NULL;
}

static void idx_close(struct idx_file *f)
{
    if (!f->path) return;
    if (f->z_init) inflateEnd(&f->z);
    if (f->fd >= 0) close(f->fd);
    free(f->in);
    f->z_init = 0;
    f->fd = -1;
    f->in = NULL;
    f->path = NULL;
}

/* Tops the input up to `need` bytes, unless the file ends first. */
static dt_status fill(struct idx_file *f, unsigned need)
{
    while (f->z.avail_in < need && !f->eof) {
        if (f->z.avail_in && f->z.next_in != f->in) memmove(f->in, f->z.next_in, f->z.avail_in);
        f->z.next_in = f->in;
        ssize_t r = read(f->fd, f->in + f->z.avail_in, IDX_GZ_BUFFER - f->z.avail_in);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return dt_set_error(DT_ERR_IO, "file %s: read failed: %s", f->path, strerror(errno));
        f->eof = r == 0;
        f->z.avail_in += (uInt)r;
        f->read_bytes += r;
    }
    return DT_OK;
}

/* Up to len bytes of a raw file into buf; *got counts them. */
static dt_status raw_read(struct idx_file *f, unsigned char *buf, size_t len, size_t *got)
{
    dt_status st = DT_OK;
    while (*got < len) {
        DT_CHECK(fill(f, 1));
        if (!f->z.avail_in) break;
        size_t n = len - *got < f->z.avail_in ? len - *got : f->z.avail_in;
        memcpy(buf + *got, f->z.next_in, n);
        f->z.next_in += n;
        f->z.avail_in -= (uInt)n;
        *got += n;
    }
out:
    return st;
}

/* zlib's reason, with what its trailer checks mean. */
static const char *zlib_reason(const char *msg, char *buf, size_t len)
{
    const char *gloss = !msg                                     ? ""
                        : !strcmp(msg, "incorrect data check")   ? ": the data's CRC-32 is not the "
                                                                   "one its gzip trailer records"
                        : !strcmp(msg, "incorrect length check") ? ": the data's length is not the "
                                                                   "one its gzip trailer records"
                                                                 : "";
    snprintf(buf, len, "%s%s", msg ? msg : "unknown error", gloss);
    return buf;
}

/* Up to len decompressed bytes into buf, member after member as gzip
 * reads them (the end of each member checks its CRC-32 and length); *got
 * counts them. Stops early at the end of the file (f->cut when that is
 * inside a member) or at bytes after a member that are not gzip
 * (f->junk). */
static dt_status gz_read(struct idx_file *f, unsigned char *buf, size_t len, size_t *got)
{
    dt_status st = DT_OK;
    char why[160];
    while (*got < len && !f->cut && f->junk < 0) {
        if (!f->in_member) {
            DT_CHECK(fill(f, 2));
            if (!f->z.avail_in) break; /* the end of the file, after a whole member */
            if (f->z.avail_in < 2 || f->z.next_in[0] != 0x1f || f->z.next_in[1] != 0x8b) {
                int64_t at = f->read_bytes - (int64_t)f->z.avail_in;
                f->junk = f->file_bytes - at > (int64_t)f->z.avail_in ? f->file_bytes - at
                                                                      : (int64_t)f->z.avail_in;
                break;
            }
            int r = f->z_init ? inflateReset(&f->z) : inflateInit2(&f->z, 16 + MAX_WBITS);
            if (r != Z_OK)
                return dt_set_error(DT_ERR_NOMEM, "file %s: cannot set up reading (zlib)", f->path);
            f->z_init = 1;
            f->in_member = 1;
        }
        DT_CHECK(fill(f, 1));
        size_t want = len - *got > (1u << 30) ? (1u << 30) : len - *got;
        f->z.next_out = buf + *got;
        f->z.avail_out = (uInt)want;
        int r = inflate(&f->z, Z_NO_FLUSH);
        *got += want - f->z.avail_out;
        if (r == Z_STREAM_END)
            f->in_member = 0;
        else if (r == Z_BUF_ERROR && !f->z.avail_in && f->eof)
            f->cut = 1; /* no input left, and the member is not over */
        else if (r == Z_MEM_ERROR)
            return dt_set_error(DT_ERR_NOMEM, "file %s: out of memory decompressing (zlib)",
                                f->path);
        else if (r != Z_OK && r != Z_BUF_ERROR)
            return dt_set_error(DT_ERR_BAD_DATA,
                                "file %s: corrupt gzip data (zlib: %s) after %llu decompressed "
                                "bytes; the file is damaged (check it with gzip -t)",
                                f->path, zlib_reason(f->z.msg, why, sizeof why),
                                (unsigned long long)(f->got + *got));
    }
out:
    return st;
}

/* Up to len bytes of the IDX data (header included) into buf; fewer only
 * at its end, which the caller judges. */
static dt_status idx_read(struct idx_file *f, void *buf, size_t len, size_t *got)
{
    *got = 0;
    return f->gz ? gz_read(f, buf, len, got) : raw_read(f, buf, len, got);
}

/* "N images of 28x28" for messages. */
static void declared_str(const struct idx_file *f, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "%llu %s", (unsigned long long)f->dims[0], f->what);
    for (int d = 1; d < f->ndims && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%llu", d > 1 ? "x" : " of ",
                              (unsigned long long)f->dims[d]);
}

/* The data the header declares must be possible: the products fit, one
 * image is of a sane size, and the file can hold it all. */
static dt_status check_declared(struct idx_file *f, size_t header_bytes)
{
    char what[160];
    int64_t sample = 1, total = 0;
    declared_str(f, what, sizeof what);
    for (int d = 1; d < f->ndims; d++)
        if (!dt_mul_i64(sample, (int64_t)f->dims[d], &sample)) sample = -1;
    if (sample < 0 || !dt_mul_i64((int64_t)f->count, sample, &total))
        return dt_set_error(DT_ERR_BAD_DATA,
                            "file %s: the IDX header declares %s, more data than any file holds",
                            f->path, what);
    if ((uint64_t)sample > IDX_MAX_SAMPLE_BYTES)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "file %s: the IDX header declares %s: one is %lld bytes, more than "
                            "the %llu MiB an image may have",
                            f->path, what, (long long)sample,
                            (unsigned long long)(IDX_MAX_SAMPLE_BYTES >> 20));
    f->sample_bytes = (uint64_t)sample;
    int64_t room = f->file_bytes - (int64_t)header_bytes;
    if (!f->gz && total > room)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "file %s: truncated: the IDX header declares %s (%lld data bytes) but "
                            "the file holds only %lld",
                            f->path, what, (long long)total, (long long)(room > 0 ? room : 0));
    if (!f->gz && total < room)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "file %s: %lld byte%s after the data its IDX header declares (%s, "
                            "%lld data bytes): an IDX file ends with its data (two files joined, "
                            "or a wrong header?)",
                            f->path, (long long)(room - total), room - total == 1 ? "" : "s", what,
                            (long long)total);
    if (f->gz && total / GZ_MAX_RATIO > f->file_bytes)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "file %s: the IDX header declares %s (%lld data bytes), more than a "
                            "gzipped file of %lld bytes can hold (truncated?)",
                            f->path, what, (long long)total, (long long)f->file_bytes);
    return DT_OK;
}

static dt_status idx_open(const char *path, int images, struct idx_file *f)
{
    dt_status st = DT_OK;
    unsigned char hdr[4 * (IDX_MAX_DIMS + 1)];
    size_t got = 0;
    int fd = -1;
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->junk = -1;
    f->what = images ? "images" : "labels";
    DT_CHECK(dt_input_open(path, images ? "IDX images" : "IDX labels", &fd, &f->file_bytes));
    f->path = path;
    f->fd = fd;
    DT_CHECK(dt_malloc(IDX_GZ_BUFFER, "the IDX read buffer", (void **)&f->in));
    f->z.next_in = f->in;
    DT_CHECK(fill(f, 2));
    f->gz = f->z.avail_in >= 2 && f->in[0] == 0x1f && f->in[1] == 0x8b;

    DT_CHECK(idx_read(f, hdr, 4, &got));
    if (got < 4) {
        st = dt_set_error(DT_ERR_BAD_DATA, "file %s: not an IDX file (only %zu bytes long%s)", path,
                          got, f->gz ? " decompressed" : "");
        goto out;
    }
    uint32_t magic = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 |
                     hdr[3];
    if (hdr[0] || hdr[1] || !idx_type_name(hdr[2]) || hdr[3] == 0) {
        st = dt_set_error(DT_ERR_BAD_DATA, "file %s: not an IDX file (magic 0x%08x)", path, magic);
        goto out;
    }
    if (hdr[2] != IDX_TYPE_U8) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "file %s: IDX element type %s (magic 0x%08x) is not supported; only "
                          "unsigned bytes are",
                          path, idx_type_name(hdr[2]), magic);
        goto out;
    }
    f->ndims = hdr[3];
    if (images ? (f->ndims < 2 || f->ndims > IDX_MAX_DIMS) : f->ndims != 1) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "file %s: IDX %s with %d dimension(s) (magic 0x%08x); expected %s "
                          "(are images and labels swapped?)",
                          path, f->what, f->ndims, magic,
                          images ? "N x height x width (magic 0x00000803)"
                                 : "N labels (magic 0x00000801)");
        goto out;
    }
    DT_CHECK(idx_read(f, hdr, 4 * (size_t)f->ndims, &got));
    if (got < 4 * (size_t)f->ndims) {
        st = dt_set_error(DT_ERR_BAD_DATA, "file %s: truncated IDX header", path);
        goto out;
    }
    int zero = 0;
    for (int d = 0; d < f->ndims; d++) {
        const unsigned char *p = hdr + 4 * d;
        f->dims[d] = (uint64_t)p[0] << 24 | (uint64_t)p[1] << 16 | (uint64_t)p[2] << 8 | p[3];
        zero |= f->dims[d] == 0;
    }
    f->count = f->dims[0];
    if (zero) {
        st = dt_set_error(DT_ERR_BAD_DATA, "file %s: IDX %s file holds no data (dimensions %s)",
                          path, f->what, f->count == 0 ? "start with 0" : "include a 0");
        goto out;
    }
    st = check_declared(f, 4 * (1 + (size_t)f->ndims));
out:
    if (st != DT_OK)
        idx_close(f);
    return st;
}

static void shape_str(const struct idx_file *f, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int d = 1; d < f->ndims && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%llu", d > 1 ? "x" : "",
                              (unsigned long long)f->dims[d]);
}

/* Why the data ended early, for a truncation message ("" for a raw file). */
static void early_end(const struct idx_file *f, char *buf, size_t len)
{
    if (f->cut)
        snprintf(buf, len, "; the file ends inside its gzip data");
    else if (f->junk >= 0)
        snprintf(buf, len, "; %lld byte%s that are not gzip data follow it", (long long)f->junk,
                 f->junk == 1 ? "" : "s");
    else
        buf[0] = '\0';
}

/* Reads the next `rows` items; a short file is a truncation error. */
static dt_status idx_read_rows(struct idx_file *f, void *buf, uint64_t rows)
{
    size_t want = (size_t)(rows * f->sample_bytes), got = 0;
    dt_status st = idx_read(f, buf, want, &got);
    if (st != DT_OK)
        return st;
    f->got += got;
    if (got < want) {
        char shape[64], why[96];
        shape_str(f, shape, sizeof shape);
        early_end(f, why, sizeof why);
        uint64_t expect = f->count * f->sample_bytes;
        return dt_set_error(DT_ERR_BAD_DATA,
                            "file %s: truncated: the header says %llu %s%s%s (%llu data bytes) "
                            "but the data ends after %llu bytes%s",
                            f->path, (unsigned long long)f->count, f->what, shape[0] ? " of " : "",
                            shape, (unsigned long long)expect, (unsigned long long)f->got, why);
    }
    return DT_OK;
}

/* After the data the header declares: the file must end there, a gzipped
 * one read to its end, so that the CRC-32 and length closing each gzip
 * member are checked and nothing follows (more data, or bytes that are
 * not gzip). */
static dt_status idx_finish(struct idx_file *f)
{
    unsigned char more[4096];
    size_t got = 0;
    uint64_t extra = 0;
    char what[160];
    dt_status st;
    /* Data after the declared: read to the end, so that damage (which
     * often decodes to more data) is said as such, and counted. */
    do {
        if ((st = idx_read(f, more, sizeof more, &got)) != DT_OK) return st;
        extra += got;
    } while (got == sizeof more);
    declared_str(f, what, sizeof what);
    if (extra) {
        char why[96];
        early_end(f, why, sizeof why);
        return dt_set_error(DT_ERR_BAD_DATA,
                            "file %s: %llu byte%s of data after the %s (%llu data bytes) its IDX "
                            "header declares%s: an IDX file ends with its data (damaged, two "
                            "files joined, or a wrong header?%s)",
                            f->path, (unsigned long long)extra, extra == 1 ? "" : "s", what,
                            (unsigned long long)(f->count * f->sample_bytes), why,
                            f->gz ? " gzip -t checks the file" : "");
    }
    if (f->cut)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "file %s: truncated: it ends inside its gzip data, after the %llu "
                            "data bytes its header declares but before the CRC-32 and length "
                            "that close the data (the file is cut short; check it with gzip -t)",
                            f->path, (unsigned long long)(f->count * f->sample_bytes));
    if (f->junk >= 0)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "file %s: %lld byte%s after the end of its gzip data, not gzip data "
                            "(gzip ignores such trailing bytes, dtrain refuses them: is the file "
                            "damaged, or two files joined?)",
                            f->path, (long long)f->junk, f->junk == 1 ? "" : "s");
    return DT_OK;
}

/* ---- options --------------------------------------------------------------- */

static dt_status check_opts(const struct dt_idx_import_opts *o, FILE *progress)
{
    if (!o)
        return dt_set_error(DT_ERR_INVALID_ARG, "IDX import: no options given");
    if (!o->train_images || !o->train_labels)
        return dt_set_error(DT_ERR_USAGE, "IDX import needs both train images and train labels");
    if (!o->out_path || !*o->out_path)
        return dt_set_error(DT_ERR_USAGE, "IDX import needs an output path");
    if (!o->test_images != !o->test_labels)
        return dt_set_error(DT_ERR_USAGE,
                            "IDX import: test images and test labels go together (got only %s)",
                            o->test_images ? o->test_images : o->test_labels);
    return dt_import_check_output(o->out_path, o->overwrite, progress);
}

/* ---- checking the sources before writing ---------------------------------- */

static void split_close(struct split_src *s)
{
    idx_close(&s->img);
    idx_close(&s->lab);
    free(s->labels);
    s->labels = NULL;
}

/* Opens a split's two files, checks they agree, reads and checks labels. */
static dt_status split_open(struct split_src *s, const char *name, const char *images,
                            const char *labels, const struct dt_class_list *cl, int *max_label)
{
    dt_status st = DT_OK;
    s->name = name;
    DT_CHECK(idx_open(images, 1, &s->img));
    DT_CHECK(idx_open(labels, 0, &s->lab));
    if (s->img.count != s->lab.count) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "%s split: %s holds %llu images but %s holds %llu labels", name,
                          images, (unsigned long long)s->img.count, labels,
                          (unsigned long long)s->lab.count);
        goto out;
    }
    DT_CHECK(dt_malloc((size_t)s->lab.count, "labels", (void **)&s->labels));
    DT_CHECK(idx_read_rows(&s->lab, s->labels, s->lab.count));
    DT_CHECK(idx_finish(&s->lab));
    for (uint64_t i = 0; i < s->lab.count; i++) {
        int v = s->labels[i];
        if (cl->count && v >= cl->count) {
            st = dt_set_error(DT_ERR_BAD_DATA,
                              "file %s: label %d at index %llu is outside the %d class names "
                              "given",
                              labels, v, (unsigned long long)i, cl->count);
            goto out;
        }
        if (v > *max_label)
            *max_label = v;
    }
out:
    return st;
}

/* ---- writing HDF5 (lock held in each helper) ------------------------------ */

/* Creates /<split>/x (empty, chunked) and writes /<split>/y. */
static dt_status create_split(hid_t file, const char *path, const struct split_src *s,
                              uint64_t chunk_rows, hid_t *x_out)
{
    dt_status st = DT_OK;
    hid_t g = -1, sx = -1, sy = -1, dcpl = -1, x = -1, y = -1;
    hsize_t dims[IDX_MAX_DIMS], chunk[IDX_MAX_DIMS], ny = s->lab.count;
    for (int d = 0; d < s->img.ndims; d++) {
        dims[d] = s->img.dims[d];
        chunk[d] = d ? s->img.dims[d] : chunk_rows;
    }
    g = H5Gcreate2(file, s->name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    sx = H5Screate_simple(s->img.ndims, dims, NULL);
    sy = H5Screate_simple(1, &ny, NULL);
    dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (g < 0 || sx < 0 || sy < 0 || dcpl < 0 || H5Pset_chunk(dcpl, s->img.ndims, chunk) < 0 ||
        H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) < 0) {
        st = dt_h5_write_error("dataset", path, path, "create split '%s'", s->name);
        goto out;
    }
    x = H5Dcreate2(g, "x", H5T_STD_U8LE, sx, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    y = H5Dcreate2(g, "y", H5T_STD_U8LE, sy, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (x < 0 || y < 0 || H5Dwrite(y, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                   s->labels) < 0) {
        st = dt_h5_write_error("dataset", path, path, "write /%s/y", s->name);
        goto out;
    }
    *x_out = x;
    x = -1;
out:
    dt_h5_close(x);
    dt_h5_close(y);
    dt_h5_close(dcpl);
    dt_h5_close(sy);
    dt_h5_close(sx);
    dt_h5_close(g);
    return st;
}

static dt_status write_rows(hid_t x, const char *path, const struct split_src *s, uint64_t row0,
                            uint64_t rows, const void *buf)
{
    hsize_t start[IDX_MAX_DIMS] = {0}, count[IDX_MAX_DIMS];
    for (int d = 0; d < s->img.ndims; d++)
        count[d] = d ? s->img.dims[d] : rows;
    start[0] = row0;
    hid_t fs = H5Dget_space(x);
    hid_t ms = H5Screate_simple(s->img.ndims, count, NULL);
    herr_t r = -1;
    if (fs >= 0 && ms >= 0 && H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) >= 0)
        r = H5Dwrite(x, H5T_NATIVE_UCHAR, ms, fs, H5P_DEFAULT, buf);
    dt_status st = DT_OK;
    if (r < 0) st = dt_h5_write_error("dataset", path, path, "write images to /%s/x", s->name);
    dt_h5_close(ms);
    dt_h5_close(fs);
    return st;
}

struct stats {
    uint64_t n, sum, sumsq; /* over train pixels, unscaled */
};

/* Rows per chunk of a split's x: about CHUNK_TARGET_BYTES. */
static uint64_t chunk_rows_of(const struct split_src *s)
{
    uint64_t rows = CHUNK_TARGET_BYTES / s->img.sample_bytes;
    if (rows < 1) rows = 1;
    if (rows > CHUNK_MAX_ROWS) rows = CHUNK_MAX_ROWS;
    if (rows > s->img.count) rows = s->img.count;
    return rows;
}

/* An upper estimate of the output's size: whole chunks of x, y, the class
 * names. */
static uint64_t import_estimate(const struct split_src *src, int nsrc, int num_classes)
{
    uint64_t data = 0, objects = 0;
    for (int i = 0; i < nsrc; i++) {
        uint64_t rows = chunk_rows_of(&src[i]);
        uint64_t chunks = (src[i].img.count + rows - 1) / rows;
        data += chunks * rows * src[i].img.sample_bytes + src[i].lab.count;
        objects += 3 + chunks; /* group, x, y, chunk index entries */
    }
    return dt_outfile_hdf5_estimate(data, objects, (uint64_t)num_classes * (DT_NAME_MAX + 16));
}

/* Streams a split's images into its x, chunk by chunk. */
static dt_status copy_images(hid_t file, const char *path, struct split_src *s,
                             struct stats *stats, FILE *progress)
{
    dt_status st = DT_OK;
    hid_t x = -1;
    unsigned char *buf = NULL;
    uint64_t chunk_rows = chunk_rows_of(s);
    DT_CHECK(dt_malloc((size_t)(chunk_rows * s->img.sample_bytes), "image chunk",
                       (void **)&buf));
    dt_h5_lock();
    st = create_split(file, path, s, chunk_rows, &x);
    dt_h5_unlock();
    if (st != DT_OK)
        goto out;
    for (uint64_t r = 0; r < s->img.count; r += chunk_rows) {
        uint64_t rows = s->img.count - r < chunk_rows ? s->img.count - r : chunk_rows;
        DT_CHECK(idx_read_rows(&s->img, buf, rows));
        if (stats) {
            size_t nb = (size_t)(rows * s->img.sample_bytes);
            for (size_t k = 0; k < nb; k++) {
                stats->sum += buf[k];
                stats->sumsq += (uint64_t)buf[k] * buf[k];
            }
            stats->n += nb;
        }
        dt_h5_lock();
        st = write_rows(x, path, s, r, rows, buf);
        dt_h5_unlock();
        if (st != DT_OK)
            goto out;
    }
    DT_CHECK(idx_finish(&s->img));
    if (progress) {
        char shape[64];
        shape_str(&s->img, shape, sizeof shape);
        fprintf(progress, "  %s: %llu images of %s from %s\n", s->name,
                (unsigned long long)s->img.count, shape, s->img.path);
        fflush(progress);
    }
out:
    if (x >= 0) {
        dt_h5_lock();
        H5Dclose(x);
        dt_h5_unlock();
    }
    free(buf);
    return st;
}

/* Writes the whole file at tmp, its space reserved first; *made says
 * whether tmp was created (the caller then renames or removes it). */
static dt_status write_file(const char *tmp, const char *out_path, struct split_src *src, int nsrc,
                            int num_classes, const struct dt_class_list *cl, FILE *progress, int *made)
{
    dt_status st = DT_OK;
    struct stats stats = {0};
    dt_h5_lock();
    hid_t file = H5Fcreate(tmp, H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
    if (file < 0) st = dt_h5_write_error("dataset", out_path, tmp, "create %s", tmp);
    dt_h5_unlock();
    if (st != DT_OK)
        return st;
    *made = 1; /* H5F_ACC_EXCL: it is ours, complete or not */
    DT_CHECK(dt_outfile_reserve("dataset", tmp, import_estimate(src, nsrc, num_classes)));
    for (int i = 0; i < nsrc; i++)
        DT_CHECK(copy_images(file, out_path, &src[i], i == 0 ? &stats : NULL, progress));

    double mean = (double)stats.sum / (double)stats.n;
    double var = (double)stats.sumsq / (double)stats.n - mean * mean;
    double sd = var > 0 ? sqrt(var) / 255.0 : 0.0;
    mean /= 255.0;
    if (!(sd > 0)) {
        if (progress)
            fprintf(progress, "  train images are all the same value: norm_std set to 1\n");
        sd = 1.0;
    }
    dt_h5_lock();
    st = dt_import_write_root_attrs(file, out_path, num_classes, cl, 1.0f / 255.0f, mean, sd);
    dt_h5_unlock();
    if (st == DT_OK && progress)
        fprintf(progress, "  %d classes, normalisation mean %.6f std %.6f (after scaling by "
                          "1/255)\n",
                num_classes, mean, sd);
out:
    dt_h5_lock();
    if (H5Fclose(file) < 0 && st == DT_OK)
        st = dt_h5_write_error("dataset", out_path, tmp, "finish writing %s", tmp);
    dt_h5_unlock();
    if (st == DT_OK) dt_outfile_release(tmp, import_estimate(src, nsrc, num_classes));
    return st;
}

dt_status dt_idx_import(const struct dt_idx_import_opts *opts, FILE *progress)
{
    dt_status st = DT_OK;
    struct split_src src[2];
    struct dt_class_list *cl = NULL;
    char tmp[DT_OUTFILE_TMP_LEN] = "";
    int nsrc = 0, max_label = 0, made_tmp = 0, committed = 0;
    double t0 = dt_now();
    memset(src, 0, sizeof src);

    DT_CHECK(check_opts(opts, progress));
    DT_CHECK(dt_calloc(1, sizeof *cl, "class names", (void **)&cl));
    DT_CHECK(dt_import_parse_classes(opts->class_names, cl));
    nsrc = 1;
    DT_CHECK(split_open(&src[0], "train", opts->train_images, opts->train_labels, cl,
                        &max_label));
    if (opts->test_images) {
        nsrc = 2;
        DT_CHECK(split_open(&src[1], "test", opts->test_images, opts->test_labels, cl,
                            &max_label));
        char a[64], b[64];
        shape_str(&src[0].img, a, sizeof a);
        shape_str(&src[1].img, b, sizeof b);
        if (strcmp(a, b) != 0) {
            st = dt_set_error(DT_ERR_BAD_DATA,
                              "file %s: test images are %s but the train images (%s) are %s",
                              opts->test_images, b, opts->train_images, a);
            goto out;
        }
    }
    int num_classes = cl->count ? cl->count : max_label + 1;
    if (progress) {
        fprintf(progress, "importing IDX into %s\n", opts->out_path);
        fflush(progress);
    }

    DT_CHECK(dt_outfile_tmp_begin("dataset", opts->out_path, tmp, sizeof tmp));
    DT_CHECK(write_file(tmp, opts->out_path, src, nsrc, num_classes, cl, progress, &made_tmp));
    DT_CHECK(dt_outfile_commit("dataset", tmp, opts->out_path));
    committed = 1;
    if (progress) {
        struct stat sb;
        char took[32];
        dt_format_duration(dt_now() - t0, took, sizeof took);
        fprintf(progress, "wrote %s (%.1f MiB) in %s\n", opts->out_path,
                stat(opts->out_path, &sb) == 0 ? (double)sb.st_size / (1 << 20) : 0.0, took);
        fflush(progress);
    }
out:
    dt_outfile_tmp_end(made_tmp ? tmp : "", committed);
    for (int i = 0; i < 2; i++)
        split_close(&src[i]);
    free(cl);
    return st;
}

/* ---- finding the standard file names ---------------------------------------- */

static int is_file(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int is_there(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* Finds dir/name or dir/name.gz, a regular file first; 0 if neither is
 * there. Something else by that name (a FIFO, a directory) is taken too,
 * so that opening it says what it is. */
static int find_one(const char *dir, const char *name, char *out)
{
    int (*const tests[2])(const char *) = {is_file, is_there};
    for (int t = 0; t < 2; t++) {
        snprintf(out, 4096, "%s/%s", dir, name);
        if (tests[t](out)) return 1;
        snprintf(out, 4096, "%s/%s.gz", dir, name);
        if (tests[t](out)) return 1;
    }
    return 0;
}

dt_status dt_idx_find_in_dir(const char *dir, struct dt_idx_import_opts *opts, char buf[4][4096])
{
    static const char *const names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                         "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    struct stat sb;
    int found[4];
    if (strlen(dir) > 4000)
        return dt_set_error(DT_ERR_USAGE, "directory path is too long");
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return dt_set_error(DT_ERR_NOT_FOUND, "IDX directory %s does not exist", dir);
    for (int i = 0; i < 4; i++)
        found[i] = find_one(dir, names[i], buf[i]);
    /* The test pair is optional, but half a pair is a mistake. */
    int need_test = found[2] || found[3];
    for (int i = 0; i < (need_test ? 4 : 2); i++)
        if (!found[i])
            return dt_set_error(DT_ERR_NOT_FOUND,
                                "IDX directory %s: no %s (looked for %s/%s and %s/%s.gz; "
                                "expected names: train-images-idx3-ubyte, "
                                "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
                                "t10k-labels-idx1-ubyte, each optionally .gz)",
                                dir, names[i], dir, names[i], dir, names[i]);
    opts->train_images = buf[0];
    opts->train_labels = buf[1];
    opts->test_images = need_test ? buf[2] : NULL;
    opts->test_labels = need_test ? buf[3] : NULL;
    return DT_OK;
}
