/*
 * dataset_attrs.c - the root attributes of a dataset file: dtrain_format
 * and format_version, the task, the classes and their names, and the
 * normalisation (scalar, or per channel with norm_channel_mean and
 * norm_channel_std), or a language-model file's vocab_size and tokenizer.
 *
 * Every attribute is read as what it must be (a string, an integer, a
 * number, a short array) and checked as the value dtrain will use: the
 * normalisation as the float32 it becomes (1e300 is a finite double), the
 * strings cut to a name's length with control characters made printable,
 * since names are printed. All with the HDF5 lock held.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "dataset_impl.h"
#include "hdf5_lock.h"

/* One string of a string attribute (names are cut to DT_NAME_MAX - 1). */
#define STR_ATTR_MAX_BYTES 65536

/* dt_ds_copy_name for a string read from the file: control characters (a
 * terminal escape in a class name) become '?', since names are printed. */
static void copy_printable(char *dst, size_t cap, const char *src)
{
    dt_ds_copy_name(dst, cap, src);
    for (char *p = dst; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
}

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
static dt_status read_lm_attrs(struct dt_ds_file *ds)
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
            strcmp(str[0], "bpe") != 0 && strcmp(str[0], "none") != 0)
            return dt_set_error(DT_ERR_BAD_DATA,
                                "dataset %s: tokenizer '%s' is not one dtrain knows (byte, gpt2, "
                                "bpe or none)",
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

dt_status dt_ds_read_root_attrs(struct dt_ds_file *ds)
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
