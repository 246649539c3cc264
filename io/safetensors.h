/*
 * safetensors.h - the safetensors file format (Hugging Face's format for
 * named tensors): an 8-byte little-endian header length N, N bytes of a
 * JSON object (each tensor's "dtype", "shape" and "data_offsets" [begin,
 * end) relative to the data that follows the header; an optional
 * "__metadata__" object of string values), then the tensors' bytes,
 * little-endian and row-major.
 *
 * Reading checks everything the header says against the file before any
 * tensor is used: the header length against the file size, the JSON, each
 * tensor's dtype (F32, F16, BF16 and F64 convert to float; others are
 * refused by name), shape and offsets (end - begin must be the shape's
 * bytes, inside the data, no two tensors overlapping, the data covered with
 * no gap), and duplicate names. A file that fails any check is
 * DT_ERR_BAD_DATA, with a message naming the file, the tensor and what was
 * expected.
 *
 * Writing goes through io/outfile.h: a temporary file in the target's
 * directory, renamed into place when complete, so a reader never sees half
 * a file and a failure leaves an earlier file untouched. dtrain writes F32.
 */
#ifndef DT_IO_SAFETENSORS_H
#define DT_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define DT_ST_MAX_DIMS 8
#define DT_ST_NAME 256 /* longest tensor name taken, with its terminator */

enum dt_st_dtype { DT_ST_F32, DT_ST_F16, DT_ST_BF16, DT_ST_F64 };

struct dt_st_tensor {
    char name[DT_ST_NAME];
    enum dt_st_dtype dtype;
    int ndim; /* 0 (a scalar) to DT_ST_MAX_DIMS */
    int64_t shape[DT_ST_MAX_DIMS];
    uint64_t begin, end; /* bytes, relative to the start of the data */
};

typedef struct dt_safetensors dt_safetensors_t;

/* Opens path and checks its header (see above). DT_ERR_NOT_FOUND for a
 * missing file, DT_ERR_IO for one that cannot be read, DT_ERR_BAD_DATA for
 * one that is not a valid safetensors file. */
dt_status dt_safetensors_open(const char *path, dt_safetensors_t **out);

/* The tensors, in the order of their offsets in the file. */
int dt_safetensors_count(const dt_safetensors_t *f);
const struct dt_st_tensor *dt_safetensors_tensor(const dt_safetensors_t *f, int i);
/* The tensor of that name, or NULL. */
const struct dt_st_tensor *dt_safetensors_find(const dt_safetensors_t *f, const char *name);
/* Number of elements of a tensor (1 for a scalar). */
int64_t dt_st_numel(const struct dt_st_tensor *t);
/* A metadata value ("__metadata__"), or NULL. */
const char *dt_safetensors_meta(const dt_safetensors_t *f, const char *key);
/* "F32", "F16", "BF16", "F64". */
const char *dt_st_dtype_name(enum dt_st_dtype d);

/* Reads tensor t (of f) into dst (dt_st_numel(t) floats), converting from
 * its dtype. DT_ERR_IO when the file cannot be read. */
dt_status dt_safetensors_read(dt_safetensors_t *f, const struct dt_st_tensor *t, float *dst);

/* NULL is a no-op. */
void dt_safetensors_close(dt_safetensors_t *f);

/* One tensor to write, F32. */
struct dt_st_out {
    const char *name; /* non-empty, shorter than DT_ST_NAME, unique in the file */
    int ndim;         /* 0 to DT_ST_MAX_DIMS */
    int64_t shape[DT_ST_MAX_DIMS];
    const float *data; /* numel floats, row-major */
};

/* Writes n tensors (in the order given) and the metadata pairs meta[0..2m)
 * (key, value, key, value, ...; m may be 0, meta NULL) to path, atomically
 * as above. DT_ERR_INVALID_ARG for a bad name, a duplicate or a bad shape;
 * DT_ERR_IO (naming the file, the system's reason and the free space) when
 * the file cannot be written. */
dt_status dt_safetensors_save(const char *path, const struct dt_st_out *t, int n,
                              const char *const *meta, int m);

#endif
