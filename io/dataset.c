/*
 * dataset.c - opening, validating and reading dtrain HDF5 datasets
 * (format v1, see dataset.h).
 *
 * Open checks everything a training run would otherwise trip over hours
 * later: the format attributes, every split's x and y, and every label
 * (labels are small, so they are read once and kept in memory; y is never
 * read again). x stays in the file and is read on demand. A file is
 * trusted no further than it can back: shapes are multiplied with checked
 * products, and before the labels are allocated x and y must really be in
 * the file (dt_h5_check_storage), so a header declaring 2^40 rows it never
 * wrote is bad data, not an allocation. Reads refuse non-finite inputs
 * with one branch-free pass over the normalised floats.
 *
 * Reads of arbitrary rows: the requested rows are sorted and de-duplicated,
 * consecutive rows are merged into runs, and each run is one H5Dread of a
 * hyperslab into a contiguous buffer; rows are then normalised into the
 * caller's buffer in request order. One read per run beats both one read
 * of the union of the hyperslabs (HDF5 1.10 handles irregular selections
 * slowly) and a point selection.
 * The chunk cache is switched off for unfiltered x: with it on, HDF5 pulls
 * a whole chunk into the cache to return one row of it. Filtered
 * (compressed) x needs the cache, so it gets a large one instead.
 *
 * Normalisation is per channel when the file says so (norm_channel_mean,
 * norm_channel_std): a sample is then C planes of H x W values, each with
 * its own mean and std (a 256-entry table per channel for uint8). Without
 * those attributes it is one plane with the scalar mean and std, which is
 * the same arithmetic as before they existed. A crop-and-flip read
 * (augmentation) is the same normalising copy with the source index
 * moved, so it costs no extra pass over the data.
 *
 * Every HDF5 call is made with the io/ HDF5 lock held (hdf5_lock.h);
 * normalisation happens outside it so loader threads overlap.
 *
 * A dataset may be several files (a list, or a glob pattern expanded
 * sorted by name), as large datasets are shipped. Each file is opened and
 * validated as above and must match the first in splits, sample shapes,
 * dtypes, classes and normalisation; a split's rows are the files' rows
 * in order, and a global row maps to (file, row) through prefix sums. A
 * read is split into one read per file holding requested rows, so a rank
 * reads only its own rows whichever file they are in. One file is read
 * exactly as before, with no extra copy.
 *
 * A row cache (dt_row_cache_*, data.cache: memory) holds chosen rows of a
 * split as read from the file (uint8, or float32 for float16 and float32
 * x), read once in runs of up to DT_ROW_CACHE_READ_BYTES per H5Dread.
 * A read from it skips the sort and the HDF5 lock: it normalises each
 * requested row straight from memory with the same normalise_row and
 * normalise_crop_flip (files of one dataset share their normalisation,
 * so the first file's tables serve), hence the same floats bit for bit.
 * Stored non-finite floats are refused at the fill, once.
 */
#define _GNU_SOURCE
#include "dataset.h"

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <hdf5.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "hdf5_lock.h"

/* Chunk cache for compressed x: big enough for a few dozen typical chunks. */
#define FILTERED_CHUNK_CACHE_BYTES ((size_t)64 << 20)
#define FILTERED_CHUNK_CACHE_SLOTS 12421 /* a prime, as HDF5 advises */
/* A compressed chunk is read and inflated whole to return one row, so its
 * size is bounded by the cache that keeps it. */
#define FILTERED_CHUNK_MAX_BYTES FILTERED_CHUNK_CACHE_BYTES
/* One string of a string attribute (names are cut to DT_NAME_MAX - 1). */
#define STR_ATTR_MAX_BYTES 65536

struct split {
    hid_t x;            /* open dataset /<split>/x */
    hid_t x_mem;        /* memory type x is read as: native uchar or float */
    size_t x_mem_size;  /* 1 or 4 */
    size_t x_file_size; /* stored bytes per element */
    int32_t *labels;    /* n validated labels */
};

struct dsfile {
    hid_t file;
    struct dt_dataset_info info;
    struct split splits[DT_DATASET_MAX_SPLITS];
    int nch;           /* normalisation channels: 1 (scalar) or norm_channels */
    const float *mean; /* nch means: &info.norm_mean or info.norm_channel_mean */
    const float *sd;   /* nch stds, likewise */
    float *lut;        /* nch x 256: normalised value of each uint8 in each channel */
};

static void copy_name(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* copy_name for a string read from the file: control characters (a
 * terminal escape in a class name) become '?', since names are printed. */
static void copy_printable(char *dst, size_t cap, const char *src)
{
    copy_name(dst, cap, src);
    for (char *p = dst; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
}

/* ---- attributes (lock held) ------------------------------------------ */

static dt_status attr_exists(const char *path, hid_t obj, const char *name, int *yes)
{
    htri_t e = H5Aexists(obj, name);
    if (e < 0)
        return dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot look up attribute '%s'", path,
                           name);
    *yes = e > 0;
    return DT_OK;
}

/* Reads a string (or string array) attribute into out[0..*count). */
static dt_status read_str_attr(const char *path, hid_t obj, const char *name,
                               char (*out)[DT_NAME_MAX], int max, int *count)
{
    dt_status st = DT_OK;
    hid_t a = -1, t = -1, s = -1, mt = -1;
    char **vl = NULL;
    char *fixed = NULL;
    a = H5Aopen(obj, name, H5P_DEFAULT);
    if (a < 0 || (t = H5Aget_type(a)) < 0 || (s = H5Aget_space(a)) < 0) {
        st = dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot open attribute '%s'", path, name);
        goto out;
    }
    if (H5Tget_class(t) != H5T_STRING) {
        st = dt_set_error(DT_ERR_BAD_DATA, "dataset %s: attribute '%s' is not a string", path,
                          name);
        goto out;
    }
    hssize_t n = H5Sget_simple_extent_npoints(s);
    if (n < 1 || n > max) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "dataset %s: attribute '%s' has %lld strings, expected 1 to %d", path,
                          name, (long long)n, max);
        goto out;
    }
    mt = H5Tcopy(H5T_C_S1);
    H5Tset_cset(mt, H5Tget_cset(t));
    if (H5Tis_variable_str(t) > 0) {
        H5Tset_size(mt, H5T_VARIABLE);
        DT_CHECK(dt_calloc((size_t)n, sizeof *vl, "string attribute", (void **)&vl));
        if (H5Aread(a, mt, vl) < 0) {
            free(vl); /* nothing was allocated by HDF5 */
            vl = NULL;
            st = dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot read attribute '%s'", path,
                             name);
            goto out;
        }
        for (hssize_t i = 0; i < n; i++)
            copy_printable(out[i], DT_NAME_MAX, vl[i] ? vl[i] : "");
#if H5_VERSION_GE(1, 12, 0)
        H5Treclaim(mt, s, H5P_DEFAULT, vl);
#else
        H5Dvlen_reclaim(mt, s, H5P_DEFAULT, vl);
#endif
    } else {
        size_t sz = H5Tget_size(t) + 1;
        if (sz > STR_ATTR_MAX_BYTES) {
            st = dt_set_error(DT_ERR_BAD_DATA,
                              "dataset %s: attribute '%s' holds strings of %zu bytes, more than "
                              "the %d a name may have",
                              path, name, sz - 1, STR_ATTR_MAX_BYTES - 1);
            goto out;
        }
        H5Tset_size(mt, sz);
        H5Tset_strpad(mt, H5T_STR_NULLTERM);
        DT_CHECK(dt_calloc((size_t)n, sz, "string attribute", (void **)&fixed));
        if (H5Aread(a, mt, fixed) < 0) {
            st = dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot read attribute '%s'", path,
                             name);
            goto out;
        }
        for (hssize_t i = 0; i < n; i++)
            copy_printable(out[i], DT_NAME_MAX, fixed + (size_t)i * sz);
    }
    *count = (int)n;
out:
    free(vl);
    free(fixed);
    dt_h5_close(mt);
    dt_h5_close(s);
    dt_h5_close(t);
    dt_h5_close(a);
    return st;
}

/* Reads a numeric scalar attribute; integer_only refuses float types. */
static dt_status read_num_attr(const char *path, hid_t obj, const char *name, int integer_only,
                               double *out)
{
    dt_status st = DT_OK;
    hid_t a = -1, t = -1, s = -1;
    a = H5Aopen(obj, name, H5P_DEFAULT);
    if (a < 0 || (t = H5Aget_type(a)) < 0 || (s = H5Aget_space(a)) < 0) {
        st = dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot open attribute '%s'", path, name);
        goto out;
    }
    H5T_class_t cls = H5Tget_class(t);
    if (!(cls == H5T_INTEGER || (cls == H5T_FLOAT && !integer_only)) ||
        H5Sget_simple_extent_npoints(s) != 1) {
        st = dt_set_error(DT_ERR_BAD_DATA, "dataset %s: attribute '%s' must be one %s", path,
                          name, integer_only ? "integer" : "number");
        goto out;
    }
    if (cls == H5T_INTEGER) {
        long long v = 0;
        if (H5Aread(a, H5T_NATIVE_LLONG, &v) < 0)
            goto read_fail;
        *out = (double)v;
    } else if (H5Aread(a, H5T_NATIVE_DOUBLE, out) < 0) {
        goto read_fail;
    }
    goto out;
read_fail:
    st = dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot read attribute '%s'", path, name);
out:
    dt_h5_close(s);
    dt_h5_close(t);
    dt_h5_close(a);
    return st;
}

/* Reads an optional numeric attribute, leaving *out alone when absent. */
static dt_status read_opt_num(const char *path, hid_t obj, const char *name, double *out)
{
    int yes = 0;
    dt_status st = attr_exists(path, obj, name, &yes);
    if (st == DT_OK && yes)
        st = read_num_attr(path, obj, name, 0, out);
    return st;
}

/* Reads a 1-D numeric attribute of 1 to max values into out[0..*count),
 * each finite as float32 and, when positive, > 0. */
static dt_status read_channel_attr(const char *path, hid_t obj, const char *name, int max,
                                   int positive, float *out, int *count)
{
    dt_status st = DT_OK;
    hid_t a = -1, t = -1, s = -1;
    double *v = NULL;
    a = H5Aopen(obj, name, H5P_DEFAULT);
    if (a < 0 || (t = H5Aget_type(a)) < 0 || (s = H5Aget_space(a)) < 0) {
        st = dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot open attribute '%s'", path, name);
        goto out;
    }
    H5T_class_t cls = H5Tget_class(t);
    hssize_t n = H5Sget_simple_extent_npoints(s);
    if ((cls != H5T_INTEGER && cls != H5T_FLOAT) || H5Sget_simple_extent_ndims(s) > 1 || n < 1 ||
        n > max) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "dataset %s: attribute '%s' must be an array of 1 to %d numbers, one "
                          "per channel",
                          path, name, max);
        goto out;
    }
    DT_CHECK(dt_calloc((size_t)n, sizeof *v, "channel attribute", (void **)&v));
    if (H5Aread(a, H5T_NATIVE_DOUBLE, v) < 0) {
        st = dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot read attribute '%s'", path, name);
        goto out;
    }
    for (hssize_t c = 0; c < n; c++) {
        float f = (float)v[c]; /* checked as the float32 it becomes */
        if (!isfinite(f) || (positive && !(f > 0))) {
            st = dt_set_error(DT_ERR_BAD_DATA,
                              "dataset %s: attribute '%s' holds %g for channel %lld; each value "
                              "must be finite%s as float32",
                              path, name, v[c], (long long)c, positive ? " and > 0" : "");
            goto out;
        }
        out[c] = f;
    }
    *count = (int)n;
out:
    free(v);
    dt_h5_close(s);
    dt_h5_close(t);
    dt_h5_close(a);
    return st;
}

/* The optional per-channel normalisation: both attributes or neither, of
 * the same length (matched against the splits once they are open). */
static dt_status read_channel_norm(struct dt_dataset_info *in, hid_t root)
{
    const char *path = in->path;
    int has_mean = 0, has_std = 0, nm = 0, ns = 0;
    dt_status st;
    DT_CHECK(attr_exists(path, root, "norm_channel_mean", &has_mean));
    DT_CHECK(attr_exists(path, root, "norm_channel_std", &has_std));
    if (!has_mean && !has_std)
        return DT_OK;
    if (!has_mean || !has_std)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "dataset %s: attribute '%s' without '%s'; per-channel normalisation "
                            "needs both",
                            path, has_mean ? "norm_channel_mean" : "norm_channel_std",
                            has_mean ? "norm_channel_std" : "norm_channel_mean");
    DT_CHECK(read_channel_attr(path, root, "norm_channel_mean", DT_DATASET_MAX_CHANNELS, 0,
                               in->norm_channel_mean, &nm));
    DT_CHECK(read_channel_attr(path, root, "norm_channel_std", DT_DATASET_MAX_CHANNELS, 1,
                               in->norm_channel_std, &ns));
    if (nm != ns)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "dataset %s: attribute 'norm_channel_mean' has %d values but "
                            "'norm_channel_std' has %d; both need one per channel",
                            path, nm, ns);
    in->norm_channels = nm;
out:
    return st;
}

/* The root attributes of a language-model file (after task). */
static dt_status read_lm_attrs(struct dsfile *ds)
{
    struct dt_dataset_info *in = &ds->info;
    char str[1][DT_NAME_MAX];
    int yes = 0, cnt = 0;
    double v = 0;
    dt_status st;
    in->lm = 1;
    in->norm_scale = 1;
    in->norm_std = 1;
    DT_CHECK(attr_exists(in->path, ds->file, "vocab_size", &yes));
    if (!yes)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "dataset %s: a language-model file needs a 'vocab_size' attribute on /",
                            in->path);
    DT_CHECK(read_num_attr(in->path, ds->file, "vocab_size", 1, &v));
    if (v < 2 || v > (double)DT_DATASET_MAX_VOCAB)
        return dt_set_error(DT_ERR_BAD_DATA, "dataset %s: vocab_size %.0f is outside [2, %lld]",
                            in->path, v, (long long)DT_DATASET_MAX_VOCAB);
    in->vocab_size = (int64_t)v;
    snprintf(in->tokenizer, sizeof in->tokenizer, "none");
    DT_CHECK(attr_exists(in->path, ds->file, "tokenizer", &yes));
    if (yes) {
        DT_CHECK(read_str_attr(in->path, ds->file, "tokenizer", str, 1, &cnt));
        if (strcmp(str[0], "byte") != 0 && strcmp(str[0], "gpt2") != 0 &&
            strcmp(str[0], "none") != 0)
            return dt_set_error(DT_ERR_BAD_DATA,
                                "dataset %s: tokenizer '%s' is not one dtrain knows (byte, gpt2 "
                                "or none)",
                                in->path, str[0]);
        snprintf(in->tokenizer, sizeof in->tokenizer, "%.15s", str[0]);
        if (strcmp(str[0], "byte") == 0 && in->vocab_size < 256)
            return dt_set_error(DT_ERR_BAD_DATA,
                                "dataset %s: a byte tokenizer needs vocab_size 256 or more, not "
                                "%lld",
                                in->path, (long long)in->vocab_size);
    }
out:
    return st;
}

static dt_status read_root_attrs(struct dsfile *ds)
{
    struct dt_dataset_info *in = &ds->info;
    const char *path = in->path;
    hid_t root = ds->file;
    char str[1][DT_NAME_MAX];
    int yes = 0, cnt = 0;
    double v = 0;
    dt_status st;

    DT_CHECK(attr_exists(path, root, "dtrain_format", &yes));
    if (!yes)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "dataset %s: an HDF5 file but not a dtrain dataset (no "
                            "'dtrain_format' attribute on /); import data with 'dtrain data "
                            "import'",
                            path);
    DT_CHECK(read_str_attr(path, root, "dtrain_format", str, 1, &cnt));
    if (strcmp(str[0], "dataset") != 0 && dt_h5_format_kind(str[0]))
        return dt_set_error(DT_ERR_BAD_DATA, "dataset %s is not a dtrain dataset (it is %s)", path,
                            dt_h5_format_kind(str[0]));
    if (strcmp(str[0], "dataset") != 0)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "dataset %s: dtrain_format is '%s', expected 'dataset'", path, str[0]);

    DT_CHECK(attr_exists(path, root, "format_version", &yes));
    if (!yes)
        return dt_set_error(DT_ERR_BAD_DATA, "dataset %s: no 'format_version' attribute on /",
                            path);
    DT_CHECK(read_num_attr(path, root, "format_version", 1, &v));
    if (v < 1 || v > DT_DATASET_FORMAT_VERSION)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "dataset %s: format version %.0f is not supported (this dtrain "
                            "reads version %d; a newer file needs a newer dtrain)",
                            path, v, DT_DATASET_FORMAT_VERSION);
    in->format_version = (int)v;

    DT_CHECK(attr_exists(path, root, "task", &yes));
    if (yes) {
        DT_CHECK(read_str_attr(path, root, "task", str, 1, &cnt));
        if (strcmp(str[0], "language_model") == 0)
            return read_lm_attrs(ds);
        if (strcmp(str[0], "classification") != 0)
            return dt_set_error(DT_ERR_BAD_DATA,
                                "dataset %s: task '%s' is not supported by format version %d "
                                "(only 'classification' and 'language_model')",
                                path, str[0], DT_DATASET_FORMAT_VERSION);
    }

    DT_CHECK(attr_exists(path, root, "num_classes", &yes));
    if (!yes)
        return dt_set_error(DT_ERR_BAD_DATA, "dataset %s: no 'num_classes' attribute on /", path);
    DT_CHECK(read_num_attr(path, root, "num_classes", 1, &v));
    if (v < 1 || v > DT_DATASET_MAX_CLASSES)
        return dt_set_error(DT_ERR_BAD_DATA, "dataset %s: num_classes %.0f is outside [1, %d]",
                            path, v, DT_DATASET_MAX_CLASSES);
    in->num_classes = (int)v;

    DT_CHECK(attr_exists(path, root, "class_names", &yes));
    if (yes) {
        DT_CHECK(read_str_attr(path, root, "class_names", in->class_names, DT_DATASET_MAX_CLASSES,
                               &cnt));
        if (cnt != in->num_classes)
            return dt_set_error(DT_ERR_BAD_DATA,
                                "dataset %s: %d class_names for num_classes %d", path, cnt,
                                in->num_classes);
    } else {
        for (int c = 0; c < in->num_classes; c++)
            snprintf(in->class_names[c], DT_NAME_MAX, "%d", c);
    }

    double scale = 1, mean = 0, sd = 1;
    DT_CHECK(read_opt_num(path, root, "norm_scale", &scale));
    DT_CHECK(read_opt_num(path, root, "norm_mean", &mean));
    DT_CHECK(read_opt_num(path, root, "norm_std", &sd));
    /* checked as the float32 values they become: 1e300 is a finite double */
    float fs = (float)scale, fm = (float)mean, fd = (float)sd;
    if (!isfinite(fs) || !isfinite(fm) || !isfinite(fd) || !(fd > 0))
        return dt_set_error(DT_ERR_BAD_DATA,
                            "dataset %s: bad normalisation (norm_scale %g, norm_mean %g, "
                            "norm_std %g; as float32, norm_std must be > 0 and all finite)",
                            path, scale, mean, sd);
    in->norm_scale = (float)scale;
    in->norm_mean = (float)mean;
    in->norm_std = (float)sd;
    DT_CHECK(read_channel_norm(in, root));
out:
    return st;
}

/* ---- splits (lock held) ---------------------------------------------- */

struct list_ctx {
    struct dsfile *ds;
    dt_status st;
};

static herr_t list_cb(hid_t g, const char *name, const H5L_info_t *info, void *data)
{
    struct list_ctx *ctx = data;
    struct dt_dataset_info *in = &ctx->ds->info;
    if (info->type != H5L_TYPE_HARD) {
        /* a soft or external link may lead out of the file (to a FIFO) */
        ctx->st = dt_set_error(DT_ERR_BAD_DATA,
                               "dataset %s: '/%s' is a link to elsewhere; splits must be groups "
                               "stored in the file",
                               in->path, name);
        return -1;
    }
    hid_t o = H5Oopen(g, name, H5P_DEFAULT);
    if (o < 0) {
        ctx->st = dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot open object '/%s'", in->path,
                              name);
        return -1;
    }
    int is_group = H5Iget_type(o) == H5I_GROUP;
    H5Oclose(o);
    if (!is_group)
        return 0;
    if (in->nsplits == DT_DATASET_MAX_SPLITS) {
        ctx->st = dt_set_error(DT_ERR_BAD_DATA, "dataset %s: more than %d splits", in->path,
                               DT_DATASET_MAX_SPLITS);
        return -1;
    }
    if (strlen(name) >= DT_NAME_MAX) {
        ctx->st = dt_set_error(DT_ERR_BAD_DATA, "dataset %s: split name '%s' is too long",
                               in->path, name);
        return -1;
    }
    copy_name(in->splits[in->nsplits++].name, DT_NAME_MAX, name);
    return 0;
}

/* Reads the shape of dataset d: ndim and dims (at most max). */
static dt_status get_shape(const char *path, const char *obj, hid_t d, int max, int *ndim,
                           hsize_t *dims)
{
    hid_t s = H5Dget_space(d);
    if (s < 0)
        return dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot get the shape of %s", path, obj);
    int nd = H5Sget_simple_extent_ndims(s);
    dt_status st = DT_OK;
    if (nd < 0)
        st = dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot get the shape of %s", path, obj);
    else if (nd > max)
        st = dt_set_error(DT_ERR_BAD_DATA, "dataset %s: %s has %d dimensions, at most %d allowed",
                          path, obj, nd, max);
    else
        H5Sget_simple_extent_dims(s, dims, NULL);
    H5Sclose(s);
    *ndim = nd;
    return st;
}

/* Opens x with a chunk cache suited to its layout (see the top comment). */
static dt_status open_x(const char *path, const char *split, hid_t g, const char *name,
                        hid_t *out)
{
    dt_status st = DT_OK;
    hid_t d = -1, dcpl = -1, dapl = -1;
    d = H5Dopen2(g, name, H5P_DEFAULT);
    if (d < 0 || (dcpl = H5Dget_create_plist(d)) < 0) {
        st = dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot open /%s/%s", path, split, name);
        goto out;
    }
    if (H5Pget_layout(dcpl) == H5D_CHUNKED) {
        int filtered = H5Pget_nfilters(dcpl) > 0;
        dapl = H5Pcreate(H5P_DATASET_ACCESS);
        H5Pset_chunk_cache(dapl, FILTERED_CHUNK_CACHE_SLOTS,
                           filtered ? FILTERED_CHUNK_CACHE_BYTES : 0, 1.0);
        H5Dclose(d);
        d = H5Dopen2(g, name, dapl);
        if (d < 0) {
            st = dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot open /%s/%s", path, split, name);
            goto out;
        }
    }
    *out = d;
    d = -1;
out:
    dt_h5_close(dapl);
    dt_h5_close(dcpl);
    dt_h5_close(d);
    return st;
}

static dt_status x_dtype(const char *path, const char *split, struct split *sp,
                         struct dt_split_info *si)
{
    hid_t t = H5Dget_type(sp->x);
    if (t < 0)
        return dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot get the type of /%s/x", path,
                           split);
    H5T_class_t cls = H5Tget_class(t);
    size_t size = H5Tget_size(t);
    H5T_sign_t sign = cls == H5T_INTEGER ? H5Tget_sign(t) : H5T_SGN_NONE;
    H5Tclose(t);
    sp->x_file_size = size;
    if (cls == H5T_INTEGER && size == 1 && sign == H5T_SGN_NONE) {
        si->x_dtype = DT_U8;
        sp->x_mem = H5T_NATIVE_UCHAR;
        sp->x_mem_size = 1;
        return DT_OK;
    }
    if (cls == H5T_FLOAT && (size == 2 || size == 4)) {
        si->x_dtype = size == 2 ? DT_F16 : DT_F32;
        sp->x_mem = H5T_NATIVE_FLOAT; /* HDF5 converts f16 on read */
        sp->x_mem_size = sizeof(float);
        return DT_OK;
    }
    return dt_set_error(DT_ERR_BAD_DATA,
                        "dataset %s: /%s/x has an unsupported type (%s, %zu bytes); x must be "
                        "uint8, float16 or float32",
                        path, split,
                        cls == H5T_INTEGER ? (sign == H5T_SGN_NONE ? "unsigned integer"
                                                                   : "signed integer")
                        : cls == H5T_FLOAT ? "float"
                                           : "not a number",
                        size);
}

/* Reads every label of the split, checks the range and counts classes. */
static dt_status load_labels(const struct dsfile *ds, const char *split, hid_t y, struct split *sp,
                             struct dt_split_info *si)
{
    const char *path = ds->info.path;
    dt_status st = DT_OK;
    int64_t *tmp = NULL;
    hid_t t = H5Dget_type(y);
    if (t < 0)
        return dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot get the type of /%s/y", path,
                           split);
    H5T_class_t cls = H5Tget_class(t);
    size_t size = H5Tget_size(t);
    H5T_sign_t sign = cls == H5T_INTEGER ? H5Tget_sign(t) : H5T_SGN_NONE;
    H5Tclose(t);
    if (cls != H5T_INTEGER || size > 8)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "dataset %s: /%s/y must hold integer labels (found a %zu-byte %s)",
                            path, split, size, cls == H5T_FLOAT ? "float" : "non-integer");
    si->y_dtype = size == 1 && sign == H5T_SGN_NONE ? DT_U8
                  : size <= 4                       ? DT_I32
                                                    : DT_I64;
    size_t n = (size_t)si->n;
    DT_CHECK(dt_calloc(n, sizeof *tmp, "labels", (void **)&tmp));
    DT_CHECK(dt_calloc(n, sizeof *sp->labels, "labels", (void **)&sp->labels));
    if (n && H5Dread(y, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, tmp) < 0) {
        st = dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot read /%s/y", path, split);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (tmp[i] < 0 || tmp[i] >= ds->info.num_classes) {
            st = dt_set_error(DT_ERR_BAD_DATA,
                              "dataset %s: split '%s': label %lld at index %zu is outside [0, "
                              "%d) (num_classes)",
                              path, split, (long long)tmp[i], i, ds->info.num_classes);
            goto out;
        }
        sp->labels[i] = (int32_t)tmp[i];
        si->class_counts[tmp[i]]++;
    }
out:
    free(tmp);
    return st;
}

/* N x sample shape of x into si: every product checked. */
static dt_status sample_shape(const char *path, const char *obj, int nd, const hsize_t *dims,
                              struct dt_split_info *si)
{
    int64_t elems = 1;
    for (int d = 0; d < nd; d++)
        if (dims[d] > (hsize_t)INT64_MAX || (d > 0 && !dt_mul_i64(elems, (int64_t)dims[d], &elems)))
            return dt_set_error(DT_ERR_BAD_DATA,
                                "dataset %s: %s declares a shape whose size does not fit in 64 "
                                "bits",
                                path, obj);
    if (elems < 1)
        return dt_set_error(DT_ERR_BAD_DATA, "dataset %s: %s has an empty sample shape", path, obj);
    si->n = (int64_t)dims[0];
    si->ndim = nd - 1;
    si->sample_elems = elems;
    for (int d = 1; d < nd; d++)
        si->shape[d - 1] = (int64_t)dims[d];
    return DT_OK;
}

/* Dataset d (obj) declares n rows of per_row values of `size` bytes,
 * described as `declared`: its data must really be in the file (see
 * dt_h5_check_storage) before anything is allocated from n. */
static dt_status check_storage(const struct dsfile *ds, const char *obj, hid_t d, int64_t n,
                               int64_t per_row, size_t size, const char *declared)
{
    char what[4200];
    int64_t elems = 0, bytes = 0;
    snprintf(what, sizeof what, "dataset %s", ds->info.path);
    if (!dt_mul_i64(n, per_row, &elems) || !dt_mul_i64(elems, (int64_t)size, &bytes))
        return dt_set_error(DT_ERR_BAD_DATA, "%s: %s declares %s, more bytes than 64 bits count",
                            what, obj, declared);
    struct dt_h5_storage s = {.what = what,
                              .file = ds->info.path,
                              .obj = obj,
                              .declared = declared,
                              .bytes = (uint64_t)bytes,
                              .file_bytes = ds->info.file_bytes,
                              .external_ok = 1};
    return dt_h5_check_storage(d, &s);
}

/* x's storage (check_storage), and a compressed x must come in chunks the
 * reader can inflate one at a time. */
static dt_status check_x_storage(const struct dsfile *ds, const char *obj, const struct split *sp,
                                 const struct dt_split_info *si)
{
    char declared[128];
    snprintf(declared, sizeof declared, "%lld rows of %lld values", (long long)si->n,
             (long long)si->sample_elems);
    dt_status st =
        check_storage(ds, obj, sp->x, si->n, si->sample_elems, sp->x_file_size, declared);
    if (st != DT_OK)
        return st;
    hid_t dcpl = H5Dget_create_plist(sp->x);
    int nd = si->ndim + 1;
    hsize_t chunk[DT_DATASET_MAX_DIMS + 1];
    if (dcpl >= 0 && H5Pget_layout(dcpl) == H5D_CHUNKED && H5Pget_nfilters(dcpl) > 0 &&
        H5Pget_chunk(dcpl, nd, chunk) == nd) {
        uint64_t cb = sp->x_file_size;
        for (int d = 0; d < nd && cb <= FILTERED_CHUNK_MAX_BYTES; d++)
            cb = chunk[d] > FILTERED_CHUNK_MAX_BYTES ? FILTERED_CHUNK_MAX_BYTES + 1 : cb * chunk[d];
        if (cb > FILTERED_CHUNK_MAX_BYTES)
            st = dt_set_error(DT_ERR_BAD_DATA,
                              "dataset %s: %s is compressed in chunks of more than %d MiB; dtrain "
                              "inflates a whole chunk to read one row, so it reads compressed x "
                              "in chunks of at most that (rewrite it with smaller chunks)",
                              ds->info.path, obj, (int)(FILTERED_CHUNK_MAX_BYTES >> 20));
    }
    dt_h5_close(dcpl);
    return st;
}

/* The same for y, read whole at open. */
static dt_status check_y_storage(const struct dsfile *ds, const char *obj, hid_t y,
                                 const struct dt_split_info *si)
{
    char declared[64];
    hid_t t = H5Dget_type(y);
    size_t size = t >= 0 ? H5Tget_size(t) : 0;
    dt_h5_close(t);
    snprintf(declared, sizeof declared, "%lld labels", (long long)si->n);
    return check_storage(ds, obj, y, si->n, 1, size, declared);
}

static dt_status open_split(struct dsfile *ds, int i)
{
    const char *path = ds->info.path;
    struct dt_split_info *si = &ds->info.splits[i];
    struct split *sp = &ds->splits[i];
    const char *name = si->name;
    dt_status st = DT_OK;
    hid_t g = -1, y = -1;
    hsize_t dims[DT_DATASET_MAX_DIMS + 1], ydims[1];
    int nd = 0, ynd = 0;
    char obj[DT_NAME_MAX + 8];

    g = H5Gopen2(ds->file, name, H5P_DEFAULT);
    if (g < 0) {
        st = dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot open split '/%s'", path, name);
        goto out;
    }
    for (int k = 0; k < 2; k++) {
        const char *want = k ? "y" : "x";
        enum dt_h5_path e = dt_h5_hard_path(g, want);
        if (e == DT_H5_PATH_ERROR)
            st =
                dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot look up /%s/%s", path, name, want);
        else if (e == DT_H5_PATH_MISSING)
            st = dt_set_error(DT_ERR_BAD_DATA, "dataset %s: split '%s' has no '%s' (/%s/%s)",
                              path, name, want, name, want);
        else if (e == DT_H5_PATH_LINK)
            st = dt_set_error(DT_ERR_BAD_DATA,
                              "dataset %s: /%s/%s is a link to elsewhere, not data stored in "
                              "the file",
                              path, name, want);
        if (st != DT_OK) goto out;
    }
    DT_CHECK(open_x(path, name, g, "x", &sp->x));
    snprintf(obj, sizeof obj, "/%s/x", name);
    DT_CHECK(get_shape(path, obj, sp->x, DT_DATASET_MAX_DIMS + 1, &nd, dims));
    if (nd < 2) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "dataset %s: %s has %d dimension(s); it must be N x sample shape "
                          "(at least 2)",
                          path, obj, nd);
        goto out;
    }
    DT_CHECK(sample_shape(path, obj, nd, dims, si));
    DT_CHECK(x_dtype(path, name, sp, si));
    DT_CHECK(check_x_storage(ds, obj, sp, si));
    si->x_bytes = (int64_t)H5Dget_storage_size(sp->x);

    y = H5Dopen2(g, "y", H5P_DEFAULT);
    if (y < 0) {
        st = dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot open /%s/y", path, name);
        goto out;
    }
    snprintf(obj, sizeof obj, "/%s/y", name);
    DT_CHECK(get_shape(path, obj, y, 1, &ynd, ydims));
    if (ynd != 1) {
        st = dt_set_error(DT_ERR_BAD_DATA, "dataset %s: %s must be 1-D (N labels)", path, obj);
        goto out;
    }
    if (ydims[0] != (hsize_t)si->n) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "dataset %s: split '%s' has %lld samples in x but %llu labels in y", path,
                          name, (long long)si->n, (unsigned long long)ydims[0]);
        goto out;
    }
    DT_CHECK(check_y_storage(ds, obj, y, si));
    DT_CHECK(load_labels(ds, name, y, sp, si));
out:
    dt_h5_close(y);
    dt_h5_close(g);
    return st;
}

/* A language-model split: /<split>/tokens, 1-D uint16 or int32. */
static dt_status open_lm_split(struct dsfile *ds, int i)
{
    const char *path = ds->info.path;
    struct dt_split_info *si = &ds->info.splits[i];
    struct split *sp = &ds->splits[i];
    dt_status st = DT_OK;
    hid_t g = -1, t = -1;
    hsize_t dims[1];
    int nd = 0;
    char obj[DT_NAME_MAX + 16];
    snprintf(obj, sizeof obj, "/%s/tokens", si->name);
    g = H5Gopen2(ds->file, si->name, H5P_DEFAULT);
    if (g < 0) {
        st = dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot open split '/%s'", path, si->name);
        goto out;
    }
    enum dt_h5_path e = dt_h5_hard_path(g, "tokens");
    if (e != DT_H5_PATH_HARD) {
        st = e == DT_H5_PATH_ERROR ? dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot look up %s",
                                                 path, obj)
             : e == DT_H5_PATH_LINK
                 ? dt_set_error(DT_ERR_BAD_DATA,
                                "dataset %s: %s is a link to elsewhere, not data stored in the "
                                "file",
                                path, obj)
                 : dt_set_error(DT_ERR_BAD_DATA,
                                "dataset %s: split '%s' of a language-model file has no 'tokens' "
                                "(%s)",
                                path, si->name, obj);
        goto out;
    }
    DT_CHECK(open_x(path, si->name, g, "tokens", &sp->x));
    DT_CHECK(get_shape(path, obj, sp->x, 1, &nd, dims));
    if (nd != 1) {
        st = dt_set_error(DT_ERR_BAD_DATA, "dataset %s: %s must be 1-D (a stream of token ids)",
                          path, obj);
        goto out;
    }
    t = H5Dget_type(sp->x);
    if (t < 0) {
        st = dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot get the type of %s", path, obj);
        goto out;
    }
    size_t size = H5Tget_size(t);
    int is_int = H5Tget_class(t) == H5T_INTEGER;
    H5T_sign_t sign = is_int ? H5Tget_sign(t) : H5T_SGN_NONE;
    if (is_int && size == 2 && sign == H5T_SGN_NONE) {
        si->x_dtype = DT_U16;
    } else if (is_int && size == 4 && sign == H5T_SGN_2) {
        si->x_dtype = DT_I32;
    } else {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "dataset %s: %s has an unsupported type (%zu bytes%s); token ids must "
                          "be uint16 or int32",
                          path, obj, size, is_int ? "" : ", not an integer");
        goto out;
    }
    si->y_dtype = si->x_dtype;
    sp->x_mem = H5T_NATIVE_INT32; /* HDF5 widens uint16 on read */
    sp->x_mem_size = sizeof(int32_t);
    sp->x_file_size = size;
    si->tokens = (int64_t)dims[0];
    DT_CHECK(check_storage(ds, obj, sp->x, si->tokens, 1, size, "its token count"));
    si->x_bytes = (int64_t)H5Dget_storage_size(sp->x);
    si->ndim = 1;
    si->window_shifts = 1;
out:
    dt_h5_close(t);
    dt_h5_close(g);
    return st;
}

static dt_status open_locked(struct dsfile *ds)
{
    const char *path = ds->info.path;
    dt_status st = DT_OK;
#if H5_VERSION_GE(1, 12, 0)
    htri_t is = H5Fis_accessible(path, H5P_DEFAULT);
#else
    htri_t is = H5Fis_hdf5(path);
#endif
    if (is < 0) return dt_h5_open_error("dataset", path, ": not an HDF5 file");
    if (is == 0) return dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: not an HDF5 file", path);
    ds->file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (ds->file < 0)
        return dt_h5_open_error("dataset", path,
                                ": the HDF5 file is damaged or truncated; import it again");
    DT_CHECK(read_root_attrs(ds));

    struct list_ctx ctx = {ds, DT_OK};
    if (H5Literate(ds->file, H5_INDEX_NAME, H5_ITER_INC, NULL, list_cb, &ctx) < 0) {
        st = ctx.st != DT_OK ? ctx.st
                             : dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot list the splits",
                                           path);
        goto out;
    }
    if (ds->info.nsplits == 0) {
        st = dt_set_error(DT_ERR_BAD_DATA, "dataset %s: no splits (no groups under /)", path);
        goto out;
    }
    for (int i = 0; i < ds->info.nsplits; i++)
        DT_CHECK(ds->info.lm ? open_lm_split(ds, i) : open_split(ds, i));
out:
    return st;
}

int dt_split_image_shape(const struct dt_split_info *si, int64_t *c, int64_t *h, int64_t *w)
{
    if (si->ndim != 2 && si->ndim != 3)
        return 0;
    int o = si->ndim - 2;
    *c = o ? si->shape[0] : 1;
    *h = si->shape[o];
    *w = si->shape[o + 1];
    return 1;
}

/* Per-channel normalisation: every split's samples are images of exactly
 * norm_channels channels. Sets the channel means and stds reads use. */
static dt_status check_channels(struct dsfile *ds)
{
    const struct dt_dataset_info *in = &ds->info;
    ds->nch = 1;
    ds->mean = &in->norm_mean;
    ds->sd = &in->norm_std;
    if (in->norm_channels == 0)
        return DT_OK;
    for (int i = 0; i < in->nsplits; i++) {
        const struct dt_split_info *si = &in->splits[i];
        int64_t c = 0, h, w;
        if (!dt_split_image_shape(si, &c, &h, &w))
            return dt_set_error(DT_ERR_BAD_DATA,
                                "dataset %s: attributes 'norm_channel_mean' and "
                                "'norm_channel_std' need image samples (H, W) or (C, H, W), but "
                                "the samples of split '%s' are not images",
                                in->path, si->name);
        if (c != in->norm_channels)
            return dt_set_error(DT_ERR_BAD_DATA,
                                "dataset %s: attributes 'norm_channel_mean' and "
                                "'norm_channel_std' have %d values, but split '%s' has %lld "
                                "channel(s); they need one value per channel",
                                in->path, in->norm_channels, si->name, (long long)c);
    }
    ds->nch = in->norm_channels;
    ds->mean = in->norm_channel_mean;
    ds->sd = in->norm_channel_std;
    return DT_OK;
}

/* The normalised value of every uint8 in every channel; all must be
 * finite where a split stores uint8 (v * 1e30 / 1e-10 is not). */
static dt_status make_lut(struct dsfile *ds)
{
    const struct dt_dataset_info *in = &ds->info;
    int u8 = 0;
    dt_status st;
    for (int i = 0; i < in->nsplits; i++)
        u8 |= in->splits[i].x_dtype == DT_U8;
    DT_CHECK(dt_calloc((size_t)ds->nch * 256, sizeof *ds->lut, "normalisation table",
                       (void **)&ds->lut));
    for (int c = 0; c < ds->nch; c++)
        for (int v = 0; v < 256; v++) {
            float *l = &ds->lut[c * 256 + v];
            *l = ((float)v * in->norm_scale - ds->mean[c]) / ds->sd[c];
            if (u8 && !isfinite(*l)) {
                char chan[32] = "";
                if (in->norm_channels)
                    snprintf(chan, sizeof chan, " in channel %d", c);
                return dt_set_error(DT_ERR_BAD_DATA,
                                    "dataset %s: normalisation turns the uint8 value %d%s into %g "
                                    "((v * %g - %g) / %g overflows float32)",
                                    in->path, v, chan, (double)*l, (double)in->norm_scale,
                                    (double)ds->mean[c], (double)ds->sd[c]);
            }
        }
out:
    return st;
}

static void file_close(struct dsfile *ds);

static dt_status file_open(const char *path, struct dsfile **out)
{
    dt_status st = DT_OK;
    struct dsfile *ds = NULL;
    int64_t size = 0;
    *out = NULL;
    if (!path || !*path)
        return dt_set_error(DT_ERR_INVALID_ARG, "dataset path is empty");
    if (strlen(path) >= sizeof ds->info.path)
        return dt_set_error(DT_ERR_INVALID_ARG, "dataset path '%.64s...' is too long", path);
    DT_CHECK(dt_input_check(path, "dataset", &size));

    DT_CHECK(dt_calloc(1, sizeof *ds, "dataset handle", (void **)&ds));
    ds->file = -1;
    for (int i = 0; i < DT_DATASET_MAX_SPLITS; i++)
        ds->splits[i].x = -1;
    copy_name(ds->info.path, sizeof ds->info.path, path);
    ds->info.file_bytes = size;

    dt_h5_lock();
    st = open_locked(ds);
    dt_h5_unlock();
    if (st != DT_OK)
        goto out;

    if (!ds->info.lm) {
        DT_CHECK(check_channels(ds));
        DT_CHECK(make_lut(ds));
    }
    *out = ds;
    ds = NULL;
out:
    file_close(ds);
    return st;
}

static void file_close(struct dsfile *ds)
{
    if (!ds)
        return;
    dt_h5_lock();
    for (int i = 0; i < DT_DATASET_MAX_SPLITS; i++)
        dt_h5_close(ds->splits[i].x);
    dt_h5_close(ds->file);
    dt_h5_unlock();
    for (int i = 0; i < DT_DATASET_MAX_SPLITS; i++)
        free(ds->splits[i].labels);
    free(ds->lut);
    free(ds);
}

static int find_split(const struct dsfile *ds, const char *name)
{
    for (int i = 0; i < ds->info.nsplits; i++)
        if (strcmp(ds->info.splits[i].name, name) == 0)
            return i;
    return -1;
}

static dt_status file_split(const struct dsfile *ds, const char *name,
                            const struct dt_split_info **out)
{
    int i = find_split(ds, name);
    if (i >= 0) {
        *out = &ds->info.splits[i];
        return DT_OK;
    }
    char have[DT_DATASET_MAX_SPLITS * (DT_NAME_MAX + 4)] = "";
    size_t len = 0;
    for (int k = 0; k < ds->info.nsplits && len < sizeof have; k++)
        len += (size_t)snprintf(have + len, sizeof have - len, "%s'%s'", k ? ", " : "",
                                ds->info.splits[k].name);
    *out = NULL;
    return dt_set_error(DT_ERR_BAD_DATA, "dataset %s has no split '%s' (it has: %s)",
                        ds->info.path, name, have);
}

/* ---- reading rows ------------------------------------------------------ */

struct req {
    uint64_t row;
    size_t pos; /* position in the caller's request */
};

static int req_cmp(const void *a, const void *b)
{
    const struct req *x = a, *y = b;
    if (x->row != y->row)
        return x->row < y->row ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* Reads sorted unique rows[0..m) of x into buf, one H5Dread per run of
 * consecutive rows. The memory space has the shape of the file selection
 * (run x sample shape): HDF5 then copies straight through, while a 1-D
 * memory space of the same size takes its general path, much slower.
 * Lock held. */
static dt_status read_runs(const struct dsfile *ds, const char *split, const struct split *sp,
                           const struct dt_split_info *si, const uint64_t *rows, size_t m,
                           unsigned char *buf)
{
    dt_status st = DT_OK;
    hsize_t start[DT_DATASET_MAX_DIMS + 1] = {0}, count[DT_DATASET_MAX_DIMS + 1];
    size_t row_bytes = (size_t)si->sample_elems * sp->x_mem_size;
    hid_t fs = H5Dget_space(sp->x);
    if (fs < 0) {
        st = dt_h5_error(DT_ERR_IO, "dataset %s: cannot set up a read of /%s/x", ds->info.path,
                         split);
        goto out;
    }
    for (int d = 0; d < si->ndim; d++)
        count[d + 1] = (hsize_t)si->shape[d];
    for (size_t i = 0; i < m;) {
        size_t j = i + 1;
        while (j < m && rows[j] == rows[j - 1] + 1)
            j++;
        start[0] = rows[i];
        count[0] = j - i;
        hid_t ms = H5Screate_simple(si->ndim + 1, count, NULL);
        herr_t r = -1;
        if (ms >= 0 && H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) >= 0)
            r = H5Dread(sp->x, sp->x_mem, ms, fs, H5P_DEFAULT, buf + i * row_bytes);
        if (r < 0) {
            st = dt_h5_error(DT_ERR_IO, "dataset %s: cannot read rows %llu..%llu of /%s/x",
                             ds->info.path, (unsigned long long)rows[i],
                             (unsigned long long)rows[j - 1], split);
            dt_h5_close(ms);
            goto out;
        }
        H5Sclose(ms);
        i = j;
    }
out:
    dt_h5_close(fs);
    return st;
}

/* Reads rows [row, row + count) of x into buf (one run of read_runs).
 * Lock held. */
static dt_status read_block(const struct dsfile *ds, const char *split, const struct split *sp,
                            const struct dt_split_info *si, uint64_t row, size_t count,
                            unsigned char *buf)
{
    dt_status st = DT_OK;
    uint64_t *rows = NULL;
    DT_CHECK(dt_calloc(count, sizeof *rows, "cache read", (void **)&rows));
    for (size_t i = 0; i < count; i++)
        rows[i] = row + i;
    st = read_runs(ds, split, sp, si, rows, count, buf);
out:
    free(rows);
    return st;
}

/* Normalises one row of n stored values into dst: nch channel planes of
 * n / nch values each (one plane of n without per-channel attributes). */
static void normalise_row(const struct dsfile *ds, const struct split *sp, const void *src,
                          float *dst, int64_t n)
{
    int64_t plane = n / ds->nch;
    for (int c = 0; c < ds->nch; c++, dst += plane) {
        if (sp->x_mem_size == 1) {
            const unsigned char *s = (const unsigned char *)src + c * plane;
            const float *lut = ds->lut + c * 256;
            for (int64_t k = 0; k < plane; k++)
                dst[k] = lut[s[k]];
            continue;
        }
        const float *s = (const float *)src + c * plane;
        float scale = ds->info.norm_scale, mean = ds->mean[c], sd = ds->sd[c];
        for (int64_t k = 0; k < plane; k++)
            dst[k] = (s[k] * scale - mean) / sd;
    }
}

/* The image geometry of a crop-and-flip read. */
struct geom {
    int64_t c, h, w;
    int32_t pad;
};

/* One output row of a crop: dst[x] for x in [x0, x1) from source row
 * `row` at column x + dx, or (flipped) w - 1 - x + dx; zero elsewhere. */
static void crop_row_u8(const unsigned char *row, const float *lut, float *dst, int64_t w,
                        int64_t x0, int64_t x1, int64_t dx, int flip)
{
    memset(dst, 0, (size_t)x0 * sizeof *dst);
    if (flip)
        for (int64_t x = x0; x < x1; x++)
            dst[x] = lut[row[w - 1 - x + dx]];
    else
        for (int64_t x = x0; x < x1; x++)
            dst[x] = lut[row[x + dx]];
    memset(dst + x1, 0, (size_t)(w - x1) * sizeof *dst);
}

static void crop_row_f32(const float *row, float scale, float mean, float sd, float *dst, int64_t w,
                         int64_t x0, int64_t x1, int64_t dx, int flip)
{
    memset(dst, 0, (size_t)x0 * sizeof *dst);
    if (flip)
        for (int64_t x = x0; x < x1; x++)
            dst[x] = (row[w - 1 - x + dx] * scale - mean) / sd;
    else
        for (int64_t x = x0; x < x1; x++)
            dst[x] = (row[x + dx] * scale - mean) / sd;
    memset(dst + x1, 0, (size_t)(w - x1) * sizeof *dst);
}

/* normalise_row through a crop and flip: output (c, y, x) is stored
 * (c, y + top - pad, x' + left - pad) with x' = w - 1 - x when flipped,
 * else x; outside the stored image it is 0. One pass over the output:
 * the columns that fall inside are worked out once per image, so the
 * inner loops have no bounds tests. */
static void normalise_crop_flip(const struct dsfile *ds, const struct split *sp, const void *src,
                                float *dst, const struct geom *g, const struct dt_crop_flip *cf)
{
    int64_t h = g->h, w = g->w, dy = cf->top - g->pad, dx = cf->left - g->pad;
    /* inside: 0 <= x + dx < w, or 0 <= w - 1 - x + dx < w when flipped */
    int64_t x0 = cf->flip ? dx : -dx, x1 = cf->flip ? w + dx : w - dx;
    x0 = x0 < 0 ? 0 : x0 > w ? w : x0;
    x1 = x1 > w ? w : x1 < x0 ? x0 : x1;
    for (int64_t c = 0; c < g->c; c++) {
        int nc = ds->nch > 1 ? (int)c : 0;
        for (int64_t y = 0; y < h; y++, dst += w) {
            int64_t sy = y + dy;
            if (sy < 0 || sy >= h) {
                memset(dst, 0, (size_t)w * sizeof *dst);
                continue;
            }
            int64_t at = (c * h + sy) * w;
            if (sp->x_mem_size == 1)
                crop_row_u8((const unsigned char *)src + at, ds->lut + nc * 256, dst, w, x0, x1, dx,
                            cf->flip);
            else
                crop_row_f32((const float *)src + at, ds->info.norm_scale, ds->mean[nc], ds->sd[nc],
                             dst, w, x0, x1, dx, cf->flip);
        }
    }
}

/* Position of the first value of x[0..n) that is not finite, or -1. The
 * scan is one branch-free pass the compiler can vectorise (v * 0 is 0 for
 * a finite v, NaN for an infinite or NaN one); the position is looked for
 * only when there is one. */
static int64_t first_nonfinite(const float *x, int64_t n)
{
    int bad = 0;
    for (int64_t k = 0; k < n; k++)
        bad |= !(x[k] * 0.0f == 0.0f);
    if (!bad) return -1;
    for (int64_t k = 0; k < n; k++)
        if (!isfinite(x[k])) return k;
    return -1;
}

/* The message for the non-finite input at position k of a read's output,
 * whose output row k / per_row is dataset row `row`, stored at `stored_row`
 * (in: the file's description, or the whole dataset's for a cache). */
static dt_status nonfinite_row_error(const struct dt_dataset_info *in, const char *split,
                                     uint64_t row, const unsigned char *stored_row, const float *x,
                                     int64_t k, int64_t per_row)
{
    int64_t e = k % per_row;
    float stored;
    memcpy(&stored, stored_row + (size_t)e * sizeof(float), sizeof stored);
    if (!isfinite(stored))
        return dt_set_error(DT_ERR_BAD_DATA,
                            "dataset %s: split '%s', row %llu: x holds %g at element %lld; "
                            "inputs must be finite",
                            in->path, split, (unsigned long long)row, (double)stored, (long long)e);
    return dt_set_error(DT_ERR_BAD_DATA,
                        "dataset %s: split '%s', row %llu: x holds %g at element %lld, which "
                        "normalisation ((v * %g - %g) / %g) turns into %g",
                        in->path, split, (unsigned long long)row, (double)stored, (long long)e,
                        (double)in->norm_scale, (double)in->norm_mean, (double)in->norm_std,
                        (double)x[k]);
}

/* The message for the non-finite input at position k of a read's output. */
static dt_status nonfinite_error(const struct dsfile *ds, const char *split, const uint64_t *idx,
                                 const size_t *uidx, const unsigned char *buf, size_t row_bytes,
                                 const float *x, int64_t k, int64_t per_row)
{
    int64_t i = k / per_row;
    return nonfinite_row_error(&ds->info, split, idx[i], buf + uidx[i] * row_bytes, x, k, per_row);
}

/* A crop-and-flip read of float x: a non-finite stored value anywhere in
 * the rows read (m rows of `per_row`, rows[] their numbers) is refused as
 * without the crop; an overflow of normalisation only where the crop
 * takes the value (k: position in the output). */
static dt_status crop_nonfinite(const struct dsfile *ds, const char *split, const uint64_t *rows,
                                size_t m, const uint64_t *idx, const unsigned char *buf,
                                int64_t per_row, const float *x, size_t n)
{
    const struct dt_dataset_info *in = &ds->info;
    int64_t k = first_nonfinite((const float *)buf, (int64_t)m * per_row);
    if (k >= 0)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "dataset %s: split '%s', row %llu: x holds %g at element %lld; "
                            "inputs must be finite",
                            in->path, split, (unsigned long long)rows[k / per_row],
                            (double)((const float *)buf)[k], (long long)(k % per_row));
    k = first_nonfinite(x, (int64_t)n * per_row);
    if (k >= 0)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "dataset %s: split '%s', row %llu: normalisation ((v * %g - mean) / "
                            "std) turns a value of x into %g (element %lld after the crop)",
                            in->path, split, (unsigned long long)idx[k / per_row],
                            (double)in->norm_scale, (double)x[k], (long long)(k % per_row));
    return DT_OK;
}

/* Reads rows idx[0..n) of one file, each through cf[i] when cf is given
 * (pad: the crop's padding). */
static dt_status file_read(struct dsfile *ds, const char *split, const uint64_t *idx, size_t n,
                           int32_t pad, const struct dt_crop_flip *cf, float *x, int32_t *y,
                           uint64_t *bytes_read)
{
    dt_status st = DT_OK;
    struct req *reqs = NULL;
    uint64_t *rows = NULL;
    size_t *uidx = NULL;
    unsigned char *buf = NULL;
    int s = find_split(ds, split);
    if (s < 0) {
        const struct dt_split_info *dummy;
        return file_split(ds, split, &dummy);
    }
    const struct dt_split_info *si = &ds->info.splits[s];
    const struct split *sp = &ds->splits[s];
    if (n == 0)
        return DT_OK;
    for (size_t i = 0; i < n; i++)
        if (idx[i] >= (uint64_t)si->n)
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "dataset %s: row %llu of split '%s' requested, which has %lld rows",
                                ds->info.path, (unsigned long long)idx[i], split,
                                (long long)si->n);

    struct geom g = {.pad = pad};
    if (cf && !dt_split_image_shape(si, &g.c, &g.h, &g.w)) {
        st = dt_set_error(DT_ERR_INVALID_ARG,
                          "dataset %s: split '%s' holds vectors, not images; they cannot be "
                          "cropped or flipped",
                          ds->info.path, split);
        goto out;
    }
    DT_CHECK(dt_calloc(n, sizeof *reqs, "read request", (void **)&reqs));
    DT_CHECK(dt_calloc(n, sizeof *rows, "read request", (void **)&rows));
    DT_CHECK(dt_calloc(n, sizeof *uidx, "read request", (void **)&uidx));
    for (size_t i = 0; i < n; i++)
        reqs[i] = (struct req){idx[i], i};
    qsort(reqs, n, sizeof *reqs, req_cmp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m == 0 || rows[m - 1] != reqs[i].row)
            rows[m++] = reqs[i].row;
        uidx[reqs[i].pos] = m - 1;
    }
    size_t row_bytes = 0, all_bytes = 0;
    if (!dt_mul_size((size_t)si->sample_elems, sp->x_mem_size, &row_bytes) ||
        !dt_mul_size(m, row_bytes, &all_bytes)) {
        st = dt_set_error(DT_ERR_INVALID_ARG,
                          "dataset %s: a read of %zu rows of split '%s' is "
                          "too large",
                          ds->info.path, m, split);
        goto out;
    }
    DT_CHECK(dt_malloc(all_bytes, "rows read from the dataset", (void **)&buf));

    dt_h5_lock();
    st = read_runs(ds, split, sp, si, rows, m, buf);
    dt_h5_unlock();
    if (st != DT_OK)
        goto out;

    for (size_t i = 0; i < n; i++) {
        float *dst = x + i * (size_t)si->sample_elems;
        if (cf)
            normalise_crop_flip(ds, sp, buf + uidx[i] * row_bytes, dst, &g, &cf[i]);
        else
            normalise_row(ds, sp, buf + uidx[i] * row_bytes, dst, si->sample_elems);
        if (y)
            y[i] = sp->labels[idx[i]];
    }
    /* uint8 inputs map through a table checked at open; floats are checked
     * here, after normalisation, which catches what it overflows too */
    if (cf && sp->x_mem_size != 1)
        DT_CHECK(crop_nonfinite(ds, split, rows, m, idx, buf, si->sample_elems, x, n));
    int64_t bad =
        sp->x_mem_size == 1 || cf ? -1 : first_nonfinite(x, (int64_t)n * si->sample_elems);
    if (bad >= 0) {
        st = nonfinite_error(ds, split, idx, uidx, buf, row_bytes, x, bad, si->sample_elems);
        goto out;
    }
    if (bytes_read)
        *bytes_read += (uint64_t)m * (uint64_t)si->sample_elems * sp->x_file_size;
out:
    free(buf);
    free(uidx);
    free(rows);
    free(reqs);
    return st;
}

/* ---- several files ----------------------------------------------------- */

struct dt_dataset {
    int nfiles;
    struct dsfile **files;
    struct dt_dataset_info info; /* the whole: rows, sizes and counts summed */
    int64_t *first;              /* first global row of file f in split s: [s * (nfiles + 1) + f] */
};

static int has_glob_chars(const char *s) { return strpbrk(s, "*?[") != NULL; }

/* A pattern that matched nothing: why, as far as its fixed directory part
 * (before the first wildcard) tells. All "cannot be found or opened"
 * (DT_ERR_NOT_FOUND). */
static dt_status no_match(const char *pattern)
{
    char dir[4096];
    size_t wild = strcspn(pattern, "*?[");
    const char *slash = NULL;
    for (const char *p = pattern; p < pattern + wild; p++)
        if (*p == '/') slash = p;
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else
        snprintf(dir, sizeof dir, "%.*s", slash == pattern ? 1 : (int)(slash - pattern), pattern);
    DIR *d = opendir(dir);
    if (d) {
        closedir(d);
        return dt_set_error(DT_ERR_NOT_FOUND,
                            "dataset %s: the pattern matches no file; check the directory and "
                            "the pattern",
                            pattern);
    }
    if (errno == ENOENT || errno == ENOTDIR)
        return dt_set_error(DT_ERR_NOT_FOUND, "dataset %s: the pattern matches no file: %s %s",
                            pattern, dir,
                            errno == ENOENT ? "does not exist" : "is not a directory");
    return dt_set_error(DT_ERR_NOT_FOUND,
                        "dataset %s: the pattern matches no file: directory %s cannot be read: %s",
                        pattern, dir, strerror(errno));
}

/* The files a path names, in order: one file, a list (entries separated by
 * newlines, the form a YAML sequence in data.path takes), or a glob pattern
 * expanded sorted by name. A pattern that matches nothing is
 * DT_ERR_NOT_FOUND naming it, unless a file of that very name exists. */
static dt_status expand_path(const char *path, char ***names, int *count)
{
    dt_status st = DT_OK;
    glob_t g = {0};
    char **v = NULL;
    int n = 0;
    *names = NULL;
    *count = 0;
    if (strchr(path, '\n')) {
        int cap = 1;
        for (const char *p = path; *p; p++)
            cap += *p == '\n';
        DT_CHECK(dt_calloc((size_t)cap, sizeof *v, "dataset file list", (void **)&v));
        for (const char *p = path; *p;) {
            const char *e = strchr(p, '\n');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            if (len == 0) {
                st = dt_set_error(DT_ERR_INVALID_ARG, "dataset list: entry %d is empty", n + 1);
                goto out;
            }
            DT_CHECK(dt_malloc(len + 1, "dataset file name", (void **)&v[n]));
            memcpy(v[n], p, len);
            v[n++][len] = '\0';
            p = e ? e + 1 : p + len;
        }
    } else if (has_glob_chars(path)) {
        int r = glob(path, 0, NULL, &g);
        if (r == GLOB_NOMATCH && access(path, F_OK) != 0) {
            st = no_match(path);
            goto out;
        }
        if (r == GLOB_NOMATCH) {
            g.gl_pathc = 0;
        } else if (r != 0) {
            st = dt_set_error(r == GLOB_NOSPACE ? DT_ERR_NOMEM : DT_ERR_IO,
                              "dataset %s: cannot expand the pattern (%s)", path,
                              r == GLOB_NOSPACE ? "out of memory" : "a directory cannot be read");
            goto out;
        }
        size_t m = r == GLOB_NOMATCH ? 1 : g.gl_pathc;
        DT_CHECK(dt_calloc(m, sizeof *v, "dataset file list", (void **)&v));
        for (size_t i = 0; i < m; i++) {
            const char *name = r == GLOB_NOMATCH ? path : g.gl_pathv[i];
            DT_CHECK(dt_malloc(strlen(name) + 1, "dataset file name", (void **)&v[n]));
            strcpy(v[n++], name);
        }
    } else {
        DT_CHECK(dt_calloc(1, sizeof *v, "dataset file list", (void **)&v));
        DT_CHECK(dt_malloc(strlen(path) + 1, "dataset file name", (void **)&v[n]));
        strcpy(v[n++], path);
    }
    *names = v;
    *count = n;
    v = NULL;
out:
    if (v)
        for (int i = 0; i < n; i++)
            free(v[i]);
    free(v);
    globfree(&g);
    return st;
}

/* DT_ERR_BAD_DATA naming two files and what differs between them. */
static dt_status differ(const struct dsfile *a, const struct dsfile *b, const char *what)
{
    return dt_set_error(DT_ERR_BAD_DATA,
                        "datasets %s and %s differ in %s; the files of one dataset must have "
                        "the same splits, sample shapes, dtypes, classes and normalisation",
                        a->info.path, b->info.path, what);
}

/* Checks that file b can continue file a. */
static dt_status same_kind(const struct dsfile *a, const struct dsfile *b)
{
    const struct dt_dataset_info *x = &a->info, *y = &b->info;
    char what[DT_NAME_MAX * 2 + 64];
    if (x->num_classes != y->num_classes)
        return differ(a, b, "the number of classes");
    for (int c = 0; c < x->num_classes; c++)
        if (strcmp(x->class_names[c], y->class_names[c]) != 0) {
            snprintf(what, sizeof what, "the name of class %d ('%s', '%s')", c, x->class_names[c],
                     y->class_names[c]);
            return differ(a, b, what);
        }
    if (x->norm_scale != y->norm_scale || x->norm_mean != y->norm_mean ||
        x->norm_std != y->norm_std)
        return differ(a, b, "the normalisation attributes (norm_scale, norm_mean, norm_std)");
    int same_ch = x->norm_channels == y->norm_channels;
    for (int c = 0; same_ch && c < x->norm_channels; c++)
        same_ch = x->norm_channel_mean[c] == y->norm_channel_mean[c] &&
                  x->norm_channel_std[c] == y->norm_channel_std[c];
    if (!same_ch)
        return differ(a, b, "the per-channel normalisation (norm_channel_mean, norm_channel_std)");
    if (x->nsplits != y->nsplits)
        return differ(a, b, "their splits (how many there are)");
    for (int i = 0; i < x->nsplits; i++) {
        const struct dt_split_info *s = &x->splits[i], *t = &y->splits[i];
        if (strcmp(s->name, t->name) != 0) {
            snprintf(what, sizeof what, "their splits ('%s' and '%s')", s->name, t->name);
            return differ(a, b, what);
        }
        int same = s->ndim == t->ndim;
        for (int d = 0; same && d < s->ndim; d++)
            same = s->shape[d] == t->shape[d];
        if (!same) {
            snprintf(what, sizeof what, "the sample shape of split '%s'", s->name);
            return differ(a, b, what);
        }
        if (s->x_dtype != t->x_dtype || s->y_dtype != t->y_dtype) {
            snprintf(what, sizeof what, "the dtypes of split '%s' (x %s, y %s vs x %s, y %s)",
                     s->name, dt_dtype_name(s->x_dtype), dt_dtype_name(s->y_dtype),
                     dt_dtype_name(t->x_dtype), dt_dtype_name(t->y_dtype));
            return differ(a, b, what);
        }
    }
    return DT_OK;
}

/* The whole: the first file's description with rows, sizes and counts
 * summed, and the prefix sums that map a global row to a file. */
static dt_status combine(struct dt_dataset *ds, const char *path)
{
    int nf = ds->nfiles;
    struct dt_dataset_info *in = &ds->info;
    *in = ds->files[0]->info;
    if (nf == 1)
        return DT_OK;
    snprintf(in->path, sizeof in->path, "%s", path);
    for (char *p = in->path; *p; p++)
        if (*p == '\n')
            *p = ',';
    dt_status st = dt_calloc((size_t)in->nsplits * (size_t)(nf + 1), sizeof *ds->first,
                             "dataset row map", (void **)&ds->first);
    if (st != DT_OK)
        return st;
    in->file_bytes = 0;
    for (int s = 0; s < in->nsplits; s++) {
        struct dt_split_info *si = &in->splits[s];
        si->n = 0;
        si->x_bytes = 0;
        memset(si->class_counts, 0, sizeof si->class_counts);
    }
    for (int f = 0; f < nf; f++) {
        const struct dt_dataset_info *fi = &ds->files[f]->info;
        in->file_bytes += fi->file_bytes;
        for (int s = 0; s < in->nsplits; s++) {
            struct dt_split_info *si = &in->splits[s];
            const struct dt_split_info *fs = &fi->splits[s];
            ds->first[s * (nf + 1) + f] = si->n;
            si->n += fs->n;
            si->x_bytes += fs->x_bytes;
            for (int c = 0; c < in->num_classes; c++)
                si->class_counts[c] += fs->class_counts[c];
        }
    }
    for (int s = 0; s < in->nsplits; s++)
        ds->first[s * (nf + 1) + nf] = in->splits[s].n;
    return DT_OK;
}

dt_status dt_dataset_open(const char *path, dt_dataset_t **out)
{
    dt_status st = DT_OK;
    struct dt_dataset *ds = NULL;
    char **names = NULL;
    int nnames = 0;
    *out = NULL;
    if (!path || !*path)
        return dt_set_error(DT_ERR_INVALID_ARG, "dataset path is empty");
    DT_CHECK(expand_path(path, &names, &nnames));
    DT_CHECK(dt_calloc(1, sizeof *ds, "dataset handle", (void **)&ds));
    DT_CHECK(dt_calloc((size_t)nnames, sizeof *ds->files, "dataset handle", (void **)&ds->files));
    for (int f = 0; f < nnames; f++) {
        DT_CHECK(file_open(names[f], &ds->files[f]));
        ds->nfiles = f + 1;
        if (nnames > 1 && ds->files[f]->info.lm) {
            st = dt_set_error(DT_ERR_USAGE,
                              "dataset %s: a language-model dataset is one file; %s is one of "
                              "%d files given (import the token streams into one file)",
                              path, names[f], nnames);
            goto out;
        }
        if (f > 0)
            DT_CHECK(same_kind(ds->files[0], ds->files[f]));
    }
    DT_CHECK(combine(ds, path));
    *out = ds;
    ds = NULL;
out:
    for (int i = 0; i < nnames; i++)
        free(names[i]);
    free(names);
    dt_dataset_close(ds);
    return st;
}

void dt_dataset_close(dt_dataset_t *ds)
{
    if (!ds)
        return;
    for (int f = 0; f < ds->nfiles; f++)
        file_close(ds->files[f]);
    free(ds->files);
    free(ds->first);
    free(ds);
}

const struct dt_dataset_info *dt_dataset_get_info(const dt_dataset_t *ds) { return &ds->info; }

int dt_dataset_nfiles(const dt_dataset_t *ds) { return ds->nfiles; }

const struct dt_dataset_info *dt_dataset_file_info(const dt_dataset_t *ds, int f)
{
    return f >= 0 && f < ds->nfiles ? &ds->files[f]->info : NULL;
}

dt_status dt_dataset_split(const dt_dataset_t *ds, const char *name,
                           const struct dt_split_info **out)
{
    for (int i = 0; i < ds->info.nsplits; i++)
        if (strcmp(ds->info.splits[i].name, name) == 0) {
            *out = &ds->info.splits[i];
            return DT_OK;
        }
    const struct dt_split_info *s0;
    dt_status st = file_split(ds->files[0], name, &s0);
    *out = NULL;
    return st;
}

/* The file holding global row `row` of a split, by binary search over
 * first[0..nf] (first[nf] is the split's size). */
static int file_of(const int64_t *first, int nf, uint64_t row)
{
    int lo = 0, hi = nf - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if ((uint64_t)first[mid] <= row)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Several files: the request is split by file (each file gets only its
 * own rows, so the bytes read stay the rows asked for), each part read as
 * one file read, and the rows put back in request order. */
static dt_status read_rows(dt_dataset_t *ds, const char *split, const uint64_t *idx, size_t n,
                           int32_t pad, const struct dt_crop_flip *cf, float *x, int32_t *y,
                           uint64_t *bytes_read)
{
    dt_status st = DT_OK;
    if (ds->info.lm) {
        if (cf)
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "dataset %s: token windows cannot be cropped or flipped",
                                ds->info.path);
        return dt_dataset_read_windows(ds, split, idx, n, 0, x, y, bytes_read);
    }
    if (ds->nfiles == 1)
        return file_read(ds->files[0], split, idx, n, pad, cf, x, y, bytes_read);
    const struct dt_split_info *si;
    if ((st = dt_dataset_split(ds, split, &si)) != DT_OK)
        return st;
    int s = (int)(si - ds->info.splits), nf = ds->nfiles;
    const int64_t *first = ds->first + s * (nf + 1);
    size_t elems = (size_t)si->sample_elems;
    size_t *cnt = NULL, *pos = NULL;
    uint64_t *local = NULL;
    float *tx = NULL;
    int32_t *ty = NULL;
    int *fof = NULL;
    struct dt_crop_flip *tcf = NULL;
    if (n == 0)
        return DT_OK;
    for (size_t i = 0; i < n; i++)
        if (idx[i] >= (uint64_t)si->n)
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "dataset %s: row %llu of split '%s' requested, which has %lld rows",
                                ds->info.path, (unsigned long long)idx[i], split, (long long)si->n);
    size_t xn = 0;
    if (!dt_mul_size(n, elems, &xn)) {
        st = dt_set_error(DT_ERR_INVALID_ARG,
                          "dataset %s: a read of %zu rows of split '%s' is too large",
                          ds->info.path, n, split);
        goto out;
    }
    DT_CHECK(dt_calloc((size_t)nf + 1, sizeof *cnt, "read request", (void **)&cnt));
    DT_CHECK(dt_calloc(n, sizeof *pos, "read request", (void **)&pos));
    DT_CHECK(dt_calloc(n, sizeof *local, "read request", (void **)&local));
    DT_CHECK(dt_calloc(n, sizeof *fof, "read request", (void **)&fof));
    DT_CHECK(dt_calloc(n, sizeof *ty, "read request", (void **)&ty));
    DT_CHECK(dt_calloc(xn, sizeof *tx, "rows read from the dataset", (void **)&tx));
    if (cf)
        DT_CHECK(dt_calloc(n, sizeof *tcf, "read request", (void **)&tcf));
    for (size_t i = 0; i < n; i++) {
        fof[i] = file_of(first, nf, idx[i]);
        cnt[fof[i] + 1]++;
    }
    for (int f = 0; f < nf; f++)
        cnt[f + 1] += cnt[f]; /* cnt[f]: where file f's rows start in the part order */
    for (size_t i = 0; i < n; i++) {
        size_t p = cnt[fof[i]]++;
        pos[i] = p;
        local[p] = idx[i] - (uint64_t)first[fof[i]];
        if (cf)
            tcf[p] = cf[i];
    }
    /* cnt[f] is now where file f's rows end */
    for (int f = 0; f < nf; f++) {
        size_t b = f ? cnt[f - 1] : 0;
        if (cnt[f] > b)
            DT_CHECK(file_read(ds->files[f], split, local + b, cnt[f] - b, pad, cf ? tcf + b : NULL,
                               tx + b * elems, ty + b, bytes_read));
    }
    for (size_t i = 0; i < n; i++) {
        memcpy(x + i * elems, tx + pos[i] * elems, elems * sizeof *x);
        if (y)
            y[i] = ty[pos[i]];
    }
out:
    free(tcf);
    free(tx);
    free(ty);
    free(fof);
    free(local);
    free(pos);
    free(cnt);
    return st;
}

dt_status dt_dataset_read(dt_dataset_t *ds, const char *split, const uint64_t *idx, size_t n,
                          float *x, int32_t *y, uint64_t *bytes_read)
{
    return read_rows(ds, split, idx, n, 0, NULL, x, y, bytes_read);
}

dt_status dt_dataset_read_crop_flip(dt_dataset_t *ds, const char *split, const uint64_t *idx,
                                    size_t n, int32_t pad, const struct dt_crop_flip *cf, float *x,
                                    int32_t *y, uint64_t *bytes_read)
{
    if (!cf || pad < 0)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "dataset %s: a crop-and-flip read needs its "
                            "crops and a padding >= 0",
                            ds->info.path);
    for (size_t i = 0; i < n; i++)
        if (cf[i].top < 0 || cf[i].top > 2 * pad || cf[i].left < 0 || cf[i].left > 2 * pad)
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "dataset %s: crop %zu at (%d, %d) is outside [0, %d] for "
                                "padding %d",
                                ds->info.path, i, (int)cf[i].top, (int)cf[i].left, 2 * (int)pad,
                                (int)pad);
    return read_rows(ds, split, idx, n, pad, cf, x, y, bytes_read);
}

/* ---- rows held in memory ------------------------------------------------ */

struct dt_row_cache {
    dt_dataset_t *ds;
    char split[DT_NAME_MAX];
    int s; /* split index */
    int64_t rows, per_row;
    size_t row_bytes; /* stored bytes of one row in memory (uint8 or float32 values) */
    unsigned char *x; /* rows x row_bytes */
    int32_t *y;       /* rows labels */
    uint64_t *ids;    /* rows dataset row numbers */
    uint64_t bytes_read;
};

uint64_t dt_row_cache_row_bytes(const struct dt_split_info *si)
{
    uint64_t v = si->x_dtype == DT_U8 ? 1 : sizeof(float);
    return (uint64_t)si->sample_elems * v + sizeof(int32_t) + sizeof(uint64_t);
}

/* Stored non-finite floats in rows [0, count) of a block read at dataset
 * row `row0` are refused here, once, as a read would refuse them. */
static dt_status cache_check_block(const struct dt_row_cache *c, const struct dsfile *f,
                                   uint64_t row0, const unsigned char *buf, size_t count)
{
    if (f->splits[c->s].x_mem_size == 1)
        return DT_OK;
    int64_t k = first_nonfinite((const float *)buf, (int64_t)count * c->per_row);
    if (k < 0)
        return DT_OK;
    int64_t i = k / c->per_row;
    return nonfinite_row_error(&c->ds->info, c->split, row0 + (uint64_t)i,
                               buf + (size_t)i * c->row_bytes, (const float *)buf, k, c->per_row);
}

/* Rows [row, row + count) of the dataset into cache positions from `at`:
 * one H5Dread per file part of at most DT_ROW_CACHE_READ_BYTES. */
static dt_status cache_fill(struct dt_row_cache *c, uint64_t row, uint64_t count, int64_t at)
{
    dt_status st = DT_OK;
    dt_dataset_t *ds = c->ds;
    int nf = ds->nfiles;
    uint64_t piece = DT_ROW_CACHE_READ_BYTES / c->row_bytes;
    if (piece < 1)
        piece = 1;
    while (count > 0) {
        int f = nf == 1 ? 0 : file_of(ds->first + c->s * (nf + 1), nf, row);
        uint64_t base = nf == 1 ? 0 : (uint64_t)ds->first[c->s * (nf + 1) + f];
        const struct dsfile *file = ds->files[f];
        const struct split *sp = &file->splits[c->s];
        const struct dt_split_info *fsi = &file->info.splits[c->s];
        uint64_t local = row - base, take = count < piece ? count : piece;
        if (take > (uint64_t)fsi->n - local)
            take = (uint64_t)fsi->n - local;
        unsigned char *dst = c->x + (size_t)at * c->row_bytes;
        dt_h5_lock();
        st = read_block(file, c->split, sp, fsi, local, (size_t)take, dst);
        dt_h5_unlock();
        if (st != DT_OK)
            return st;
        DT_CHECK(cache_check_block(c, file, row, dst, (size_t)take));
        memcpy(c->y + at, sp->labels + local, (size_t)take * sizeof *c->y);
        for (uint64_t i = 0; i < take; i++)
            c->ids[at + (int64_t)i] = row + i;
        c->bytes_read += take * (uint64_t)fsi->sample_elems * sp->x_file_size;
        row += take;
        count -= take;
        at += (int64_t)take;
    }
out:
    return st;
}

dt_status dt_row_cache_create(dt_dataset_t *ds, const char *split, const int64_t *start,
                              const int64_t *count, int nranges, dt_row_cache_t **out)
{
    dt_status st = DT_OK;
    struct dt_row_cache *c = NULL;
    const struct dt_split_info *si;
    *out = NULL;
    if (ds->info.lm)
        return dt_set_error(DT_ERR_UNSUPPORTED,
                            "dataset %s: data.cache=memory is not implemented for "
                            "language-model datasets in this version; set data.cache: none",
                            ds->info.path);
    DT_CHECK(dt_dataset_split(ds, split, &si));
    int64_t rows = 0;
    for (int k = 0; k < nranges; k++) {
        if (start[k] < 0 || count[k] < 0 || start[k] > si->n - count[k])
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "dataset %s: cannot cache rows %lld..%lld of split '%s', which "
                                "has %lld rows",
                                ds->info.path, (long long)start[k],
                                (long long)(start[k] + count[k]), split, (long long)si->n);
        rows += count[k];
    }
    DT_CHECK(dt_calloc(1, sizeof *c, "row cache", (void **)&c));
    c->ds = ds;
    copy_name(c->split, sizeof c->split, split);
    c->s = (int)(si - ds->info.splits);
    c->rows = rows;
    c->per_row = si->sample_elems;
    c->row_bytes = (size_t)si->sample_elems * ds->files[0]->splits[c->s].x_mem_size;
    size_t all = 0;
    if (!dt_mul_size((size_t)rows, c->row_bytes, &all)) {
        st = dt_set_error(DT_ERR_NOMEM, "dataset %s: %lld rows of split '%s' do not fit in memory",
                          ds->info.path, (long long)rows, split);
        goto out;
    }
    DT_CHECK(dt_malloc(all ? all : 1, "cached rows of the dataset", (void **)&c->x));
    DT_CHECK(dt_calloc((size_t)rows + 1, sizeof *c->y, "cached labels", (void **)&c->y));
    DT_CHECK(dt_calloc((size_t)rows + 1, sizeof *c->ids, "cached row ids", (void **)&c->ids));
    int64_t at = 0;
    for (int k = 0; k < nranges; k++) {
        DT_CHECK(cache_fill(c, (uint64_t)start[k], (uint64_t)count[k], at));
        at += count[k];
    }
    *out = c;
    c = NULL;
out:
    dt_row_cache_destroy(c);
    return st;
}

void dt_row_cache_destroy(dt_row_cache_t *c)
{
    if (!c)
        return;
    free(c->x);
    free(c->y);
    free(c->ids);
    free(c);
}

int64_t dt_row_cache_rows(const dt_row_cache_t *c) { return c->rows; }

uint64_t dt_row_cache_bytes(const dt_row_cache_t *c)
{
    return (uint64_t)c->rows * (c->row_bytes + sizeof *c->y + sizeof *c->ids);
}

uint64_t dt_row_cache_bytes_read(const dt_row_cache_t *c) { return c->bytes_read; }

uint64_t dt_row_cache_row_id(const dt_row_cache_t *c, int64_t pos) { return c->ids[pos]; }

dt_status dt_row_cache_read(const dt_row_cache_t *c, const uint64_t *pos, size_t n, int32_t pad,
                            const struct dt_crop_flip *cf, float *x, int32_t *y)
{
    const struct dsfile *f0 = c->ds->files[0];
    const struct split *sp = &f0->splits[c->s];
    const struct dt_split_info *si = &c->ds->info.splits[c->s];
    struct geom g = {.pad = pad};
    if (cf && (pad < 0 || !dt_split_image_shape(si, &g.c, &g.h, &g.w)))
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "dataset %s: split '%s' cannot be cropped or flipped (vectors, or a "
                            "negative padding)",
                            c->ds->info.path, c->split);
    for (size_t i = 0; i < n; i++) {
        if (pos[i] >= (uint64_t)c->rows)
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "dataset %s: cached row %llu of split '%s' requested; the cache "
                                "holds %lld",
                                c->ds->info.path, (unsigned long long)pos[i], c->split,
                                (long long)c->rows);
        if (cf && (cf[i].top < 0 || cf[i].top > 2 * pad || cf[i].left < 0 || cf[i].left > 2 * pad))
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "dataset %s: crop %zu at (%d, %d) is outside [0, %d] for "
                                "padding %d",
                                c->ds->info.path, i, (int)cf[i].top, (int)cf[i].left, 2 * (int)pad,
                                (int)pad);
    }
    for (size_t i = 0; i < n; i++) {
        const unsigned char *src = c->x + (size_t)pos[i] * c->row_bytes;
        float *dst = x + i * (size_t)c->per_row;
        if (cf)
            normalise_crop_flip(f0, sp, src, dst, &g, &cf[i]);
        else
            normalise_row(f0, sp, src, dst, c->per_row);
        if (y)
            y[i] = c->y[pos[i]];
    }
    if (sp->x_mem_size == 1)
        return DT_OK; /* the table was checked at open */
    /* stored values were checked when cached; what normalisation overflows is caught here */
    int64_t k = first_nonfinite(x, (int64_t)n * c->per_row);
    if (k < 0)
        return DT_OK;
    int64_t i = k / c->per_row;
    if (cf)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "dataset %s: split '%s', row %llu: normalisation ((v * %g - mean) / "
                            "std) turns a value of x into %g (element %lld after the crop)",
                            c->ds->info.path, c->split, (unsigned long long)c->ids[pos[i]],
                            (double)f0->info.norm_scale, (double)x[k], (long long)(k % c->per_row));
    return nonfinite_row_error(&c->ds->info, c->split, c->ids[pos[i]],
                               c->x + (size_t)pos[i] * c->row_bytes, x, k, c->per_row);
}

/* ---- language-model windows -------------------------------------------- */

dt_status dt_dataset_set_seq_len(dt_dataset_t *ds, int64_t seq_len)
{
    struct dsfile *f = ds->files[0];
    if (!ds->info.lm)
        return dt_set_error(DT_ERR_USAGE,
                            "dataset %s holds classification samples, not token streams; a "
                            "sequence length applies to language-model datasets",
                            ds->info.path);
    if (seq_len < 1 || seq_len > DT_DATASET_MAX_SEQ_LEN)
        return dt_set_error(DT_ERR_USAGE, "sequence length %lld is outside [1, %lld]",
                            (long long)seq_len, (long long)DT_DATASET_MAX_SEQ_LEN);
    for (int i = 0; i < f->info.nsplits; i++) {
        struct dt_split_info *si = &f->info.splits[i];
        int64_t w = si->tokens > 0 ? (si->tokens - 1) / seq_len : 0;
        if (w < 1)
            return dt_set_error(DT_ERR_BAD_DATA,
                                "dataset %s: split '%s' has %lld tokens, fewer than one window "
                                "of seq_len + 1 = %lld tokens; lower the sequence length or "
                                "import more text",
                                ds->info.path, si->name, (long long)si->tokens,
                                (long long)seq_len + 1);
        si->n = w >= 2 ? w - 1 : 1;
        si->window_shifts = w >= 2 ? seq_len : 1;
        si->ndim = 1;
        si->shape[0] = seq_len;
        si->sample_elems = seq_len;
    }
    f->info.seq_len = seq_len;
    memcpy(ds->info.splits, f->info.splits, sizeof ds->info.splits);
    ds->info.seq_len = seq_len;
    return DT_OK;
}

dt_status dt_dataset_read_windows(dt_dataset_t *ds, const char *split, const uint64_t *idx,
                                  size_t n, int64_t shift, float *x, int32_t *y,
                                  uint64_t *bytes_read)
{
    struct dsfile *f = ds->files[0];
    const char *path = ds->info.path;
    dt_status st = DT_OK;
    int32_t *tok = NULL;
    hid_t mem = -1, fs = -1;
    int s = find_split(f, split);
    if (!ds->info.lm || ds->info.seq_len < 1)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "dataset %s: windows are read from a language-model dataset after "
                            "its sequence length is set",
                            path);
    if (s < 0) {
        const struct dt_split_info *dummy;
        return file_split(f, split, &dummy);
    }
    const struct dt_split_info *si = &f->info.splits[s];
    const int64_t T = ds->info.seq_len;
    if (shift < 0 || shift >= si->window_shifts)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "dataset %s: window offset %lld of split '%s' is outside [0, %lld)",
                            path, (long long)shift, split, (long long)si->window_shifts);
    for (size_t i = 0; i < n; i++)
        if (idx[i] >= (uint64_t)si->n)
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "dataset %s: window %llu of split '%s' requested, which has %lld",
                                path, (unsigned long long)idx[i], split, (long long)si->n);
    if (n == 0)
        return DT_OK;
    DT_CHECK(dt_malloc((size_t)(T + 1) * sizeof *tok, "a token window", (void **)&tok));
    hsize_t count = (hsize_t)(T + 1);
    dt_h5_lock();
    mem = H5Screate_simple(1, &count, NULL);
    fs = H5Dget_space(f->splits[s].x);
    for (size_t i = 0; i < n && st == DT_OK; i++) {
        hsize_t start = (hsize_t)(shift + (int64_t)idx[i] * T);
        if (mem < 0 || fs < 0 ||
            H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, NULL, &count, NULL) < 0 ||
            H5Dread(f->splits[s].x, H5T_NATIVE_INT32, mem, fs, H5P_DEFAULT, tok) < 0) {
            st = dt_h5_error(DT_ERR_IO, "dataset %s: cannot read tokens %llu to %llu of split '%s'",
                             path, (unsigned long long)start,
                             (unsigned long long)(start + count - 1), split);
            break;
        }
        for (int64_t t = 0; t <= T; t++)
            if (tok[t] < 0 || tok[t] >= ds->info.vocab_size) {
                st = dt_set_error(DT_ERR_BAD_DATA,
                                  "dataset %s: token %llu of split '%s' is %d, outside the "
                                  "vocabulary [0, %lld)",
                                  path, (unsigned long long)(start + (hsize_t)t), split,
                                  (int)tok[t], (long long)ds->info.vocab_size);
                break;
            }
        for (int64_t t = 0; t < T && st == DT_OK; t++) {
            x[i * (size_t)T + (size_t)t] = (float)tok[t];
            if (y)
                y[i * (size_t)T + (size_t)t] = tok[t + 1];
        }
    }
    dt_h5_close(fs);
    dt_h5_close(mem);
    dt_h5_unlock();
    if (st == DT_OK && bytes_read)
        *bytes_read += (uint64_t)n * (uint64_t)(T + 1) * f->splits[s].x_file_size;
out:
    free(tok);
    return st;
}

/* ---- summary ----------------------------------------------------------- */

/* Per-class counts on one line: "6000 each" when equal, every count when
 * there are few classes, else the smallest and largest. */
static void print_counts(const struct dt_dataset_info *in, const struct dt_split_info *si,
                         FILE *out)
{
    int k = in->num_classes, lo = 0, hi = 0;
    for (int c = 1; c < k; c++) {
        if (si->class_counts[c] < si->class_counts[lo])
            lo = c;
        if (si->class_counts[c] > si->class_counts[hi])
            hi = c;
    }
    if (si->class_counts[lo] == si->class_counts[hi]) {
        fprintf(out, "    per class: %lld each\n", (long long)si->class_counts[lo]);
    } else if (k <= 32) {
        fprintf(out, "    per class:");
        for (int c = 0; c < k; c++)
            fprintf(out, " %d:%lld", c, (long long)si->class_counts[c]);
        fprintf(out, "\n");
    } else {
        fprintf(out, "    per class: min %lld (class %d), max %lld (class %d)\n",
                (long long)si->class_counts[lo], lo, (long long)si->class_counts[hi], hi);
    }
}

void dt_dataset_print(const dt_dataset_t *ds, FILE *out)
{
    const struct dt_dataset_info *in = &ds->info;
    char size[32];
    dt_format_bytes((uint64_t)in->file_bytes, size, sizeof size);
    fprintf(out, "dataset %s\n", in->path);
    if (ds->nfiles > 1) {
        fprintf(out, "  files (%d, rows numbered across them in this order):\n", ds->nfiles);
        for (int f = 0; f < ds->nfiles; f++) {
            const struct dt_dataset_info *fi = &ds->files[f]->info;
            dt_format_bytes((uint64_t)fi->file_bytes, size, sizeof size);
            fprintf(out, "    %s: %s,", fi->path, size);
            for (int i = 0; i < fi->nsplits; i++)
                fprintf(out, " %s %lld rows (from %lld)%s", fi->splits[i].name,
                        (long long)fi->splits[i].n, (long long)ds->first[i * (ds->nfiles + 1) + f],
                        i + 1 < fi->nsplits ? "," : "");
            fprintf(out, "\n");
        }
        dt_format_bytes((uint64_t)in->file_bytes, size, sizeof size);
        fprintf(out, "  total size: %s, format version %d\n", size, in->format_version);
    } else {
        fprintf(out, "  file size: %s, format version %d\n", size, in->format_version);
    }
    if (in->lm) {
        fprintf(out, "  language model: vocabulary %lld, tokenizer %s\n", (long long)in->vocab_size,
                in->tokenizer);
        for (int i = 0; i < in->nsplits; i++) {
            const struct dt_split_info *si = &in->splits[i];
            dt_format_bytes((uint64_t)si->x_bytes, size, sizeof size);
            fprintf(out, "  split %s: %lld tokens (%s), stored in %s", si->name,
                    (long long)si->tokens, dt_dtype_name(si->x_dtype), size);
            if (in->seq_len)
                fprintf(out, "; %lld windows of %lld + 1", (long long)si->n,
                        (long long)in->seq_len);
            fprintf(out, "\n");
        }
        return;
    }
    fprintf(out, "  classes (%d):", in->num_classes);
    for (int c = 0; c < in->num_classes; c++) {
        if (c == 32 && in->num_classes > 40) {
            fprintf(out, " ... (%d more)", in->num_classes - c);
            break;
        }
        fprintf(out, "%s %d=%s", c ? "," : "", c, in->class_names[c]);
    }
    if (in->norm_channels) {
        fprintf(out, "\n  normalisation per channel c: (v * %g - mean[c]) / std[c], mean",
                in->norm_scale);
        for (int c = 0; c < in->norm_channels && c < 16; c++)
            fprintf(out, "%s%g", c ? ", " : " ", in->norm_channel_mean[c]);
        fprintf(out, "%s; std", in->norm_channels > 16 ? ", ..." : "");
        for (int c = 0; c < in->norm_channels && c < 16; c++)
            fprintf(out, "%s%g", c ? ", " : " ", in->norm_channel_std[c]);
        fprintf(out, "%s\n", in->norm_channels > 16 ? ", ..." : "");
    } else {
        fprintf(out, "\n  normalisation: (v * %g - %g) / %g\n", in->norm_scale, in->norm_mean,
                in->norm_std);
    }
    for (int i = 0; i < in->nsplits; i++) {
        const struct dt_split_info *si = &in->splits[i];
        dt_format_bytes((uint64_t)si->x_bytes, size, sizeof size);
        fprintf(out, "  split %s: %lld samples of ", si->name, (long long)si->n);
        for (int d = 0; d < si->ndim; d++)
            fprintf(out, "%s%lld", d ? "x" : "", (long long)si->shape[d]);
        fprintf(out, ", x %s, y %s, x stored in %s\n", dt_dtype_name(si->x_dtype),
                dt_dtype_name(si->y_dtype), size);
        int64_t c, h, w;
        if (dt_split_image_shape(si, &c, &h, &w))
            fprintf(out, "    images, channels first: C x H x W = %lldx%lldx%lld\n", (long long)c,
                    (long long)h, (long long)w);
        print_counts(in, si, out);
    }
}
