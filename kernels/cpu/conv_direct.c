/*
 * conv_direct.c - direct convolution on the CPU for stride 1 and "same"
 * padding (an odd filter padded by half its size each way, so the output
 * is as large as the input): the forward pass; the input gradient, which
 * at stride 1 is the same convolution of dy with the filter flipped and
 * transposed; and the filter gradient.
 *
 * Each image's channels are copied into planes whose rows are Wp = W +
 * pad_w wide: the pad_w zeros after a row are its right padding and the
 * next row's left padding. Output (p, q) then has the flat index
 * o = p*Wp + q, and filter tap (r, s) meets it at o + r*Wp + s in the
 * copy, one offset per tap for the whole plane. The forward and the input
 * gradient compute their output over that flat index, pad_w columns per
 * row more than it needs (thrown away when the rows are copied out), in
 * tiles of 4 output channels by 24 positions, 12 vector accumulators: per
 * input channel and tap, 3 vector loads of the copy, 4 broadcast weights
 * and 12 multiply-adds. The filter gradient takes dy transposed, each
 * flat position's filters side by side (zero at the pad columns), and
 * sums over the positions in tiles of 16 filters by 6 (channel, tap)
 * pairs: per position, 2 vector loads of dy, 6 broadcast inputs and 12
 * multiply-adds. There is no column matrix and nothing to pack but the
 * filter and dy, where BLAS products over a row or column matrix of 16 to
 * 64 channels spend much of their time packing their operands.
 *
 * Each output is summed in a fixed order (the forward and the input
 * gradient over input channels, then taps in row-major order; the filter
 * gradient over the flat positions in order), on any thread count. The
 * tiles are built twice: for the x86-64 baseline, and, chosen when the
 * CPU has them, for AVX2 with FMA (this file is compiled with FMA
 * contraction), whose multiply-adds round once. So their last bits depend
 * on the CPU, as BLAS products' do; on one machine they are the same on
 * any thread count.
 *
 * The output (y, or dx) is WRITTEN (=).
 */
#include <string.h>

#include "cpu_ops.h"

/* Output channels and vectors of positions per tile. */
#define TILE_K 4
#define TILE_V 3
#define VEC 8

/* The tiles are built for AVX2 with FMA, and run where the CPU has both
 * (unless dt_cpu_conv_direct_pin turned them off: tests compare the
 * lowerings that run without them). */
#if defined(__x86_64__) && defined(__GNUC__)
#define TILES __attribute__((target("avx2,fma")))
static int cpu_has_tiles(void)
{
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#else
#define TILES
static int cpu_has_tiles(void)
{
    return 0;
}
#endif

static int direct_off;

int dt_cpu_conv_direct_pin(int on)
{
    direct_off = !on;
    return !on || cpu_has_tiles();
}

int dt_cpu_conv_direct_ok(const struct dt_conv2d_shape *s)
{
    return !direct_off && cpu_has_tiles() && s->stride_h == 1 && s->stride_w == 1 &&
           s->dil_h == 1 && s->dil_w == 1 && s->R % 2 == 1 && s->S % 2 == 1 && s->R * s->S > 1 &&
           s->pad_h * 2 == s->R - 1 && s->pad_w * 2 == s->S - 1 &&
           s->R * s->S <= DT_CPU_DIRECT_TAPS && s->P == s->H && s->Q == s->W;
}

/* The plane geometry of one image: row width, floats per channel's copy
 * (leading zeros, padded rows, then zeros that over-long tiles read),
 * vectors of flat outputs, floats per output channel. */
struct plane {
    int Wp;
    size_t ldx;
    int nvec;
    size_t ldy;
};

static struct plane plane_of(const struct dt_conv2d_shape *s)
{
    struct plane g;
    g.Wp = s->W + s->pad_w;
    g.nvec = (s->H * g.Wp + VEC - 1) / VEC;
    g.ldy = (size_t)g.nvec * VEC;
    g.ldx = (size_t)s->pad_w + (size_t)(s->H + 2 * s->pad_h) * g.Wp + s->S + 2 * VEC;
    return g;
}

/* off[t] = where filter tap t (row-major) meets flat output 0 in a
 * channel's copy. */
static void tap_offsets(int *off, const struct dt_conv2d_shape *s, const struct plane *g)
{
    for (int r = 0; r < s->R; r++)
        for (int c = 0; c < s->S; c++)
            off[r * s->S + c] = r * g->Wp + c;
}

/* Filters of the transposed dy, rounded up to whole vectors. */
static int filters_padded(const struct dt_conv2d_shape *s)
{
    return (s->K / s->groups + VEC - 1) / VEC * VEC;
}

size_t dt_cpu_conv_direct_ws(const struct dt_conv2d_shape *s)
{
    const struct plane g = plane_of(s);
    const int Cg = s->C / s->groups, Kg = s->K / s->groups;
    const size_t most = (size_t)(Cg > Kg ? Cg : Kg);
    const size_t grad = (size_t)Cg * g.ldx + g.ldy * (size_t)filters_padded(s);
    return most * (g.ldx + g.ldy) > grad ? most * (g.ldx + g.ldy) : grad;
}

/* wp = the filter in tile order: per group, per block of up to TILE_K
 * output channels of the pass, (input channel, tap, channel in the block).
 * The forward's output channels are the filters k and its inputs the
 * channels c; the input gradient's are c and k, with each filter turned
 * by half a turn (tap (r, s) takes w's (R-1-r, S-1-s)). */
void dt_cpu_conv_direct_pack(float *wp, const float *w, const struct dt_conv2d_shape *s,
                             int bwd_data)
{
    const int G = s->groups, Kg = s->K / G, Cg = s->C / G, R = s->R, S = s->S, T = R * S;
    const int nout = bwd_data ? Cg : Kg, nin = bwd_data ? Kg : Cg;
    for (int g = 0; g < G; g++) {
        const float *wg = w + (size_t)g * Kg * Cg * T;
        for (int o0 = 0; o0 < nout; o0 += TILE_K) {
            const int kb = nout - o0 < TILE_K ? nout - o0 : TILE_K;
            for (int i = 0; i < nin; i++)
                for (int t = 0; t < T; t++)
                    for (int b = 0; b < kb; b++) {
                        const int o = o0 + b;
                        const size_t at = bwd_data ? ((size_t)i * Cg + o) * T + (T - 1 - t)
                                                   : ((size_t)o * Cg + i) * T + t;
                        *wp++ = wg[at];
                    }
        }
    }
}

/* xp(n, ldx) = the planes x(n, H, W) with their padding (see the top). */
static void pad_planes(float *xp, const float *x, int n, const struct dt_conv2d_shape *s,
                       const struct plane *g)
{
    const int H = s->H, W = s->W, Wp = g->Wp, gap = Wp - W;
    const size_t head = (size_t)s->pad_w + (size_t)s->pad_h * Wp;
    const size_t tail = g->ldx - head - (size_t)H * Wp;
    for (int c = 0; c < n; c++) {
        float *d = xp + (size_t)c * g->ldx;
        const float *a = x + (size_t)c * H * W;
        memset(d, 0, head * sizeof *d);
        d += head;
        for (int h = 0; h < H; h++, d += Wp, a += W) {
            memcpy(d, a, (size_t)W * sizeof *d);
            memset(d + W, 0, (size_t)gap * sizeof *d);
        }
        memset(d, 0, tail * sizeof *d);
    }
}

/* y(n, H, W) = the flat outputs yf(n, ldy) without their pad columns. */
static void unpad_planes(float *y, const float *yf, int n, const struct dt_conv2d_shape *s,
                         const struct plane *g)
{
    const int H = s->H, W = s->W;
    for (int k = 0; k < n; k++) {
        const float *a = yf + (size_t)k * g->ldy;
        for (int h = 0; h < H; h++, y += W)
            memcpy(y, a + (size_t)h * g->Wp, (size_t)W * sizeof *y);
    }
}

/* yf's rows [0, KB) (ldy apart), vectors [0, NV) = the sum over input
 * channels c < nin and taps t < T of wp[(c*T + t)*KB + k] times the copy
 * xp(c) from off[t] on. */
static inline __attribute__((always_inline)) void tile(float *yf, size_t ldy, const float *xp,
                                                       size_t ldx, const float *wp, const int *off,
                                                       int nin, int T, int KB, int NV)
{
    f32x8 acc[TILE_K][TILE_V];
#pragma GCC unroll 4
    for (int k = 0; k < KB; k++)
#pragma GCC unroll 3
        for (int v = 0; v < NV; v++)
            acc[k][v] = (f32x8){0};
    for (int c = 0; c < nin; c++) {
        const float *xc = xp + (size_t)c * ldx;
        for (int t = 0; t < T; t++, wp += KB) {
            f32x8 xv[TILE_V];
#pragma GCC unroll 3
            for (int v = 0; v < NV; v++)
                memcpy(&xv[v], xc + off[t] + v * VEC, sizeof xv[v]);
#pragma GCC unroll 4
            for (int k = 0; k < KB; k++) {
                const float wf = wp[k];
                const f32x8 wk = {wf, wf, wf, wf, wf, wf, wf, wf};
#pragma GCC unroll 3
                for (int v = 0; v < NV; v++)
                    acc[k][v] += wk * xv[v];
            }
        }
    }
#pragma GCC unroll 4
    for (int k = 0; k < KB; k++)
#pragma GCC unroll 3
        for (int v = 0; v < NV; v++)
            memcpy(yf + (size_t)k * ldy + v * VEC, &acc[k][v], sizeof acc[k][v]);
}

/* One tile of KB channels by NV vectors, constants in each case. */
#define TILE_CASE(KB, NV)                                                                          \
    case (KB)*TILE_V + (NV):                                                                       \
        tile(y, ldy, x, ldx, wp, off, nin, T, KB, NV);                                             \
        break

/* yf(nout, ldy) = the convolution of the copies xp(nin, ldx), tile by
 * tile: for each run of positions, every block of output channels. */
static inline __attribute__((always_inline)) void planes(float *yf, size_t ldy, int nvec,
                                                         const float *xp, size_t ldx, int nin,
                                                         int nout, const float *wpack,
                                                         const int *off, int T)
{
    for (int v0 = 0; v0 < nvec; v0 += TILE_V) {
        const int nv = nvec - v0 < TILE_V ? nvec - v0 : TILE_V;
        const float *wp = wpack, *x = xp + (size_t)v0 * VEC;
        for (int k0 = 0; k0 < nout; k0 += TILE_K) {
            const int kb = nout - k0 < TILE_K ? nout - k0 : TILE_K;
            float *y = yf + (size_t)k0 * ldy + (size_t)v0 * VEC;
            switch (kb * TILE_V + nv) {
                TILE_CASE(4, 3);
                TILE_CASE(4, 2);
                TILE_CASE(4, 1);
                TILE_CASE(3, 3);
                TILE_CASE(3, 2);
                TILE_CASE(3, 1);
                TILE_CASE(2, 3);
                TILE_CASE(2, 2);
                TILE_CASE(2, 1);
                TILE_CASE(1, 3);
                TILE_CASE(1, 2);
                TILE_CASE(1, 1);
            default:
                break;
            }
            wp += (size_t)kb * nin * T;
        }
    }
}

TILES static void direct_planes(float *yf, size_t ldy, int nvec, const float *xp, size_t ldx,
                                int nin, int nout, const float *wpack, const int *off, int T)
{
    planes(yf, ldy, nvec, xp, ldx, nin, nout, wpack, off, T);
}

/* out = one image's pass: forward, x(C, H, W) -> y(K, H, W), or input
 * gradient, dy(K, H, W) -> dx(C, H, W); wp from dt_cpu_conv_direct_pack
 * for the same pass, ws of dt_cpu_conv_direct_ws floats. */
void dt_cpu_conv_direct_image(float *out, const float *in, const float *wp,
                              const struct dt_conv2d_shape *s, int bwd_data, float *ws)
{
    const struct plane g = plane_of(s);
    const int G = s->groups, Kg = s->K / G, Cg = s->C / G, T = s->R * s->S;
    const int nin = bwd_data ? Kg : Cg, nout = bwd_data ? Cg : Kg;
    const size_t plane = (size_t)s->H * s->W;
    int off[DT_CPU_DIRECT_TAPS];
    tap_offsets(off, s, &g);
    float *xp = ws, *yf = ws + (size_t)nin * g.ldx;
    for (int grp = 0; grp < G; grp++) {
        pad_planes(xp, in + (size_t)grp * nin * plane, nin, s, &g);
        direct_planes(yf, g.ldy, g.nvec, xp, g.ldx, nin, nout, wp + (size_t)grp * nout * nin * T,
                      off, T);
        unpad_planes(out + (size_t)grp * nout * plane, yf, nout, s, &g);
    }
}

/* Vectors of filters and (channel, tap) pairs per tile of the filter
 * gradient. */
#define GRAD_KV 2
#define GRAD_T 6

/* dyt(ldy, ldk) = the planes dy(nk, H, W) transposed: row o (a flat
 * position, see the top) holds every filter's value there; zero in the
 * pad columns, past the last row and in the filters past nk. Blocks of 8
 * filters by 8 positions go through registers. */
TILES static void transpose_planes(float *dyt, int ldk, const float *dy, int nk,
                                   const struct dt_conv2d_shape *s, const struct plane *g)
{
    const int H = s->H, W = s->W, Wp = g->Wp, HW = H * W;
    for (int h = 0; h < H; h++)
        memset(dyt + ((size_t)h * Wp + W) * ldk, 0, (size_t)(Wp - W) * ldk * sizeof *dyt);
    memset(dyt + (size_t)H * Wp * ldk, 0, (g->ldy - (size_t)H * Wp) * ldk * sizeof *dyt);
    int k0 = 0;
    for (; k0 + 8 <= nk; k0 += 8) {
        const float *a = dy + (size_t)k0 * HW;
        int i = 0, h = 0, q = 0; /* i = h*W + q */
        for (; i + 8 <= HW; i += 8) {
            f32x8 r[8], c[8];
#pragma GCC unroll 8
            for (int m = 0; m < 8; m++)
                memcpy(&r[m], a + (size_t)m * HW + i, sizeof r[m]);
            dt_cpu_transpose8(c, r);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                memcpy(dyt + ((size_t)h * Wp + q) * ldk + k0, &c[j], sizeof c[j]);
                if (++q == W) {
                    q = 0;
                    h++;
                }
            }
        }
        for (; i < HW; i++) {
            for (int m = 0; m < 8; m++)
                dyt[((size_t)h * Wp + q) * ldk + k0 + m] = a[(size_t)m * HW + i];
            if (++q == W) {
                q = 0;
                h++;
            }
        }
    }
    for (int h = 0; h < H; h++)
        for (int q = 0; q < W; q++) {
            float *d = dyt + ((size_t)h * Wp + q) * ldk;
            for (int k = k0; k < nk; k++)
                d[k] = dy[(size_t)k * HW + (size_t)h * W + q];
            memset(d + nk, 0, (size_t)(ldk - nk) * sizeof *d);
        }
}

/* dwt's rows [0, NT) (ldw apart), filters [0, nk) += the sums over flat
 * positions o < n of dyt's row o (KV vectors of filters) times the copy
 * xs[j] at o, in order of o. */
static inline __attribute__((always_inline)) void grad_tile(float *dwt, size_t ldw, int nk,
                                                            const float *dyt, int ldk,
                                                            const float *const *xs, int n, int KV,
                                                            int NT)
{
    f32x8 acc[GRAD_T][GRAD_KV];
#pragma GCC unroll 6
    for (int j = 0; j < NT; j++)
#pragma GCC unroll 2
        for (int v = 0; v < KV; v++)
            acc[j][v] = (f32x8){0};
    for (int o = 0; o < n; o++, dyt += ldk) {
        f32x8 d[GRAD_KV];
#pragma GCC unroll 2
        for (int v = 0; v < KV; v++)
            memcpy(&d[v], dyt + v * VEC, sizeof d[v]);
#pragma GCC unroll 6
        for (int j = 0; j < NT; j++) {
            const float xf = xs[j][o];
            const f32x8 xb = {xf, xf, xf, xf, xf, xf, xf, xf};
#pragma GCC unroll 2
            for (int v = 0; v < KV; v++)
                acc[j][v] += d[v] * xb;
        }
    }
#pragma GCC unroll 6
    for (int j = 0; j < NT; j++)
#pragma GCC unroll 2
        for (int v = 0; v < KV; v++) {
            float *d = dwt + (size_t)j * ldw + v * VEC;
            if (v * VEC + VEC <= nk) {
                f32x8 sum;
                memcpy(&sum, d, sizeof sum);
                sum += acc[j][v];
                memcpy(d, &sum, sizeof sum);
                continue;
            }
            float lane[VEC];
            memcpy(lane, &acc[j][v], sizeof lane);
            for (int l = 0; v * VEC + l < nk; l++)
                d[l] += lane[l];
        }
}

#define GRAD_CASE(KV, NT)                                                                          \
    case (KV)*GRAD_T + (NT):                                                                       \
        grad_tile(dwt + (size_t)i0 * ldw + k0, ldw, nk, dyt + k0, ldk, xs, n, KV, NT);             \
        break

/* dwt(nc*T, ldw) += one group's filter gradient, transposed: row c*T + t
 * holds tap t of channel c for every filter; from dyt (ldk filters per
 * flat position, n positions) and the copies xp(nc, ldx), taps at off[]. */
static inline __attribute__((always_inline)) void grads(float *dwt, size_t ldw, const float *dyt,
                                                        int ldk, int n, const float *xp, size_t ldx,
                                                        int nc, const int *off, int T)
{
    const int pairs = nc * T;
    for (int k0 = 0; k0 < (int)ldw; k0 += GRAD_KV * VEC) {
        const int nk = (int)ldw - k0, kv = nk > VEC ? GRAD_KV : 1;
        for (int i0 = 0; i0 < pairs; i0 += GRAD_T) {
            const int nt = pairs - i0 < GRAD_T ? pairs - i0 : GRAD_T;
            const float *xs[GRAD_T];
            for (int j = 0; j < nt; j++)
                xs[j] = xp + (size_t)((i0 + j) / T) * ldx + off[(i0 + j) % T];
            switch (kv * GRAD_T + nt) {
                GRAD_CASE(2, 6);
                GRAD_CASE(2, 5);
                GRAD_CASE(2, 4);
                GRAD_CASE(2, 3);
                GRAD_CASE(2, 2);
                GRAD_CASE(2, 1);
                GRAD_CASE(1, 6);
                GRAD_CASE(1, 5);
                GRAD_CASE(1, 4);
                GRAD_CASE(1, 3);
                GRAD_CASE(1, 2);
                GRAD_CASE(1, 1);
            default:
                break;
            }
        }
    }
}

TILES static void direct_grads(float *dwt, size_t ldw, const float *dyt, int ldk, int n,
                               const float *xp, size_t ldx, int nc, const int *off, int T)
{
    grads(dwt, ldw, dyt, ldk, n, xp, ldx, nc, off, T);
}

/* dwt += one image's filter gradient, from dy(K, H, W) and x(C, H, W),
 * transposed: group g's block (at g * Kg * Cg*R*S) is (Cg*R*S, Kg), its
 * rows in the filter's order (c, r, s); ws of dt_cpu_conv_direct_ws
 * floats. */
void dt_cpu_conv_direct_filter_image(float *dwt, const float *dy, const float *x,
                                     const struct dt_conv2d_shape *s, float *ws)
{
    const struct plane g = plane_of(s);
    const int G = s->groups, Kg = s->K / G, Cg = s->C / G, T = s->R * s->S, ldk = filters_padded(s);
    const size_t plane = (size_t)s->H * s->W;
    int off[DT_CPU_DIRECT_TAPS];
    tap_offsets(off, s, &g);
    float *xp = ws, *dyt = ws + (size_t)Cg * g.ldx;
    const int n = s->H * g.Wp;
    for (int grp = 0; grp < G; grp++) {
        float *dwtg = dwt + (size_t)grp * Kg * Cg * T;
        pad_planes(xp, x + (size_t)grp * Cg * plane, Cg, s, &g);
        transpose_planes(dyt, ldk, dy + (size_t)grp * Kg * plane, Kg, s, &g);
        direct_grads(dwtg, (size_t)Kg, dyt, ldk, n, xp, g.ldx, Cg, off, T);
    }
}
