/*
 * dataset_impl.h - what the sources of the dataset reader share (format
 * v1, see dataset.h); nothing here is public API.
 *
 * A dataset is one or more files (struct dt_dataset); each file is opened
 * and validated whole into a struct dt_ds_file: its description, every
 * split's open x (or tokens) and validated labels, and the normalisation
 * tables. The sources, one concern each:
 *   dataset.c          opening and closing a file and the whole dataset,
 *                      the public queries, and the reads (which dispatch
 *                      to the files below)
 *   dataset_attrs.c    the root attributes: format, task, classes,
 *                      normalisation
 *   dataset_split.c    listing the splits and validating each one's x and
 *                      y (or tokens) before anything is allocated from them
 *   dataset_norm.c     the normalisation tables and the normalising copy,
 *                      plain or through a crop and flip, shared by file
 *                      reads and the row cache so both give the same floats
 *   dataset_rows.c     reading arbitrary rows of one file
 *   dataset_files.c    a dataset of several files: the list or glob, the
 *                      check that they match, the global row map, reads
 *                      split by file
 *   dataset_cache.c    the row cache (data.cache: memory)
 *   dataset_lm.c       language-model token windows
 *   dataset_summary.c  the printed description (dtrain data info)
 * A function below marked "lock held" is called with the io/ HDF5 lock
 * held (hdf5_lock.h); the others take it themselves or make no HDF5 call.
 */
#ifndef DT_IO_DATASET_IMPL_H
#define DT_IO_DATASET_IMPL_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dataset.h"

/* One split of one file. */
struct dt_ds_split {
    hid_t x;            /* open dataset /<split>/x */
    hid_t x_mem;        /* memory type x is read as: native uchar or float */
    size_t x_mem_size;  /* 1 or 4 */
    size_t x_file_size; /* stored bytes per element */
    int32_t *labels;    /* n validated labels */
};

/* One file of a dataset, opened and validated. */
struct dt_ds_file {
    hid_t file;
    struct dt_dataset_info info;
    struct dt_ds_split splits[DT_DATASET_MAX_SPLITS];
    int nch;           /* normalisation channels: 1 (scalar) or norm_channels */
    const float *mean; /* nch means: &info.norm_mean or info.norm_channel_mean */
    const float *sd;   /* nch stds, likewise */
    float *lut;        /* nch x 256: normalised value of each uint8 in each channel */
};

/* The dataset: its files in order and the whole they make. */
struct dt_dataset {
    int nfiles;
    struct dt_ds_file **files;
    struct dt_dataset_info info; /* the whole: rows, sizes and counts summed */
    int64_t *first;              /* first global row of file f in split s: [s * (nfiles + 1) + f] */
};

/* The image geometry of a crop-and-flip read. */
struct dt_ds_geom {
    int64_t c, h, w;
    int32_t pad;
};

/* Copies src into dst[cap], cut to cap - 1 bytes. */
static inline void dt_ds_copy_name(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* ---- dataset_attrs.c ---- */

/* Reads and checks the root attributes of the open file ds->file into
 * ds->info (a language-model file's too). Lock held. */
dt_status dt_ds_read_root_attrs(struct dt_ds_file *ds);

/* ---- dataset_split.c ---- */

/* The splits: every group under / (hard links only), in name order, into
 * ds->info.splits[].name; none is bad data. Lock held. */
dt_status dt_ds_list_splits(struct dt_ds_file *ds);

/* Opens and validates split i of a classification file (x, y, every
 * label) or of a language-model file (tokens). Lock held. */
dt_status dt_ds_open_split(struct dt_ds_file *ds, int i);
dt_status dt_ds_open_lm_split(struct dt_ds_file *ds, int i);

/* ---- dataset.c ---- */

/* The index of the split called name in ds, or -1. */
int dt_ds_find_split(const struct dt_ds_file *ds, const char *name);

/* The split called name, or DT_ERR_BAD_DATA naming the splits ds has. */
dt_status dt_ds_file_split(const struct dt_ds_file *ds, const char *name,
                           const struct dt_split_info **out);

/* ---- dataset_norm.c ---- */

/* Sets the channel means and stds reads use, checking that per-channel
 * normalisation meets image samples of that many channels. */
dt_status dt_ds_check_channels(struct dt_ds_file *ds);

/* Fills ds->lut (the normalised value of every uint8 in every channel),
 * refusing values that overflow where a split stores uint8. */
dt_status dt_ds_make_lut(struct dt_ds_file *ds);

/* Normalises one stored row of n values into dst. */
void dt_ds_normalise_row(const struct dt_ds_file *ds, const struct dt_ds_split *sp, const void *src,
                         float *dst, int64_t n);

/* The same through a crop and flip of the image geometry g. */
void dt_ds_normalise_crop_flip(const struct dt_ds_file *ds, const struct dt_ds_split *sp,
                               const void *src, float *dst, const struct dt_ds_geom *g,
                               const struct dt_crop_flip *cf);

/* Position of the first value of x[0..n) that is not finite, or -1. */
int64_t dt_ds_first_nonfinite(const float *x, int64_t n);

/* DT_ERR_BAD_DATA for the non-finite value at position k of a read's
 * output (per_row values a row), which is dataset row `row`, stored at
 * stored_row: a stored non-finite value, or what normalisation made. */
dt_status dt_ds_nonfinite_row_error(const struct dt_dataset_info *in, const char *split,
                                    uint64_t row, const unsigned char *stored_row, const float *x,
                                    int64_t k, int64_t per_row);

/* ---- dataset_rows.c ---- */

/* Reads rows [row, row + count) of x as stored (uint8 or float32 values)
 * into buf. Lock held. */
dt_status dt_ds_read_block(const struct dt_ds_file *ds, const char *split,
                           const struct dt_ds_split *sp, const struct dt_split_info *si,
                           uint64_t row, size_t count, unsigned char *buf);

/* Reads and normalises rows idx[0..n) of one file into x (and labels into
 * y when given), each through cf[i] when cf is given (pad: the crop's
 * padding); adds the stored bytes read to *bytes_read when given. Takes
 * the lock. */
dt_status dt_ds_file_read(struct dt_ds_file *ds, const char *split, const uint64_t *idx, size_t n,
                          int32_t pad, const struct dt_crop_flip *cf, float *x, int32_t *y,
                          uint64_t *bytes_read);

/* ---- dataset_files.c ---- */

/* The file names path stands for: one file, a newline-separated list or a
 * glob pattern. The caller frees each name and the array. */
dt_status dt_ds_expand_path(const char *path, char ***names, int *count);

/* DT_ERR_BAD_DATA unless file b can continue file a. */
dt_status dt_ds_same_kind(const struct dt_ds_file *a, const struct dt_ds_file *b);

/* ds->info and ds->first from the files opened into ds. */
dt_status dt_ds_combine(struct dt_dataset *ds, const char *path);

/* The file holding global row `row`, from first[0..nf]. */
int dt_ds_file_of(const int64_t *first, int nf, uint64_t row);

/* dt_ds_file_read for a dataset of several files. */
dt_status dt_ds_files_read(dt_dataset_t *ds, const char *split, const uint64_t *idx, size_t n,
                           int32_t pad, const struct dt_crop_flip *cf, float *x, int32_t *y,
                           uint64_t *bytes_read);

#endif
