/*
 * pool.c - 2-D max and average pooling on the CPU (NCHW), forward and
 * backward. Global average pooling is average pooling with R = H, S = W.
 *
 * Padded positions never win a max and count as zeros in an average
 * (PyTorch's count_include_pad=True, divisor R*S). The max backward routes
 * each window's gradient to its first maximum in row-major window order,
 * found again from x (y is checked for presence only; recomputing keeps
 * ties deterministic), and sums where windows overlap.
 *
 * The reference versions visit every window tap and test it against the
 * padding. The fast versions work one output row at a time: for each
 * window row and column tap they work out once which outputs the tap
 * meets inside the image, then run a plain loop over those outputs, which
 * the compiler vectorises for stride 1 and keeps branch-free otherwise.
 *
 * These ops have no parameters; outputs and input gradients (dx) are
 * WRITTEN (=).
 */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"

static dt_status check_pool(const char *op, const struct dt_pool2d_shape *s, const void *a,
                            const void *b)
{
    if (!s || !a || !b)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu %s: shape and tensors must not be NULL", op);
    if (s->N < 1 || s->C < 1 || s->H < 1 || s->W < 1 || s->R < 1 || s->S < 1)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cpu %s: sizes must be >= 1 (N=%d C=%d H=%d W=%d R=%d S=%d)", op, s->N,
                            s->C, s->H, s->W, s->R, s->S);
    if (s->stride_h < 1 || s->stride_w < 1 || s->pad_h < 0 || s->pad_w < 0 || s->pad_h >= s->R ||
        s->pad_w >= s->S)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cpu %s: stride must be >= 1 and padding in [0, window) (stride %dx%d, "
                            "padding %dx%d, window %dx%d)",
                            op, s->stride_h, s->stride_w, s->pad_h, s->pad_w, s->R, s->S);
    int P = dt_conv_out_dim(s->H, s->pad_h, 1, s->R, s->stride_h);
    int Q = dt_conv_out_dim(s->W, s->pad_w, 1, s->S, s->stride_w);
    if (P < 1 || Q < 1)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cpu %s: a %dx%d window does not fit the %dx%d input padded by %dx%d",
                            op, s->R, s->S, s->H, s->W, s->pad_h, s->pad_w);
    if (s->P != P || s->Q != Q)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cpu %s: output is %dx%d but the shape says %dx%d (use "
                            "dt_conv_out_dim)",
                            op, P, Q, s->P, s->Q);
    return DT_OK;
}

/* The window of output (p, q): rows [h0, h1), columns [v0, v1) clipped
 * to the image. */
static void window(const struct dt_pool2d_shape *s, int p, int q, int *h0, int *h1, int *v0,
                   int *v1)
{
    int h = p * s->stride_h - s->pad_h, v = q * s->stride_w - s->pad_w;
    *h0 = h < 0 ? 0 : h;
    *h1 = h + s->R > s->H ? s->H : h + s->R;
    *v0 = v < 0 ? 0 : v;
    *v1 = v + s->S > s->W ? s->W : v + s->S;
}

/* Index within the (H, W) plane of the first maximum of output (p, q)'s
 * window, in row-major window order. */
static size_t argmax(const float *xp, const struct dt_pool2d_shape *s, int p, int q)
{
    int h0, h1, v0, v1;
    window(s, p, q, &h0, &h1, &v0, &v1);
    size_t best = (size_t)h0 * s->W + v0;
    for (int h = h0; h < h1; h++)
        for (int v = v0; v < v1; v++)
            if (xp[(size_t)h * s->W + v] > xp[best])
                best = (size_t)h * s->W + v;
    return best;
}

/* ---- reference ------------------------------------------------------- */

/* y(n,c,p,q) = max over the window's taps inside the image of x(n,c,h,v) */
dt_status dt_cpu_maxpool2d_fwd_ref(dt_backend_t *be, float *y, const float *x,
                                   const struct dt_pool2d_shape *s)
{
    dt_status st = check_pool("maxpool2d_fwd", s, y, x);
    if (st != DT_OK)
        return st;
    for (size_t nc = 0; nc < (size_t)s->N * s->C; nc++)
        for (int p = 0; p < s->P; p++)
            for (int q = 0; q < s->Q; q++) {
                float m = -INFINITY;
                for (int r = 0; r < s->R; r++)
                    for (int t = 0; t < s->S; t++) {
                        int h = p * s->stride_h - s->pad_h + r, v = q * s->stride_w - s->pad_w + t;
                        if (h >= 0 && h < s->H && v >= 0 && v < s->W &&
                            x[(nc * s->H + h) * s->W + v] > m)
                            m = x[(nc * s->H + h) * s->W + v];
                    }
                y[(nc * s->P + p) * s->Q + q] = m;
            }
    return DT_OK;
}

/* dx(n,c,h,v) = sum of dy(n,c,p,q) over the windows whose first maximum
 * is (h, v) */
dt_status dt_cpu_maxpool2d_bwd_ref(dt_backend_t *be, float *dx, const float *dy, const float *x,
                                   const float *y, const struct dt_pool2d_shape *s)
{
    dt_status st = check_pool("maxpool2d_bwd", s, dx, dy);
    if (st == DT_OK && (!x || !y))
        st = dt_set_error(DT_ERR_INVALID_ARG, "cpu maxpool2d_bwd: x and y must not be NULL");
    if (st != DT_OK)
        return st;
    size_t HW = (size_t)s->H * s->W;
    for (size_t nc = 0; nc < (size_t)s->N * s->C; nc++) {
        for (size_t i = 0; i < HW; i++)
            dx[nc * HW + i] = 0.0f;
        for (int p = 0; p < s->P; p++)
            for (int q = 0; q < s->Q; q++)
                dx[nc * HW + argmax(x + nc * HW, s, p, q)] += dy[(nc * s->P + p) * s->Q + q];
    }
    return DT_OK;
}

/* y(n,c,p,q) = sum over the window's taps inside the image of x / (R*S) */
dt_status dt_cpu_avgpool2d_fwd_ref(dt_backend_t *be, float *y, const float *x,
                                   const struct dt_pool2d_shape *s)
{
    dt_status st = check_pool("avgpool2d_fwd", s, y, x);
    if (st != DT_OK)
        return st;
    float inv = 1.0f / ((float)s->R * s->S);
    for (size_t nc = 0; nc < (size_t)s->N * s->C; nc++)
        for (int p = 0; p < s->P; p++)
            for (int q = 0; q < s->Q; q++) {
                float sum = 0.0f;
                for (int r = 0; r < s->R; r++)
                    for (int t = 0; t < s->S; t++) {
                        int h = p * s->stride_h - s->pad_h + r, v = q * s->stride_w - s->pad_w + t;
                        if (h >= 0 && h < s->H && v >= 0 && v < s->W)
                            sum += x[(nc * s->H + h) * s->W + v];
                    }
                y[(nc * s->P + p) * s->Q + q] = sum * inv;
            }
    return DT_OK;
}

/* dx(n,c,h,v) = sum over the windows holding (h, v) of dy(n,c,p,q) / (R*S) */
dt_status dt_cpu_avgpool2d_bwd_ref(dt_backend_t *be, float *dx, const float *dy,
                                   const struct dt_pool2d_shape *s)
{
    dt_status st = check_pool("avgpool2d_bwd", s, dx, dy);
    if (st != DT_OK)
        return st;
    float inv = 1.0f / ((float)s->R * s->S);
    size_t HW = (size_t)s->H * s->W;
    for (size_t nc = 0; nc < (size_t)s->N * s->C; nc++) {
        for (size_t i = 0; i < HW; i++)
            dx[nc * HW + i] = 0.0f;
        for (int p = 0; p < s->P; p++)
            for (int q = 0; q < s->Q; q++) {
                int h0, h1, v0, v1;
                window(s, p, q, &h0, &h1, &v0, &v1);
                for (int h = h0; h < h1; h++)
                    for (int v = v0; v < v1; v++)
                        dx[nc * HW + (size_t)h * s->W + v] += dy[(nc * s->P + p) * s->Q + q] * inv;
            }
    }
    return DT_OK;
}

/* ---- fast ------------------------------------------------------------ */

/* The outputs [*lo, *hi) of a row whose column tap t lands inside the
 * image, reading input column q*stride + off (off = t - pad). */
static void tap_range(int off, int stride, int W, int Q, int *lo, int *hi)
{
    int a = off >= 0 ? 0 : (-off + stride - 1) / stride;
    int b = W - off <= 0 ? 0 : (W - off + stride - 1) / stride;
    if (b > Q)
        b = Q;
    if (a > b)
        a = b;
    *lo = a;
    *hi = b;
}

/* Window rows [*r0, *r1) of output row p that fall inside the image. */
static void row_taps(const struct dt_pool2d_shape *s, int p, int *r0, int *r1)
{
    int h = p * s->stride_h - s->pad_h;
    *r0 = h < 0 ? -h : 0;
    *r1 = h + s->R > s->H ? s->H - h : s->R;
}

dt_status dt_cpu_maxpool2d_fwd(dt_backend_t *be, float *y, const float *x,
                               const struct dt_pool2d_shape *s)
{
    dt_status st = check_pool("maxpool2d_fwd", s, y, x);
    if (st != DT_OK)
        return st;
    const int W = s->W, Q = s->Q, sw = s->stride_w;
    for (size_t nc = 0; nc < (size_t)s->N * s->C; nc++) {
        const float *xp = x + nc * s->H * W; /* (H, W) */
        for (int p = 0; p < s->P; p++) {
            float *yr = y + (nc * s->P + p) * Q; /* (Q) */
            for (int q = 0; q < Q; q++)
                yr[q] = -INFINITY;
            int r0, r1;
            row_taps(s, p, &r0, &r1);
            for (int r = r0; r < r1; r++) {
                const float *xr = xp + (size_t)(p * s->stride_h - s->pad_h + r) * W; /* (W) */
                for (int t = 0; t < s->S; t++) {
                    int off = t - s->pad_w, lo, hi;
                    tap_range(off, sw, W, Q, &lo, &hi);
                    for (int q = lo; q < hi; q++) {
                        float v = xr[q * sw + off];
                        yr[q] = v > yr[q] ? v : yr[q];
                    }
                }
            }
        }
    }
    return DT_OK;
}

dt_status dt_cpu_maxpool2d_bwd(dt_backend_t *be, float *dx, const float *dy, const float *x,
                               const float *y, const struct dt_pool2d_shape *s)
{
    dt_status st = check_pool("maxpool2d_bwd", s, dx, dy);
    if (st == DT_OK && (!x || !y))
        st = dt_set_error(DT_ERR_INVALID_ARG, "cpu maxpool2d_bwd: x and y must not be NULL");
    if (st != DT_OK)
        return st;
    size_t HW = (size_t)s->H * s->W;
    const int overlap = s->stride_h < s->R || s->stride_w < s->S;
    for (size_t nc = 0; nc < (size_t)s->N * s->C; nc++) {
        float *dxp = dx + nc * HW;
        const float *xp = x + nc * HW, *dyp = dy + nc * s->P * s->Q;
        memset(dxp, 0, HW * sizeof *dxp);
        for (int p = 0; p < s->P; p++)
            for (int q = 0; q < s->Q; q++) {
                size_t i = argmax(xp, s, p, q);
                /* without overlap each input has one window: no read-modify-write chain */
                if (overlap)
                    dxp[i] += dyp[p * s->Q + q];
                else
                    dxp[i] = dyp[p * s->Q + q];
            }
    }
    return DT_OK;
}

dt_status dt_cpu_avgpool2d_fwd(dt_backend_t *be, float *y, const float *x,
                               const struct dt_pool2d_shape *s)
{
    dt_status st = check_pool("avgpool2d_fwd", s, y, x);
    if (st != DT_OK)
        return st;
    const int W = s->W, Q = s->Q, sw = s->stride_w;
    const float inv = 1.0f / ((float)s->R * s->S);
    for (size_t nc = 0; nc < (size_t)s->N * s->C; nc++) {
        const float *xp = x + nc * s->H * W; /* (H, W) */
        for (int p = 0; p < s->P; p++) {
            float *yr = y + (nc * s->P + p) * Q; /* (Q) */
            for (int q = 0; q < Q; q++)
                yr[q] = 0.0f;
            int r0, r1;
            row_taps(s, p, &r0, &r1);
            for (int r = r0; r < r1; r++) {
                const float *xr = xp + (size_t)(p * s->stride_h - s->pad_h + r) * W; /* (W) */
                for (int t = 0; t < s->S; t++) {
                    int off = t - s->pad_w, lo, hi;
                    tap_range(off, sw, W, Q, &lo, &hi);
                    for (int q = lo; q < hi; q++)
                        yr[q] += xr[q * sw + off];
                }
            }
            for (int q = 0; q < Q; q++)
                yr[q] *= inv;
        }
    }
    return DT_OK;
}

dt_status dt_cpu_avgpool2d_bwd(dt_backend_t *be, float *dx, const float *dy,
                               const struct dt_pool2d_shape *s)
{
    dt_status st = check_pool("avgpool2d_bwd", s, dx, dy);
    if (st != DT_OK)
        return st;
    const int W = s->W, Q = s->Q, sw = s->stride_w;
    const float inv = 1.0f / ((float)s->R * s->S);
    for (size_t nc = 0; nc < (size_t)s->N * s->C; nc++) {
        float *dxp = dx + nc * s->H * W; /* (H, W) */
        memset(dxp, 0, (size_t)s->H * W * sizeof *dxp);
        for (int p = 0; p < s->P; p++) {
            const float *dyr = dy + (nc * s->P + p) * Q; /* (Q) */
            int r0, r1;
            row_taps(s, p, &r0, &r1);
            for (int r = r0; r < r1; r++) {
                float *dxr = dxp + (size_t)(p * s->stride_h - s->pad_h + r) * W; /* (W) */
                for (int t = 0; t < s->S; t++) {
                    int off = t - s->pad_w, lo, hi;
                    tap_range(off, sw, W, Q, &lo, &hi);
                    for (int q = lo; q < hi; q++)
                        dxr[q * sw + off] += dyr[q] * inv;
                }
            }
        }
    }
    return DT_OK;
}
