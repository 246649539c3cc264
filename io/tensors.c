/*
 * tensors.c - saving and loading named fp32 tensors with HDF5 (serial
 * API, one process). Every HDF5 call holds the io/ lock.
 */
#include "tensors.h"

#include <errno.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hdf5_lock.h"

#define MODEL_FORMAT "model"
#define MODEL_VERSION 1
#define MAX_TENSORS 4096

static herr_t put_string_attr(hid_t loc, const char *name, const char *value)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(value) + 1);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(loc, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    herr_t e = a < 0 ? -1 : H5Awrite(a, t, value);
    if (a >= 0)
        H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(t);
    return e;
}

static herr_t put_int_attr(hid_t loc, const char *name, int value)
{
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(loc, name, H5T_NATIVE_INT, sp, H5P_DEFAULT, H5P_DEFAULT);
    herr_t e = a < 0 ? -1 : H5Awrite(a, H5T_NATIVE_INT, &value);
    if (a >= 0)
        H5Aclose(a);
    H5Sclose(sp);
    return e;
}

static dt_status write_tensor(hid_t grp, const struct dt_named_tensor *t, const char *path)
{
    hsize_t dims[2] = {(hsize_t)t->shape[0], t->ndim > 1 ? (hsize_t)t->shape[1] : 1};
    hid_t sp = H5Screate_simple(t->ndim > 1 ? 2 : 1, dims, NULL);
    hid_t d = H5Dcreate2(grp, t->name, H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    herr_t e = d < 0 ? -1 : H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, t->data);
    if (d >= 0)
        H5Dclose(d);
    H5Sclose(sp);
    return e < 0 ? dt_h5_error(DT_ERR_IO, "model %s: cannot write tensor %s", path, t->name)
                 : DT_OK;
}

static dt_status save_locked(const char *tmp, const char *path, const struct dt_named_tensor *t,
                             int n)
{
    dt_status st = DT_OK;
    hid_t f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0)
        return dt_h5_error(DT_ERR_IO, "model %s: cannot create %s", path, tmp);
    hid_t g = H5Gcreate2(f, "params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0 || put_string_attr(f, "dtrain_format", MODEL_FORMAT) < 0 ||
        put_int_attr(f, "format_version", MODEL_VERSION) < 0)
        st = dt_h5_error(DT_ERR_IO, "model %s: cannot write its header", path);
    for (int i = 0; i < n && st == DT_OK; i++)
        st = write_tensor(g, &t[i], path);
    if (g >= 0)
        H5Gclose(g);
    if (H5Fclose(f) < 0 && st == DT_OK)
        st = dt_h5_error(DT_ERR_IO, "model %s: cannot close %s", path, tmp);
    return st;
}

dt_status dt_tensors_save(const char *path, const struct dt_named_tensor *t, int n)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    dt_h5_lock();
    dt_status st = save_locked(tmp, path, t, n);
    dt_h5_unlock();
    if (st == DT_OK && rename(tmp, path) != 0)
        st = dt_set_error(DT_ERR_IO, "model %s: cannot rename %s into place: %s", path, tmp,
                          strerror(errno));
    if (st != DT_OK)
        unlink(tmp);
    return st;
}

struct load_ctx {
    const char *path;
    struct dt_named_tensor *t;
    int n;
    dt_status st;
};

static herr_t load_one(hid_t grp, const char *name, const H5L_info_t *info, void *op)
{
    struct load_ctx *c = op;
    if (c->n >= MAX_TENSORS) {
        c->st = dt_set_error(DT_ERR_BAD_DATA, "model %s: more than %d tensors", c->path,
                             MAX_TENSORS);
        return -1;
    }
    struct dt_named_tensor *t = &c->t[c->n];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    hid_t d = H5Dopen2(grp, name, H5P_DEFAULT);
    hid_t sp = d < 0 ? -1 : H5Dget_space(d);
    hsize_t dims[2] = {0, 1};
    int nd = sp < 0 ? -1 : H5Sget_simple_extent_ndims(sp);
    if (nd == 1 || nd == 2) {
        H5Sget_simple_extent_dims(sp, dims, NULL);
        t->ndim = nd;
        t->shape[0] = (int64_t)dims[0];
        t->shape[1] = (int64_t)dims[1];
        t->data = malloc((size_t)(dims[0] * dims[1]) * sizeof(float) + 1);
    }
    if (!t->data || H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, t->data) < 0)
        c->st = dt_h5_error(DT_ERR_BAD_DATA, "model %s: cannot read tensor %s", c->path, name);
    if (sp >= 0)
        H5Sclose(sp);
    if (d >= 0)
        H5Dclose(d);
    if (c->st != DT_OK) {
        free(t->data);
        t->data = NULL;
    }
    c->n += c->st == DT_OK;
    return c->st == DT_OK ? 0 : -1;
}

dt_status dt_tensors_load(const char *path, struct dt_named_tensor **out, int *n)
{
    struct load_ctx c = {.path = path, .t = calloc(MAX_TENSORS, sizeof *c.t)};
    if (!c.t)
        return dt_set_error(DT_ERR_NOMEM, "out of memory loading model %s", path);
    if (access(path, R_OK) != 0) {
        free(c.t);
        return dt_set_error(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO, "model %s: %s", path,
                            strerror(errno));
    }
    dt_h5_lock();
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t g = f < 0 ? -1 : H5Gopen2(f, "params", H5P_DEFAULT);
    if (g < 0)
        c.st = dt_h5_error(DT_ERR_BAD_DATA, "model %s: not a dtrain model file", path);
    else
        H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, NULL, load_one, &c);
    if (g >= 0)
        H5Gclose(g);
    if (f >= 0)
        H5Fclose(f);
    dt_h5_unlock();
    if (c.st != DT_OK) {
        dt_tensors_free(c.t, c.n);
        return c.st;
    }
    *out = c.t;
    *n = c.n;
    return DT_OK;
}

void dt_tensors_free(struct dt_named_tensor *t, int n)
{
    if (!t)
        return;
    for (int i = 0; i < n; i++)
        free(t[i].data);
    free(t);
}
