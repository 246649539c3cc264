/*
 * ops_check.h - argument checks that every backend's ops share, so a
 * shape means the same thing, and is refused with the same words, on the
 * CPU and on a GPU. Each returns DT_ERR_INVALID_ARG with
 * "<backend> <op>: <why>" (backend "cpu", "cuda").
 */
#ifndef DT_OPS_CHECK_H
#define DT_OPS_CHECK_H

#include "ops.h"

/* Positive sizes, strides, dilations and groups, padding >= 0, groups
 * dividing C and K, a filter that fits the padded input, and P, Q as
 * dt_conv_out_dim gives them. */
dt_status dt_check_conv2d(const char *backend, const char *op, const struct dt_conv2d_shape *s);

/* Positive sizes, windows and strides, padding in [0, window), a window
 * that fits the padded input, and P, Q as dt_conv_out_dim gives them. */
dt_status dt_check_pool2d(const char *backend, const char *op, const struct dt_pool2d_shape *s);

#endif
