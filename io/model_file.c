/*
 * model_file.c - saving and loading the model file (model.h5): named fp32
 * tensors with HDF5 (serial API, one process). Every HDF5 call holds the io/ lock.
 *
 * Saving goes through outfile.h like a checkpoint: the space of the
 * temporary file's data is reserved first, so a full disk or a file-size
 * limit fails before any data is written, with the system's reason and
 * the free space, and the old model file stays as it was. Loading checks that each
 * tensor's declared shape fits in the file before it allocates for it.
 */
#include "model_file.h"

#include <errno.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/files.h"
#include "hdf5_lock.h"
#include "outfile.h"

#define MODEL_FORMAT "model"
#define MODEL_VERSION 1
#define MAX_TENSORS 4096
#define MODEL_PATH 4200
#define FORMAT_MAX 64 /* longest dtrain_format value read */
#define MODEL_HEADER_BYTES 4096
#define MODEL_TENSOR_BYTES 512

static herr_t put_string_attr(hid_t loc, const char *name, const char *value)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(value) + 1);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(loc, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    herr_t e = a < 0 ? -1 : H5Awrite(a, t, value);
    dt_h5_close(a);
    H5Sclose(sp);
    H5Tclose(t);
    return e;
}

static herr_t put_int_attr(hid_t loc, const char *name, int value)
{
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(loc, name, H5T_NATIVE_INT, sp, H5P_DEFAULT, H5P_DEFAULT);
    herr_t e = a < 0 ? -1 : H5Awrite(a, H5T_NATIVE_INT, &value);
    dt_h5_close(a);
    H5Sclose(sp);
    return e;
}

/* Where tensor i's data is: its own, or the source's. */
struct source {
    dt_status (*get)(void *ctx, int i, const float **data);
    void *ctx;
};

static dt_status write_tensor(hid_t grp, const struct dt_named_tensor *t, const float *data,
                              const char *path, const char *tmp)
{
    hsize_t dims[DT_MAX_DIMS];
    for (int d = 0; d < t->shape.ndim; d++)
        dims[d] = (hsize_t)t->shape.dim[d];
    hid_t sp = H5Screate_simple(t->shape.ndim, dims, NULL);
    hid_t d = H5Dcreate2(grp, t->name, H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    herr_t e = d < 0 ? -1 : H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
    dt_status st = DT_OK;
    if (e < 0) st = dt_h5_write_error("model", path, tmp, "write tensor %s", t->name);
    dt_h5_close(d);
    H5Sclose(sp);
    return st;
}

/* Bytes of tensor data: the exact part of the file's size. */
static uint64_t model_data_bytes(const struct dt_named_tensor *t, int n)
{
    uint64_t bytes = 0;
    for (int i = 0; i < n; i++)
        bytes += (uint64_t)dt_shape_numel(&t[i].shape) * sizeof(float);
    return bytes;
}

/* An upper estimate of the whole file: measured with HDF5 1.10 at 2.6 KiB
 * plus 0.45 KiB per tensor beyond the data. */
static uint64_t model_estimate(const struct dt_named_tensor *t, int n)
{
    return MODEL_HEADER_BYTES + MODEL_TENSOR_BYTES * (uint64_t)n + model_data_bytes(t, n);
}

static dt_status save_locked(const char *tmp, const char *path, const struct dt_named_tensor *t,
                             int n, const struct source *src)
{
    dt_status st = DT_OK;
    hid_t g = -1;
    unlink(tmp); /* stale, and never followed if it is a symlink */
    hid_t f = H5Fcreate(tmp, H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) return dt_h5_write_error("model", path, tmp, "create %s", tmp);
    /* The file-size limit is held against the whole estimate; the disk
     * reserves the data, which is exact and is what makes a model large:
     * the headers' few KiB are only estimated, and reserving them would
     * refuse a model that fits on a nearly full disk. */
    st = dt_outfile_check_limit("model", path, model_estimate(t, n));
    if (st == DT_OK) st = dt_outfile_reserve("model", tmp, model_data_bytes(t, n));
    if (st == DT_OK) {
        g = H5Gcreate2(f, "params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (g < 0 || put_string_attr(f, "dtrain_format", MODEL_FORMAT) < 0 ||
            put_int_attr(f, "format_version", MODEL_VERSION) < 0)
            st = dt_h5_write_error("model", path, tmp, "write its header");
    }
    for (int i = 0; i < n && st == DT_OK; i++) {
        const float *data = t[i].data;
        if (src) st = src->get(src->ctx, i, &data);
        if (st == DT_OK) st = write_tensor(g, &t[i], data, path, tmp);
    }
    dt_h5_close(g);
    if (H5Fclose(f) < 0 && st == DT_OK)
        st = dt_h5_write_error("model", path, tmp, "finish writing %s", tmp);
    return st;
}

static dt_status check_tensors(const struct dt_named_tensor *t, int n, int sourced)
{
    if (n < 0 || n > MAX_TENSORS || (n > 0 && !t))
        return dt_set_error(DT_ERR_INVALID_ARG, "model: %d tensors (at most %d)", n, MAX_TENSORS);
    for (int i = 0; i < n; i++) {
        int64_t numel = dt_shape_numel(&t[i].shape), bytes = 0;
        if (!t[i].name[0] || !memchr(t[i].name, '\0', sizeof t[i].name) || strchr(t[i].name, '/') ||
            t[i].shape.ndim < 1 || numel < 0 ||
            !dt_mul_i64(numel, (int64_t)sizeof(float), &bytes) || (numel > 0 && !t[i].data && !sourced))
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "model: tensor %d (%.*s) has no valid name, "
                                "shape or data",
                                i, DT_TENSOR_NAME - 1, t[i].name);
    }
    return DT_OK;
}

static dt_status save(const char *path, const struct dt_named_tensor *t, int n,
                      const struct source *src)
{
    char tmp[DT_OUTFILE_TMP_LEN] = "";
    dt_status st = check_tensors(t, n, src != NULL);
    if (st != DT_OK) return st;
    if (strlen(path) + 32 > MODEL_PATH)
        return dt_set_error(DT_ERR_INVALID_ARG, "model path %.64s... is too long", path);
    /* the temporary names its host and pid, so one that a killed process
     * left is removed by the next save (outfile.h) */
    st = dt_outfile_tmp_begin("model", path, tmp, sizeof tmp);
    if (st != DT_OK) return st;
    dt_h5_lock();
    st = save_locked(tmp, path, t, n, src);
    dt_h5_unlock();
    if (st == DT_OK) {
        dt_outfile_release(tmp, model_data_bytes(t, n));
        st = dt_outfile_commit("model", tmp, path);
    }
    dt_outfile_tmp_end(tmp, st == DT_OK);
    return st;
}

dt_status dt_model_file_save(const char *path, const struct dt_named_tensor *t, int n)
{
    return save(path, t, n, NULL);
}

dt_status dt_model_file_save_from(const char *path, const struct dt_named_tensor *t, int n,
                                  dt_status (*get)(void *ctx, int i, const float **data),
                                  void *ctx)
{
    struct source src = {.get = get, .ctx = ctx};
    return save(path, t, n, &src);
}

/* ---- loading ------------------------------------------------------------- */

struct load_ctx {
    const char *path;
    int64_t file_bytes;
    struct dt_named_tensor *t;
    int n;
    dt_status st;
};

/* Opens /params/<name> and reads its shape; the data must fit in the file
 * (checked before anything is allocated for it). */
static dt_status open_one(struct load_ctx *c, hid_t grp, const char *name, const H5L_info_t *info,
                          hid_t *d, struct dt_named_tensor *t)
{
    hsize_t dims[DT_MAX_DIMS] = {0};
    char shape[DT_MAX_DIMS * 21 + 8], declared[sizeof shape + 32], what[MODEL_PATH + 32];
    int64_t numel = 0, bytes = 0;
    if (strlen(name) >= sizeof t->name)
        return dt_set_error(DT_ERR_BAD_DATA, "model %s: tensor name '%.64s...' is longer than %d",
                            c->path, name, DT_TENSOR_NAME - 1);
    snprintf(t->name, sizeof t->name, "%s", name);
    if (info->type != H5L_TYPE_HARD)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "model %s: /params/%s is a link to elsewhere, not a tensor in the file",
                            c->path, name);
    *d = H5Dopen2(grp, name, H5P_DEFAULT);
    if (*d < 0)
        return dt_h5_error(DT_ERR_BAD_DATA, "model %s: /params/%s is not a readable tensor",
                           c->path, name);
    hid_t sp = H5Dget_space(*d), ty = H5Dget_type(*d);
    int nd = sp < 0 ? -1 : H5Sget_simple_extent_ndims(sp);
    H5T_class_t cls = ty < 0 ? H5T_NO_CLASS : H5Tget_class(ty);
    /* the number of dimensions is checked before they are read into dims */
    int ok = nd >= 1 && nd <= DT_MAX_DIMS && H5Sget_simple_extent_dims(sp, dims, NULL) >= 0 &&
             (cls == H5T_FLOAT || cls == H5T_INTEGER);
    dt_h5_close(ty);
    dt_h5_close(sp);
    if (!ok)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "model %s: /params/%s is not an array of numbers of 1 to %d "
                            "dimensions",
                            c->path, name, DT_MAX_DIMS);
    t->shape.ndim = nd;
    for (int k = 0; k < nd; k++)
        t->shape.dim[k] = dims[k] > INT64_MAX ? -1 : (int64_t)dims[k];
    dt_shape_format(&t->shape, shape, sizeof shape);
    numel = dt_shape_numel(&t->shape);
    if (numel < 0 || !dt_mul_i64(numel, (int64_t)sizeof(float), &bytes) || bytes > c->file_bytes)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "model %s: /params/%s declares shape %s, more values than the "
                            "file's %lld bytes hold",
                            c->path, name, shape, (long long)c->file_bytes);
    snprintf(declared, sizeof declared, "%lld values", (long long)numel);
    snprintf(what, sizeof what, "model %s", c->path);
    char obj[DT_TENSOR_NAME + 16];
    snprintf(obj, sizeof obj, "/params/%s", name);
    struct dt_h5_storage s = {.what = what,
                              .file = c->path,
                              .obj = obj,
                              .declared = declared,
                              .bytes = (uint64_t)bytes,
                              .file_bytes = c->file_bytes};
    return dt_h5_check_storage(*d, &s);
}

static herr_t load_one(hid_t grp, const char *name, const H5L_info_t *info, void *op)
{
    struct load_ctx *c = op;
    hid_t d = -1;
    if (c->n >= MAX_TENSORS) {
        c->st = dt_set_error(DT_ERR_BAD_DATA, "model %s: more than %d tensors", c->path,
                             MAX_TENSORS);
        return -1;
    }
    struct dt_named_tensor *t = &c->t[c->n];
    memset(t, 0, sizeof *t);
    c->st = open_one(c, grp, name, info, &d, t);
    if (c->st == DT_OK) {
        size_t numel = (size_t)dt_shape_numel(&t->shape);
        c->st = dt_malloc(numel * sizeof(float), "a model tensor", (void **)&t->data);
    }
    if (c->st == DT_OK && H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, t->data) < 0)
        c->st = dt_h5_error(DT_ERR_BAD_DATA, "model %s: cannot read tensor %s", c->path, name);
    dt_h5_close(d);
    if (c->st != DT_OK) {
        free(t->data);
        t->data = NULL;
        return -1;
    }
    c->n++;
    return 0;
}

/* dtrain_format, when the file has one, must say "model". */
static dt_status check_format(hid_t f, const char *path)
{
    char value[FORMAT_MAX] = "";
    int has = dt_h5_read_format(f, value, sizeof value);
    if (has == 0 || (has > 0 && strcmp(value, MODEL_FORMAT) == 0)) return DT_OK;
    if (has < 0)
        return dt_h5_error(DT_ERR_BAD_DATA, "model %s: its dtrain_format cannot be read", path);
    if (dt_h5_format_kind(value))
        return dt_set_error(DT_ERR_BAD_DATA, "model %s is not a dtrain model file (it is %s)", path,
                            dt_h5_format_kind(value));
    return dt_set_error(DT_ERR_BAD_DATA,
                        "model %s is not a dtrain model file (its dtrain_format is '%s')", path,
                        value);
}

/* format_version, when the file has one, must be one this dtrain reads:
 * a newer dtrain may have changed what the layout means. */
static dt_status check_version(hid_t f, const char *path)
{
    htri_t e = H5Aexists(f, "format_version");
    if (e <= 0)
        return e < 0 ? dt_h5_error(DT_ERR_BAD_DATA, "model %s is damaged", path) : DT_OK;
    long long version = 0;
    hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
    hid_t t = a < 0 ? -1 : H5Aget_type(a);
    hid_t sp = a < 0 ? -1 : H5Aget_space(a);
    herr_t r = -1;
    if (t >= 0 && sp >= 0 && H5Tget_class(t) == H5T_INTEGER &&
        H5Sget_simple_extent_npoints(sp) == 1)
        r = H5Aread(a, H5T_NATIVE_LLONG, &version);
    dt_status st = DT_OK;
    if (r < 0)
        st = dt_h5_error(DT_ERR_BAD_DATA,
                         "model %s: its format_version is not a single integer that can be read",
                         path);
    else if (version < 1 || version > MODEL_VERSION)
        st = dt_set_error(
            DT_ERR_BAD_DATA, "model %s has format version %lld; this dtrain reads version %d%s",
            path, version, MODEL_VERSION, version > MODEL_VERSION ? ": use a newer dtrain" : "");
    dt_h5_close(sp);
    dt_h5_close(t);
    dt_h5_close(a);
    return st;
}

static void load_locked(struct load_ctx *c)
{
    hid_t f = H5Fopen(c->path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t g = -1;
    if (f < 0) {
        c->st = dt_h5_open_error("model", c->path, " is damaged or is not an HDF5 file");
        return;
    }
    c->st = check_format(f, c->path);
    if (c->st == DT_OK)
        c->st = check_version(f, c->path);
    if (c->st == DT_OK) {
        enum dt_h5_path p = dt_h5_hard_path(f, "params");
        if (p == DT_H5_PATH_HARD) g = H5Gopen2(f, "params", H5P_DEFAULT);
        if (g < 0)
            c->st = dt_h5_error(DT_ERR_BAD_DATA,
                                "model %s: not a dtrain model file (no /params group)", c->path);
    }
    if (c->st == DT_OK && H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, NULL, load_one, c) < 0 &&
        c->st == DT_OK)
        c->st = dt_h5_error(DT_ERR_BAD_DATA, "model %s: cannot list its tensors", c->path);
    dt_h5_close(g);
    H5Fclose(f);
}

dt_status dt_model_file_load(const char *path, struct dt_named_tensor **out, int *n)
{
    struct load_ctx c = {.path = path};
    dt_status st = dt_input_check(path, "model", &c.file_bytes);
    if (st != DT_OK) return st;
    DT_CHECK(dt_calloc(MAX_TENSORS, sizeof *c.t, "a model's tensor list", (void **)&c.t));
    dt_h5_lock();
    load_locked(&c);
    dt_h5_unlock();
    st = c.st;
    if (st == DT_OK) {
        *out = c.t;
        *n = c.n;
        c.t = NULL;
    }
out:
    dt_model_file_free(c.t, c.n);
    return st;
}

void dt_model_file_free(struct dt_named_tensor *t, int n)
{
    if (!t)
        return;
    for (int i = 0; i < n; i++)
        free(t[i].data);
    free(t);
}
