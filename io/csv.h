/*
 * csv.h - importing CSV files (one sample a line: a label column of
 * integer class ids and numeric feature columns) into a dtrain HDF5
 * dataset (see dataset.h), features stored as float32.
 */
#ifndef DT_CSV_H
#define DT_CSV_H

#include <stdio.h>

#include "core/status.h"

enum dt_csv_header { DT_CSV_HEADER_AUTO = 0, DT_CSV_HEADER_YES, DT_CSV_HEADER_NO };

struct dt_csv_import_opts {
    const char *train, *test;  /* train required, test optional */
    const char *out_path;      /* the .h5 to create */
    const char *label_column;  /* NULL: the first; a number counts from 1, else a header name */
    enum dt_csv_header header; /* auto: a first line with a non-numeric field is a header */
    const char *class_names;   /* optional: "a,b,c" */
    int overwrite;             /* replace an existing out_path */
};

/* Imports the files. Errors: DT_ERR_NOT_FOUND (missing, not a regular
 * file), DT_ERR_BAD_DATA naming file, line and column (wrong column count,
 * a value that is not a number, a non-finite value, a label that is not a
 * whole number in [0, classes)), DT_ERR_USAGE (label column not found,
 * out_path exists and overwrite is off, bad class names), DT_ERR_IO.
 * Progress lines go to `progress` when not NULL. */
dt_status dt_csv_import(const struct dt_csv_import_opts *opts, FILE *progress);

#endif
