/*
 * idx.h - importing IDX files (the MNIST / Fashion-MNIST format, gzipped
 * or raw) into a dtrain HDF5 dataset (see dataset.h).
 *
 * The output is written under a temporary name in the same directory and
 * renamed into place only when complete, so a failed import never leaves
 * a half-written dataset.
 */
#ifndef DT_IDX_H
#define DT_IDX_H

#include <stdio.h>

#include "core/status.h"

struct dt_idx_import_opts {
    const char *train_images, *train_labels; /* required */
    const char *test_images, *test_labels;   /* optional pair */
    const char *out_path;                     /* the .h5 to create */
    const char *class_names;                  /* optional: "a,b,c" */
    int overwrite;                            /* replace an existing out_path */
};

/* Imports the files. Errors name the file: DT_ERR_NOT_FOUND (missing),
 * DT_ERR_BAD_DATA (wrong magic, truncated, images and labels disagree),
 * DT_ERR_IO (cannot write out_path), DT_ERR_USAGE (out_path exists and
 * overwrite is off). Progress lines go to `progress` when not NULL. */
dt_status dt_idx_import(const struct dt_idx_import_opts *opts, FILE *progress);

/* Fills train/test file names from a directory holding the standard names
 * (train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz],
 * t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]). The strings
 * are stored in `buf` (4 * 4096 bytes). */
dt_status dt_idx_find_in_dir(const char *dir, struct dt_idx_import_opts *opts, char buf[4][4096]);

#endif
