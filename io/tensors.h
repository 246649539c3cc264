/*
 * tensors.h - named fp32 tensors in an HDF5 file: the trained model a run
 * leaves in its run directory (model.h5), readable by any HDF5 tool.
 *
 * Layout: root attributes dtrain_format = "model", format_version = 1;
 * one dataset per tensor at /params/<name> (e.g. /params/fc1.weight), of
 * its shape, float32. Written under a temporary name and renamed into
 * place when complete, so a reader never sees half a file.
 */
#ifndef DT_TENSORS_H
#define DT_TENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "../runtime/status.h"

#define DT_TENSOR_NAME 64

struct dt_named_tensor {
    char name[DT_TENSOR_NAME];
    int ndim;           /* 1 or 2 */
    int64_t shape[2];
    float *data;        /* host memory, shape[0] * shape[1] (or shape[0]) floats */
};

/* Writes n tensors to path atomically. DT_ERR_IO names the file. */
dt_status dt_tensors_save(const char *path, const struct dt_named_tensor *t, int n);

/* Reads the tensors of a model file: *out gets a malloc'd array of *n
 * tensors, each with malloc'd data; free with dt_tensors_free. */
dt_status dt_tensors_load(const char *path, struct dt_named_tensor **out, int *n);
void dt_tensors_free(struct dt_named_tensor *t, int n);

#endif
