/*
 * import.c - what the dataset importers share (see import.h): the class
 * names option, the output path check, the root attributes, and the
 * writer of in-memory splits used by the .npy and CSV importers.
 * The language-model importers (lm_import.c) share the output check and
 * their own root attributes.
 *
 * The writer follows the IDX importer: x is chunked by about 1 MiB of rows
 * and not compressed (dataset.c explains why random row reads want
 * uncompressed chunks), y is int32, and the file is written through
 * outfile.h under a temporary name, its space reserved first, then synced
 * and renamed into place; the temporary file is removed on any failure.
 */
#define _GNU_SOURCE
#include "import.h"

#include <hdf5.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/text.h"
#include "hdf5_lock.h"
#include "outfile.h"

_Static_assert(sizeof(hid_t) == sizeof(int64_t), "hid_t is passed as int64_t");

#define CHUNK_TARGET_BYTES (1u << 20)
#define CHUNK_MAX_ROWS 1024
#define GZIP_PROBE_OUT 16384 /* output buffer of the gzip probe */

dt_status dt_import_parse_classes(const char *s, struct dt_class_list *cl)
{
    cl->count = 0;
    if (!s)
        return DT_OK;
    const char *p = s;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len && (*p == ' ' || *p == '\t')) {
            p++;
            len--;
        }
        while (len && (p[len - 1] == ' ' || p[len - 1] == '\t'))
            len--;
        if (cl->count == DT_DATASET_MAX_CLASSES)
            return dt_set_error(DT_ERR_USAGE, "class names: more than %d given",
                                DT_DATASET_MAX_CLASSES);
        if (len == 0)
            return dt_set_error(DT_ERR_USAGE, "class names: name %d in '%s' is empty",
                                cl->count + 1, s);
        if (len >= DT_NAME_MAX)
            return dt_set_error(DT_ERR_USAGE, "class names: '%.*s' is longer than %d characters",
                                (int)len, p, DT_NAME_MAX - 1);
        memcpy(cl->names[cl->count], p, len);
        cl->names[cl->count][len] = '\0';
        for (int c = 0; c < cl->count; c++)
            if (strcmp(cl->names[c], cl->names[cl->count]) == 0)
                return dt_set_error(DT_ERR_USAGE, "class names: '%s' appears twice", cl->names[c]);
        cl->count++;
        if (!end)
            return DT_OK;
        p = end + 1;
    }
}

dt_status dt_import_check_output(const char *out_path, int overwrite, FILE *progress)
{
    struct stat sb;
    if (!out_path || !*out_path)
        return dt_set_error(DT_ERR_USAGE, "import needs an output path (-o OUT.h5)");
    if (strlen(out_path) > 4000)
        return dt_set_error(DT_ERR_USAGE, "output path is too long");
    if (lstat(out_path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return dt_set_error(DT_ERR_USAGE, "output %s is a directory; give the file to create",
                            out_path);
    if (lstat(out_path, &sb) == 0 && !overwrite)
        return dt_set_error(DT_ERR_USAGE,
                            "output %s already exists; pass --force to replace it, or choose "
                            "another path",
                            out_path);
    return dt_outfile_clear_stale("dataset", out_path, progress);
}

static dt_status write_attr(hid_t obj, const char *name, hid_t ftype, hid_t mtype, hsize_t n,
                            const void *buf, const char *path)
{
    hid_t s = n ? H5Screate_simple(1, &n, NULL) : H5Screate(H5S_SCALAR);
    hid_t a = s >= 0 ? H5Acreate2(obj, name, ftype, s, H5P_DEFAULT, H5P_DEFAULT) : -1;
    herr_t r = a >= 0 ? H5Awrite(a, mtype, buf) : -1;
    dt_status st = DT_OK;
    if (r < 0)
        st = dt_h5_write_error("dataset", path, path, "write attribute '%s'", name);
    dt_h5_close(a);
    dt_h5_close(s);
    return st;
}

dt_status dt_import_write_root_attrs(int64_t file, const char *path, int num_classes,
                                     const struct dt_class_list *cl, float scale, double mean,
                                     double sd)
{
    dt_status st = DT_OK;
    hid_t str = H5Tcopy(H5T_C_S1);
    H5Tset_size(str, H5T_VARIABLE);
    H5Tset_cset(str, H5T_CSET_UTF8);
    const char *fmt = "dataset", *task = "classification";
    const char **names = NULL;
    char(*numbered)[DT_NAME_MAX] = NULL;
    int version = DT_DATASET_FORMAT_VERSION;
    float fmean = (float)mean, fsd = (float)sd;

    DT_CHECK(dt_calloc((size_t)num_classes, sizeof *names, "class names", (void **)&names));
    if (!cl->count)
        DT_CHECK(
            dt_calloc((size_t)num_classes, sizeof *numbered, "class names", (void **)&numbered));
    for (int c = 0; c < num_classes; c++) {
        if (cl->count) {
            names[c] = cl->names[c];
        } else {
            snprintf(numbered[c], DT_NAME_MAX, "%d", c);
            names[c] = numbered[c];
        }
    }
    DT_CHECK(write_attr(file, "dtrain_format", str, str, 0, &fmt, path));
    DT_CHECK(write_attr(file, "format_version", H5T_STD_I32LE, H5T_NATIVE_INT, 0, &version, path));
    DT_CHECK(write_attr(file, "task", str, str, 0, &task, path));
    DT_CHECK(write_attr(file, "num_classes", H5T_STD_I32LE, H5T_NATIVE_INT, 0, &num_classes, path));
    DT_CHECK(write_attr(file, "class_names", str, str, (hsize_t)num_classes, names, path));
    DT_CHECK(write_attr(file, "norm_scale", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 0, &scale, path));
    DT_CHECK(write_attr(file, "norm_mean", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 0, &fmean, path));
    DT_CHECK(write_attr(file, "norm_std", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 0, &fsd, path));
out:
    free(numbered);
    free(names);
    H5Tclose(str);
    return st;
}

dt_status dt_import_write_lm_root_attrs(int64_t file, const char *path, int32_t vocab_size,
                                        const char *tokenizer)
{
    dt_status st = DT_OK;
    hid_t str = H5Tcopy(H5T_C_S1);
    H5Tset_size(str, H5T_VARIABLE);
    H5Tset_cset(str, H5T_CSET_UTF8);
    const char *fmt = "dataset", *task = "language_model";
    int version = DT_DATASET_FORMAT_VERSION;
    DT_CHECK(write_attr(file, "dtrain_format", str, str, 0, &fmt, path));
    DT_CHECK(write_attr(file, "format_version", H5T_STD_I32LE, H5T_NATIVE_INT, 0, &version, path));
    DT_CHECK(write_attr(file, "task", str, str, 0, &task, path));
    DT_CHECK(write_attr(file, "vocab_size", H5T_STD_I32LE, H5T_NATIVE_INT32, 0, &vocab_size, path));
    DT_CHECK(write_attr(file, "tokenizer", str, str, 0, &tokenizer, path));
out:
    H5Tclose(str);
    return st;
}

int dt_import_is_gzip(const unsigned char *head, size_t n)
{
    unsigned char out[GZIP_PROBE_OUT];
    z_stream z;
    /* magic, deflate, no reserved flag bits */
    if (n < 10 || head[0] != 0x1f || head[1] != 0x8b || head[2] != 8 || (head[3] & 0xe0)) return 0;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return 0;
    z.next_in = (unsigned char *)head;
    z.avail_in = (uInt)n;
    int r;
    do {
        z.next_out = out;
        z.avail_out = sizeof out;
        r = inflate(&z, Z_NO_FLUSH);
    } while (r == Z_OK && z.avail_in);
    inflateEnd(&z);
    return r == Z_OK || r == Z_STREAM_END || r == Z_BUF_ERROR;
}

float dt_import_half_to_float(uint16_t h)
{
    int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float v;
    if (e == 0)
        v = ldexpf((float)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexpf((float)(m | 0x400), e - 25);
    return sign ? -v : v;
}

static size_t elem_bytes(enum dt_dtype t)
{
    return t == DT_U8 ? 1 : t == DT_F16 ? 2 : 4;
}

static int64_t sample_elems(const struct dt_import_split *s)
{
    int64_t e = 1;
    for (int d = 0; d < s->ndim; d++)
        e *= s->shape[d];
    return e;
}

static uint64_t chunk_rows_of(const struct dt_import_split *s)
{
    uint64_t sb = (uint64_t)sample_elems(s) * elem_bytes(s->dtype);
    uint64_t rows = CHUNK_TARGET_BYTES / (sb ? sb : 1);
    if (rows < 1)
        rows = 1;
    if (rows > CHUNK_MAX_ROWS)
        rows = CHUNK_MAX_ROWS;
    if (rows > (uint64_t)s->n)
        rows = (uint64_t)s->n;
    return rows;
}

static uint64_t estimate(const struct dt_import_split *s, int nsplits, int num_classes)
{
    uint64_t data = 0, objects = 0;
    for (int i = 0; i < nsplits; i++) {
        uint64_t rows = chunk_rows_of(&s[i]);
        uint64_t chunks = ((uint64_t)s[i].n + rows - 1) / rows;
        data += chunks * rows * (uint64_t)sample_elems(&s[i]) * elem_bytes(s[i].dtype) +
                4 * (uint64_t)s[i].n;
        objects += 3 + chunks;
    }
    return dt_outfile_hdf5_estimate(data, objects, (uint64_t)num_classes * (DT_NAME_MAX + 16));
}

/* The file and memory type of x: float16 is built from float32's layout
 * (HDF5 has no predefined half type in every version dtrain builds with). */
static hid_t x_type(enum dt_dtype t)
{
    if (t == DT_U8)
        return H5Tcopy(H5T_STD_U8LE);
    if (t == DT_F32)
        return H5Tcopy(H5T_IEEE_F32LE);
    hid_t h = H5Tcopy(H5T_IEEE_F32LE);
    if (h < 0 || H5Tset_fields(h, 15, 10, 5, 0, 10) < 0 || H5Tset_size(h, 2) < 0 ||
        H5Tset_ebias(h, 15) < 0) {
        dt_h5_close(h);
        return -1;
    }
    return h;
}

/* Caller holds the HDF5 lock. */
static dt_status write_split(hid_t file, const char *path, const struct dt_import_split *s)
{
    dt_status st = DT_OK;
    hid_t g = -1, sx = -1, sy = -1, dcpl = -1, x = -1, y = -1, t = -1;
    hsize_t dims[1 + DT_DATASET_MAX_DIMS], chunk[1 + DT_DATASET_MAX_DIMS], ny = (hsize_t)s->n;
    dims[0] = (hsize_t)s->n;
    chunk[0] = chunk_rows_of(s);
    for (int d = 0; d < s->ndim; d++)
        dims[d + 1] = chunk[d + 1] = (hsize_t)s->shape[d];
    g = H5Gcreate2(file, s->name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    sx = H5Screate_simple(1 + s->ndim, dims, NULL);
    sy = H5Screate_simple(1, &ny, NULL);
    dcpl = H5Pcreate(H5P_DATASET_CREATE);
    t = x_type(s->dtype);
    if (g < 0 || sx < 0 || sy < 0 || dcpl < 0 || t < 0 ||
        H5Pset_chunk(dcpl, 1 + s->ndim, chunk) < 0 ||
        H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) < 0) {
        st = dt_h5_write_error("dataset", path, path, "create split '%s'", s->name);
        goto out;
    }
    x = H5Dcreate2(g, "x", t, sx, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    y = H5Dcreate2(g, "y", H5T_STD_I32LE, sy, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (x < 0 || y < 0 || H5Dwrite(x, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, s->x) < 0 ||
        H5Dwrite(y, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, s->y) < 0) {
        st = dt_h5_write_error("dataset", path, path, "write /%s/x and /%s/y", s->name, s->name);
        goto out;
    }
out:
    dt_h5_close(t);
    dt_h5_close(x);
    dt_h5_close(y);
    dt_h5_close(dcpl);
    dt_h5_close(sy);
    dt_h5_close(sx);
    dt_h5_close(g);
    return st;
}

/* Mean and standard deviation of the training inputs, after scaling. */
static void train_stats(const struct dt_import_split *s, float *scale, double *mean, double *sd)
{
    size_t n = (size_t)(s->n * sample_elems(s));
    double sum = 0, sumsq = 0;
    *scale = s->dtype == DT_U8 ? 1.0f / 255.0f : 1.0f;
    for (size_t i = 0; i < n; i++) {
        double v = s->dtype == DT_U8    ? ((const uint8_t *)s->x)[i] / 255.0
                   : s->dtype == DT_F16 ? dt_import_half_to_float(((const uint16_t *)s->x)[i])
                                              : ((const float *)s->x)[i];
        sum += v;
        sumsq += v * v;
    }
    *mean = n ? sum / (double)n : 0.0;
    double var = n ? sumsq / (double)n - *mean * *mean : 0.0;
    *sd = var > 0 ? sqrt(var) : 0.0;
}

/* Value i of a split's x as a double, after scaling. */
static double value_at(const struct dt_import_split *s, size_t i, float scale)
{
    return s->dtype == DT_U8    ? ((const uint8_t *)s->x)[i] * (double)scale
           : s->dtype == DT_F16 ? dt_import_half_to_float(((const uint16_t *)s->x)[i])
                                : ((const float *)s->x)[i];
}

/* Whether the splits are (C, H, W) images of the same C (C = shape[0]),
 * the case that gets per-channel normalisation. */
static int channel_images(const struct dt_import_split *s, int nsplits)
{
    for (int i = 0; i < nsplits; i++)
        if (s[i].ndim != 3 || s[i].shape[0] != s[0].shape[0] ||
            s[0].shape[0] > DT_DATASET_MAX_CHANNELS)
            return 0;
    return 1;
}

/* Mean and standard deviation of each channel of the training images,
 * after scaling; a constant channel gets std 1. */
static void channel_stats(const struct dt_import_split *s, float scale, float *mean, float *sd,
                          FILE *progress)
{
    int64_t nch = s->shape[0], plane = s->shape[1] * s->shape[2];
    for (int64_t c = 0; c < nch; c++) {
        double sum = 0, sumsq = 0;
        for (int64_t r = 0; r < s->n; r++)
            for (int64_t k = 0; k < plane; k++) {
                double v = value_at(s, (size_t)((r * nch + c) * plane + k), scale);
                sum += v;
                sumsq += v * v;
            }
        double cnt = (double)s->n * (double)plane;
        double m = cnt > 0 ? sum / cnt : 0.0, var = cnt > 0 ? sumsq / cnt - m * m : 0.0;
        double d = var > 0 ? sqrt(var) : 0.0;
        if (!(d > 0) || !isfinite(d) || !isfinite(m) || !isfinite((float)d) || !((float)d > 0)) {
            if (progress)
                fprintf(progress, "  train channel %lld is all the same value: its std set to 1\n",
                        (long long)c);
            d = 1.0;
        }
        mean[c] = isfinite((float)m) ? (float)m : 0.0f;
        sd[c] = (float)d;
    }
}

static dt_status write_channel_attrs(hid_t file, const char *path, int nch, const float *mean,
                                     const float *sd)
{
    dt_status st;
    DT_CHECK(write_attr(file, "norm_channel_mean", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, (hsize_t)nch,
                        mean, path));
    DT_CHECK(write_attr(file, "norm_channel_std", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, (hsize_t)nch,
                        sd, path));
out:
    return st;
}

static dt_status write_file(const char *tmp, const char *out_path, const struct dt_import_split *s,
                            int nsplits, int num_classes, const struct dt_class_list *cl,
                            FILE *progress, int *made)
{
    dt_status st = DT_OK;
    float scale, *cmean = NULL; /* per-channel means, then stds */
    double mean, sd;
    train_stats(&s[0], &scale, &mean, &sd);
    if (!(sd > 0) || !isfinite(sd) || !isfinite(mean)) {
        if (progress)
            fprintf(progress, "  train inputs are all the same value: norm_std set to 1\n");
        sd = 1.0;
    }
    dt_h5_lock();
    hid_t file = H5Fcreate(tmp, H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
    if (file < 0)
        st = dt_h5_write_error("dataset", out_path, tmp, "create %s", tmp);
    dt_h5_unlock();
    if (st != DT_OK)
        return st;
    *made = 1;
    DT_CHECK(dt_outfile_reserve("dataset", tmp, estimate(s, nsplits, num_classes)));
    for (int i = 0; i < nsplits; i++) {
        dt_h5_lock();
        st = write_split(file, out_path, &s[i]);
        dt_h5_unlock();
        if (st != DT_OK)
            goto out;
        if (progress) {
            char shape[96] = "";
            size_t k = 0;
            for (int d = 0; d < s[i].ndim && k < sizeof shape; d++)
                k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%lld", d ? "x" : "",
                                      (long long)s[i].shape[d]);
            fprintf(progress, "  %s: %lld samples of %s %s from %s\n", s[i].name, (long long)s[i].n,
                    shape, dt_dtype_name(s[i].dtype), s[i].source);
        }
    }
    int nch = channel_images(s, nsplits) ? (int)s[0].shape[0] : 0;
    if (nch) {
        DT_CHECK(dt_calloc((size_t)nch * 2, sizeof *cmean, "channel statistics", (void **)&cmean));
        channel_stats(&s[0], scale, cmean, cmean + nch, progress);
    }
    dt_h5_lock();
    st = dt_import_write_root_attrs(file, out_path, num_classes, cl, scale, mean, sd);
    if (st == DT_OK && nch)
        st = write_channel_attrs(file, out_path, nch, cmean, cmean + nch);
    dt_h5_unlock();
    if (st == DT_OK && progress)
        fprintf(progress, "  %d classes, normalisation mean %.6f std %.6f%s\n", num_classes, mean,
                sd, s[0].dtype == DT_U8 ? " (after scaling by 1/255)" : "");
    if (st == DT_OK && progress && nch) {
        fprintf(progress, "  per-channel normalisation of %d channels (replaces the above):", nch);
        for (int c = 0; c < nch && c < 16; c++)
            fprintf(progress, " %d: mean %.6f std %.6f%s", c, cmean[c], cmean[nch + c],
                    c + 1 < nch ? "," : "");
        fprintf(progress, "%s\n", nch > 16 ? " ..." : "");
    }
out:
    dt_h5_lock();
    if (H5Fclose(file) < 0 && st == DT_OK)
        st = dt_h5_write_error("dataset", out_path, tmp, "finish writing %s", tmp);
    dt_h5_unlock();
    if (st == DT_OK)
        dt_outfile_release(tmp, estimate(s, nsplits, num_classes));
    free(cmean);
    return st;
}

void dt_import_report_written(FILE *progress, const char *out_path, double t0)
{
    if (!progress)
        return;
    struct stat sb;
    char took[32];
    dt_format_duration(dt_now() - t0, took, sizeof took);
    fprintf(progress, "wrote %s (%.1f MiB) in %s\n", out_path,
            stat(out_path, &sb) == 0 ? (double)sb.st_size / (1 << 20) : 0.0, took);
    fflush(progress);
}

dt_status dt_import_write(const char *out_path, const struct dt_import_split *splits, int nsplits,
                          int num_classes, const struct dt_class_list *cl, FILE *progress)
{
    dt_status st = DT_OK;
    char tmp[DT_OUTFILE_TMP_LEN] = "";
    int made = 0, committed = 0;
    double t0 = dt_now();
    DT_CHECK(dt_outfile_tmp_begin("dataset", out_path, tmp, sizeof tmp));
    DT_CHECK(write_file(tmp, out_path, splits, nsplits, num_classes, cl, progress, &made));
    DT_CHECK(dt_outfile_commit("dataset", tmp, out_path));
    committed = 1;
    dt_import_report_written(progress, out_path, t0);
out:
    dt_outfile_tmp_end(made ? tmp : "", committed);
    return st;
}
