/*
 * fz_h5.h - a small builder of valid HDF5 files with hostile content, for
 * the dataset and checkpoint fuzz targets.
 *
 * Fuzzing the bytes of an HDF5 file mostly finds bugs inside libhdf5's own
 * parser, which dtrain cannot fix. Here the fuzzer's bytes instead choose
 * what a well-formed file holds, written through the HDF5 API: every
 * attribute and dataset the caller describes is written as described
 * (byte 0) or made hostile: left out, another type or class, another
 * dataspace (arrays, empty, null, 2-D), odd values, other dimensions
 * (including huge ones that are declared and never written), other
 * layouts (contiguous, chunked, compressed, compact) and partial writes.
 * dtrain's reader then opens what HDF5 wrote.
 *
 * An HDF5 call that refuses a hostile choice just leaves that object out
 * of the file: the file stays valid, and the missing object is one more
 * case for the reader.
 */
#ifndef DT_FZ_H5_H
#define DT_FZ_H5_H

#include <hdf5.h>
#include <stdint.h>

#include "fz_util.h"

#define FZ_MAX_DIMS 6

/* Errors of HDF5 calls the builder makes on purpose stay quiet. */
void fz_h5_quiet(void);

/* Creates path with a file-format version chosen by the input. */
hid_t fz_h5_create(struct fz_in *in, const char *path);
/* Closes a file the builder made; aborts if HDF5 cannot. */
void fz_h5_close(hid_t file);
/* Objects (files, groups, datasets, attributes) still open anywhere. */
long fz_h5_open_objects(void);

enum fz_attr_kind { FZ_ATTR_STR, FZ_ATTR_INT, FZ_ATTR_UINT, FZ_ATTR_FLOAT };

/* An attribute as a well-formed file has it. */
struct fz_attr {
    const char *name;
    enum fz_attr_kind kind;
    hid_t type;              /* numbers: the file type, e.g. H5T_STD_I32LE */
    int vlen;                /* strings: variable length (else fixed size) */
    const char *const *strs; /* strings: the values */
    int nstrs;               /* 0: one scalar string strs[0]; n: a 1-D array */
    int64_t i;               /* FZ_ATTR_INT */
    uint64_t u;              /* FZ_ATTR_UINT */
    double f;                /* FZ_ATTR_FLOAT */
};

/* Writes the attribute as described or, as the input chooses, a hostile
 * variant of it, or leaves it out. */
void fz_h5_attr(struct fz_in *in, hid_t obj, const struct fz_attr *a);
/* Zero to three more attributes with names, types and values from the input. */
void fz_h5_junk_attrs(struct fz_in *in, hid_t obj);

/* A dataset as a well-formed file has it. */
struct fz_dset {
    const char *name;
    hid_t type; /* file type */
    int ndims;
    uint64_t dims[FZ_MAX_DIMS];
    hid_t mem_type;     /* type of values */
    const void *values; /* product(dims) values, or NULL for zeros */
    int chunked;        /* chunked layout (else contiguous) */
};

/* What was made: the dataset may be missing, or have other dimensions. */
struct fz_made {
    int ok;    /* the dataset exists */
    int ndims; /* -1: null dataspace; 0: scalar */
    uint64_t dims[FZ_MAX_DIMS];
    int written; /* some values were written */
};

/* Writes the dataset as described or a hostile variant of it (another
 * type, dimensions, layout, values, a partial or no write), or leaves it
 * out. made may be NULL. */
void fz_h5_dataset(struct fz_in *in, hid_t loc, const struct fz_dset *d, struct fz_made *made);

/* The float16 type dtrain datasets use (HDF5 1.10 has none built in). */
hid_t fz_h5_f16(void);

#endif
