/*
 * conv2d.c - 2-D convolution over (C, H, W) images, as torch.nn.Conv2d:
 * weight (out, C/groups, kh, kw), optional bias per output channel.
 *
 * Settings: out (channels), kernel (3, or [kh, kw]), stride (1),
 * padding (0), dilation (1), groups (1), bias (true). The backend's
 * convolution needs scratch (im2col columns on the CPU, the chosen
 * algorithms' workspace on cuDNN): the layer asks the backend once, for
 * the largest batch, and the model gives it that much of its arena.
 */
#include <limits.h>
#include <stdio.h>

#include "layer.h"

struct conv_cfg {
    int64_t out, k[2], stride[2], pad[2], dil[2], groups;
    int bias;
};

static struct dt_conv2d_shape shape_of(const struct dt_layer *l, int64_t rows)
{
    const struct conv_cfg *c = (const struct conv_cfg *)l->cfg;
    struct dt_conv2d_shape s = {
        .N = (int)rows,
        .C = (int)l->in.dim[0],
        .H = (int)l->in.dim[1],
        .W = (int)l->in.dim[2],
        .K = (int)c->out,
        .R = (int)c->k[0],
        .S = (int)c->k[1],
        .stride_h = (int)c->stride[0],
        .stride_w = (int)c->stride[1],
        .pad_h = (int)c->pad[0],
        .pad_w = (int)c->pad[1],
        .dil_h = (int)c->dil[0],
        .dil_w = (int)c->dil[1],
        .groups = (int)c->groups,
        .P = (int)l->out.dim[1],
        .Q = (int)l->out.dim[2],
    };
    return s;
}

static dt_status build(struct dt_layer *l, const struct dt_layer_spec *spec,
                       const struct dt_job *job, int64_t num_classes)
{
    static const char *const known[] = {"out",      "kernel", "stride", "padding",
                                        "dilation", "groups", "bias",   NULL};
    struct conv_cfg *c = (struct conv_cfg *)l->cfg;
    dt_status st;
    char s[64];
    DT_CHECK(dt_layer_known(l, spec, known));
    DT_CHECK(dt_layer_want_image(l));
    DT_CHECK(dt_layer_int(l, spec, "out", 0, 1, 65536, &c->out));
    if (c->out == 0) {
        st = dt_set_error(DT_ERR_USAGE, "%s: conv2d needs out (its output channels)", l->where);
        goto out;
    }
    DT_CHECK(dt_layer_int2(l, spec, "kernel", 3, 1, 1024, c->k));
    DT_CHECK(dt_layer_int2(l, spec, "stride", 1, 1, 1024, c->stride));
    DT_CHECK(dt_layer_int2(l, spec, "padding", 0, 0, 1024, c->pad));
    DT_CHECK(dt_layer_int2(l, spec, "dilation", 1, 1, 1024, c->dil));
    DT_CHECK(dt_layer_int(l, spec, "groups", 1, 1, 65536, &c->groups));
    DT_CHECK(dt_layer_bool(l, spec, "bias", 1, &c->bias));
    int64_t C = l->in.dim[0], H = l->in.dim[1], W = l->in.dim[2];
    if (C % c->groups || c->out % c->groups) {
        st = dt_set_error(DT_ERR_USAGE,
                          "%s: groups (%lld) must divide the input channels (%lld) and out (%lld)",
                          l->where, (long long)c->groups, (long long)C, (long long)c->out);
        goto out;
    }
    if (C > 65536 || H > INT_MAX / 4 || W > INT_MAX / 4) {
        st = dt_set_error(DT_ERR_BAD_DATA, "%s: an input of %s is more than conv2d takes", l->where,
                          dt_shape_format(&l->in, s, sizeof s));
        goto out;
    }
    int P =
        dt_conv_out_dim((int)H, (int)c->pad[0], (int)c->dil[0], (int)c->k[0], (int)c->stride[0]);
    int Q =
        dt_conv_out_dim((int)W, (int)c->pad[1], (int)c->dil[1], (int)c->k[1], (int)c->stride[1]);
    if (P < 1 || Q < 1) {
        st = dt_set_error(DT_ERR_USAGE,
                          "%s: a %lldx%lld kernel (dilation %lld) does not fit the %lldx%lld input "
                          "with padding %lld; lower kernel or raise padding",
                          l->where, (long long)c->k[0], (long long)c->k[1], (long long)c->dil[0],
                          (long long)H, (long long)W, (long long)c->pad[0]);
        goto out;
    }
    l->out = dt_shape_make(3, c->out, P, Q, 0);
    int64_t cg = C / c->groups, fan_in = cg * c->k[0] * c->k[1];
    dt_layer_param(l, "weight", dt_shape_make(4, c->out, cg, c->k[0], c->k[1]), DT_INIT_FAN_IN,
                   DT_GROUP_WEIGHT, fan_in, c->out / c->groups * c->k[0] * c->k[1]);
    if (c->bias)
        dt_layer_param(l, "bias", dt_shape_make(1, c->out, 0, 0, 0), DT_INIT_ZEROS, DT_GROUP_BIAS,
                       fan_in, c->out);
    l->flops = 2.0 * (double)fan_in * (double)c->out * (double)P * (double)Q;
out:
    return st;
}

static dt_status workspace(struct dt_layer *l, dt_backend_t *be, int64_t max_rows)
{
    struct dt_conv2d_shape s = shape_of(l, max_rows);
    size_t bytes = 0;
    if (be && dt_backend_ops(be)->conv2d_workspace) {
        dt_status st = dt_backend_ops(be)->conv2d_workspace(be, &s, &bytes);
        if (st != DT_OK)
            return dt_error_context(st, "%s: sizing the convolution's workspace", l->where);
    } else { /* the CPU's im2col columns of one image and group */
        bytes = (size_t)(s.C / s.groups) * (size_t)s.R * (size_t)s.S * (size_t)s.P * (size_t)s.Q *
                sizeof(float);
    }
    l->ws_fixed = bytes;
    l->ws_per_row = 0;
    return DT_OK;
}

static dt_status fwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    const struct conv_cfg *c = (const struct conv_cfg *)l->cfg;
    struct dt_conv2d_shape s = shape_of(l, x->rows);
    dt_status st = x->ops->conv2d_fwd(x->be, x->out, x->in, x->p[0], &s, x->ws, x->ws_bytes);
    if (st == DT_OK && c->bias)
        st = x->ops->channel_bias_fwd(x->be, x->out, x->p[1], s.N, s.K, s.P * s.Q);
    return st;
}

static dt_status bwd(struct dt_layer *l, const struct dt_layer_ctx *x)
{
    const struct conv_cfg *c = (const struct conv_cfg *)l->cfg;
    struct dt_conv2d_shape s = shape_of(l, x->rows);
    dt_status st = DT_OK;
    if (c->bias)
        st = x->ops->channel_bias_bwd(x->be, x->g[1], x->dout, s.N, s.K, s.P * s.Q);
    if (st == DT_OK)
        st = x->ops->conv2d_bwd_filter(x->be, x->g[0], x->dout, x->in, &s, x->ws, x->ws_bytes);
    if (st == DT_OK && x->din)
        st = x->ops->conv2d_bwd_data(x->be, x->din, x->dout, x->p[0], &s, x->ws, x->ws_bytes);
    return st;
}

static void describe(const struct dt_layer *l, char *buf, size_t len)
{
    const struct conv_cfg *c = (const struct conv_cfg *)l->cfg;
    snprintf(buf, len, "k%lldx%lld s%lld p%lld%s%s", (long long)c->k[0], (long long)c->k[1],
             (long long)c->stride[0], (long long)c->pad[0], c->groups > 1 ? " grouped" : "",
             c->bias ? "" : " no bias");
}

const struct dt_layer_kind dt_layer_conv2d = {
    .name = "conv2d",
    .doc = "2-D convolution over (channels, height, width) (torch.nn.Conv2d)",
    .settings = "out, kernel: 3, stride: 1, padding: 0, dilation: 1, groups: 1, bias: true",
    .build = build,
    .fwd = fwd,
    .bwd = bwd,
    .describe = describe,
    .workspace = workspace,
    .ops = {DT_OP_conv2d_workspace, DT_OP_conv2d_fwd, DT_OP_conv2d_bwd_data,
            DT_OP_conv2d_bwd_filter, DT_OP_channel_bias_fwd, DT_OP_channel_bias_bwd, DT_OP_COUNT},
    .output_free = 1,
};
