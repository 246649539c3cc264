/*
 * model_file.h - the model file: named fp32 tensors in an HDF5 file, the
 * trained model a run leaves in its run directory (model.h5), readable by
 * any HDF5 tool.
 *
 * Layout: root attributes dtrain_format = "model", format_version = 1;
 * one dataset per tensor at /params/<name> (e.g. /params/fc1.weight), of
 * its shape (1 to DT_MAX_DIMS dimensions, row-major), float32. Written
 * under a temporary name and renamed into place when complete, so a
 * reader never sees half a file. Tensors of more than 2 dimensions (a
 * convolution's K x C x R x S weights) did not change what the layout
 * says, so the version stayed 1; a file of a newer version is refused.
 */
#ifndef DT_MODEL_FILE_H
#define DT_MODEL_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"

#define DT_TENSOR_NAME 64

struct dt_named_tensor {
    char name[DT_TENSOR_NAME];
    struct dt_shape shape; /* 1 to DT_MAX_DIMS dimensions */
    float *data;           /* host memory, dt_shape_numel(&shape) floats, row-major */
};

/* Writes n tensors to path atomically: under a temporary name in the same
 * directory, the space of its data reserved first, synced, renamed into
 * place. DT_ERR_IO names the file and carries the system's reason and the
 * free space ("File too large (the file-size limit, ulimit -f, is ...)",
 * "No space left on device; 12 KiB free on its file system"); a failure
 * leaves an earlier file at path untouched. DT_ERR_INVALID_ARG for a
 * tensor without a valid name (at most 63 characters, no '/'), shape (1 to
 * DT_MAX_DIMS non-negative dimensions) or data. */
dt_status dt_model_file_save(const char *path, const struct dt_named_tensor *t, int n);
/* The same, with each tensor's data asked for just before it is written,
 * in order (t[i].data is not read): get(ctx, i, &data) points data at
 * tensor i's floats, which need stay only until the next call, so that
 * tensors assembled on demand (sharded parameters) are never all in
 * memory at once. A failure of get is the save's; after any failure get
 * is not called again. */
dt_status dt_model_file_save_from(const char *path, const struct dt_named_tensor *t, int n,
                                  dt_status (*get)(void *ctx, int i, const float **data),
                                  void *ctx);

/* Reads the tensors of a model file: *out gets a malloc'd array of *n
 * tensors, each with malloc'd data; free with dt_model_file_free. Each
 * tensor's declared shape must fit in the file before it is allocated.
 * Errors: DT_ERR_NOT_FOUND (no such file, not a regular file),
 * DT_ERR_BAD_DATA (not HDF5, not a dtrain model, a format version newer
 * than this dtrain reads, a tensor that is not an array of numbers of 1 to
 * DT_MAX_DIMS dimensions, a name too long, a link out of the file),
 * DT_ERR_IO (a system call failed inside HDF5). */
dt_status dt_model_file_load(const char *path, struct dt_named_tensor **out, int *n);
void dt_model_file_free(struct dt_named_tensor *t, int n);

#endif
