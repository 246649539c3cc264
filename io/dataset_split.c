/*
 * dataset_split.c - the splits of a dataset file: listed (every group
 * under /), then each one's x and y (a classification split) or tokens (a
 * language-model split) opened and validated.
 *
 * A file is trusted no further than it can back: shapes are multiplied
 * with checked products, and before the labels are allocated x and y must
 * really be in the file (dt_h5_check_storage), so a header declaring 2^40
 * rows it never wrote is bad data, not an allocation. Labels are small, so
 * they are read once here, checked against num_classes and kept in memory;
 * y is never read again. x stays in the file and is read on demand. Links
 * that lead out of the file (soft, external) are refused, as they could
 * lead to a FIFO that never answers.
 *
 * The chunk cache is switched off for unfiltered x: with it on, HDF5 pulls
 * a whole chunk into the cache to return one row of it. Filtered
 * (compressed) x needs the cache, so it gets a large one instead, and its
 * chunks may be no larger than that cache. All with the HDF5 lock held.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "dataset_impl.h"
#include "hdf5_lock.h"

/* Chunk cache for compressed x: big enough for a few dozen typical chunks. */
#define FILTERED_CHUNK_CACHE_BYTES ((size_t)64 << 20)
#define FILTERED_CHUNK_CACHE_SLOTS 12421 /* a prime, as HDF5 advises */
/* A compressed chunk is read and inflated whole to return one row, so its
 * size is bounded by the cache that keeps it. */
#define FILTERED_CHUNK_MAX_BYTES FILTERED_CHUNK_CACHE_BYTES

struct list_ctx {
    struct dt_ds_file *ds;
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
    /* the tokenizer's files a token dataset keeps (io/dataset.h) are no split */
    if (!strcmp(name, "tokenizer") && H5Lexists(g, "tokenizer/vocab.json", H5P_DEFAULT) > 0)
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
    dt_ds_copy_name(in->splits[in->nsplits++].name, DT_NAME_MAX, name);
    return 0;
}

dt_status dt_ds_list_splits(struct dt_ds_file *ds)
{
    const char *path = ds->info.path;
    struct list_ctx ctx = {ds, DT_OK};
    if (H5Literate(ds->file, H5_INDEX_NAME, H5_ITER_INC, NULL, list_cb, &ctx) < 0)
        return ctx.st != DT_OK
                   ? ctx.st
                   : dt_h5_error(DT_ERR_BAD_DATA, "dataset %s: cannot list the splits", path);
    if (ds->info.nsplits == 0)
        return dt_set_error(DT_ERR_BAD_DATA, "dataset %s: no splits (no groups under /)", path);
    return DT_OK;
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

/* Opens x with a chunk cache suited to its layout (see the top of this file). */
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

static dt_status x_dtype(const char *path, const char *split, struct dt_ds_split *sp,
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
static dt_status load_labels(const struct dt_ds_file *ds, const char *split, hid_t y,
                             struct dt_ds_split *sp, struct dt_split_info *si)
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
static dt_status check_storage(const struct dt_ds_file *ds, const char *obj, hid_t d, int64_t n,
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
static dt_status check_x_storage(const struct dt_ds_file *ds, const char *obj,
                                 const struct dt_ds_split *sp, const struct dt_split_info *si)
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
static dt_status check_y_storage(const struct dt_ds_file *ds, const char *obj, hid_t y,
                                 const struct dt_split_info *si)
{
    char declared[64];
    hid_t t = H5Dget_type(y);
    size_t size = t >= 0 ? H5Tget_size(t) : 0;
    dt_h5_close(t);
    snprintf(declared, sizeof declared, "%lld labels", (long long)si->n);
    return check_storage(ds, obj, y, si->n, 1, size, declared);
}

dt_status dt_ds_open_split(struct dt_ds_file *ds, int i)
{
    const char *path = ds->info.path;
    struct dt_split_info *si = &ds->info.splits[i];
    struct dt_ds_split *sp = &ds->splits[i];
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
dt_status dt_ds_open_lm_split(struct dt_ds_file *ds, int i)
{
    const char *path = ds->info.path;
    struct dt_split_info *si = &ds->info.splits[i];
    struct dt_ds_split *sp = &ds->splits[i];
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
