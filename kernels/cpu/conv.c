/*
 * conv.c - 2-D convolution on the CPU (NCHW, cross-correlation, with
 * stride, padding, dilation and groups), forward and both backward passes.
 *
 * The reference versions are the seven nested loops of the definition,
 * one output (or one input/filter gradient) element at a time.
 *
 * The fast versions lower each (image, group) to GEMMs through im2col:
 * the column matrix col(Cg*R*S, P*Q) holds, for each filter tap (c, r, s),
 * the input pixels that tap meets at every output position (zero where the
 * tap falls in the padding). Then
 *   forward      y_g(Kg, PQ)      = w_g(Kg, CgRS) . col
 *   backward-data  dcol(CgRS, PQ) = w_g^T . dy_g, scattered back by col2im
 *   backward-filter dw_g^T(CgRS, Kg) += col . dy_g^T  (sgemm with beta = 1),
 *                  summed per chunk of images and added to dw transposed
 * At vertical stride 1 with a filter taller than one row, all three
 * passes lower by rows instead (rows() below): a matrix of the input's
 * padded rows for each (c, s), in which filter row r's part of col is a
 * window read in place, so the copy (and rows_back's scatter) is 1/R of
 * im2col's, and each product becomes R products over Cg*S terms (or, for
 * the input gradient, R products added into overlapping windows).
 * Depthwise convolutions there (one input channel and at most TAPS_MAX_KG
 * filters per group) lower by rows too, however narrow the filter, and
 * their products, R*S terms per output, run as vectorised weighted sums
 * of the row matrix's windows instead of BLAS calls (taps_* below).
 * At stride 1 with "same" padding (an odd filter padded by half its size,
 * not depthwise), all three passes run as direct convolutions instead
 * (conv_direct.c), with no BLAS call.
 * The column matrix of one image lives in the caller's workspace
 * (conv2d_workspace says how big); forward and the input gradient by
 * rows also regroup the filter, and the filter gradient keeps one partial
 * sum per chunk of images, both allocated per call. A 1x1 filter with
 * stride 1 and no padding needs no columns: the image itself is col.
 * im2col and col2im copy whole output rows, with the padded ends filled
 * or skipped once per row rather than tested per element; at stride 1 with
 * an output as wide as the input, and at stride 2 with an output half the
 * input each way (through the input's four phases), each tap is one long
 * copy.
 *
 * With train.precision bf16 or fp16 the GEMM operands (x or dy, and w)
 * are rounded to that type first (dt_cpu_operand), as linear.c does; the
 * reference rounds the same operands, so both see the same numbers.
 *
 * The filter gradient (dw) ACCUMULATES (+=); the input gradient (dx) and
 * the output (y) are WRITTEN (=).
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "kernels/ops_check.h"
#include "cpu_ops.h"

/* Scratch slots of the rounded operands (shared with linear.c's use). */
enum { OPERAND_X, OPERAND_W, OPERAND_DY };

static dt_status check_shape(const char *op, const struct dt_conv2d_shape *s)
{
    dt_status st = dt_check_conv2d("cpu", op, s);
    if (st != DT_OK)
        return st;
    long long cols = (long long)(s->C / s->groups) * s->R * s->S * s->P * s->Q;
    if (cols > INT_MAX || (long long)s->H * s->W > INT_MAX)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cpu %s: one image's column matrix (%lld values) is too large", op,
                            cols);
    return DT_OK;
}

static dt_status check_ptrs(const char *op, const void *a, const void *b, const void *c)
{
    if (!a || !b || !c)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu %s: tensors must not be NULL", op);
    return DT_OK;
}

static size_t x_size(const struct dt_conv2d_shape *s) { return (size_t)s->N * s->C * s->H * s->W; }
static size_t y_size(const struct dt_conv2d_shape *s) { return (size_t)s->N * s->K * s->P * s->Q; }
static size_t w_size(const struct dt_conv2d_shape *s)
{
    return (size_t)s->K * (s->C / s->groups) * s->R * s->S;
}

/* The fast path needs no column matrix: a 1x1 filter, stride 1, no padding. */
static int is_pointwise(const struct dt_conv2d_shape *s)
{
    return s->R == 1 && s->S == 1 && s->stride_h == 1 && s->stride_w == 1 && s->pad_h == 0 &&
           s->pad_w == 0;
}

/* The three passes lower by rows (see rows() below) when the filter is
 * taller than one row at vertical stride 1 and each row product has at
 * least ROWS_MIN_INNER terms: fewer and the thin products lose to one
 * over the whole column matrix (one input channel, 3x3: 0.8 of im2col's
 * speed). */
#define ROWS_MIN_INNER 16

/* Depthwise convolutions (one input channel per group, a few filters per
 * group, at most TAPS_MAX taps) lower by rows too, but their products run
 * here instead of in BLAS (taps_* below): a product per (image, channel)
 * with 9 terms costs BLAS more in calls than in arithmetic. */
#define TAPS_MAX_KG 8
#define TAPS_MAX 64

static int by_taps(const struct dt_conv2d_shape *s)
{
    return s->stride_h == 1 && s->R > 1 && s->C == s->groups && s->K / s->groups <= TAPS_MAX_KG &&
           s->R * s->S <= TAPS_MAX;
}

static int by_rows(const struct dt_conv2d_shape *s)
{
    return (s->stride_h == 1 && s->R > 1 && (s->C / s->groups) * s->S >= ROWS_MIN_INNER) ||
           by_taps(s);
}

/* The three passes run as direct convolutions (conv_direct.c) at stride
 * 1 with "same" padding, on CPUs that run them, except depthwise ones
 * (by_taps). */
static int direct(const struct dt_conv2d_shape *s)
{
    return dt_cpu_conv_direct_ok(s) && !by_taps(s);
}

/* Padded rows of the row matrix: output row p meets padded row p + r*dil_h. */
static int rows_tall(const struct dt_conv2d_shape *s) { return s->P + s->dil_h * (s->R - 1); }

/* Stride 2 with an output half the input's size each way (H and W even)
 * and a filter of at least 3x3: im2col and col2im go through the input's
 * four phases (even and odd rows and columns), in which each tap's column
 * row is one phase shifted by whole rows and columns (phases() below). */
static int phase_ok(const struct dt_conv2d_shape *s)
{
    return s->stride_h == 2 && s->stride_w == 2 && s->dil_h == 1 && s->dil_w == 1 &&
           s->H % 2 == 0 && s->W % 2 == 0 && s->P * 2 == s->H && s->Q * 2 == s->W && s->R >= 3 &&
           s->S >= 3;
}

/* Bytes of one image's column matrix (the larger of im2col's and the row
 * matrix where both are used; with the phases after the columns where
 * phase_ok), 0 for the pointwise case. */
static size_t fast_ws_bytes(const struct dt_conv2d_shape *s)
{
    if (is_pointwise(s))
        return 0;
    size_t cols = (size_t)(s->C / s->groups) * s->R * s->S * s->P * s->Q;
    if (phase_ok(s))
        cols += (size_t)(s->C / s->groups) * s->H * s->W;
    size_t rows = by_rows(s) ? (size_t)(s->C / s->groups) * s->S * rows_tall(s) * s->Q : 0;
    if (cols < rows)
        cols = rows;
    if (direct(s) && cols < dt_cpu_conv_direct_ws(s))
        cols = dt_cpu_conv_direct_ws(s);
    return cols * sizeof(float);
}

/* ---- reference ------------------------------------------------------- */

dt_status dt_cpu_conv2d_workspace_ref(dt_backend_t *be, const struct dt_conv2d_shape *s,
                                      size_t *bytes)
{
    dt_status st = check_shape("conv2d_workspace", s);
    if (st == DT_OK && !bytes)
        st = dt_set_error(DT_ERR_INVALID_ARG, "cpu conv2d_workspace: bytes must not be NULL");
    if (st == DT_OK)
        *bytes = 0; /* the reference loops need no scratch */
    return st;
}

/* y(n,k,p,q) = sum over c in k's group, r, s of
 *   x(n, c, p*sh - ph + r*dh, q*sw - pw + s*dw) * w(k, c - group start, r, s) */
dt_status dt_cpu_conv2d_fwd_ref(dt_backend_t *be, float *y, const float *x, const float *w,
                                const struct dt_conv2d_shape *s, void *ws, size_t ws_bytes)
{
    dt_status st = check_shape("conv2d_fwd", s);
    if (st == DT_OK)
        st = check_ptrs("conv2d_fwd", y, x, w);
    if (st == DT_OK)
        st = dt_cpu_operand(be, OPERAND_X, x, x_size(s), &x);
    if (st == DT_OK)
        st = dt_cpu_operand(be, OPERAND_W, w, w_size(s), &w);
    if (st != DT_OK)
        return st;
    int Cg = s->C / s->groups, Kg = s->K / s->groups;
    for (int n = 0; n < s->N; n++)
        for (int k = 0; k < s->K; k++) {
            int c0 = k / Kg * Cg;
            for (int p = 0; p < s->P; p++)
                for (int q = 0; q < s->Q; q++) {
                    float acc = 0.0f;
                    for (int c = 0; c < Cg; c++)
                        for (int r = 0; r < s->R; r++)
                            for (int t = 0; t < s->S; t++) {
                                int h = p * s->stride_h - s->pad_h + r * s->dil_h;
                                int v = q * s->stride_w - s->pad_w + t * s->dil_w;
                                if (h < 0 || h >= s->H || v < 0 || v >= s->W)
                                    continue;
                                acc += x[(((size_t)n * s->C + c0 + c) * s->H + h) * s->W + v] *
                                       w[(((size_t)k * Cg + c) * s->R + r) * s->S + t];
                            }
                    y[(((size_t)n * s->K + k) * s->P + p) * s->Q + q] = acc;
                }
        }
    return DT_OK;
}

/* dx(n,c,h,v) = sum over k in c's group, r, s, and the (p, q) whose tap
 * (r, s) lands on (h, v), of dy(n,k,p,q) * w(k, c - group start, r, s) */
dt_status dt_cpu_conv2d_bwd_data_ref(dt_backend_t *be, float *dx, const float *dy, const float *w,
                                     const struct dt_conv2d_shape *s, void *ws, size_t ws_bytes)
{
    dt_status st = check_shape("conv2d_bwd_data", s);
    if (st == DT_OK)
        st = check_ptrs("conv2d_bwd_data", dx, dy, w);
    if (st == DT_OK)
        st = dt_cpu_operand(be, OPERAND_DY, dy, y_size(s), &dy);
    if (st == DT_OK)
        st = dt_cpu_operand(be, OPERAND_W, w, w_size(s), &w);
    if (st != DT_OK)
        return st;
    int Cg = s->C / s->groups, Kg = s->K / s->groups;
    for (int n = 0; n < s->N; n++)
        for (int c = 0; c < s->C; c++) {
            int g = c / Cg, cg = c % Cg;
            for (int h = 0; h < s->H; h++)
                for (int v = 0; v < s->W; v++) {
                    float acc = 0.0f;
                    for (int k = g * Kg; k < (g + 1) * Kg; k++)
                        for (int r = 0; r < s->R; r++)
                            for (int t = 0; t < s->S; t++) {
                                int ph = h + s->pad_h - r * s->dil_h; /* = p * stride_h */
                                int pw = v + s->pad_w - t * s->dil_w;
                                if (ph < 0 || pw < 0 || ph % s->stride_h || pw % s->stride_w)
                                    continue;
                                int p = ph / s->stride_h, q = pw / s->stride_w;
                                if (p >= s->P || q >= s->Q)
                                    continue;
                                acc += dy[(((size_t)n * s->K + k) * s->P + p) * s->Q + q] *
                                       w[(((size_t)k * Cg + cg) * s->R + r) * s->S + t];
                            }
                    dx[(((size_t)n * s->C + c) * s->H + h) * s->W + v] = acc;
                }
        }
    return DT_OK;
}

/* dw(k,c,r,s) += sum over n, p, q of dy(n,k,p,q) * x(n, group start + c,
 * p*sh - ph + r*dh, q*sw - pw + s*dw) */
dt_status dt_cpu_conv2d_bwd_filter_ref(dt_backend_t *be, float *dw, const float *dy, const float *x,
                                       const struct dt_conv2d_shape *s, void *ws, size_t ws_bytes)
{
    dt_status st = check_shape("conv2d_bwd_filter", s);
    if (st == DT_OK)
        st = check_ptrs("conv2d_bwd_filter", dw, dy, x);
    if (st == DT_OK)
        st = dt_cpu_operand(be, OPERAND_DY, dy, y_size(s), &dy);
    if (st == DT_OK)
        st = dt_cpu_operand(be, OPERAND_X, x, x_size(s), &x);
    if (st != DT_OK)
        return st;
    int Cg = s->C / s->groups, Kg = s->K / s->groups;
    for (int k = 0; k < s->K; k++) {
        int c0 = k / Kg * Cg;
        for (int c = 0; c < Cg; c++)
            for (int r = 0; r < s->R; r++)
                for (int t = 0; t < s->S; t++) {
                    float acc = 0.0f;
                    for (int n = 0; n < s->N; n++)
                        for (int p = 0; p < s->P; p++)
                            for (int q = 0; q < s->Q; q++) {
                                int h = p * s->stride_h - s->pad_h + r * s->dil_h;
                                int v = q * s->stride_w - s->pad_w + t * s->dil_w;
                                if (h < 0 || h >= s->H || v < 0 || v >= s->W)
                                    continue;
                                acc += dy[(((size_t)n * s->K + k) * s->P + p) * s->Q + q] *
                                       x[(((size_t)n * s->C + c0 + c) * s->H + h) * s->W + v];
                            }
                    dw[(((size_t)k * Cg + c) * s->R + r) * s->S + t] += acc;
                }
    }
    return DT_OK;
}

/* ---- fast ------------------------------------------------------------ */

/* The output columns [*lo, *hi) whose tap at input offset `off`
 * (= tap * dil - pad) lands inside [0, W), for outputs 0..Q-1 at `stride`. */
static inline __attribute__((always_inline)) void tap_range(int off, int stride, int W, int Q, int *lo, int *hi)
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

/* Short copies in blocks of this many floats (one SSE register). */
#define SHORT_BLOCK 4

/* d(n) = a(n). Rows are short (one output row), so an inline loop beats a
 * call to memcpy: blocks of DT_CPU_LANES, then of SHORT_BLOCK, and the
 * last SHORT_BLOCK again (overlapping) instead of a scalar tail. d and a
 * do not overlap. */
static inline __attribute__((always_inline)) void copy_row(float *d, const float *a, int n)
{
    int i = 0;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES) {
        float t[DT_CPU_LANES];
        for (int k = 0; k < DT_CPU_LANES; k++)
            t[k] = a[i + k];
        for (int k = 0; k < DT_CPU_LANES; k++)
            d[i + k] = t[k];
    }
    for (; i + SHORT_BLOCK <= n; i += SHORT_BLOCK) {
        float t[SHORT_BLOCK];
        for (int k = 0; k < SHORT_BLOCK; k++)
            t[k] = a[i + k];
        for (int k = 0; k < SHORT_BLOCK; k++)
            d[i + k] = t[k];
    }
    if (i < n && n >= SHORT_BLOCK) {
        float t[SHORT_BLOCK];
        for (int k = 0; k < SHORT_BLOCK; k++)
            t[k] = a[n - SHORT_BLOCK + k];
        for (int k = 0; k < SHORT_BLOCK; k++)
            d[n - SHORT_BLOCK + k] = t[k];
        return;
    }
    for (; i < n; i++)
        d[i] = a[i];
}

/* d(n) = every second float of a: d[i] = a[2i], eight at a time from two
 * loads and one shuffle, the tail as the last eight again. No load reads
 * a[2n - 1] (which may lie past the image). */
static inline __attribute__((always_inline)) void copy_row_stride2(float *d, const float *a, int n)
{
    const i32x8 even = {0, 2, 4, 6, 8, 10, 12, 14};
    int i = 0;
    for (; i + 9 <= n; i += 8) {
        f32x8 lo, hi;
        memcpy(&lo, a + 2 * i, sizeof lo);
        memcpy(&hi, a + 2 * i + 8, sizeof hi);
        f32x8 v = __builtin_shuffle(lo, hi, even);
        memcpy(d + i, &v, sizeof v);
    }
    if (i < n && n >= 9) {
        /* the last eight again, from a[2n - 17] to a[2n - 2]: odd lanes */
        const i32x8 odd = {1, 3, 5, 7, 9, 11, 13, 15};
        f32x8 lo, hi;
        memcpy(&lo, a + 2 * n - 17, sizeof lo);
        memcpy(&hi, a + 2 * n - 9, sizeof hi);
        f32x8 v = __builtin_shuffle(lo, hi, odd);
        memcpy(d + n - 8, &v, sizeof v);
        return;
    }
    for (; i < n; i++)
        d[i] = a[2 * i];
}

/* A strided output row: d[q] = a[q * stride]. */
static inline __attribute__((always_inline)) void copy_row_strided(float *d, const float *a, int n,
                                                                   int stride)
{
    if (stride == 1)
        copy_row(d, a, n);
    else if (stride == 2)
        copy_row_stride2(d, a, n);
    else
        for (int q = 0; q < n; q++)
            d[q] = a[q * stride];
}

/* dst(Q) = row h of the plane xc(H, W) at the output columns, tap offset
 * ow: columns [qlo, qhi) from the image, the rest (all of it when h is
 * outside the image) zero. */
static inline __attribute__((always_inline)) void gather_row(float *dst, const float *xc, int h,
                                                             const struct dt_conv2d_shape *s,
                                                             int qlo, int qhi, int ow)
{
    const int Q = s->Q, sw = s->stride_w;
    if (h < 0 || h >= s->H || qlo == qhi) {
        memset(dst, 0, (size_t)Q * sizeof *dst);
        return;
    }
    const float *src = xc + (size_t)h * s->W; /* (W) */
    for (int q = 0; q < qlo; q++)
        dst[q] = 0.0f;
    copy_row_strided(dst + qlo, src + qlo * sw + ow, qhi - qlo, sw);
    for (int q = qhi; q < Q; q++)
        dst[q] = 0.0f;
}

/* The flat path of im2col and col2im: stride 1 and an output as wide as
 * the input (Q == W, a "same" convolution). Then a tap's whole column row
 * is the image shifted by one flat offset, so it is one long copy (or
 * add), and only the columns the shift wraps across the image's edge, and
 * the rows outside it, need fixing. */
static int flat_ok(const struct dt_conv2d_shape *s)
{
    return s->stride_h == 1 && s->stride_w == 1 && s->Q == s->W;
}

/* A tap whose column row is its source plane shifted by one flat offset:
 * valid in rows [plo, phi) and columns [qlo, qhi) of the (P, Q) row; the
 * flat range [i0, i1) of the row that maps inside the source, at row
 * index + delta; meets 0 when nothing does. */
struct shift {
    int plo, phi, qlo, qhi, meets;
    long i0, i1, delta;
};

/* Completes t from its valid rows and columns, its flat offset, the row's
 * width Q and the source plane's size. */
static inline __attribute__((always_inline)) struct shift shift_done(struct shift t, long delta, int Q,
                                                                     long source)
{
    t.meets = 0;
    if (t.plo >= t.phi || t.qlo >= t.qhi)
        return t;
    t.delta = delta;
    t.i0 = (long)t.plo * Q;
    t.i1 = (long)t.phi * Q;
    if (t.i0 + delta < 0)
        t.i0 = -delta;
    if (t.i1 + delta > source)
        t.i1 = source - delta;
    t.meets = t.i0 < t.i1;
    return t;
}

/* Tap (r, t) of the flat path: its column row is the image shifted. */
static inline __attribute__((always_inline)) struct shift flat_tap(const struct dt_conv2d_shape *s,
                                                                   int r, int t)
{
    int oh = r * s->dil_h - s->pad_h, ow = t * s->dil_w - s->pad_w;
    struct shift sh = {0};
    tap_range(ow, 1, s->W, s->Q, &sh.qlo, &sh.qhi);
    tap_range(oh, 1, s->H, s->P, &sh.plo, &sh.phi);
    return shift_done(sh, (long)oh * s->W + ow, s->Q, (long)s->H * s->W);
}

/* A plane (P, Q) shifted by (di, dj) into another (P, Q). */
static inline __attribute__((always_inline)) struct shift shift_tap(int P, int Q, int di, int dj)
{
    struct shift sh = {.plo = di < 0 ? -di : 0, .phi = di > 0 ? P - di : P,
                       .qlo = dj < 0 ? -dj : 0, .qhi = dj > 0 ? Q - dj : Q};
    return shift_done(sh, (long)di * Q + dj, Q, (long)P * Q);
}

/* Zeroes the columns outside [qlo, qhi) of rows [plo, phi) of a tap's
 * column row (P, Q): a column or two, so column by column (a loop along a
 * row would become a call to memset per row). */
static inline __attribute__((always_inline)) void zero_edges(float *row, int Q, int plo, int phi, int qlo, int qhi)
{
    for (int q = 0; q < qlo; q++)
        for (int p = plo; p < phi; p++)
            row[(size_t)p * Q + q] = 0.0f;
    for (int q = qhi; q < Q; q++)
        for (int p = plo; p < phi; p++)
            row[(size_t)p * Q + q] = 0.0f;
}

/* row(n floats, Q wide) = src shifted by t: one copy, then zeros where
 * nothing lands and in the wrapped columns. */
static inline __attribute__((always_inline)) void shift_copy(float *row, const float *src, size_t n,
                                                             int Q, const struct shift *t)
{
    if (!t->meets) {
        memset(row, 0, n * sizeof *row);
        return;
    }
    memset(row, 0, (size_t)t->i0 * sizeof *row);
    memcpy(row + t->i0, src + t->i0 + t->delta, (size_t)(t->i1 - t->i0) * sizeof *row);
    memset(row + t->i1, 0, (n - (size_t)t->i1) * sizeof *row);
    zero_edges(row, Q, t->plo, t->phi, t->qlo, t->qhi);
}

static inline __attribute__((always_inline)) void im2col_flat(float *col, const float *xg, int Cg, const struct dt_conv2d_shape *s)
{
    const size_t HW = (size_t)s->H * s->W, PQ = (size_t)s->P * s->Q, RS = (size_t)s->R * s->S;
    for (int r = 0; r < s->R; r++)
        for (int t = 0; t < s->S; t++) {
            struct shift sh = flat_tap(s, r, t);
            for (int c = 0; c < Cg; c++)
                shift_copy(col + ((size_t)c * RS + (size_t)r * s->S + t) * PQ, xg + c * HW, PQ,
                           s->Q, &sh);
        }
}

/* Tap offset o (= tap - pad) at stride 2: phase o mod 2, shift o div 2
 * (both rounded down). */
static inline __attribute__((always_inline)) int phase_of(int o) { return o & 1; }
static inline __attribute__((always_inline)) int shift_of(int o) { return (o - (o & 1)) / 2; }

/* ph(Cg, 4, P, Q) = xg(Cg, H, W)'s phases: phase 2a + b holds
 * x(c, 2i + a, 2j + b). */
static inline __attribute__((always_inline)) void phases(float *ph, const float *xg, int Cg,
                                                         const struct dt_conv2d_shape *s)
{
    const int P = s->P, Q = s->Q, W = s->W;
    const size_t PQ = (size_t)P * Q;
    for (int c = 0; c < Cg; c++) {
        float *pc = ph + (size_t)c * 4 * PQ;
        const float *xc = xg + (size_t)c * s->H * W;
        for (int i = 0; i < P; i++)
            for (int a = 0; a < 2; a++) {
                const float *row = xc + (size_t)(2 * i + a) * W; /* (W) */
                copy_row_stride2(pc + (2 * a) * PQ + (size_t)i * Q, row, Q);
                copy_row_stride2(pc + (2 * a + 1) * PQ + (size_t)i * Q, row + 1, Q);
            }
    }
}

/* im2col through the phases (phase_ok): each tap's column row is a phase
 * shifted by one flat offset, its wrapped columns and the rows outside
 * zeroed, as the flat path does. ph: scratch of Cg*H*W floats. */
static inline __attribute__((always_inline)) void im2col_phases(float *col, float *ph,
                                                                const float *xg, int Cg,
                                                                const struct dt_conv2d_shape *s)
{
    const int P = s->P, Q = s->Q;
    const size_t PQ = (size_t)P * Q, RS = (size_t)s->R * s->S;
    phases(ph, xg, Cg, s);
    for (int r = 0; r < s->R; r++)
        for (int t = 0; t < s->S; t++) {
            int oh = r - s->pad_h, ow = t - s->pad_w;
            struct shift sh = shift_tap(P, Q, shift_of(oh), shift_of(ow));
            int phase = 2 * phase_of(oh) + phase_of(ow);
            for (int c = 0; c < Cg; c++)
                shift_copy(col + ((size_t)c * RS + (size_t)r * s->S + t) * PQ,
                           ph + ((size_t)c * 4 + phase) * PQ, PQ, Q, &sh);
        }
}

/* col(Cg*R*S, P*Q) from one image's group xg(Cg, H, W); where phase_ok,
 * the phases go in the Cg*H*W floats after col. */
DT_CPU_CLONES static void im2col(float *col, const float *xg, int Cg, const struct dt_conv2d_shape *s)
{
    if (flat_ok(s)) {
        im2col_flat(col, xg, Cg, s);
        return;
    }
    if (phase_ok(s)) {
        im2col_phases(col, col + (size_t)Cg * s->R * s->S * s->P * s->Q, xg, Cg, s);
        return;
    }
    const int H = s->H, W = s->W, P = s->P, Q = s->Q, sh = s->stride_h, sw = s->stride_w;
    for (int c = 0; c < Cg; c++)
        for (int r = 0; r < s->R; r++)
            for (int t = 0; t < s->S; t++) {
                int ow = t * s->dil_w - s->pad_w, qlo, qhi;
                tap_range(ow, sw, W, Q, &qlo, &qhi);
                float *row = col + ((size_t)(c * s->R + r) * s->S + t) * P * Q;
                for (int p = 0; p < P; p++)
                    gather_row(row + (size_t)p * Q, xg + (size_t)c * H * W,
                               p * sh - s->pad_h + r * s->dil_h, s, qlo, qhi, ow);
            }
}

/* The row matrix rows(Cg*S, T*Q), T = rows_tall(s), of one image's group
 * xg(Cg, H, W): row (c, t) holds, for padded row u = h + pad_h and output
 * column q, x(c, u - pad_h, q*stride_w + t*dil_w - pad_w), zero outside
 * the image. Filter row r's part of the column matrix is then the same
 * rows read from padded row r*dil_h on: rows + r*dil_h*Q as a (Cg*S,
 * P*Q) matrix with leading dimension T*Q, so a product over it needs
 * no copy of its own. It is 1/R of im2col's copying. */
DT_CPU_CLONES static void rows(float *col, const float *xg, int Cg, const struct dt_conv2d_shape *s)
{
    const int H = s->H, W = s->W, Q = s->Q, sw = s->stride_w, T = rows_tall(s);
    if (flat_ok(s)) {
        /* T = H + 2*pad_h: the padding rows, then the plane shifted by one
         * flat offset (one copy), its wrapped columns zeroed */
        const size_t HW = (size_t)H * W, top = (size_t)s->pad_h * Q;
        const size_t bottom = (size_t)(T - s->pad_h - H) * Q;
        for (int t = 0; t < s->S; t++) {
            struct shift sh = shift_tap(H, W, 0, t * s->dil_w - s->pad_w);
            for (int c = 0; c < Cg; c++) {
                float *row = col + ((size_t)c * s->S + t) * T * Q; /* (T, Q) */
                float *img = row + top;                            /* (H, Q) */
                memset(row, 0, top * sizeof *row);
                shift_copy(img, xg + c * HW, HW, Q, &sh);
                memset(img + HW, 0, bottom * sizeof *img);
            }
        }
        return;
    }
    for (int c = 0; c < Cg; c++)
        for (int t = 0; t < s->S; t++) {
            int ow = t * s->dil_w - s->pad_w, qlo, qhi;
            tap_range(ow, sw, W, Q, &qlo, &qhi);
            float *row = col + ((size_t)c * s->S + t) * T * Q; /* (T, Q) */
            for (int u = 0; u < T; u++)
                gather_row(row + (size_t)u * Q, xg + (size_t)c * H * W, u - s->pad_h, s, qlo,
                           qhi, ow);
        }
}

/* d(n) += a(n), in blocks of DT_CPU_LANES and then of SHORT_BLOCK through
 * a stack block, so the compiler vectorises it without proving that d and
 * a do not overlap. */
static inline __attribute__((always_inline)) void add_row(float *d, const float *a, int n)
{
    int i = 0;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES) {
        float t[DT_CPU_LANES];
        for (int k = 0; k < DT_CPU_LANES; k++)
            t[k] = d[i + k] + a[i + k];
        for (int k = 0; k < DT_CPU_LANES; k++)
            d[i + k] = t[k];
    }
    for (; i + SHORT_BLOCK <= n; i += SHORT_BLOCK) {
        float t[SHORT_BLOCK];
        for (int k = 0; k < SHORT_BLOCK; k++)
            t[k] = d[i + k] + a[i + k];
        for (int k = 0; k < SHORT_BLOCK; k++)
            d[i + k] = t[k];
    }
    for (; i < n; i++)
        d[i] += a[i];
}

/* dst += row (Q wide) shifted back by t: the row's wrapped columns are
 * zeroed in place (it is scratch), so that one flat add carries only real
 * gradients. */
static inline __attribute__((always_inline)) void shift_add(float *dst, float *row, int Q,
                                                            const struct shift *t)
{
    if (!t->meets)
        return;
    zero_edges(row, Q, t->plo, t->phi, t->qlo, t->qhi);
    add_row(dst + t->i0 + t->delta, row + t->i0, (int)(t->i1 - t->i0));
}

static inline __attribute__((always_inline)) void col2im_flat(float *dxg, float *dcol, int Cg, const struct dt_conv2d_shape *s)
{
    const size_t HW = (size_t)s->H * s->W, PQ = (size_t)s->P * s->Q, RS = (size_t)s->R * s->S;
    memset(dxg, 0, (size_t)Cg * HW * sizeof *dxg);
    for (int r = 0; r < s->R; r++)
        for (int t = 0; t < s->S; t++) {
            struct shift sh = flat_tap(s, r, t);
            for (int c = 0; c < Cg; c++)
                shift_add(dxg + c * HW, dcol + ((size_t)c * RS + (size_t)r * s->S + t) * PQ, s->Q,
                          &sh);
        }
}

/* dxg(Cg, H, W) = the sum of the row matrix (Cg*S, T*Q) scattered back
 * where rows() read it (dxg is zeroed first; the row matrix may be
 * changed). */
DT_CPU_CLONES static void rows_back(float *dxg, float *col, int Cg, const struct dt_conv2d_shape *s)
{
    const int H = s->H, W = s->W, Q = s->Q, sw = s->stride_w, T = rows_tall(s);
    const long HW = (long)H * W;
    memset(dxg, 0, (size_t)Cg * HW * sizeof *dxg);
    for (int c = 0; c < Cg; c++)
        for (int t = 0; t < s->S; t++) {
            int ow = t * s->dil_w - s->pad_w, qlo, qhi;
            tap_range(ow, sw, W, Q, &qlo, &qhi);
            float *img = col + ((size_t)c * s->S + t) * T * Q + (size_t)s->pad_h * Q; /* (H, Q) */
            float *dxc = dxg + c * HW;
            if (flat_ok(s)) {
                struct shift sh = shift_tap(H, W, 0, ow);
                shift_add(dxc, img, Q, &sh);
                continue;
            }
            for (int h = 0; h < H; h++) {
                const float *src = img + (size_t)h * Q; /* (Q) */
                float *dst = dxc + (size_t)h * W;       /* (W) */
                if (sw == 1)
                    add_row(dst + qlo + ow, src + qlo, qhi - qlo);
                else
                    for (int q = qlo; q < qhi; q++)
                        dst[q * sw + ow] += src[q];
            }
        }
}

/* col2im through the phases (phase_ok): each tap's column row added to
 * its phase at one flat offset (wrapped columns zeroed first), then the
 * phases interleaved into dxg, which they cover. ph: scratch of Cg*H*W
 * floats. */
static inline __attribute__((always_inline)) void col2im_phases(float *dxg, float *col, float *ph,
                                                                int Cg,
                                                                const struct dt_conv2d_shape *s)
{
    const int P = s->P, Q = s->Q, W = s->W;
    const size_t PQ = (size_t)P * Q, RS = (size_t)s->R * s->S;
    memset(ph, 0, (size_t)Cg * 4 * PQ * sizeof *ph);
    for (int r = 0; r < s->R; r++)
        for (int t = 0; t < s->S; t++) {
            int oh = r - s->pad_h, ow = t - s->pad_w;
            struct shift sh = shift_tap(P, Q, shift_of(oh), shift_of(ow));
            int phase = 2 * phase_of(oh) + phase_of(ow);
            for (int c = 0; c < Cg; c++)
                shift_add(ph + ((size_t)c * 4 + phase) * PQ,
                          col + ((size_t)c * RS + (size_t)r * s->S + t) * PQ, Q, &sh);
        }
    for (int c = 0; c < Cg; c++) {
        const float *pc = ph + (size_t)c * 4 * PQ;
        float *dc = dxg + (size_t)c * s->H * W;
        for (int i = 0; i < P; i++)
            for (int a = 0; a < 2; a++) {
                const float *even = pc + (2 * a) * PQ + (size_t)i * Q;
                const float *odd = pc + (2 * a + 1) * PQ + (size_t)i * Q;
                float *row = dc + (size_t)(2 * i + a) * W; /* (W) */
                for (int j = 0; j < Q; j++) {
                    row[2 * j] = even[j];
                    row[2 * j + 1] = odd[j];
                }
            }
    }
}

/* dxg(Cg, H, W) = the sum of col(Cg*R*S, P*Q) scattered back where
 * im2col read it (dxg is zeroed first; col may be changed; where
 * phase_ok, the Cg*H*W floats after col are scratch). */
DT_CPU_CLONES static void col2im(float *dxg, float *col, int Cg, const struct dt_conv2d_shape *s)
{
    if (flat_ok(s)) {
        col2im_flat(dxg, col, Cg, s);
        return;
    }
    if (phase_ok(s)) {
        col2im_phases(dxg, col, col + (size_t)Cg * s->R * s->S * s->P * s->Q, Cg, s);
        return;
    }
    const int H = s->H, W = s->W, P = s->P, Q = s->Q, sh = s->stride_h, sw = s->stride_w;
    memset(dxg, 0, (size_t)Cg * H * W * sizeof *dxg);
    for (int c = 0; c < Cg; c++)
        for (int r = 0; r < s->R; r++)
            for (int t = 0; t < s->S; t++) {
                int ow = t * s->dil_w - s->pad_w, qlo, qhi;
                tap_range(ow, sw, W, Q, &qlo, &qhi);
                const float *row = col + ((size_t)(c * s->R + r) * s->S + t) * P * Q;
                for (int p = 0; p < P; p++) {
                    int h = p * sh - s->pad_h + r * s->dil_h;
                    if (h < 0 || h >= H)
                        continue;
                    const float *src = row + (size_t)p * Q;     /* (Q) */
                    float *dst = dxg + ((size_t)c * H + h) * W; /* (W) */
                    if (sw == 1) {
                        add_row(dst + qlo + ow, src + qlo, qhi - qlo);
                    } else {
                        for (int q = qlo; q < qhi; q++)
                            dst[q * sw + ow] += src[q];
                    }
                }
            }
}

static dt_status check_ws(const char *op, const struct dt_conv2d_shape *s, const void *ws,
                          size_t ws_bytes)
{
    size_t need = fast_ws_bytes(s);
    if (need > 0 && (!ws || ws_bytes < need))
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cpu %s: workspace of %zu bytes%s, this shape needs %zu (ask "
                            "conv2d_workspace)",
                            op, ws_bytes, ws ? "" : " (NULL)", need);
    return DT_OK;
}

dt_status dt_cpu_conv2d_workspace(dt_backend_t *be, const struct dt_conv2d_shape *s, size_t *bytes)
{
    dt_status st = check_shape("conv2d_workspace", s);
    if (st == DT_OK && !bytes)
        st = dt_set_error(DT_ERR_INVALID_ARG, "cpu conv2d_workspace: bytes must not be NULL");
    if (st == DT_OK)
        *bytes = fast_ws_bytes(s);
    return st;
}

/* Images per partial sum of the filter gradient. */
#define FILTER_CHUNK 8

/* One image's work, for the three passes; samples are shared by the
 * pool's threads, each with its own column matrix. */
struct conv_job {
    const struct dt_conv2d_shape *s;
    float *out;         /* y, dx, or dw */
    const float *a, *b; /* x and w, dy and w, dy and x */
    float **partial;    /* bwd_filter: chunk t's sum, transposed */
    dt_backend_t *be;
    void *ws;           /* the caller's column matrix, on one thread */
    dt_backend_t *gemm; /* one image at a time: its products shared by the threads */
    const float *wr;    /* forward and input gradient by rows: the filter as (G, R, Kg, Cg*S);
                           direct: as dt_cpu_conv_direct_pack writes it */
    int by_rows;        /* the passes lower by rows */
    int direct;         /* the pass runs as a direct convolution */
    int chunks;
};

/* wr(G, R, Kg, Cg*S) = w(K, Cg, R, S) regrouped by filter row. */
static void filter_by_rows(float *wr, const float *w, const struct dt_conv2d_shape *s)
{
    const int G = s->groups, Kg = s->K / G, Cg = s->C / G, R = s->R, S = s->S;
    for (int g = 0; g < G; g++)
        for (int k = 0; k < Kg; k++)
            for (int c = 0; c < Cg; c++)
                for (int r = 0; r < R; r++)
                    for (int t = 0; t < S; t++)
                        wr[(((size_t)g * R + r) * Kg + k) * Cg * S + (size_t)c * S + t] =
                            w[(((size_t)g * Kg + k) * Cg + c) * R * S + (size_t)r * S + t];
}

/* By rows or direct (and with images): *wr = j->wr = the filter regrouped
 * for the forward or (bwd_data) the input gradient, which the caller
 * frees; else nothing. */
static dt_status regroup_filter(struct conv_job *j, float **wr, int bwd_data, const char *what)
{
    *wr = NULL;
    if (!(j->by_rows || j->direct) || j->s->N == 0)
        return DT_OK;
    dt_status st = dt_malloc(w_size(j->s) * sizeof **wr, what, (void **)wr);
    if (st == DT_OK && j->direct)
        dt_cpu_conv_direct_pack(*wr, j->b, j->s, bwd_data);
    else if (st == DT_OK)
        filter_by_rows(*wr, j->b, j->s);
    j->wr = *wr;
    return st;
}

static void *job_col(const struct conv_job *j, int thread)
{
    return j->ws ? j->ws : dt_cpu_scratch(j->be, thread);
}

/* out(n) (+)= a[0] * v[0] + a[1] * v[1] + ... + a[m-1] * v[m-1] (added to
 * out's values when add, else written), summed in that order; in blocks of
 * DT_CPU_LANES, which GCC vectorises at -O2, the tail one at a time. */
DT_CPU_CLONES static void weighted_sum(float *out, const float *const *v, const float *a, int m,
                                       int n, int add)
{
    int i = 0;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES) {
        float acc[DT_CPU_LANES];
        if (add)
            memcpy(acc, out + i, sizeof acc);
        else
            memset(acc, 0, sizeof acc);
        for (int t = 0; t < m; t++) {
            const float at = a[t], *vt = v[t] + i;
            for (int l = 0; l < DT_CPU_LANES; l++)
                acc[l] += at * vt[l];
        }
        memcpy(out + i, acc, sizeof acc);
    }
    for (; i < n; i++) {
        float acc = add ? out[i] : 0.0f;
        for (int t = 0; t < m; t++)
            acc += a[t] * v[t][i];
        out[i] = acc;
    }
}

/* dot(a, b) over n in DT_CPU_LANES lanes, the tail and then the lanes
 * added in order */
DT_CPU_CLONES static float dot_lanes(const float *a, const float *b, int n)
{
    float lane[DT_CPU_LANES] = {0};
    int i = 0;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES)
        for (int l = 0; l < DT_CPU_LANES; l++)
            lane[l] += a[i + l] * b[i + l];
    float sum = 0.0f;
    for (; i < n; i++)
        sum += a[i] * b[i];
    for (int l = 0; l < DT_CPU_LANES; l++)
        sum += lane[l];
    return sum;
}

/* by_taps: where the row matrix rows(S, T*Q) of one channel holds the
 * window of filter tap (r, c): its row c from r*dil_h*Q on (PQ values). */
static size_t tap_at(const struct dt_conv2d_shape *s, int r, int c)
{
    return ((size_t)c * rows_tall(s) + (size_t)r * s->dil_h) * s->Q;
}

/* Tap (r, c) of filter k in a group's filter regrouped by rows, (R, Kg, S). */
static float tap_weight(const float *wrg, const struct dt_conv2d_shape *s, int r, int k, int c)
{
    return wrg[((size_t)r * (s->K / s->groups) + k) * s->S + c];
}

/* yg(Kg, PQ) = sum over taps (r, c) of the weight . window (r, c) */
static void taps_fwd(float *yg, const float *rowm, const float *wrg,
                     const struct dt_conv2d_shape *s)
{
    const int R = s->R, S = s->S, Kg = s->K / s->groups, PQ = s->P * s->Q;
    const float *v[TAPS_MAX];
    float a[TAPS_MAX];
    for (int k = 0; k < Kg; k++) {
        for (int r = 0; r < R; r++)
            for (int c = 0; c < S; c++) {
                v[r * S + c] = rowm + tap_at(s, r, c);
                a[r * S + c] = tap_weight(wrg, s, r, k, c);
            }
        weighted_sum(yg + (size_t)k * PQ, v, a, R * S, PQ, 0);
    }
}

/* The row matrix's gradient: window (r, c) += sum over k of the weight .
 * dyg(k); its rows below P are only added to (zeroed first) */
static void taps_bwd_data(float *rowm, const float *dyg, const float *wrg,
                          const struct dt_conv2d_shape *s)
{
    const int R = s->R, S = s->S, Kg = s->K / s->groups, PQ = s->P * s->Q;
    const size_t TQ = (size_t)rows_tall(s) * s->Q;
    const float *v[TAPS_MAX_KG];
    float a[TAPS_MAX_KG];
    for (int k = 0; k < Kg; k++)
        v[k] = dyg + (size_t)k * PQ;
    for (int c = 0; c < S; c++) {
        memset(rowm + tap_at(s, 0, c) + PQ, 0, (TQ - PQ) * sizeof *rowm);
        for (int r = 0; r < R; r++) {
            for (int k = 0; k < Kg; k++)
                a[k] = tap_weight(wrg, s, r, k, c);
            weighted_sum(rowm + tap_at(s, r, c), v, a, Kg, PQ, r > 0);
        }
    }
}

/* dwtg's rows (r, c)(Kg) += window (r, c) . dyg(k) for each k */
static void taps_bwd_filter(float *dwtg, const float *rowm, const float *dyg,
                            const struct dt_conv2d_shape *s)
{
    const int R = s->R, S = s->S, Kg = s->K / s->groups, PQ = s->P * s->Q;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < S; c++)
            for (int k = 0; k < Kg; k++)
                dwtg[((size_t)r * S + c) * Kg + k] +=
                    dot_lanes(rowm + tap_at(s, r, c), dyg + (size_t)k * PQ, PQ);
}

static void fwd_image(const struct conv_job *j, int n, float *col_ws)
{
    const struct dt_conv2d_shape *s = j->s;
    const int G = s->groups, Cg = s->C / G, Kg = s->K / G, CRS = Cg * s->R * s->S;
    const int HW = s->H * s->W, PQ = s->P * s->Q;
    const int CS = Cg * s->S, TQ = rows_tall(s) * s->Q, step = s->dil_h * s->Q;
    if (j->direct) {
        dt_cpu_conv_direct_image(j->out + (size_t)n * s->K * PQ, j->a + (size_t)n * s->C * HW,
                                 j->wr, s, 0, col_ws);
        return;
    }
    for (int g = 0; g < G; g++) {
        const float *xg = j->a + ((size_t)n * s->C + (size_t)g * Cg) * HW; /* (Cg, H, W) */
        float *yg = j->out + ((size_t)n * s->K + (size_t)g * Kg) * PQ;     /* (Kg, PQ) */
        if (j->by_rows) {
            rows(col_ws, xg, Cg, s);
            if (by_taps(s)) {
                taps_fwd(yg, col_ws, j->wr + (size_t)g * s->R * Kg * CS, s);
                continue;
            }
            /* yg(Kg, PQ) = sum over r of wr(g, r)(Kg, CS) . the rows from r*dil_h */
            for (int r = 0; r < s->R; r++)
                dt_cpu_sgemm(j->gemm, 0, 0, Kg, PQ, CS, 1.0f,
                             j->wr + ((size_t)g * s->R + r) * Kg * CS, CS,
                             col_ws + (size_t)r * step, TQ, r ? 1.0f : 0.0f, yg, PQ);
            continue;
        }
        const float *col = xg;
        if (!is_pointwise(s)) {
            im2col(col_ws, xg, Cg, s);
            col = col_ws;
        }
        /* yg(Kg, PQ) = wg(Kg, CRS) . col(CRS, PQ) */
        dt_cpu_sgemm(j->gemm, 0, 0, Kg, PQ, CRS, 1.0f, j->b + (size_t)g * Kg * CRS, CRS, col, PQ,
                     0.0f, yg, PQ);
    }
}

static void bwd_data_image(const struct conv_job *j, int n, float *col_ws)
{
    const struct dt_conv2d_shape *s = j->s;
    const int G = s->groups, Cg = s->C / G, Kg = s->K / G, CRS = Cg * s->R * s->S;
    const int HW = s->H * s->W, PQ = s->P * s->Q;
    const int direct = is_pointwise(s);
    const int CS = Cg * s->S, T = rows_tall(s), step = s->dil_h * s->Q;
    if (j->direct) {
        dt_cpu_conv_direct_image(j->out + (size_t)n * s->C * HW, j->a + (size_t)n * s->K * PQ,
                                 j->wr, s, 1, col_ws);
        return;
    }
    for (int g = 0; g < G; g++) {
        float *dxg = j->out + ((size_t)n * s->C + (size_t)g * Cg) * HW;     /* (Cg, H, W) */
        const float *dyg = j->a + ((size_t)n * s->K + (size_t)g * Kg) * PQ; /* (Kg, PQ) */
        if (j->by_rows && by_taps(s)) {
            taps_bwd_data(col_ws, dyg, j->wr + (size_t)g * s->R * Kg * CS, s);
            rows_back(dxg, col_ws, Cg, s);
            continue;
        }
        if (j->by_rows) {
            /* the row matrix's gradient: rows from r*dil_h (CS, PQ) +=
             * wr(g, r)(Kg, CS)^T . dyg; the rows below P are only added to */
            for (int c = 0; c < CS; c++)
                memset(col_ws + ((size_t)c * T + s->P) * s->Q, 0,
                       (size_t)(T - s->P) * s->Q * sizeof *col_ws);
            for (int r = 0; r < s->R; r++)
                dt_cpu_sgemm(j->gemm, 1, 0, CS, PQ, Kg, 1.0f,
                             j->wr + ((size_t)g * s->R + r) * Kg * CS, CS, dyg, PQ,
                             r ? 1.0f : 0.0f, col_ws + (size_t)r * step, T * s->Q);
            rows_back(dxg, col_ws, Cg, s);
            continue;
        }
        float *dcol = direct ? dxg : col_ws;
        /* dcol(CRS, PQ) = wg(Kg, CRS)^T . dyg(Kg, PQ) */
        dt_cpu_sgemm(j->gemm, 1, 0, CRS, PQ, Kg, 1.0f, j->b + (size_t)g * Kg * CRS, CRS, dyg, PQ,
                     0.0f, dcol, PQ);
        if (!direct)
            col2im(dxg, dcol, Cg, s);
    }
}

/* dwt += image n's filter gradient, transposed: group g's block of dwt
 * (at g * Kg * CRS) is (CRS, Kg), its rows in im2col's order (c, r, s)
 * (direct too), or (r, c, s) by rows. With few filters (Kg of 16 to 64) and many taps,
 * OpenBLAS runs this product faster than dwg(Kg, CRS) += dyg . col^T. */
static void bwd_filter_image(const struct conv_job *j, int n, float *dwt, float *col_ws)
{
    const struct dt_conv2d_shape *s = j->s;
    const int G = s->groups, Cg = s->C / G, Kg = s->K / G, CRS = Cg * s->R * s->S;
    const int HW = s->H * s->W, PQ = s->P * s->Q;
    const int CS = Cg * s->S, TQ = rows_tall(s) * s->Q, step = s->dil_h * s->Q;
    if (j->direct) {
        dt_cpu_conv_direct_filter_image(dwt, j->a + (size_t)n * s->K * PQ,
                                        j->b + (size_t)n * s->C * HW, s, col_ws);
        return;
    }
    for (int g = 0; g < G; g++) {
        const float *xg = j->b + ((size_t)n * s->C + (size_t)g * Cg) * HW;  /* (Cg, H, W) */
        const float *dyg = j->a + ((size_t)n * s->K + (size_t)g * Kg) * PQ; /* (Kg, PQ) */
        float *dwtg = dwt + (size_t)g * Kg * CRS;
        if (j->by_rows) {
            rows(col_ws, xg, Cg, s);
            if (by_taps(s)) {
                taps_bwd_filter(dwtg, col_ws, dyg, s);
                continue;
            }
            /* dwtg's rows (r, .)(CS, Kg) += the rows from r*dil_h . dyg^T */
            for (int r = 0; r < s->R; r++)
                dt_cpu_sgemm(j->gemm, 0, 1, CS, Kg, PQ, 1.0f, col_ws + (size_t)r * step, TQ, dyg,
                             PQ, 1.0f, dwtg + (size_t)r * CS * Kg, Kg);
            continue;
        }
        const float *col = xg;
        if (!is_pointwise(s)) {
            im2col(col_ws, xg, Cg, s);
            col = col_ws;
        }
        /* dwtg(CRS, Kg) += col(CRS, PQ) . dyg(Kg, PQ)^T */
        dt_cpu_sgemm(j->gemm, 0, 1, CRS, Kg, PQ, 1.0f, col, PQ, dyg, PQ, 1.0f, dwtg, Kg);
    }
}

static void fwd_task(void *a, int n, int thread)
{
    fwd_image(a, n, job_col(a, thread));
}

static void bwd_data_task(void *a, int n, int thread)
{
    bwd_data_image(a, n, job_col(a, thread));
}

/* Chunk t of the samples, in order, into partial[t] (transposed, zeroed). */
static void bwd_filter_task(void *a, int t, int thread)
{
    const struct conv_job *j = a;
    int N = j->s->N, lo = t * FILTER_CHUNK, hi = lo + FILTER_CHUNK < N ? lo + FILTER_CHUNK : N;
    for (int n = lo; n < hi; n++)
        bwd_filter_image(j, n, j->partial[t], job_col(j, thread));
}

/* The caller's workspace on one thread; else every thread's own. */
static dt_status conv_threads(dt_backend_t *be, const struct dt_conv2d_shape *s,
                              struct conv_job *j, void *ws)
{
    int threads = s->N > 1 ? dt_cpu_threads(be) : 1;
    j->be = be;
    j->ws = threads == 1 ? ws : NULL;
    j->gemm = threads == 1 ? be : NULL;
    return threads == 1 ? DT_OK : dt_cpu_scratch_reserve(be, fast_ws_bytes(s));
}

dt_status dt_cpu_conv2d_fwd(dt_backend_t *be, float *y, const float *x, const float *w,
                            const struct dt_conv2d_shape *s, void *ws, size_t ws_bytes)
{
    dt_status st = check_shape("conv2d_fwd", s);
    if (st == DT_OK)
        st = check_ptrs("conv2d_fwd", y, x, w);
    if (st == DT_OK)
        st = check_ws("conv2d_fwd", s, ws, ws_bytes);
    if (st == DT_OK)
        st = dt_cpu_operand(be, OPERAND_X, x, x_size(s), &x);
    if (st == DT_OK)
        st = dt_cpu_operand(be, OPERAND_W, w, w_size(s), &w);
    struct conv_job j = {.s = s, .out = y, .a = x, .b = w, .by_rows = st == DT_OK && by_rows(s),
                         .direct = st == DT_OK && direct(s)};
    if (st == DT_OK)
        st = conv_threads(be, s, &j, ws);
    float *wr = NULL;
    if (st == DT_OK)
        st = regroup_filter(&j, &wr, 0, "conv2d_fwd's filter regrouped");
    if (st != DT_OK)
        return st;
    dt_cpu_run(j.ws ? NULL : be, s->N, fwd_task, &j);
    free(wr);
    return DT_OK;
}

dt_status dt_cpu_conv2d_bwd_data(dt_backend_t *be, float *dx, const float *dy, const float *w,
                                 const struct dt_conv2d_shape *s, void *ws, size_t ws_bytes)
{
    dt_status st = check_shape("conv2d_bwd_data", s);
    if (st == DT_OK)
        st = check_ptrs("conv2d_bwd_data", dx, dy, w);
    if (st == DT_OK)
        st = check_ws("conv2d_bwd_data", s, ws, ws_bytes);
    if (st == DT_OK)
        st = dt_cpu_operand(be, OPERAND_DY, dy, y_size(s), &dy);
    if (st == DT_OK)
        st = dt_cpu_operand(be, OPERAND_W, w, w_size(s), &w);
    struct conv_job j = {.s = s, .out = dx, .a = dy, .b = w, .by_rows = st == DT_OK && by_rows(s),
                         .direct = st == DT_OK && direct(s)};
    if (st == DT_OK)
        st = conv_threads(be, s, &j, ws);
    float *wr = NULL;
    if (st == DT_OK)
        st = regroup_filter(&j, &wr, 1, "conv2d_bwd_data's filter regrouped");
    if (st != DT_OK)
        return st;
    dt_cpu_run(j.ws ? NULL : be, s->N, bwd_data_task, &j);
    free(wr);
    return DT_OK;
}

/* d(n) += a(n), contiguous: vectorised (the partial sums do not overlap). */
DT_CPU_CLONES static void sum_into(float *restrict d, const float *restrict a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] += a[i];
}

/* dw(K, CRS) += the transposed sum dwt (group g's block (CRS, Kg), its
 * rows in the order bwd_filter_image says). */
static void add_transposed(float *dw, const float *dwt, const struct dt_conv2d_shape *s,
                           int by_rows)
{
    const int G = s->groups, Kg = s->K / G, Cg = s->C / G, R = s->R, S = s->S;
    const size_t CRS = (size_t)Cg * R * S;
    for (int g = 0; g < G; g++) {
        const float *src = dwt + (size_t)g * Kg * CRS;
        float *d = dw + (size_t)g * Kg * CRS;
        for (int k = 0; k < Kg; k++)
            for (int c = 0; c < Cg; c++)
                for (int r = 0; r < R; r++)
                    for (int t = 0; t < S; t++) {
                        size_t at = ((size_t)c * R + r) * S + t;
                        size_t i = by_rows ? ((size_t)r * Cg + c) * S + t : at;
                        d[(size_t)k * CRS + at] += src[i * Kg + k];
                    }
    }
}

/* The filter gradient: chunks of FILTER_CHUNK consecutive images, each
 * summed in image order into its own zeroed sum (transposed), the sums
 * added in chunk order, and their total added to dw. The chunks are the
 * same on any number of threads, so the sum is too. */
dt_status dt_cpu_conv2d_bwd_filter(dt_backend_t *be, float *dw, const float *dy, const float *x,
                                   const struct dt_conv2d_shape *s, void *ws, size_t ws_bytes)
{
    dt_status st = check_shape("conv2d_bwd_filter", s);
    if (st == DT_OK)
        st = check_ptrs("conv2d_bwd_filter", dw, dy, x);
    if (st == DT_OK)
        st = check_ws("conv2d_bwd_filter", s, ws, ws_bytes);
    if (st == DT_OK)
        st = dt_cpu_operand(be, OPERAND_DY, dy, y_size(s), &dy);
    if (st == DT_OK)
        st = dt_cpu_operand(be, OPERAND_X, x, x_size(s), &x);
    struct conv_job j = {.s = s, .a = dy, .b = x, .by_rows = st == DT_OK && by_rows(s),
                         .direct = st == DT_OK && direct(s)};
    if (st == DT_OK)
        st = conv_threads(be, s, &j, ws);
    if (st != DT_OK)
        return st;
    if (s->N == 0)
        return DT_OK;
    float *sums = NULL;
    j.chunks = (s->N + FILTER_CHUNK - 1) / FILTER_CHUNK;
    const size_t wn = w_size(s);
    st = dt_calloc((size_t)j.chunks, sizeof *j.partial, "conv2d_bwd_filter's partial sums",
                   (void **)&j.partial);
    if (st == DT_OK)
        st = dt_calloc((size_t)j.chunks * wn, sizeof *sums, "conv2d_bwd_filter's partial sums",
                       (void **)&sums);
    if (st != DT_OK) {
        free(j.partial);
        return st;
    }
    for (int t = 0; t < j.chunks; t++)
        j.partial[t] = sums + (size_t)t * wn;
    dt_cpu_run(j.ws ? NULL : be, j.chunks, bwd_filter_task, &j);
    for (int t = 1; t < j.chunks; t++)
        sum_into(sums, j.partial[t], wn);
    add_transposed(dw, sums, s, j.by_rows && !j.direct);
    free(j.partial);
    free(sums);
    return DT_OK;
}
