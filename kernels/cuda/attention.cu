/*
 * attention.cu - multi-head scaled dot-product attention on the GPU, causal
 * or not, forward and backward, in fp32, as kernels/ops.h defines it:
 *   qkv(B,T,3,H,Dh) holds q, k, v of every head side by side in a row
 *   (row stride 3*H*Dh); out(B,T,H,Dh); lse(B,H,T) = logsumexp of each
 *   query's scaled scores s_ij = q_i.k_j / sqrt(Dh), kept for backward.
 * It computes what kernels/cpu/attention.c computes, by the flash-attention
 * scheme, so memory grows linearly with T: no T x T matrix is ever stored.
 *
 * Forward: one block per (tile of FWD_BQ queries, b, h). The block walks
 * the key tiles of ATT_TILE keys (only those up to its last query when
 * causal), staging K and V in shared memory. A warp owns FWD_ROWS queries;
 * lane l scores key k0 + l against each of them, and the warp keeps, per
 * query, the online softmax: the running maximum m, the running sum l of
 * exp(s - m) and the running output sum, rescaled by exp(m_old - m_new)
 * whenever the maximum grows. At the end out = sum / l, lse = m + log(l).
 *
 * Backward, with P_ij = exp(s_ij - lse_i) rebuilt from lse, in three
 * kernels:
 *   1. Dvec_i = rowsum(dO_i * O_i), one warp per (b, i, h), into the
 *      workspace (B*H*T floats: all the scratch these kernels need);
 *   2. dK, dV: one block per (tile of BWD_ROWS * ATT_WARPS keys, b, h), a
 *      warp per BWD_ROWS keys, walking the query tiles of ATT_TILE queries
 *      (lane l = query q0 + l; when causal only the tiles at or after the
 *      keys): dS_ij = P_ij (dO_i.v_j - Dvec_i),
 *      dV_j = sum_i P_ij dO_i,  dK_j = sum_i dS_ij q_i / sqrt(Dh);
 *   3. dQ: one block per (tile of BWD_ROWS * ATT_WARPS queries, b, h), a
 *      warp per BWD_ROWS queries, walking the key tiles (lane l = key
 *      k0 + l): dQ_i = sum_j dS_ij k_j / sqrt(Dh).
 * Each output element is summed by one thread (or one warp's fixed
 * shuffle tree) in a fixed order, and kernels 2 and 3 write disjoint
 * parts of dqkv: no atomics, so the gradients are the same bits on every
 * run. The sums run in another order than the CPU's, so the two agree to
 * fp32 rounding, not bit for bit.
 *
 * Head sizes up to ATT_MAX_DH (128) run; each kernel is compiled for
 * Dh rounded up to a multiple of 32 (a template on the number of 32-wide
 * chunks), with the unused columns of the shared tiles held at zero.
 * A larger Dh is DT_ERR_UNSUPPORTED. Tiles that the lanes read along the
 * head dimension (one row per lane) have a row stride of W + 1 floats, so
 * the 32 lanes hit 32 different shared-memory banks; every tile of a kernel
 * together stays under the 48 KiB of static shared memory a block may have.
 *
 * The math is plain fp32 on the CUDA cores (expf and logf, no fast-math
 * intrinsics), whatever train.precision says: tensor-core (bf16) attention
 * is not part of this version.
 *
 * No parameters. out, lse and the input gradient dqkv are WRITTEN (=).
 */
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>

#include "cuda_impl.h"

#define ATT_WARP 32          /* lanes per warp */
#define ATT_FULL 0xffffffffu /* every lane of a warp */
#define ATT_WARPS 4          /* warps per block, every kernel */
#define ATT_THREADS (ATT_WARPS * ATT_WARP)
#define ATT_TILE ATT_WARP /* keys (forward, dQ) or queries (dK, dV) per tile: one per lane */
#define ATT_MAX_DH 128    /* the largest head size compiled */
#define ATT_MAX_CHUNKS (ATT_MAX_DH / ATT_WARP)
#define FWD_ROWS 4 /* queries per warp in the forward */
#define FWD_BQ (ATT_WARPS * FWD_ROWS)
#define BWD_ROWS 2 /* keys (dK, dV) or queries (dQ) per warp in the backward */
#define BWD_B (ATT_WARPS * BWD_ROWS)
#define DVEC_WARPS 8         /* rows per block of the Dvec kernel */
#define ATT_MAX_GRID_Y 65535 /* (b, h) pairs beyond it are looped over */

/* The shapes every kernel gets. */
struct att_geom {
    int B, T, H, Dh;
    int causal;
    float scale; /* 1/sqrt(Dh) */
};

/* Where the rows of q (which = 0), k (1) or v (2) of (b, h) start in qkv
 * and dqkv; their stride is 3*H*Dh. */
static __device__ size_t qkv_off(const struct att_geom &g, int b, int h, int which)
{
    return ((size_t)b * g.T * 3 + which) * (size_t)g.H * g.Dh + (size_t)h * g.Dh;
}

/* Whether query i may see key j (both inside [0, T)). */
static __device__ bool att_allowed(const struct att_geom &g, int i, int j)
{
    return i < g.T && j < g.T && (!g.causal || j <= i);
}

static __device__ float warp_max(float v)
{
    for (int o = ATT_WARP / 2; o > 0; o /= 2)
        v = fmaxf(v, __shfl_xor_sync(ATT_FULL, v, o));
    return v;
}

static __device__ float warp_sum(float v)
{
    for (int o = ATT_WARP / 2; o > 0; o /= 2)
        v += __shfl_xor_sync(ATT_FULL, v, o);
    return v;
}

/* dst[r][d] = src row t0 + r, column d, for r < nrows and d < W; zero past
 * T or Dh. ld is the source's row stride. Every thread of the block calls it. */
template <int W, int S>
static __device__ void load_rows(float (*dst)[S], int nrows, const float *src, size_t ld, int t0,
                                 const struct att_geom &g)
{
    for (int idx = threadIdx.x; idx < nrows * W; idx += ATT_THREADS) {
        const int r = idx / W, d = idx % W, t = t0 + r;
        dst[r][d] = (t < g.T && d < g.Dh) ? src[(size_t)t * ld + d] : 0.0f;
    }
}

/* ---- forward ----------------------------------------------------------- */

/* Block (x, y): queries [x*FWD_BQ, +FWD_BQ) of the (b, h) pairs y, y + gridDim.y, ... */
template <int CH>
static __global__ void __launch_bounds__(ATT_THREADS)
    att_fwd_kernel(float *out, float *lse, const float *qkv, struct att_geom g)
{
    constexpr int W = CH * ATT_WARP;
    __shared__ float qs[FWD_BQ][W];
    __shared__ float ks[ATT_TILE][W + 1];
    __shared__ float vs[ATT_TILE][W];
    const int lane = threadIdx.x % ATT_WARP, warp = threadIdx.x / ATT_WARP;
    const int q0 = blockIdx.x * FWD_BQ;
    const size_t ld = (size_t)3 * g.H * g.Dh;
    const int kend = g.causal ? min(g.T, q0 + FWD_BQ) : g.T;

    for (int bh = blockIdx.y; bh < g.B * g.H; bh += gridDim.y) {
        const int b = bh / g.H, h = bh % g.H;
        __syncthreads(); /* the previous pair's tiles have been read */
        load_rows<W, W>(qs, FWD_BQ, qkv + qkv_off(g, b, h, 0), ld, q0, g);

        float m[FWD_ROWS], l[FWD_ROWS], acc[FWD_ROWS][CH];
        for (int r = 0; r < FWD_ROWS; r++) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
            for (int e = 0; e < CH; e++)
                acc[r][e] = 0.0f;
        }
        for (int k0 = 0; k0 < kend; k0 += ATT_TILE) {
            __syncthreads();
            load_rows<W, W + 1>(ks, ATT_TILE, qkv + qkv_off(g, b, h, 1), ld, k0, g);
            load_rows<W, W>(vs, ATT_TILE, qkv + qkv_off(g, b, h, 2), ld, k0, g);
            __syncthreads();

            /* s[r] = q_(row r) . k_(k0 + lane) */
            float s[FWD_ROWS];
            for (int r = 0; r < FWD_ROWS; r++)
                s[r] = 0.0f;
            for (int d = 0; d < g.Dh; d++) {
                const float kd = ks[lane][d];
                for (int r = 0; r < FWD_ROWS; r++)
                    s[r] += qs[warp * FWD_ROWS + r][d] * kd;
            }
            /* online softmax: p = exp(s - m_new), the old sums rescaled */
            float p[FWD_ROWS];
            for (int r = 0; r < FWD_ROWS; r++) {
                const int i = q0 + warp * FWD_ROWS + r;
                const float sr = att_allowed(g, i, k0 + lane) ? s[r] * g.scale : -INFINITY;
                const float mn = fmaxf(m[r], warp_max(sr));
                float corr = 1.0f;
                p[r] = 0.0f;
                if (mn != -INFINITY) { /* some key is allowed so far */
                    corr = expf(m[r] - mn);
                    p[r] = expf(sr - mn);
                }
                l[r] = l[r] * corr + warp_sum(p[r]);
                m[r] = mn;
                for (int e = 0; e < CH; e++)
                    acc[r][e] *= corr;
            }
            /* acc[r][e] += sum over the tile's keys jj of p_jj v_jj[lane + 32e] */
            for (int jj = 0; jj < ATT_TILE; jj++) {
                float vj[CH];
                for (int e = 0; e < CH; e++)
                    vj[e] = vs[jj][lane + ATT_WARP * e];
                for (int r = 0; r < FWD_ROWS; r++) {
                    const float pj = __shfl_sync(ATT_FULL, p[r], jj);
                    for (int e = 0; e < CH; e++)
                        acc[r][e] += pj * vj[e];
                }
            }
        }
        for (int r = 0; r < FWD_ROWS; r++) {
            const int i = q0 + warp * FWD_ROWS + r;
            if (i >= g.T)
                continue;
            const float inv = 1.0f / l[r];
            float *o = out + (((size_t)b * g.T + i) * g.H + h) * g.Dh;
            for (int e = 0; e < CH; e++) {
                const int d = lane + ATT_WARP * e;
                if (d < g.Dh)
                    o[d] = acc[r][e] * inv;
            }
            if (lane == 0)
                lse[((size_t)b * g.H + h) * g.T + i] = m[r] + logf(l[r]);
        }
    }
}

/* ---- backward ---------------------------------------------------------- */

/* dvec[(b*H + h)*T + i] = sum over d of dout(b,i,h,d) * out(b,i,h,d); one
 * warp per (b, i, h), in the order of out's rows. */
static __global__ void att_dvec_kernel(float *dvec, const float *dout, const float *out,
                                       struct att_geom g)
{
    const int lane = threadIdx.x % ATT_WARP;
    const size_t rows = (size_t)g.B * g.T * g.H;
    const size_t first = (size_t)blockIdx.x * DVEC_WARPS + threadIdx.x / ATT_WARP;
    for (size_t row = first; row < rows; row += (size_t)gridDim.x * DVEC_WARPS) {
        const float *o = out + row * g.Dh, *dout_row = dout + row * g.Dh;
        float s = 0.0f;
        for (int d = lane; d < g.Dh; d += ATT_WARP)
            s += dout_row[d] * o[d];
        s = warp_sum(s);
        if (lane == 0) {
            const size_t h = row % (size_t)g.H, bi = row / (size_t)g.H;
            const size_t b = bi / (size_t)g.T, i = bi % (size_t)g.T;
            dvec[(b * g.H + h) * g.T + i] = s;
        }
    }
}

/* Block (x, y): dK and dV of keys [x*BWD_B, +BWD_B) of the pairs y, y + gridDim.y, ... */
template <int CH>
static __global__ void __launch_bounds__(ATT_THREADS)
    att_dkv_kernel(float *dqkv, const float *dout, const float *qkv, const float *lse,
                   const float *dvec, struct att_geom g)
{
    constexpr int W = CH * ATT_WARP;
    __shared__ float qs[ATT_TILE][W + 1];
    __shared__ float dos[ATT_TILE][W + 1];
    __shared__ float ks[BWD_B][W];
    __shared__ float vs[BWD_B][W];
    __shared__ float lse_s[ATT_TILE], dvec_s[ATT_TILE];
    const int lane = threadIdx.x % ATT_WARP, warp = threadIdx.x / ATT_WARP;
    const int k0 = blockIdx.x * BWD_B;
    const size_t ld = (size_t)3 * g.H * g.Dh, ldo = (size_t)g.H * g.Dh;
    const int qstart = g.causal ? k0 / ATT_TILE * ATT_TILE : 0;

    for (int bh = blockIdx.y; bh < g.B * g.H; bh += gridDim.y) {
        const int b = bh / g.H, h = bh % g.H;
        const float *lse_bh = lse + (size_t)bh * g.T, *dvec_bh = dvec + (size_t)bh * g.T;
        __syncthreads();
        load_rows<W, W>(ks, BWD_B, qkv + qkv_off(g, b, h, 1), ld, k0, g);
        load_rows<W, W>(vs, BWD_B, qkv + qkv_off(g, b, h, 2), ld, k0, g);

        float dk[BWD_ROWS][CH], dv[BWD_ROWS][CH];
        for (int r = 0; r < BWD_ROWS; r++)
            for (int e = 0; e < CH; e++)
                dk[r][e] = dv[r][e] = 0.0f;
        for (int q0 = qstart; q0 < g.T; q0 += ATT_TILE) {
            __syncthreads();
            load_rows<W, W + 1>(qs, ATT_TILE, qkv + qkv_off(g, b, h, 0), ld, q0, g);
            load_rows<W, W + 1>(dos, ATT_TILE, dout + (size_t)b * g.T * ldo + (size_t)h * g.Dh, ldo,
                                q0, g);
            if (threadIdx.x < ATT_TILE) {
                const int i = q0 + threadIdx.x;
                lse_s[threadIdx.x] = i < g.T ? lse_bh[i] : 0.0f;
                dvec_s[threadIdx.x] = i < g.T ? dvec_bh[i] : 0.0f;
            }
            __syncthreads();

            /* lane = query i: s[r] = q_i . k_(row r), dp[r] = dO_i . v_(row r) */
            float s[BWD_ROWS], dp[BWD_ROWS];
            for (int r = 0; r < BWD_ROWS; r++)
                s[r] = dp[r] = 0.0f;
            for (int d = 0; d < g.Dh; d++) {
                const float qd = qs[lane][d], dod = dos[lane][d];
                for (int r = 0; r < BWD_ROWS; r++) {
                    s[r] += qd * ks[warp * BWD_ROWS + r][d];
                    dp[r] += dod * vs[warp * BWD_ROWS + r][d];
                }
            }
            float p[BWD_ROWS], ds[BWD_ROWS];
            for (int r = 0; r < BWD_ROWS; r++) {
                const int j = k0 + warp * BWD_ROWS + r;
                p[r] = att_allowed(g, q0 + lane, j) ? expf(s[r] * g.scale - lse_s[lane]) : 0.0f;
                ds[r] = p[r] * (dp[r] - dvec_s[lane]);
            }
            /* over the tile's queries ii: dv += p_ii dO_ii, dk += ds_ii q_ii */
            for (int ii = 0; ii < ATT_TILE; ii++) {
                float qi[CH], doi[CH];
                for (int e = 0; e < CH; e++) {
                    qi[e] = qs[ii][lane + ATT_WARP * e];
                    doi[e] = dos[ii][lane + ATT_WARP * e];
                }
                for (int r = 0; r < BWD_ROWS; r++) {
                    const float pi = __shfl_sync(ATT_FULL, p[r], ii);
                    const float dsi = __shfl_sync(ATT_FULL, ds[r], ii);
                    for (int e = 0; e < CH; e++) {
                        dv[r][e] += pi * doi[e];
                        dk[r][e] += dsi * qi[e];
                    }
                }
            }
        }
        for (int r = 0; r < BWD_ROWS; r++) {
            const int j = k0 + warp * BWD_ROWS + r;
            if (j >= g.T)
                continue;
            float *dkr = dqkv + qkv_off(g, b, h, 1) + (size_t)j * ld;
            float *dvr = dqkv + qkv_off(g, b, h, 2) + (size_t)j * ld;
            for (int e = 0; e < CH; e++) {
                const int d = lane + ATT_WARP * e;
                if (d < g.Dh) {
                    dkr[d] = dk[r][e] * g.scale;
                    dvr[d] = dv[r][e];
                }
            }
        }
    }
}

/* Block (x, y): dQ of queries [x*BWD_B, +BWD_B) of the pairs y, y + gridDim.y, ... */
template <int CH>
static __global__ void __launch_bounds__(ATT_THREADS)
    att_dq_kernel(float *dqkv, const float *dout, const float *qkv, const float *lse,
                  const float *dvec, struct att_geom g)
{
    constexpr int W = CH * ATT_WARP;
    __shared__ float qs[BWD_B][W];
    __shared__ float dos[BWD_B][W];
    __shared__ float ks[ATT_TILE][W + 1];
    __shared__ float vs[ATT_TILE][W + 1];
    const int lane = threadIdx.x % ATT_WARP, warp = threadIdx.x / ATT_WARP;
    const int q0 = blockIdx.x * BWD_B;
    const size_t ld = (size_t)3 * g.H * g.Dh, ldo = (size_t)g.H * g.Dh;
    const int kend = g.causal ? min(g.T, q0 + BWD_B) : g.T;

    for (int bh = blockIdx.y; bh < g.B * g.H; bh += gridDim.y) {
        const int b = bh / g.H, h = bh % g.H;
        __syncthreads();
        load_rows<W, W>(qs, BWD_B, qkv + qkv_off(g, b, h, 0), ld, q0, g);
        load_rows<W, W>(dos, BWD_B, dout + (size_t)b * g.T * ldo + (size_t)h * g.Dh, ldo, q0, g);
        float li[BWD_ROWS], di[BWD_ROWS], dq[BWD_ROWS][CH];
        for (int r = 0; r < BWD_ROWS; r++) {
            const int i = q0 + warp * BWD_ROWS + r;
            li[r] = i < g.T ? lse[(size_t)bh * g.T + i] : 0.0f;
            di[r] = i < g.T ? dvec[(size_t)bh * g.T + i] : 0.0f;
            for (int e = 0; e < CH; e++)
                dq[r][e] = 0.0f;
        }
        for (int k0 = 0; k0 < kend; k0 += ATT_TILE) {
            __syncthreads();
            load_rows<W, W + 1>(ks, ATT_TILE, qkv + qkv_off(g, b, h, 1), ld, k0, g);
            load_rows<W, W + 1>(vs, ATT_TILE, qkv + qkv_off(g, b, h, 2), ld, k0, g);
            __syncthreads();

            /* lane = key j: s[r] = q_(row r) . k_j, dp[r] = dO_(row r) . v_j */
            float s[BWD_ROWS], dp[BWD_ROWS];
            for (int r = 0; r < BWD_ROWS; r++)
                s[r] = dp[r] = 0.0f;
            for (int d = 0; d < g.Dh; d++) {
                const float kd = ks[lane][d], vd = vs[lane][d];
                for (int r = 0; r < BWD_ROWS; r++) {
                    s[r] += qs[warp * BWD_ROWS + r][d] * kd;
                    dp[r] += dos[warp * BWD_ROWS + r][d] * vd;
                }
            }
            float ds[BWD_ROWS];
            for (int r = 0; r < BWD_ROWS; r++) {
                const int i = q0 + warp * BWD_ROWS + r;
                const float p = att_allowed(g, i, k0 + lane) ? expf(s[r] * g.scale - li[r]) : 0.0f;
                ds[r] = p * (dp[r] - di[r]);
            }
            /* over the tile's keys jj: dq += ds_jj k_jj */
            for (int jj = 0; jj < ATT_TILE; jj++) {
                float kj[CH];
                for (int e = 0; e < CH; e++)
                    kj[e] = ks[jj][lane + ATT_WARP * e];
                for (int r = 0; r < BWD_ROWS; r++) {
                    const float dsj = __shfl_sync(ATT_FULL, ds[r], jj);
                    for (int e = 0; e < CH; e++)
                        dq[r][e] += dsj * kj[e];
                }
            }
        }
        for (int r = 0; r < BWD_ROWS; r++) {
            const int i = q0 + warp * BWD_ROWS + r;
            if (i >= g.T)
                continue;
            float *dqr = dqkv + qkv_off(g, b, h, 0) + (size_t)i * ld;
            for (int e = 0; e < CH; e++) {
                const int d = lane + ATT_WARP * e;
                if (d < g.Dh)
                    dqr[d] = dq[r][e] * g.scale;
            }
        }
    }
}

/* ---- launchers --------------------------------------------------------- */

#define ATT_FMT "B=%d T=%d H=%d Dh=%d causal=%d"

/* The shapes every attention op accepts, in the CPU ops' words; a head
 * larger than ATT_MAX_DH is DT_ERR_UNSUPPORTED. */
static dt_status check_shape(const char *op, int B, int T, int H, int Dh, int causal)
{
    if (B < 1 || T < 1 || H < 1 || Dh < 1)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cuda %s: sizes must be >= 1 (B=%d, T=%d, H=%d, Dh=%d)", op, B, T, H,
                            Dh);
    if (causal != 0 && causal != 1)
        return dt_set_error(DT_ERR_INVALID_ARG, "cuda %s: causal must be 0 or 1 (got %d)", op,
                            causal);
    if (Dh > ATT_MAX_DH)
        return dt_set_error(DT_ERR_UNSUPPORTED,
                            "cuda %s: head size Dh=%d is above %d, the largest this version's "
                            "attention kernels are built for: use more heads of at most %d "
                            "(model width / heads)",
                            op, Dh, ATT_MAX_DH, ATT_MAX_DH);
    if ((long long)B * H > INT_MAX || (long long)3 * H * Dh > INT_MAX)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cuda %s: B*H = %lld or 3*H*Dh = %lld is above INT_MAX", op,
                            (long long)B * H, (long long)3 * H * Dh);
    return DT_OK;
}

/* Bytes of the workspace: Dvec of the backward, B*H*T floats. */
static size_t ws_need(int B, int T, int H) { return (size_t)B * H * T * sizeof(float); }

/* Both directions take the workspace attention_workspace sized (the
 * forward does not use it, but refuses what the CPU's refuses). */
static dt_status check_ws(const char *op, int B, int T, int H, const void *ws, size_t ws_bytes)
{
    const size_t need = ws_need(B, T, H);
    if (!ws || ws_bytes < need)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cuda %s: the workspace (%zu bytes%s) is smaller than the %zu bytes "
                            "attention_workspace asks for with B=%d, T=%d, H=%d",
                            op, ws ? ws_bytes : 0, ws ? "" : ", NULL", need, B, T, H);
    return DT_OK;
}

static struct att_geom geom(int B, int T, int H, int Dh, int causal)
{
    struct att_geom g;
    g.B = B;
    g.T = T;
    g.H = H;
    g.Dh = Dh;
    g.causal = causal;
    g.scale = 1.0f / sqrtf((float)Dh);
    return g;
}

/* x: the tiles of `per` rows over T; y: (b, h) pairs, looped past the limit. */
static dim3 att_grid(const struct att_geom &g, int per)
{
    const int bh = g.B * g.H;
    return dim3((unsigned)((g.T + per - 1) / per),
                (unsigned)(bh < ATT_MAX_GRID_Y ? bh : ATT_MAX_GRID_Y));
}

dt_status dt_cuda_attention_workspace(dt_backend_t *be, int B, int T, int H, int Dh, int causal,
                                      size_t *bytes)
{
    dt_status st = check_shape("attention_workspace", B, T, H, Dh, causal);
    if (st != DT_OK)
        return st;
    DT_CUDA_REQUIRE(bytes, "attention_workspace", "bytes must not be NULL");
    *bytes = ws_need(B, T, H);
    return DT_OK;
}

/* The kernel of the forward for Dh rounded up to CH chunks of 32. */
template <int CH>
static void launch_fwd(struct cuda_backend *cb, float *out, float *lse, const float *qkv,
                       const struct att_geom &g)
{
    DT_CUDA_LAUNCH(att_fwd_kernel<CH>, att_grid(g, FWD_BQ), ATT_THREADS, 0, cb->stream, out, lse, qkv, g);
}

dt_status dt_cuda_attention_fwd(dt_backend_t *be, float *out, float *lse, const float *qkv, int B,
                                int T, int H, int Dh, int causal, void *ws, size_t ws_bytes)
{
    DT_CUDA_REQUIRE(out && lse && qkv, "attention_fwd", "out, lse and qkv must not be NULL");
    dt_status st = check_shape("attention_fwd", B, T, H, Dh, causal);
    if (st != DT_OK)
        return st;
    st = check_ws("attention_fwd", B, T, H, ws, ws_bytes);
    if (st != DT_OK)
        return st;
    struct cuda_backend *cb = dt_cuda_of(be);
    const struct att_geom g = geom(B, T, H, Dh, causal);
    switch ((Dh + ATT_WARP - 1) / ATT_WARP) {
    case 1:
        launch_fwd<1>(cb, out, lse, qkv, g);
        break;
    case 2:
        launch_fwd<2>(cb, out, lse, qkv, g);
        break;
    case 3:
        launch_fwd<3>(cb, out, lse, qkv, g);
        break;
    default:
        launch_fwd<ATT_MAX_CHUNKS>(cb, out, lse, qkv, g);
        break;
    }
    return DT_CUDA_LAUNCHED(cb, "attention_fwd", ATT_FMT, B, T, H, Dh, causal);
}

/* The dK/dV and dQ kernels of the backward for Dh rounded up to CH chunks. */
template <int CH>
static void launch_bwd(struct cuda_backend *cb, float *dqkv, const float *dout, const float *qkv,
                       const float *lse, const float *dvec, const struct att_geom &g)
{
    DT_CUDA_LAUNCH(att_dkv_kernel<CH>, att_grid(g, BWD_B), ATT_THREADS, 0, cb->stream, dqkv, dout, qkv, lse, dvec, g);
    DT_CUDA_LAUNCH(att_dq_kernel<CH>, att_grid(g, BWD_B), ATT_THREADS, 0, cb->stream, dqkv, dout, qkv, lse, dvec, g);
}

dt_status dt_cuda_attention_bwd(dt_backend_t *be, float *dqkv, const float *dout, const float *qkv,
                                const float *out, const float *lse, int B, int T, int H, int Dh,
                                int causal, void *ws, size_t ws_bytes)
{
    DT_CUDA_REQUIRE(dqkv && dout && qkv && out && lse, "attention_bwd",
                    "dqkv, dout, qkv, out and lse must not be NULL");
    dt_status st = check_shape("attention_bwd", B, T, H, Dh, causal);
    if (st != DT_OK)
        return st;
    st = check_ws("attention_bwd", B, T, H, ws, ws_bytes);
    if (st != DT_OK)
        return st;
    struct cuda_backend *cb = dt_cuda_of(be);
    const struct att_geom g = geom(B, T, H, Dh, causal);
    float *dvec = (float *)ws;

    const size_t rows = (size_t)B * T * H;
    size_t blocks = (rows + DVEC_WARPS - 1) / DVEC_WARPS;
    if (blocks > DT_CUDA_MAX_BLOCKS)
        blocks = DT_CUDA_MAX_BLOCKS;
    DT_CUDA_LAUNCH(att_dvec_kernel, (unsigned)blocks, DVEC_WARPS * ATT_WARP, 0, cb->stream, dvec, dout, out, g);
    st = DT_CUDA_LAUNCHED(cb, "attention_bwd", ATT_FMT ", rowsum(dout*out)", B, T, H, Dh, causal);
    if (st != DT_OK)
        return st;
    switch ((Dh + ATT_WARP - 1) / ATT_WARP) {
    case 1:
        launch_bwd<1>(cb, dqkv, dout, qkv, lse, dvec, g);
        break;
    case 2:
        launch_bwd<2>(cb, dqkv, dout, qkv, lse, dvec, g);
        break;
    case 3:
        launch_bwd<3>(cb, dqkv, dout, qkv, lse, dvec, g);
        break;
    default:
        launch_bwd<ATT_MAX_CHUNKS>(cb, dqkv, dout, qkv, lse, dvec, g);
        break;
    }
    return DT_CUDA_LAUNCHED(cb, "attention_bwd", ATT_FMT, B, T, H, Dh, causal);
}

/* ---- decoding with a key/value cache ------------------------------------------- */

#define DEC_THREADS ATT_MAX_DH /* per (new row, head); thread d also keeps out[d] */
#define DEC_TILE 1024          /* keys scored at a time, in shared memory */

/* The new rows' keys and values into the caches (T, H, Dh). */
static __global__ void att_dec_store_kernel(float *kc, float *vc, const float *qkv, int pos, int n,
                                            int C)
{
    const size_t total = (size_t)n * C;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / C, c = e % C;
        kc[(size_t)(pos + i) * C + c] = qkv[i * 3 * C + C + c];
        vc[(size_t)(pos + i) * C + c] = qkv[i * 3 * C + 2 * C + c];
    }
}

/* The block's value of v by a fixed tree (max or sum) over red[]; every
 * thread gets it. */
static __device__ float dec_reduce(float *red, float v, int is_max)
{
    const int t = threadIdx.x;
    red[t] = v;
    __syncthreads();
    for (int w = DEC_THREADS / 2; w > 0; w >>= 1) {
        if (t < w)
            red[t] = is_max ? fmaxf(red[t], red[t + w]) : red[t] + red[t + w];
        __syncthreads();
    }
    float r = red[0];
    __syncthreads();
    return r;
}

/* One block per (new row i, head h): the scores of the cached keys
 * 0..pos+i tile by tile, an online softmax (running max and sum, the
 * output rescaled when the max grows), thread d accumulating out[d]. */
static __global__ void att_dec_kernel(float *out, const float *kc, const float *vc,
                                      const float *qkv, int pos, int H, int Dh, float scale)
{
    __shared__ float s[DEC_TILE];
    __shared__ float red[DEC_THREADS];
    const int i = blockIdx.x, h = blockIdx.y, t = threadIdx.x, C = H * Dh, kn = pos + i + 1;
    const float *q = qkv + (size_t)i * 3 * C + (size_t)h * Dh;
    float m = -INFINITY, l = 0.0f, acc = 0.0f;
    for (int j0 = 0; j0 < kn; j0 += DEC_TILE) {
        const int tn = kn - j0 < DEC_TILE ? kn - j0 : DEC_TILE;
        float tm = -INFINITY;
        for (int jj = t; jj < tn; jj += DEC_THREADS) {
            const float *k = kc + (size_t)(j0 + jj) * C + (size_t)h * Dh;
            float a = 0.0f;
            for (int d = 0; d < Dh; d++)
                a += q[d] * k[d];
            s[jj] = a * scale;
            tm = fmaxf(tm, s[jj]);
        }
        const float mnew = fmaxf(m, dec_reduce(red, tm, 1));
        float ts = 0.0f;
        for (int jj = t; jj < tn; jj += DEC_THREADS) {
            s[jj] = expf(s[jj] - mnew);
            ts += s[jj];
        }
        const float rescale = expf(m - mnew); /* 0 on the first tile (m = -inf) */
        l = l * rescale + dec_reduce(red, ts, 0);
        if (t < Dh) {
            float a = acc * rescale;
            for (int jj = 0; jj < tn; jj++)
                a += s[jj] * vc[(size_t)(j0 + jj) * C + (size_t)h * Dh + t];
            acc = a;
        }
        m = mnew;
        __syncthreads(); /* s is rewritten by the next tile */
    }
    if (t < Dh)
        out[(size_t)i * C + (size_t)h * Dh + t] = acc / l;
}

dt_status dt_cuda_attention_decode(dt_backend_t *be, float *out, float *kcache, float *vcache,
                                   const float *qkv, int pos, int n, int T, int H, int Dh)
{
    DT_CUDA_REQUIRE(out && kcache && vcache && qkv, "attention_decode",
                    "out, kcache, vcache and qkv must not be NULL");
    DT_CUDA_REQUIRE(n >= 1 && H >= 1 && Dh >= 1 && pos >= 0 && T >= 1 && pos <= T - n,
                    "attention_decode",
                    "positions %d..%d of a cache of %d rows (H=%d, Dh=%d): need n >= 1, H, Dh "
                    ">= 1 and the positions inside the cache",
                    pos, pos + n - 1, T, H, Dh);
    dt_status st = check_shape("attention_decode", 1, T, H, Dh, 1);
    if (st != DT_OK)
        return st;
    DT_CUDA_REQUIRE(H <= ATT_MAX_GRID_Y, "attention_decode", "H=%d is above %d", H,
                    ATT_MAX_GRID_Y);
    struct cuda_backend *cb = dt_cuda_of(be);
    const int C = H * Dh;
    const size_t total = (size_t)n * C;
    const unsigned blocks =
        (unsigned)((total + DT_CUDA_THREADS - 1) / DT_CUDA_THREADS < 4096
                       ? (total + DT_CUDA_THREADS - 1) / DT_CUDA_THREADS
                       : 4096);
    DT_CUDA_LAUNCH(att_dec_store_kernel, dim3(blocks), DT_CUDA_THREADS, 0, cb->stream, kcache,
                   vcache, qkv, pos, n, C);
    DT_CUDA_LAUNCH(att_dec_kernel, dim3((unsigned)n, (unsigned)H), DEC_THREADS, 0, cb->stream, out,
                   kcache, vcache, qkv, pos, H, Dh, 1.0f / sqrtf((float)Dh));
    return DT_CUDA_LAUNCHED(cb, "attention_decode", "pos=%d n=%d T=%d H=%d Dh=%d", pos, n, T, H,
                            Dh);
}
