/*
 * ops_check.c - the shape checks every backend's convolution and pooling
 * ops share (see ops_check.h).
 */
#include "ops_check.h"

dt_status dt_check_conv2d(const char *be, const char *op, const struct dt_conv2d_shape *s)
{
    if (!s)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s %s: shape must not be NULL", be, op);
    if (s->N < 1 || s->C < 1 || s->H < 1 || s->W < 1 || s->K < 1 || s->R < 1 || s->S < 1)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "%s %s: sizes must be >= 1 (N=%d C=%d H=%d W=%d K=%d R=%d S=%d)", be,
                            op, s->N, s->C, s->H, s->W, s->K, s->R, s->S);
    if (s->stride_h < 1 || s->stride_w < 1 || s->dil_h < 1 || s->dil_w < 1 || s->pad_h < 0 ||
        s->pad_w < 0 || s->groups < 1)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "%s %s: stride, dilation and groups must be >= 1 and padding >= 0 "
                            "(stride %dx%d, dilation %dx%d, padding %dx%d, groups %d)",
                            be, op, s->stride_h, s->stride_w, s->dil_h, s->dil_w, s->pad_h,
                            s->pad_w, s->groups);
    if (s->C % s->groups || s->K % s->groups)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "%s %s: C=%d and K=%d must both be divisible by groups=%d", be, op,
                            s->C, s->K, s->groups);
    int P = dt_conv_out_dim(s->H, s->pad_h, s->dil_h, s->R, s->stride_h);
    int Q = dt_conv_out_dim(s->W, s->pad_w, s->dil_w, s->S, s->stride_w);
    if (P < 1 || Q < 1)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "%s %s: a %dx%d filter (dilation %dx%d) does not fit the %dx%d input "
                            "padded by %dx%d",
                            be, op, s->R, s->S, s->dil_h, s->dil_w, s->H, s->W, s->pad_h, s->pad_w);
    if (s->P != P || s->Q != Q)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "%s %s: output is %dx%d but the shape says %dx%d (use "
                            "dt_conv_out_dim)",
                            be, op, P, Q, s->P, s->Q);
    return DT_OK;
}

dt_status dt_check_pool2d(const char *be, const char *op, const struct dt_pool2d_shape *s)
{
    if (!s)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s %s: shape must not be NULL", be, op);
    if (s->N < 1 || s->C < 1 || s->H < 1 || s->W < 1 || s->R < 1 || s->S < 1)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "%s %s: sizes must be >= 1 (N=%d C=%d H=%d W=%d R=%d S=%d)", be, op,
                            s->N, s->C, s->H, s->W, s->R, s->S);
    if (s->stride_h < 1 || s->stride_w < 1 || s->pad_h < 0 || s->pad_w < 0 || s->pad_h >= s->R ||
        s->pad_w >= s->S)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "%s %s: stride must be >= 1 and padding in [0, window) (stride %dx%d, "
                            "padding %dx%d, window %dx%d)",
                            be, op, s->stride_h, s->stride_w, s->pad_h, s->pad_w, s->R, s->S);
    int P = dt_conv_out_dim(s->H, s->pad_h, 1, s->R, s->stride_h);
    int Q = dt_conv_out_dim(s->W, s->pad_w, 1, s->S, s->stride_w);
    if (P < 1 || Q < 1)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "%s %s: a %dx%d window does not fit the %dx%d input padded by %dx%d",
                            be, op, s->R, s->S, s->H, s->W, s->pad_h, s->pad_w);
    if (s->P != P || s->Q != Q)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "%s %s: output is %dx%d but the shape says %dx%d (use "
                            "dt_conv_out_dim)",
                            be, op, P, Q, s->P, s->Q);
    return DT_OK;
}
