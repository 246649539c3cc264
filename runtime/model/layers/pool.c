/*
 * pool.c - pooling over (C, H, W) images: maxpool2d and avgpool2d
 * (kernel, stride = kernel, padding = 0; an average counts padded
 * positions, as PyTorch's default), and global_avgpool, the mean of each
 * channel, which gives a vector of C values.
 */
#include <limits.h>
#include <stdio.h>

#include "layer.h"

struct pool_cfg {
    int64_t k[2], stride[2], pad[2];
};

static struct dt_pool2d_shape shape_of(const struct dt_layer *l, int64_t rows)
{
    const struct pool_cfg *c = (const struct pool_cfg *)l->cfg;
    struct dt_pool2d_shape s = {
        .N = (int)rows,
        .C = (int)l->in.dim[0],
        .H = (int)l->in.dim[1],
        .W = (int)l->in.dim[2],
        .R = (int)c->k[0],
        .S = (int)c->k[1],
        .stride_h = (int)c->stride[0],
        .stride_w = (int)c->stride[1],
        .pad_h = (int)c->pad[0],
        .pad_w = (int)c->pad[1],
        .P = 1,
        .Q = 1,
    };
    if (l->out.ndim == 3) {
        s.P = (int)l->out.dim[1];
        s.Q = (int)l->out.dim[2];
    }
    return s;
}

static dt_status build_window(struct dt_layer *l, const struct dt_layer_spec *spec,
                              const struct dt_job *job, int64_t num_classes)
{
    static const char *const known[] = {"kernel", "stride", "padding", NULL};
    struct pool_cfg *c = (struct pool_cfg *)l->cfg;
    dt_status st;
    DT_CHECK(dt_layer_known(l, spec, known));
    DT_CHECK(dt_layer_want_image(l));
    DT_CHECK(dt_layer_int2(l, spec, "kernel", 2, 1, 1024, c->k));
    DT_CHECK(dt_layer_int2(l, spec, "stride", 0, 0, 1024, c->stride));
    DT_CHECK(dt_layer_int2(l, spec, "padding", 0, 0, 1024, c->pad));
    for (int a = 0; a < 2; a++)
        if (c->stride[a] == 0)
            c->stride[a] = c->k[a];
    if (2 * c->pad[0] > c->k[0] || 2 * c->pad[1] > c->k[1]) {
        st = dt_set_error(DT_ERR_USAGE, "%s: padding must be at most half the kernel", l->where);
        goto out;
    }
    if (l->in.dim[1] > INT_MAX / 4 || l->in.dim[2] > INT_MAX / 4 || l->in.dim[0] > INT_MAX) {
        st = dt_set_error(DT_ERR_BAD_DATA, "%s: the input is more than pooling takes", l->where);
        goto out;
    }
    int P = dt_conv_out_dim((int)l->in.dim[1], (int)c->pad[0], 1, (int)c->k[0], (int)c->stride[0]);
    int Q = dt_conv_out_dim((int)l->in.dim[2], (int)c->pad[1], 1, (int)c->k[1], (int)c->stride[1]);
    if (P < 1 || Q < 1) {
        st = dt_set_error(DT_ERR_USAGE, "%s: a %lldx%lld window does not fit the %lldx%lld input",
                          l->where, (long long)c->k[0], (long long)c->k[1], (long long)l->in.dim[1],
                          (long long)l->in.dim[2]);
        goto out;
    }
    l->out = dt_shape_make(3, l->in.dim[0], P, Q, 0);
out:
    return st;
}

static dt_status build_global(struct dt_layer *l, const struct dt_layer_spec *spec,
                              const struct dt_job *job, int64_t num_classes)
{
    static const char *const known[] = {NULL};
    struct pool_cfg *c = (struct pool_cfg *)l->cfg;
    dt_status st;
    DT_CHECK(dt_layer_known(l, spec, known));
    DT_CHECK(dt_layer_want_image(l));
    if (l->in.dim[1] > 1024 || l->in.dim[2] > 1024 || l->in.dim[0] > INT_MAX) {
        st = dt_set_error(DT_ERR_BAD_DATA, "%s: global_avgpool takes images up to 1024x1024",
                          l->where);
        goto out;
    }
    c->k[0] = c->stride[0] = l->in.dim[1];
    c->k[1] = c->stride[1] = l->in.dim[2];
    l->out = dt_shape_make(1, l->in.dim[0], 0, 0, 0);
out:
    return st;
}

static dt_status max_fwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    struct dt_pool2d_shape s = shape_of(l, x->rows);
    return x->ops->maxpool2d_fwd(x->be, x->out, x->in, &s);
}

static dt_status max_bwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    struct dt_pool2d_shape s = shape_of(l, x->rows);
    return x->din ? x->ops->maxpool2d_bwd(x->be, x->din, x->dout, x->in, x->out, &s) : DT_OK;
}

static dt_status avg_fwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    struct dt_pool2d_shape s = shape_of(l, x->rows);
    return x->ops->avgpool2d_fwd(x->be, x->out, x->in, &s);
}

static dt_status avg_bwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    struct dt_pool2d_shape s = shape_of(l, x->rows);
    return x->din ? x->ops->avgpool2d_bwd(x->be, x->din, x->dout, &s) : DT_OK;
}

static void describe(const struct dt_layer *l, char *buf, size_t len)
{
    const struct pool_cfg *c = (const struct pool_cfg *)l->cfg;
    snprintf(buf, len, "k%lldx%lld s%lld p%lld", (long long)c->k[0], (long long)c->k[1],
             (long long)c->stride[0], (long long)c->pad[0]);
}

const struct dt_layer_kind dt_layer_maxpool2d = {
    .name = "maxpool2d",
    .doc = "maximum over windows (torch.nn.MaxPool2d)",
    .settings = "kernel: 2, stride: the kernel, padding: 0",
    .build = build_window,
    .fwd = max_fwd,
    .bwd = max_bwd,
    .describe = describe,
    .ops = {DT_OP_maxpool2d_fwd, DT_OP_maxpool2d_bwd, DT_OP_COUNT},
};

const struct dt_layer_kind dt_layer_avgpool2d = {
    .name = "avgpool2d",
    .doc = "mean over windows, padding counted (torch.nn.AvgPool2d)",
    .settings = "kernel: 2, stride: the kernel, padding: 0",
    .build = build_window,
    .fwd = avg_fwd,
    .bwd = avg_bwd,
    .describe = describe,
    .ops = {DT_OP_avgpool2d_fwd, DT_OP_avgpool2d_bwd, DT_OP_COUNT},
};

const struct dt_layer_kind dt_layer_global_avgpool = {
    .name = "global_avgpool",
    .doc = "mean of each channel: (C, H, W) to C values",
    .settings = "none",
    .build = build_global,
    .fwd = avg_fwd,
    .bwd = avg_bwd,
    .ops = {DT_OP_avgpool2d_fwd, DT_OP_avgpool2d_bwd, DT_OP_COUNT},
};
