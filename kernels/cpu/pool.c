/*
 * pool.c - 2-D max and average pooling on the CPU (NCHW), forward and
 * backward. Global average pooling is average pooling with R = H, S = W.
 *
 * Padded positions never win a max and count as zeros in an average
 * (PyTorch's count_include_pad=True, divisor R*S). The max backward routes
 * each window's gradient to the first element in row-major window order
 * that equals the window's maximum y (so ties are deterministic), and sums
 * where windows overlap.
 *
 * The reference versions visit every window tap and test it against the
 * padding. The fast versions work one output row at a time: for each
 * window row and column tap they work out once which outputs the tap
 * meets inside the image, then run a plain loop over those outputs, which
 * the compiler vectorises for stride 1 and keeps branch-free otherwise.
 * The common 2x2 window at stride 2 has its own loops on blocks of
 * windows, their cells compared as vectors: the forward's max, and a
 * backward that writes every cell (the gradient at the first cell equal
 * to the max, 0 at the others) without branching on data.
 *
 * These ops have no parameters; outputs and input gradients (dx) are
 * WRITTEN (=).
 */
#include <math.h>
#include <string.h>

#include "kernels/ops_check.h"
#include "cpu_ops.h"

static dt_status check_pool(const char *op, const struct dt_pool2d_shape *s, const void *a,
                            const void *b)
{
    if (!s || !a || !b)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu %s: shape and tensors must not be NULL", op);
    return dt_check_pool2d("cpu", op, s);
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

/* Index within the (H, W) plane of the first element of output (p, q)'s
 * window, in row-major window order, that equals the window's maximum m;
 * -1 when none does (a window of NaNs). */
static long first_max(const float *xp, const struct dt_pool2d_shape *s, int p, int q, float m)
{
    int h0, h1, v0, v1;
    window(s, p, q, &h0, &h1, &v0, &v1);
    for (int h = h0; h < h1; h++)
        for (int v = v0; v < v1; v++)
            if (xp[(size_t)h * s->W + v] == m)
                return (long)h * s->W + v;
    return -1;
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
            for (int q = 0; q < s->Q; q++) {
                size_t o = (nc * s->P + p) * s->Q + q;
                long i = first_max(x + nc * HW, s, p, q, y[o]);
                if (i >= 0)
                    dx[nc * HW + (size_t)i] += dy[o];
            }
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

/* 2x2 windows at stride 2 without padding, one output row (input rows
 * x0, x1): each input is in one window, so the backward needs no sums.
 * Both passes work on blocks of 8 windows (16 columns) or 4, their cells
 * split into vectors of the windows' a, b (row x0) and c, d (row x1); a
 * block may overlap the one before (the same values again). */
#define EVEN8 ((i32x8){0, 2, 4, 6, 8, 10, 12, 14})
#define ODD8 ((i32x8){1, 3, 5, 7, 9, 11, 13, 15})
#define EVEN4 ((i32x4){0, 2, 4, 6})
#define ODD4 ((i32x4){1, 3, 5, 7})

/* a, b, c, d of the n windows from x0 and x1 (2n floats each) */
#define MAXPOOL2X2_CELLS(fv, n, EVEN, ODD)                                                         \
    fv p_, q_;                                                                                     \
    memcpy(&p_, x0, sizeof p_);                                                                    \
    memcpy(&q_, x0 + (n), sizeof q_);                                                              \
    fv a = __builtin_shuffle(p_, q_, EVEN), b = __builtin_shuffle(p_, q_, ODD);                    \
    memcpy(&p_, x1, sizeof p_);                                                                    \
    memcpy(&q_, x1 + (n), sizeof q_);                                                              \
    fv c = __builtin_shuffle(p_, q_, EVEN), d = __builtin_shuffle(p_, q_, ODD)

/* yr(n) = the windows' max as the scalar loop below takes it: each cell
 * replaces the max so far when greater (a select by mask), starting from
 * -inf, so NaN never wins. */
#define MAXPOOL2X2_FWD_BLOCK(name, fv, iv, n, EVEN, ODD)                                          \
    static inline __attribute__((always_inline)) void name(float *yr, const float *x0,           \
                                                           const float *x1)                      \
    {                                                                                            \
        MAXPOOL2X2_CELLS(fv, n, EVEN, ODD);                                                      \
        fv m = (fv){0} - (float)INFINITY;                                                        \
        iv k = a > m;                                                                            \
        m = (fv)(((iv)a & k) | ((iv)m & ~k));                                                    \
        k = b > m;                                                                               \
        m = (fv)(((iv)b & k) | ((iv)m & ~k));                                                    \
        k = c > m;                                                                               \
        m = (fv)(((iv)c & k) | ((iv)m & ~k));                                                    \
        k = d > m;                                                                               \
        m = (fv)(((iv)d & k) | ((iv)m & ~k));                                                    \
        memcpy(yr, &m, sizeof m);                                                                \
    }

MAXPOOL2X2_FWD_BLOCK(maxpool2x2_fwd8, f32x8, i32x8, 8, EVEN8, ODD8)
MAXPOOL2X2_FWD_BLOCK(maxpool2x2_fwd4, f32x4, i32x4, 4, EVEN4, ODD4)

/* Runs block8(at(j)) on each block of 8 windows of a row of Q and on the
 * last 8 again, or block4 on the first and the last 4 of a row of 4 to 7;
 * nothing on a row of fewer than 4 (the callers loop over those). */
#define MAXPOOL2X2_BLOCKS(Q, block8, block4, at)                                                   \
    do {                                                                                           \
        if ((Q) >= 8) {                                                                            \
            int j_ = 0;                                                                            \
            for (; j_ + 8 <= (Q); j_ += 8)                                                         \
                block8(at(j_));                                                                    \
            if (j_ < (Q))                                                                          \
                block8(at((Q) - 8));                                                               \
        } else if ((Q) >= 4) {                                                                     \
            block4(at(0));                                                                         \
            if ((Q) > 4)                                                                           \
                block4(at((Q) - 4));                                                               \
        }                                                                                          \
    } while (0)

#define FWD_AT(j) yr + (j), x0 + 2 * (j), x1 + 2 * (j)

static inline __attribute__((always_inline)) void maxpool2x2_fwd_row(float *yr, const float *x0, const float *x1, int Q)
{
    if (Q >= 4) {
        MAXPOOL2X2_BLOCKS(Q, maxpool2x2_fwd8, maxpool2x2_fwd4, FWD_AT);
        return;
    }
    for (int q = 0; q < Q; q++) {
        float a = x0[2 * q], b = x0[2 * q + 1], c = x1[2 * q], d = x1[2 * q + 1];
        float m = a > -INFINITY ? a : -INFINITY; /* NaN never wins, as in the reference */
        m = b > m ? b : m;
        m = c > m ? c : m;
        yr[q] = d > m ? d : m;
    }
}

/* d0, d1 (2n floats each) = each window's gradient at its first cell
 * equal to the max (a, b, c, d order) and 0 at the others, every cell
 * written. */
#define MAXPOOL2X2_BWD_BLOCK(name, fv, iv, n, EVEN, ODD, LO, HI)                               \
    static inline __attribute__((always_inline)) void name(float *d0, float *d1, const float *x0, \
                                                           const float *x1, const float *yr,   \
                                                           const float *dyr)                   \
    {                                                                                          \
        MAXPOOL2X2_CELLS(fv, n, EVEN, ODD);                                                    \
        fv m;                                                                                  \
        iv g;                                                                                  \
        memcpy(&m, yr, sizeof m);                                                              \
        memcpy(&g, dyr, sizeof g);                                                             \
        iv ea = a == m, eb = (b == m) & ~ea, taken = ea | eb;                                  \
        iv ec = (c == m) & ~taken, ed = (d == m) & ~(taken | ec);                              \
        iv va = g & ea, vb = g & eb, vc = g & ec, vd = g & ed;                                 \
        iv r0 = __builtin_shuffle(va, vb, LO), r1 = __builtin_shuffle(va, vb, HI);             \
        iv r2 = __builtin_shuffle(vc, vd, LO), r3 = __builtin_shuffle(vc, vd, HI);             \
        memcpy(d0, &r0, sizeof r0);                                                            \
        memcpy(d0 + (n), &r1, sizeof r1);                                                      \
        memcpy(d1, &r2, sizeof r2);                                                            \
        memcpy(d1 + (n), &r3, sizeof r3);                                                      \
    }

MAXPOOL2X2_BWD_BLOCK(maxpool2x2_bwd8, f32x8, i32x8, 8, EVEN8, ODD8,
                     ((i32x8){0, 8, 1, 9, 2, 10, 3, 11}), ((i32x8){4, 12, 5, 13, 6, 14, 7, 15}))
MAXPOOL2X2_BWD_BLOCK(maxpool2x2_bwd4, f32x4, i32x4, 4, EVEN4, ODD4, ((i32x4){0, 4, 1, 5}),
                     ((i32x4){2, 6, 3, 7}))

#define BWD_AT(j) d0 + 2 * (j), d1 + 2 * (j), x0 + 2 * (j), x1 + 2 * (j), yr + (j), dyr + (j)

/* One output row's backward (input rows d0, d1 of 2*Q columns, written
 * whole); rows of fewer than 4 windows window by window, the same choice
 * with selects. */
static inline __attribute__((always_inline)) void maxpool2x2_bwd_row(float *d0, float *d1, const float *x0, const float *x1,
                               const float *yr, const float *dyr, int Q)
{
    if (Q >= 4) {
        MAXPOOL2X2_BLOCKS(Q, maxpool2x2_bwd8, maxpool2x2_bwd4, BWD_AT);
        return;
    }
    for (int q = 0; q < Q; q++) {
        float m = yr[q], g = dyr[q];
        int ea = x0[2 * q] == m, eb = !ea && x0[2 * q + 1] == m;
        int ec = !ea && !eb && x1[2 * q] == m, ed = !ea && !eb && !ec && x1[2 * q + 1] == m;
        d0[2 * q] = ea ? g : 0.0f;
        d0[2 * q + 1] = eb ? g : 0.0f;
        d1[2 * q] = ec ? g : 0.0f;
        d1[2 * q + 1] = ed ? g : 0.0f;
    }
}

/* A window that is the whole image: global average pooling. */
static int is_global(const struct dt_pool2d_shape *s)
{
    return s->R == s->H && s->S == s->W && s->pad_h == 0 && s->pad_w == 0;
}

/* Sum of n floats, one float accumulator per lane. */
static inline __attribute__((always_inline)) float plane_sum(const float *v, size_t n)
{
    float acc[DT_CPU_LANES] = {0};
    size_t i = 0;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES)
        for (int k = 0; k < DT_CPU_LANES; k++)
            acc[k] += v[i + k];
    float s = 0.0f;
    for (; i < n; i++)
        s += v[i];
    for (int k = 0; k < DT_CPU_LANES; k++)
        s += acc[k];
    return s;
}

/* A pass over a block of the (n, c) planes, as on one thread. */
struct pool_job {
    const struct dt_pool2d_shape *s;
    float *y; /* y, or dx */
    const float *x, *dy, *yin;
};

static int is_2x2_stride2(const struct dt_pool2d_shape *s)
{
    return s->R == 2 && s->S == 2 && s->stride_h == 2 && s->stride_w == 2 && s->pad_h == 0 &&
           s->pad_w == 0;
}

DT_CPU_CLONES static void maxpool2d_fwd_planes(void *arg, size_t first, size_t end)
{
    const struct pool_job *j = arg;
    const struct dt_pool2d_shape *s = j->s;
    float *y = j->y;
    const float *x = j->x;
    const int W = s->W, Q = s->Q, sw = s->stride_w;
    for (size_t nc = first; nc < end; nc++) {
        const float *xp = x + nc * s->H * W; /* (H, W) */
        if (is_2x2_stride2(s)) {
            for (int p = 0; p < s->P; p++)
                maxpool2x2_fwd_row(y + (nc * s->P + p) * Q, xp + (size_t)2 * p * W,
                                   xp + (size_t)(2 * p + 1) * W, Q);
            continue;
        }
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
}

dt_status dt_cpu_maxpool2d_fwd(dt_backend_t *be, float *y, const float *x,
                               const struct dt_pool2d_shape *s)
{
    dt_status st = check_pool("maxpool2d_fwd", s, y, x);
    if (st != DT_OK)
        return st;
    struct pool_job j = {.s = s, .y = y, .x = x, .dy = NULL, .yin = NULL};
    dt_cpu_for(be, (size_t)s->N * s->C, 1 + DT_CPU_GRAIN / ((size_t)s->H * s->W + 1), maxpool2d_fwd_planes, &j);
    return DT_OK;
}

DT_CPU_CLONES static void maxpool2d_bwd_planes(void *arg, size_t first, size_t end)
{
    const struct pool_job *j = arg;
    const struct dt_pool2d_shape *s = j->s;
    float *dx = j->y;
    const float *x = j->x, *dy = j->dy, *y = j->yin;
    const size_t HW = (size_t)s->H * s->W, PQ = (size_t)s->P * s->Q;
    const int W = s->W;
    for (size_t nc = first; nc < end; nc++) {
        float *dxp = dx + nc * HW;
        const float *xp = x + nc * HW, *yp = y + nc * PQ, *dyp = dy + nc * PQ;
        if (is_2x2_stride2(s)) {
            if (2 * s->P < s->H || 2 * s->Q < W) /* an odd edge that no window covers */
                memset(dxp, 0, HW * sizeof *dxp);
            for (int p = 0; p < s->P; p++)
                maxpool2x2_bwd_row(dxp + (size_t)2 * p * W, dxp + (size_t)(2 * p + 1) * W,
                                   xp + (size_t)2 * p * W, xp + (size_t)(2 * p + 1) * W,
                                   yp + (size_t)p * s->Q, dyp + (size_t)p * s->Q, s->Q);
            continue;
        }
        memset(dxp, 0, HW * sizeof *dxp);
        for (int p = 0; p < s->P; p++)
            for (int q = 0; q < s->Q; q++) {
                long i = first_max(xp, s, p, q, yp[p * s->Q + q]);
                if (i >= 0)
                    dxp[i] += dyp[p * s->Q + q];
            }
    }
}

dt_status dt_cpu_maxpool2d_bwd(dt_backend_t *be, float *dx, const float *dy, const float *x,
                               const float *y, const struct dt_pool2d_shape *s)
{
    dt_status st = check_pool("maxpool2d_bwd", s, dx, dy);
    if (st == DT_OK && (!x || !y))
        st = dt_set_error(DT_ERR_INVALID_ARG, "cpu maxpool2d_bwd: x and y must not be NULL");
    if (st != DT_OK)
        return st;
    struct pool_job j = {.s = s, .y = dx, .x = x, .dy = dy, .yin = y};
    dt_cpu_for(be, (size_t)s->N * s->C, 1 + DT_CPU_GRAIN / ((size_t)s->H * s->W + 1), maxpool2d_bwd_planes, &j);
    return DT_OK;
}

DT_CPU_CLONES static void avgpool2d_fwd_planes(void *arg, size_t first, size_t end)
{
    const struct pool_job *j = arg;
    const struct dt_pool2d_shape *s = j->s;
    float *y = j->y;
    const float *x = j->x;
    const int W = s->W, Q = s->Q, sw = s->stride_w;
    const float inv = 1.0f / ((float)s->R * s->S);
    for (size_t nc = first; nc < end; nc++) {
        const float *xp = x + nc * s->H * W; /* (H, W) */
        if (is_global(s)) {
            y[nc] = plane_sum(xp, (size_t)s->H * W) * inv;
            continue;
        }
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
}

dt_status dt_cpu_avgpool2d_fwd(dt_backend_t *be, float *y, const float *x,
                               const struct dt_pool2d_shape *s)
{
    dt_status st = check_pool("avgpool2d_fwd", s, y, x);
    if (st != DT_OK)
        return st;
    struct pool_job j = {.s = s, .y = y, .x = x, .dy = NULL, .yin = NULL};
    dt_cpu_for(be, (size_t)s->N * s->C, 1 + DT_CPU_GRAIN / ((size_t)s->H * s->W + 1), avgpool2d_fwd_planes, &j);
    return DT_OK;
}

DT_CPU_CLONES static void avgpool2d_bwd_planes(void *arg, size_t first, size_t end)
{
    const struct pool_job *j = arg;
    const struct dt_pool2d_shape *s = j->s;
    float *dx = j->y;
    const float *dy = j->dy;
    const int W = s->W, Q = s->Q, sw = s->stride_w;
    const float inv = 1.0f / ((float)s->R * s->S);
    for (size_t nc = first; nc < end; nc++) {
        float *dxp = dx + nc * s->H * W; /* (H, W) */
        if (is_global(s)) {
            float g = dy[nc] * inv;
            for (size_t i = 0; i < (size_t)s->H * W; i++)
                dxp[i] = g;
            continue;
        }
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
}

dt_status dt_cpu_avgpool2d_bwd(dt_backend_t *be, float *dx, const float *dy,
                               const struct dt_pool2d_shape *s)
{
    dt_status st = check_pool("avgpool2d_bwd", s, dx, dy);
    if (st != DT_OK)
        return st;
    struct pool_job j = {.s = s, .y = dx, .x = NULL, .dy = dy, .yin = NULL};
    dt_cpu_for(be, (size_t)s->N * s->C, 1 + DT_CPU_GRAIN / ((size_t)s->H * s->W + 1), avgpool2d_bwd_planes, &j);
    return DT_OK;
}
