/*
 * dataset.c - opening, validating and reading dtrain HDF5 datasets
 * (format v1, see dataset.h): the public entry points.
 *
 * Open checks everything a training run would otherwise trip over hours
 * later: the format attributes (dataset_attrs.c), every split's x and y
 * and every label (dataset_split.c), and the normalisation
 * (dataset_norm.c), for each file of the dataset, and that the files
 * match (dataset_files.c). Reads come back here and go to the one file
 * (dataset_rows.c), the files of the request (dataset_files.c) or the
 * token windows (dataset_lm.c). The sources share dataset_impl.h.
 *
 * Every HDF5 call is made with the io/ HDF5 lock held (hdf5_lock.h): a
 * file is opened and closed under one lock, and a read takes it around
 * its H5Dread calls only, so normalisation happens outside it and loader
 * threads overlap.
 */
#define _GNU_SOURCE
#include "dataset.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/files.h"
#include "dataset_impl.h"
#include "hdf5_lock.h"

static dt_status open_locked(struct dt_ds_file *ds)
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
    DT_CHECK(dt_ds_read_root_attrs(ds));
    DT_CHECK(dt_ds_list_splits(ds));
    for (int i = 0; i < ds->info.nsplits; i++)
        DT_CHECK(ds->info.lm ? dt_ds_open_lm_split(ds, i) : dt_ds_open_split(ds, i));
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

static void file_close(struct dt_ds_file *ds);

/* Opens and validates one file (lock taken here). */
static dt_status file_open(const char *path, struct dt_ds_file **out)
{
    dt_status st = DT_OK;
    struct dt_ds_file *ds = NULL;
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
    dt_ds_copy_name(ds->info.path, sizeof ds->info.path, path);
    ds->info.file_bytes = size;

    dt_h5_lock();
    st = open_locked(ds);
    dt_h5_unlock();
    if (st != DT_OK)
        goto out;

    if (!ds->info.lm) {
        DT_CHECK(dt_ds_check_channels(ds));
        DT_CHECK(dt_ds_make_lut(ds));
    }
    *out = ds;
    ds = NULL;
out:
    file_close(ds);
    return st;
}

static void file_close(struct dt_ds_file *ds)
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

int dt_ds_find_split(const struct dt_ds_file *ds, const char *name)
{
    for (int i = 0; i < ds->info.nsplits; i++)
        if (strcmp(ds->info.splits[i].name, name) == 0)
            return i;
    return -1;
}

dt_status dt_ds_file_split(const struct dt_ds_file *ds, const char *name,
                           const struct dt_split_info **out)
{
    int i = dt_ds_find_split(ds, name);
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

dt_status dt_dataset_open(const char *path, dt_dataset_t **out)
{
    dt_status st = DT_OK;
    struct dt_dataset *ds = NULL;
    char **names = NULL;
    int nnames = 0;
    *out = NULL;
    if (!path || !*path)
        return dt_set_error(DT_ERR_INVALID_ARG, "dataset path is empty");
    DT_CHECK(dt_ds_expand_path(path, &names, &nnames));
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
        if (f > 0) DT_CHECK(dt_ds_same_kind(ds->files[0], ds->files[f]));
    }
    DT_CHECK(dt_ds_combine(ds, path));
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
    dt_status st = dt_ds_file_split(ds->files[0], name, &s0);
    *out = NULL;
    return st;
}

/* Every read of rows: token windows for a language-model dataset, one
 * file read for one file, else split by file (dataset_files.c). */
static dt_status read_rows(dt_dataset_t *ds, const char *split, const uint64_t *idx, size_t n,
                           int32_t pad, const struct dt_crop_flip *cf, float *x, int32_t *y,
                           uint64_t *bytes_read)
{
    if (ds->info.lm) {
        if (cf)
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "dataset %s: token windows cannot be cropped or flipped",
                                ds->info.path);
        return dt_dataset_read_windows(ds, split, idx, n, 0, x, y, bytes_read);
    }
    if (ds->nfiles == 1)
        return dt_ds_file_read(ds->files[0], split, idx, n, pad, cf, x, y, bytes_read);
    return dt_ds_files_read(ds, split, idx, n, pad, cf, x, y, bytes_read);
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
