/*
 * tensor.h - the one dtype enum and the one shape descriptor that the
 * model, the ops, the datasets, the communicators and the checkpoint files
 * share, so a tensor's type and shape mean the same thing everywhere.
 *
 * A shape is dense and row-major (the last dimension varies fastest):
 * layouts that need strides carry them themselves. Up to DT_MAX_DIMS
 * dimensions; a scalar has ndim 0 and one element.
 */
#ifndef DT_TENSOR_H
#define DT_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#define DT_MAX_DIMS 8

enum dt_dtype {
    DT_F32 = 0,
    DT_BF16,
    DT_F16,
    DT_F64,
    DT_I32,
    DT_I64,
    DT_U16,
    DT_U8,
};
#define DT_DTYPE_COUNT 8

/* "f32", "bf16", "f16", "f64", "i32", "i64", "u16", "u8" ("unknown" for
 * anything else). */
const char *dt_dtype_name(enum dt_dtype t);
/* The dtype of that name, or -1. */
int dt_dtype_parse(const char *name);
/* Bytes per element; 0 for a value outside the enum. */
size_t dt_dtype_size(enum dt_dtype t);
/* 1 for the floating-point types. */
int dt_dtype_is_float(enum dt_dtype t);

struct dt_shape {
    int ndim;
    int64_t dim[DT_MAX_DIMS];
};

/* A shape from up to four leading dimensions (ndim of them are used). */
struct dt_shape dt_shape_make(int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3);
/* Elements of the shape: the product of its dimensions (1 for ndim 0),
 * or -1 when a dimension is negative, ndim is outside 0..DT_MAX_DIMS or
 * the product does not fit in int64_t. */
int64_t dt_shape_numel(const struct dt_shape *s);
int dt_shape_equal(const struct dt_shape *a, const struct dt_shape *b);
/* "64x1x3x3" ("scalar" for ndim 0) into buf; returns buf. */
char *dt_shape_format(const struct dt_shape *s, char *buf, size_t len);

/* A tensor's type and shape. */
struct dt_tensor_desc {
    enum dt_dtype dtype;
    struct dt_shape shape;
};

#endif
