/*
 * npy.h - importing NumPy .npy arrays (inputs and labels, a train and an
 * optional test pair) into a dtrain HDF5 dataset (see dataset.h).
 */
#ifndef DT_NPY_H
#define DT_NPY_H

#include <stdio.h>

#include "core/status.h"

struct dt_npy_import_opts {
    const char *train_x, *train_y; /* required */
    const char *test_x, *test_y;   /* optional pair */
    const char *out_path;          /* the .h5 to create */
    const char *class_names;       /* optional: "a,b,c" */
    int overwrite;                 /* replace an existing out_path */
};

/* Imports the arrays. x: shape (N, ...) with 1 to 4 sample dimensions, C
 * order, little-endian; uint8, float16 and float32 are stored as they are,
 * float64 and the other integer types are converted to float32. y: an
 * integer array of shape (N,) with labels in [0, classes).
 * Errors name the file: DT_ERR_NOT_FOUND (missing, not a regular file),
 * DT_ERR_BAD_DATA (not .npy, a header that does not parse, a dtype or
 * order not supported, truncated, shapes or counts that disagree, a
 * non-finite input, a label out of range), DT_ERR_IO (cannot write),
 * DT_ERR_USAGE (out_path exists and overwrite is off, bad class names).
 * Progress lines go to `progress` when not NULL. */
dt_status dt_npy_import(const struct dt_npy_import_opts *opts, FILE *progress);

#endif
