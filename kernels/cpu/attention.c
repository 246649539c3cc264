/*
 * attention.c - multi-head scaled dot-product attention on the CPU,
 * causal or not, forward and backward, as kernels/ops.h defines it:
 *   qkv(B,T,3,H,Dh) holds q, k, v of every head side by side in a row
 *   (row stride 3*H*Dh); out(B,T,H,Dh); lse(B,H,T) = logsumexp of each
 *   query's scaled scores, kept so backward can rebuild the softmax.
 *
 * Memory grows linearly with T: no T x T matrix is ever kept. The
 * reference works one query row at a time and recomputes what it needs;
 * the fast version works on blocks of ATTN_QBLOCK query rows against the
 * keys, in a workspace of two such blocks of scores.
 *
 * Reference: the math line by line, sums in double. Forward, per query i:
 * s_j = q_i.k_j / sqrt(Dh) for the allowed keys j (j <= i when causal),
 * lse_i = logsumexp(s), out_i = sum_j softmax(s)_j v_j, with the row of
 * scores in the workspace. Backward, per (i, j): p = exp(s_ij - lse_i),
 * dv_j += p dout_i, ds = p (dout_i.v_j - dout_i.out_i), dq_i += ds k_j / sqrt(Dh),
 * dk_j += ds q_i / sqrt(Dh); no buffer at all.
 *
 * Fast: per (b, h) and block of query rows [i0, i1), OpenBLAS sgemm on
 * the strided slices of qkv directly (lda = 3*H*Dh, no copies):
 *   S = Q K^T / sqrt(Dh) over keys [0, kn), the row softmax in place
 *   (masked entries 0), lse from the same pass, O = P V.
 * Backward recomputes P = exp(S - lse) and then
 *   dV += P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dO * O)),
 *   dQ = dS K / sqrt(Dh),  dK += dS^T Q / sqrt(Dh).
 * With causal masking a block needs only the keys up to its last row
 * (kn = i1), so the masked upper triangle costs nothing but the part of
 * it inside the diagonal block. The exponentials and row loops work on
 * blocks of DT_CPU_LANES floats that GCC vectorises at -O2 (an own
 * polynomial exp, dt_vexp_sub_lanes of vexp.h). Threads: the (sequence,
 * head) pairs are shared by the pool's threads, each pair computed whole
 * by one thread with one-thread BLAS calls, so any thread count gives the
 * same bits. On CPUs where the own tiles run (AVX2 and FMA, no AVX-512),
 * the same steps run on the tiles instead of BLAS, cut finer at the
 * causal mask (the section "fast, by the own tiles" below).
 *
 * train.precision does not reach this op: it computes in fp32 on the CPU
 * whatever the matmul operand precision of linear and conv.
 *
 * No parameters. out, lse and the input gradient dqkv are WRITTEN (=).
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"
#include "tiles.h"
#include "vexp.h"

/* Query rows per block of the fast path with BLAS: a block of scores is
 * ATTN_QBLOCK x T floats, two of them make its workspace. */
#define ATTN_QBLOCK 64
/* Query rows per block with the own tiles: 10 tiles of 6 rows. */
#define ATTN_TBLOCK 60

static int qblock(int T) { return T < ATTN_QBLOCK ? T : ATTN_QBLOCK; }
static int tblock(int T) { return T < ATTN_TBLOCK ? T : ATTN_TBLOCK; }
static size_t up16(size_t n) { return (n + 15) / 16 * 16; }

/* The tiles' workspace, in floats, at w (see at_layout): scores and
 * their gradients (two blocks of query rows x T rounded up to 16), the
 * head's keys and values packed (K^T, V^T, and K or V), a block's queries
 * and output gradients packed, and 6 rows of an operand's edge. */
static size_t at_floats(int T, int Dh)
{
    size_t Tp = up16((size_t)T), Dp = up16((size_t)Dh), QB = (size_t)tblock(T);
    return 2 * QB * Tp + 2 * Tp * (size_t)Dh + (size_t)T * Dp + 2 * QB * Dp +
           GT_MR * (size_t)(T > Dh ? T : Dh);
}

/* The workspace of all versions: the larger of the BLAS path's (two
 * blocks of query rows x T scores; the reference uses the first T
 * doubles as its row of scores) and the tiles' (at_layout). Linear in
 * T and in Dh. */
static size_t attn_ws_bytes(int T, int Dh)
{
    size_t blas = 2 * (size_t)qblock(T) * (size_t)T, tiles = at_floats(T, Dh);
    return (blas > tiles ? blas : tiles) * sizeof(float);
}

static dt_status check_shape(const char *op, int B, int T, int H, int Dh, int causal)
{
    if (B < 1 || T < 1 || H < 1 || Dh < 1)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cpu %s: sizes must be >= 1 (B=%d, T=%d, H=%d, Dh=%d)", op, B, T, H,
                            Dh);
    if (causal != 0 && causal != 1)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu %s: causal must be 0 or 1 (got %d)", op,
                            causal);
    if ((long long)3 * H * Dh > INT_MAX)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cpu %s: a row of qkv, 3*H*Dh = %lld values, is too long for BLAS", op,
                            (long long)3 * H * Dh);
    return DT_OK;
}

static dt_status check_ws(const char *op, int T, int Dh, const void *ws, size_t ws_bytes)
{
    size_t need = attn_ws_bytes(T, Dh);
    if (!ws || ws_bytes < need)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cpu %s: the workspace (%zu bytes%s) is smaller than the %zu bytes "
                            "attention_workspace asks for with T=%d and Dh=%d",
                            op, ws ? ws_bytes : 0, ws ? "" : ", NULL", need, T, Dh);
    return DT_OK;
}

static dt_status check_fwd(const float *out, const float *lse, const float *qkv, int B, int T,
                           int H, int Dh, int causal, const void *ws, size_t ws_bytes)
{
    DT_CPU_REQUIRE(out && lse && qkv, "attention_fwd", "out, lse and qkv must not be NULL");
    dt_status st = check_shape("attention_fwd", B, T, H, Dh, causal);
    return st != DT_OK ? st : check_ws("attention_fwd", T, Dh, ws, ws_bytes);
}

static dt_status check_bwd(const float *dqkv, const float *dout, const float *qkv, const float *out,
                           const float *lse, int B, int T, int H, int Dh, int causal,
                           const void *ws, size_t ws_bytes)
{
    DT_CPU_REQUIRE(dqkv && dout && qkv && out && lse, "attention_bwd",
                   "dqkv, dout, qkv, out and lse must not be NULL");
    dt_status st = check_shape("attention_bwd", B, T, H, Dh, causal);
    return st != DT_OK ? st : check_ws("attention_bwd", T, Dh, ws, ws_bytes);
}

/* One head of one sequence: where its q, k, v (and their gradients), its
 * out (and dout) and its lse start, and their row strides. */
struct head {
    size_t q, k, v; /* offsets into qkv/dqkv, row stride ld */
    size_t o;       /* offset into out/dout, row stride ldo */
    size_t l;       /* offset into lse, contiguous */
    int ld, ldo;
};

static struct head head_at(int b, int h, int T, int H, int Dh)
{
    int ld = 3 * H * Dh, ldo = H * Dh;
    size_t q = (size_t)b * T * ld + (size_t)h * Dh;
    return (struct head){.q = q,
                         .k = q + (size_t)H * Dh,
                         .v = q + 2 * (size_t)H * Dh,
                         .o = (size_t)b * T * ldo + (size_t)h * Dh,
                         .l = ((size_t)b * H + h) * T,
                         .ld = ld,
                         .ldo = ldo};
}

/* Sets the T rows of Dh floats at x (row stride ld) to zero. */
static void zero_rows(float *x, int T, int Dh, int ld)
{
    for (int t = 0; t < T; t++)
        memset(x + (size_t)t * ld, 0, (size_t)Dh * sizeof *x);
}

dt_status dt_cpu_attention_workspace(dt_backend_t *be, int B, int T, int H, int Dh, int causal,
                                     size_t *bytes)
{
    dt_status st = check_shape("attention_workspace", B, T, H, Dh, causal);
    if (st == DT_OK && !bytes)
        st = dt_set_error(DT_ERR_INVALID_ARG, "cpu attention_workspace: bytes must not be NULL");
    if (st == DT_OK)
        *bytes = attn_ws_bytes(T, Dh);
    return st;
}

/* ---- reference ------------------------------------------------------- */

static double dot(const float *a, const float *b, int n)
{
    double s = 0.0;
    for (int d = 0; d < n; d++)
        s += (double)a[d] * b[d];
    return s;
}

/* s(T) = q k^T / sqrt(Dh) for each query i;
 * lse[i] = logsumexp(s[:n]), out[i] = softmax(s[:n]) v[:n], n = causal ? i+1 : T */
dt_status dt_cpu_attention_fwd_ref(dt_backend_t *be, float *out, float *lse, const float *qkv,
                                   int B, int T, int H, int Dh, int causal, void *ws,
                                   size_t ws_bytes)
{
    dt_status st = check_fwd(out, lse, qkv, B, T, H, Dh, causal, ws, ws_bytes);
    if (st != DT_OK)
        return st;
    const double scale = 1.0 / sqrt((double)Dh);
    double *s = ws; /* (T) */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            struct head hd = head_at(b, h, T, H, Dh);
            for (int i = 0; i < T; i++) {
                const float *qi = qkv + hd.q + (size_t)i * hd.ld; /* (Dh) */
                int n = causal ? i + 1 : T;
                double mx = -INFINITY, sum = 0.0;
                for (int j = 0; j < n; j++) {
                    s[j] = scale * dot(qi, qkv + hd.k + (size_t)j * hd.ld, Dh);
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int j = 0; j < n; j++) {
                    s[j] = exp(s[j] - mx);
                    sum += s[j];
                }
                lse[hd.l + i] = (float)(mx + log(sum));
                for (int d = 0; d < Dh; d++) {
                    double acc = 0.0;
                    for (int j = 0; j < n; j++)
                        acc += s[j] * qkv[hd.v + (size_t)j * hd.ld + d];
                    out[hd.o + (size_t)i * hd.ldo + d] = (float)(acc / sum);
                }
            }
        }
    return DT_OK;
}

/* For each query i and allowed key j: p = exp(q_i.k_j / sqrt(Dh) - lse_i),
 * dv_j += p dout_i, ds = p (dout_i.v_j - dout_i.out_i),
 * dq_i += ds k_j / sqrt(Dh), dk_j += ds q_i / sqrt(Dh) */
dt_status dt_cpu_attention_bwd_ref(dt_backend_t *be, float *dqkv, const float *dout,
                                   const float *qkv, const float *out, const float *lse, int B,
                                   int T, int H, int Dh, int causal, void *ws, size_t ws_bytes)
{
    dt_status st = check_bwd(dqkv, dout, qkv, out, lse, B, T, H, Dh, causal, ws, ws_bytes);
    if (st != DT_OK)
        return st;
    const double scale = 1.0 / sqrt((double)Dh);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            struct head hd = head_at(b, h, T, H, Dh);
            zero_rows(dqkv + hd.q, T, Dh, hd.ld);
            zero_rows(dqkv + hd.k, T, Dh, hd.ld);
            zero_rows(dqkv + hd.v, T, Dh, hd.ld);
            for (int i = 0; i < T; i++) {
                const float *qi = qkv + hd.q + (size_t)i * hd.ld;    /* (Dh) */
                const float *doi = dout + hd.o + (size_t)i * hd.ldo; /* (Dh) */
                float *dqi = dqkv + hd.q + (size_t)i * hd.ld;
                double delta = dot(doi, out + hd.o + (size_t)i * hd.ldo, Dh);
                int n = causal ? i + 1 : T;
                for (int j = 0; j < n; j++) {
                    const float *kj = qkv + hd.k + (size_t)j * hd.ld;
                    const float *vj = qkv + hd.v + (size_t)j * hd.ld;
                    float *dkj = dqkv + hd.k + (size_t)j * hd.ld;
                    float *dvj = dqkv + hd.v + (size_t)j * hd.ld;
                    double p = exp(scale * dot(qi, kj, Dh) - lse[hd.l + i]);
                    double ds = p * (dot(doi, vj, Dh) - delta);
                    for (int d = 0; d < Dh; d++) {
                        dvj[d] += (float)(p * doi[d]);
                        dqi[d] += (float)(scale * ds * kj[d]);
                        dkj[d] += (float)(scale * ds * qi[d]);
                    }
                }
            }
        }
    return DT_OK;
}

/* ---- fast ------------------------------------------------------------ */

/* y(n) = e^(x(n) - sub); y may be x. Built for AVX-512, AVX2 and the
 * baseline and picked at load time, as dropout.c and optim.c do; the file
 * is compiled without FMA contraction, so every clone gives the same bits. */
DT_CPU_CLONES static void
exp_sub_row(float *y, const float *x, int n, float sub)
{
    int j = 0;
    for (; j + DT_CPU_LANES <= n; j += DT_CPU_LANES)
        dt_vexp_sub_lanes(y + j, x + j, sub);
    if (j < n) {
        float t[DT_CPU_LANES] = {0};
        memcpy(t, x + j, (size_t)(n - j) * sizeof *t);
        dt_vexp_sub_lanes(t, t, sub);
        memcpy(y + j, t, (size_t)(n - j) * sizeof *t);
    }
}

/* Largest of x(n), n >= 1. A NaN may or may not win; a NaN score reaches
 * the output through its exponential either way. */
static inline __attribute__((always_inline)) float row_max(const float *x, int n)
{
    float m[DT_CPU_LANES];
    for (int k = 0; k < DT_CPU_LANES; k++)
        m[k] = x[0];
    int j = 0;
    for (; j + DT_CPU_LANES <= n; j += DT_CPU_LANES)
        for (int k = 0; k < DT_CPU_LANES; k++)
            m[k] = x[j + k] > m[k] ? x[j + k] : m[k];
    float mx = x[0];
    for (; j < n; j++)
        mx = x[j] > mx ? x[j] : mx;
    for (int k = 0; k < DT_CPU_LANES; k++)
        mx = m[k] > mx ? m[k] : mx;
    return mx;
}

/* Sum of x(n), one accumulator per lane. */
static inline __attribute__((always_inline)) float row_sum(const float *x, int n)
{
    float acc[DT_CPU_LANES] = {0};
    int j = 0;
    for (; j + DT_CPU_LANES <= n; j += DT_CPU_LANES)
        for (int k = 0; k < DT_CPU_LANES; k++)
            acc[k] += x[j + k];
    float s = 0.0f;
    for (; j < n; j++)
        s += x[j];
    for (int k = 0; k < DT_CPU_LANES; k++)
        s += acc[k];
    return s;
}

/* Row of kn scores, the first n allowed: softmax in place (the rest set
 * to 0); returns the row's logsumexp. Cloned like exp_sub_row. */
DT_CPU_CLONES static float softmax_row(float *s,
                                                                                      int n, int kn)
{
    float mx = row_max(s, n);
    exp_sub_row(s, s, n, mx);
    float sum = row_sum(s, n), inv = 1.0f / sum;
    int j = 0;
    for (; j + DT_CPU_LANES <= n; j += DT_CPU_LANES)
        for (int k = 0; k < DT_CPU_LANES; k++)
            s[j + k] *= inv;
    for (; j < n; j++)
        s[j] *= inv;
    memset(s + n, 0, (size_t)(kn - n) * sizeof *s);
    return mx + logf(sum);
}

/* The block's scores S(m, kn) = Q[i0:i0+m] K[0:kn]^T * scale. */
static void block_scores(float *S, const float *qkv, const struct head *hd, int i0, int m, int kn,
                         int Dh, float scale)
{
    dt_cpu_sgemm1(0, 1, m, kn, Dh, scale,
                qkv + hd->q + (size_t)i0 * hd->ld, hd->ld, qkv + hd->k, hd->ld, 0.0f, S, kn);
}

/* The heads of all sequences are shared by the pool's threads, each head
 * computed whole by one thread in its own scratch (the caller's workspace
 * on one thread), so the results are the one-thread bits. */
struct att_job {
    float *out, *lse, *dqkv;
    const float *qkv, *dout, *cout, *clse;
    int T, H, Dh, causal, tiles; /* tiles: by the own tiles (below) */
    dt_backend_t *be;
    void *ws;
};

static void att_fwd_head(void *a, int bh, int thread);
static void att_bwd_head(void *a, int bh, int thread);
#if DT_TILES_X86
static void at_fwd_head(const struct att_job *j, const struct head *hd, float *w);
static void at_bwd_head(const struct att_job *j, const struct head *hd, float *w);
#endif

static dt_status att_threads(dt_backend_t *be, struct att_job *j, void *ws, size_t ws_bytes,
                             int heads)
{
    int threads = heads > 1 ? dt_cpu_threads(be) : 1;
    j->be = be;
    j->ws = threads == 1 ? ws : NULL;
    j->tiles = DT_TILES_X86 && dt_cpu_tiles_on();
    return threads == 1 ? DT_OK : dt_cpu_scratch_reserve(be, ws_bytes);
}

dt_status dt_cpu_attention_fwd(dt_backend_t *be, float *out, float *lse, const float *qkv, int B,
                               int T, int H, int Dh, int causal, void *ws, size_t ws_bytes)
{
    dt_status st = check_fwd(out, lse, qkv, B, T, H, Dh, causal, ws, ws_bytes);
    if (st != DT_OK)
        return st;
    struct att_job j = {.out = out, .lse = lse, .qkv = qkv, .T = T, .H = H, .Dh = Dh,
                        .causal = causal};
    if ((st = att_threads(be, &j, ws, ws_bytes, B * H)) != DT_OK)
        return st;
    dt_cpu_run(j.ws ? NULL : be, B * H, att_fwd_head, &j);
    return DT_OK;
}

/* One (sequence, head) of the forward. */
static void att_fwd_head(void *a, int bh, int thread)
{
    const struct att_job *j = a;
    const int T = j->T, H = j->H, Dh = j->Dh, causal = j->causal;
    const float *qkv = j->qkv;
    float *out = j->out, *lse = j->lse;
    const float scale = (float)(1.0 / sqrt((double)Dh));
    const int QB = qblock(T);
    float *S = j->ws ? j->ws : dt_cpu_scratch(j->be, thread); /* (QB, kn) */
    struct head hd = head_at(bh / H, bh % H, T, H, Dh);
#if DT_TILES_X86
    if (j->tiles) {
        at_fwd_head(j, &hd, S);
        return;
    }
#endif
    for (int i0 = 0; i0 < T; i0 += QB) {
        int m = T - i0 < QB ? T - i0 : QB, kn = causal ? i0 + m : T;
        block_scores(S, qkv, &hd, i0, m, kn, Dh, scale);
        for (int r = 0; r < m; r++)
            lse[hd.l + i0 + r] =
                softmax_row(S + (size_t)r * kn, causal ? i0 + r + 1 : T, kn);
        /* O[i0:i0+m] = P V[0:kn] */
        dt_cpu_sgemm1(0, 0, m, Dh, kn, 1.0f, S, kn,
                    qkv + hd.v, hd.ld, 0.0f, out + hd.o + (size_t)i0 * hd.ldo, hd.ldo);
    }
}

/* P(m, kn) = exp(S - lse) row by row (row stride ld), masked entries 0. */
static void probs_from_lse(float *S, size_t ld, const float *lse, int i0, int m, int kn,
                           int causal, int T)
{
    for (int r = 0; r < m; r++) {
        float *s = S + (size_t)r * ld;
        int n = causal ? i0 + r + 1 : T;
        exp_sub_row(s, s, n, lse[i0 + r]);
        memset(s + n, 0, (size_t)(kn - n) * sizeof *s);
    }
}

/* dP(m, kn) becomes dS = P * (dP - rowsum(dO * O)) over each row's
 * allowed keys, 0 past them (row stride ld of both). Cloned like
 * exp_sub_row. */
DT_CPU_CLONES static void
score_grads(float *dP, const float *P, size_t ld, const float *dout, const float *out,
            const struct head *hd, int i0, int m, int kn, int Dh, int causal)
{
    for (int r = 0; r < m; r++) {
        const float *doi = dout + hd->o + (size_t)(i0 + r) * hd->ldo;
        const float *oi = out + hd->o + (size_t)(i0 + r) * hd->ldo;
        float delta = 0.0f;
        for (int d = 0; d < Dh; d++)
            delta += doi[d] * oi[d];
        float *ds = dP + (size_t)r * ld;
        const float *p = P + (size_t)r * ld;
        int n = causal ? i0 + r + 1 : kn, j = 0;
        for (; j + DT_CPU_LANES <= n; j += DT_CPU_LANES) {
            float t[DT_CPU_LANES];
            for (int k = 0; k < DT_CPU_LANES; k++)
                t[k] = p[j + k] * (ds[j + k] - delta);
            for (int k = 0; k < DT_CPU_LANES; k++)
                ds[j + k] = t[k];
        }
        for (; j < n; j++)
            ds[j] = p[j] * (ds[j] - delta);
        memset(ds + n, 0, (size_t)(kn - n) * sizeof *ds);
    }
}

/* ---- fast, by the own tiles ------------------------------------------ */

/* On CPUs where the own tiles run (tiles.h, dt_cpu_tiles_on), the fast
 * version's products are theirs instead of BLAS's, per (sequence, head):
 * the head's K^T and V (or K^T, V^T and K) packed once into panels of 16
 * columns, then per block of ATTN_TBLOCK query rows the same steps as
 * above, each product cut at the causal mask by tiles of 6 query rows:
 * a tile's scores stop at the 16-key panel of its last row, its P V and
 * dS K at its last row's key, and a tile of 6 keys' P^T dO and dS^T Q
 * start at the first query row that sees them. So the masked triangle
 * costs at most a panel per tile, where BLAS over a block computes its
 * whole diagonal square. Keys and values are packed once per head, a
 * block's queries and output gradients once per block (BLAS packs both
 * operands of every call), and the products write their scale and sum
 * with the result.
 * Each element is summed over its terms in order (one FMA each), by one
 * thread per head: the same bits on any thread count; the last bits
 * depend on the CPU, as BLAS's do. */
#if DT_TILES_X86
struct at_ws {
    float *S, *dP, *kt, *vt, *kn, *qp, *dop, *ap;
    size_t lds;
};

static struct at_ws at_layout(float *w, int T, int Dh)
{
    size_t Tp = up16((size_t)T), Dp = up16((size_t)Dh), QB = (size_t)tblock(T);
    struct at_ws s = {.lds = Tp};
    s.S = w;
    s.dP = s.S + QB * Tp;
    s.kt = s.dP + QB * Tp;
    s.vt = s.kt + Tp * (size_t)Dh;
    s.kn = s.vt + Tp * (size_t)Dh;
    s.qp = s.kn + (size_t)T * Dp;
    s.dop = s.qp + QB * Dp;
    s.ap = s.dop + QB * Dp;
    return s;
}

/* A's rows read where they lie (row stride lda), or its columns (A
 * transposed, or a packed edge: column stride lda). */
static TILES void at_tile_rows(int K, const float *a, size_t lda, const float *b, float *c,
                               size_t ldc, int add, float alpha)
{
    dt_tile_body(K, a, lda, 1, b, c, ldc, add, NULL, alpha);
}

static TILES void at_tile_cols(int K, const float *a, size_t lda, const float *b, float *c,
                               size_t ldc, int add, float alpha)
{
    dt_tile_body(K, a, 1, lda, b, c, ldc, add, NULL, alpha);
}

/* C(mr, nr) = alpha A(mr, K) B(K, 16), or C += it when add, for mr <= 6
 * and nr <= 16: A(r, k) at a[r * ars + k * aks] with ars or aks 1, B a
 * packed panel. A whole tile runs on C in place; fewer than 6 rows of A
 * are packed into ap (6 x K floats, zeros past mr), and a tile past C's
 * edge goes through a 6 x 16 copy. */
static void at_tile_edge(int K, const float *a, size_t ars, size_t aks, const float *b, float *c,
                         size_t ldc, int mr, int nr, int add, float alpha, float *ap)
{
    const float *at = a;
    size_t lda = aks != 1 ? aks : ars;
    int cols = aks != 1;
    if (mr < GT_MR) {
        for (int k = 0; k < K; k++)
            for (int r = 0; r < GT_MR; r++)
                ap[(size_t)k * GT_MR + r] = r < mr ? a[r * ars + k * aks] : 0.0f;
        at = ap, lda = GT_MR, cols = 1;
    }
    float edge[GT_MR * GT_NR] = {0};
    for (int r = 0; r < mr && add; r++)
        memcpy(edge + r * GT_NR, c + (size_t)r * ldc, (size_t)nr * sizeof *c);
    if (cols)
        at_tile_cols(K, at, lda, b, edge, GT_NR, add, alpha);
    else
        at_tile_rows(K, at, lda, b, edge, GT_NR, add, alpha);
    for (int r = 0; r < mr; r++)
        memcpy(c + (size_t)r * ldc, edge + r * GT_NR, (size_t)nr * sizeof *c);
}

static inline __attribute__((always_inline)) void
at_tile(int K, const float *a, size_t ars, size_t aks, const float *b, float *c, size_t ldc,
        int mr, int nr, int add, float alpha, float *ap)
{
    if (mr < GT_MR || nr < GT_NR)
        at_tile_edge(K, a, ars, aks, b, c, ldc, mr, nr, add, alpha, ap);
    else if (aks != 1)
        at_tile_cols(K, a, aks, b, c, ldc, add, alpha);
    else
        at_tile_rows(K, a, ars, b, c, ldc, add, alpha);
}

/* The first row of the tile of 6 rows that starts at m0 in a block of m
 * rows: m0, but for the last tile of a block of 6 rows or more, which
 * ends at the block's end (the rows it shares with the tile before are
 * written twice, with the same values where their terms are finite, and
 * the tile runs whole instead of through at_tile_edge). */
static int at_first_row(int m0, int m)
{
    return m - m0 < GT_MR && m >= GT_MR ? m - GT_MR : m0;
}

/* S(m, up to Tp) = alpha A B^T for the block's m rows, A's rows at a
 * (stride lda), B^T packed (bt: panels of 16 keys, Dh x 16 each): each
 * tile of 6 rows up to the panel of its last allowed key (row i0 + r of
 * the sequence allows keys up to it when causal), whole panels (keys
 * past T are 0). */
static void at_scores(float *S, size_t lds, const float *a, size_t lda, const float *bt, int m,
                      int i0, int T, int Dh, int causal, float alpha, float *ap)
{
    for (int m1 = 0; m1 < m; m1 += GT_MR) {
        int m0 = at_first_row(m1, m), mr = m - m0 < GT_MR ? m - m0 : GT_MR;
        int keys = causal ? i0 + m0 + mr : T;
        for (int p = 0; p < keys; p += GT_NR)
            at_tile(Dh, a + (size_t)m0 * lda, lda, 1, bt + (size_t)p * Dh,
                    S + (size_t)m0 * lds + p, lds, mr, GT_NR, 0, alpha, ap);
    }
}

/* C(m, Dh) = alpha P B for the block's m rows of P (stride lds), B
 * packed (bn: panels of 16 of its Dh columns, T x 16 each), each tile of
 * 6 rows over the keys up to its last row's. */
static void at_rows_times(float *C, size_t ldc, const float *P, size_t lds, const float *bn,
                          int m, int i0, int T, int Dh, int causal, float alpha, float *ap)
{
    for (int m1 = 0; m1 < m; m1 += GT_MR) {
        int m0 = at_first_row(m1, m), mr = m - m0 < GT_MR ? m - m0 : GT_MR;
        int keys = causal ? i0 + m0 + mr : T;
        for (int c = 0; c < Dh; c += GT_NR)
            at_tile(keys, P + (size_t)m0 * lds, lds, 1, bn + (size_t)c * T,
                    C + (size_t)m0 * ldc + c, ldc, mr, Dh - c < GT_NR ? Dh - c : GT_NR, 0, alpha,
                    ap);
    }
}

/* C(kn, Dh) += alpha P^T B for the keys [0, kn) of a block of m query
 * rows starting at i0, B's m rows packed (bn: panels of 16 of its Dh
 * columns, m x 16 each): each tile of 6 keys over the query rows from
 * the first that sees them. */
static void at_cols_times(float *C, size_t ldc, const float *P, size_t lds, const float *bn,
                          int m, int i0, int kn, int Dh, int causal, float alpha, float *ap)
{
    for (int j0 = 0; j0 < kn; j0 += GT_MR) {
        int jr = kn - j0 < GT_MR ? kn - j0 : GT_MR, r0 = causal && j0 > i0 ? j0 - i0 : 0;
        for (int c = 0; c < Dh; c += GT_NR)
            at_tile(m - r0, P + (size_t)r0 * lds + j0, 1, lds, bn + (size_t)c * m + r0 * GT_NR,
                    C + (size_t)j0 * ldc + c, ldc, jr, Dh - c < GT_NR ? Dh - c : GT_NR, 1, alpha,
                    ap);
    }
}

/* Panels of 16 columns: x's n rows (stride ld) of Dh columns as they lie
 * (bn: Dh/16 panels of n x 16), or transposed (bt: n/16 panels of Dh x
 * 16, columns past n zero). */
static void at_pack_n(float *bn, const float *x, size_t ld, int n, int Dh)
{
    dt_tile_pack_panels(0, x, ld, 0, n, 0, Dh, Dh, bn);
}

static void at_pack_t(float *bt, const float *x, size_t ld, int n, int Dh)
{
    dt_tile_pack_panels(1, x, ld, 0, Dh, 0, n, n, bt);
}

static void at_fwd_head(const struct att_job *j, const struct head *hd, float *w)
{
    const int T = j->T, Dh = j->Dh, causal = j->causal, QB = tblock(T);
    const float *qkv = j->qkv;
    const float scale = (float)(1.0 / sqrt((double)Dh));
    struct at_ws s = at_layout(w, T, Dh);
    at_pack_t(s.kt, qkv + hd->k, hd->ld, T, Dh);
    at_pack_n(s.kn, qkv + hd->v, hd->ld, T, Dh);
    for (int i0 = 0; i0 < T; i0 += QB) {
        int m = T - i0 < QB ? T - i0 : QB, kn = causal ? i0 + m : T;
        at_scores(s.S, s.lds, qkv + hd->q + (size_t)i0 * hd->ld, hd->ld, s.kt, m, i0, T, Dh,
                  causal, scale, s.ap);
        for (int r = 0; r < m; r++)
            j->lse[hd->l + i0 + r] = softmax_row(s.S + r * s.lds, causal ? i0 + r + 1 : T, kn);
        at_rows_times(j->out + hd->o + (size_t)i0 * hd->ldo, hd->ldo, s.S, s.lds, s.kn, m, i0, T,
                      Dh, causal, 1.0f, s.ap);
    }
}

static void at_bwd_head(const struct att_job *j, const struct head *hd, float *w)
{
    const int T = j->T, Dh = j->Dh, causal = j->causal, QB = tblock(T);
    const float *qkv = j->qkv, *dout = j->dout;
    float *dqkv = j->dqkv;
    const float scale = (float)(1.0 / sqrt((double)Dh));
    struct at_ws s = at_layout(w, T, Dh);
    at_pack_t(s.kt, qkv + hd->k, hd->ld, T, Dh);
    at_pack_t(s.vt, qkv + hd->v, hd->ld, T, Dh);
    at_pack_n(s.kn, qkv + hd->k, hd->ld, T, Dh);
    zero_rows(dqkv + hd->k, T, Dh, hd->ld);
    zero_rows(dqkv + hd->v, T, Dh, hd->ld);
    for (int i0 = 0; i0 < T; i0 += QB) {
        int m = T - i0 < QB ? T - i0 : QB, kn = causal ? i0 + m : T;
        const float *q = qkv + hd->q + (size_t)i0 * hd->ld;
        const float *dO = dout + hd->o + (size_t)i0 * hd->ldo;
        at_scores(s.S, s.lds, q, hd->ld, s.kt, m, i0, T, Dh, causal, scale, s.ap);
        probs_from_lse(s.S, s.lds, j->clse + hd->l, i0, m, kn, causal, T);
        /* dV[0:kn] += P^T dO */
        at_pack_n(s.dop, dO, hd->ldo, m, Dh);
        at_cols_times(dqkv + hd->v, hd->ld, s.S, s.lds, s.dop, m, i0, kn, Dh, causal, 1.0f, s.ap);
        /* dP = dO V^T, then dS in its place */
        at_scores(s.dP, s.lds, dO, hd->ldo, s.vt, m, i0, T, Dh, causal, 1.0f, s.ap);
        score_grads(s.dP, s.S, s.lds, dout, j->cout, hd, i0, m, kn, Dh, causal);
        /* dQ = dS K * scale, dK[0:kn] += dS^T Q * scale */
        at_rows_times(dqkv + hd->q + (size_t)i0 * hd->ld, hd->ld, s.dP, s.lds, s.kn, m, i0, T, Dh,
                      causal, scale, s.ap);
        at_pack_n(s.qp, q, hd->ld, m, Dh);
        at_cols_times(dqkv + hd->k, hd->ld, s.dP, s.lds, s.qp, m, i0, kn, Dh, causal, scale, s.ap);
    }
}
#endif

dt_status dt_cpu_attention_bwd(dt_backend_t *be, float *dqkv, const float *dout, const float *qkv,
                               const float *out, const float *lse, int B, int T, int H, int Dh,
                               int causal, void *ws, size_t ws_bytes)
{
    dt_status st = check_bwd(dqkv, dout, qkv, out, lse, B, T, H, Dh, causal, ws, ws_bytes);
    if (st != DT_OK)
        return st;
    struct att_job j = {.dqkv = dqkv, .dout = dout, .qkv = qkv, .cout = out, .clse = lse, .T = T,
                        .H = H, .Dh = Dh, .causal = causal};
    if ((st = att_threads(be, &j, ws, ws_bytes, B * H)) != DT_OK)
        return st;
    dt_cpu_run(j.ws ? NULL : be, B * H, att_bwd_head, &j);
    return DT_OK;
}

/* One (sequence, head) of the backward. */
static void att_bwd_head(void *a, int bh, int thread)
{
    const struct att_job *j = a;
    const int T = j->T, H = j->H, Dh = j->Dh, causal = j->causal;
    const float *qkv = j->qkv, *dout = j->dout, *out = j->cout, *lse = j->clse;
    float *dqkv = j->dqkv;
    const float scale = (float)(1.0 / sqrt((double)Dh));
    const int QB = qblock(T);
    float *P = j->ws ? j->ws : dt_cpu_scratch(j->be, thread), *dP = P + (size_t)QB * T;
    struct head hd = head_at(bh / H, bh % H, T, H, Dh);
#if DT_TILES_X86
    if (j->tiles) {
        at_bwd_head(j, &hd, P);
        return;
    }
#endif
    float *dq = dqkv + hd.q, *dk = dqkv + hd.k, *dv = dqkv + hd.v;
    const float *k = qkv + hd.k, *v = qkv + hd.v, *dO;
    zero_rows(dk, T, Dh, hd.ld);
    zero_rows(dv, T, Dh, hd.ld);
    for (int i0 = 0; i0 < T; i0 += QB) {
        int m = T - i0 < QB ? T - i0 : QB, kn = causal ? i0 + m : T;
        dO = dout + hd.o + (size_t)i0 * hd.ldo;
        block_scores(P, qkv, &hd, i0, m, kn, Dh, scale);
        probs_from_lse(P, kn, lse + hd.l, i0, m, kn, causal, T);
        /* dV[0:kn] += P^T dO */
        dt_cpu_sgemm1(1, 0, kn, Dh, m, 1.0f, P, kn, dO,
                    hd.ldo, 1.0f, dv, hd.ld);
        /* dP = dO V[0:kn]^T, then dS in its place */
        dt_cpu_sgemm1(0, 1, m, kn, Dh, 1.0f, dO, hd.ldo, v,
                    hd.ld, 0.0f, dP, kn);
        score_grads(dP, P, kn, dout, out, &hd, i0, m, kn, Dh, causal);
        /* dQ[i0:i0+m] = dS K[0:kn] * scale */
        dt_cpu_sgemm1(0, 0, m, Dh, kn, scale, dP, kn, k,
                    hd.ld, 0.0f, dq + (size_t)i0 * hd.ld, hd.ld);
        /* dK[0:kn] += dS^T Q[i0:i0+m] * scale */
        dt_cpu_sgemm1(1, 0, kn, Dh, m, scale, dP, kn,
                    qkv + hd.q + (size_t)i0 * hd.ld, hd.ld, 1.0f, dk, hd.ld);
    }
}

/* ---- decoding with a key/value cache ------------------------------------------ */

/* One sequence, n new positions: their keys and values into the caches,
 * then per new row i and head h the softmax of the scaled scores over the
 * cached rows 0..pos+i, as attention_fwd's reference takes it (sums in
 * double), times the cached values. Shared by both CPU tables: one query
 * row at a time is all generation asks. */
dt_status dt_cpu_attention_decode(dt_backend_t *be, float *out, float *kcache, float *vcache,
                                  const float *qkv, int pos, int n, int T, int H, int Dh)
{
    (void)be;
    DT_CPU_REQUIRE(out && kcache && vcache && qkv, "attention_decode",
                   "out, kcache, vcache and qkv must not be NULL");
    DT_CPU_REQUIRE(n >= 1 && H >= 1 && Dh >= 1 && pos >= 0 && T >= 1 && pos <= T - n,
                   "attention_decode",
                   "positions %d..%d of a cache of %d rows (H=%d, Dh=%d): need n >= 1, H, Dh "
                   ">= 1 and the positions inside the cache",
                   pos, pos + n - 1, T, H, Dh);
    const size_t C = (size_t)H * (size_t)Dh, ld = 3 * C;
    for (int i = 0; i < n; i++) {
        memcpy(kcache + (size_t)(pos + i) * C, qkv + (size_t)i * ld + C, C * sizeof(float));
        memcpy(vcache + (size_t)(pos + i) * C, qkv + (size_t)i * ld + 2 * C, C * sizeof(float));
    }
    double *p = malloc((size_t)(pos + n) * sizeof *p), *acc = malloc((size_t)Dh * sizeof *acc);
    if (!p || !acc) {
        free(p);
        free(acc);
        return dt_set_error(DT_ERR_NOMEM, "cpu attention_decode: no memory for %d scores",
                            pos + n);
    }
    const double scale = 1.0 / sqrt((double)Dh);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < H; h++) {
            const float *q = qkv + (size_t)i * ld + (size_t)h * Dh;
            int kn = pos + i + 1;
            double top = -INFINITY, sum = 0;
            for (int j = 0; j < kn; j++) {
                const float *k = kcache + (size_t)j * C + (size_t)h * Dh;
                double s = 0;
                for (int d = 0; d < Dh; d++)
                    s += (double)q[d] * k[d];
                p[j] = s * scale;
                top = p[j] > top ? p[j] : top;
            }
            memset(acc, 0, (size_t)Dh * sizeof *acc);
            for (int j = 0; j < kn; j++) {
                const float *v = vcache + (size_t)j * C + (size_t)h * Dh;
                double w = exp(p[j] - top);
                sum += w;
                for (int d = 0; d < Dh; d++)
                    acc[d] += w * v[d];
            }
            float *o = out + (size_t)i * C + (size_t)h * Dh;
            for (int d = 0; d < Dh; d++)
                o[d] = (float)(acc[d] / sum);
        }
    free(p);
    free(acc);
    return DT_OK;
}
