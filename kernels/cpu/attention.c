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
 * same bits.
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
#include "vexp.h"

/* Query rows per block of the fast path: a block of scores is
 * ATTN_QBLOCK x T floats, two of them make the workspace. */
#define ATTN_QBLOCK 64

static int qblock(int T) { return T < ATTN_QBLOCK ? T : ATTN_QBLOCK; }

/* The workspace of both versions: two blocks of query rows x T scores
 * (the reference uses the first T doubles as its row of scores). */
static size_t attn_ws_bytes(int T) { return 2 * (size_t)qblock(T) * (size_t)T * sizeof(float); }

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

static dt_status check_ws(const char *op, int T, const void *ws, size_t ws_bytes)
{
    size_t need = attn_ws_bytes(T);
    if (!ws || ws_bytes < need)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cpu %s: the workspace (%zu bytes%s) is smaller than the %zu bytes "
                            "attention_workspace asks for with T=%d",
                            op, ws ? ws_bytes : 0, ws ? "" : ", NULL", need, T);
    return DT_OK;
}

static dt_status check_fwd(const float *out, const float *lse, const float *qkv, int B, int T,
                           int H, int Dh, int causal, const void *ws, size_t ws_bytes)
{
    DT_CPU_REQUIRE(out && lse && qkv, "attention_fwd", "out, lse and qkv must not be NULL");
    dt_status st = check_shape("attention_fwd", B, T, H, Dh, causal);
    return st != DT_OK ? st : check_ws("attention_fwd", T, ws, ws_bytes);
}

static dt_status check_bwd(const float *dqkv, const float *dout, const float *qkv, const float *out,
                           const float *lse, int B, int T, int H, int Dh, int causal,
                           const void *ws, size_t ws_bytes)
{
    DT_CPU_REQUIRE(dqkv && dout && qkv && out && lse, "attention_bwd",
                   "dqkv, dout, qkv, out and lse must not be NULL");
    dt_status st = check_shape("attention_bwd", B, T, H, Dh, causal);
    return st != DT_OK ? st : check_ws("attention_bwd", T, ws, ws_bytes);
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
        *bytes = attn_ws_bytes(T);
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
    int T, H, Dh, causal;
    dt_backend_t *be;
    void *ws;
};

static void att_fwd_head(void *a, int bh, int thread);
static void att_bwd_head(void *a, int bh, int thread);

static dt_status att_threads(dt_backend_t *be, struct att_job *j, void *ws, size_t ws_bytes,
                             int heads)
{
    int threads = heads > 1 ? dt_cpu_threads(be) : 1;
    j->be = be;
    j->ws = threads == 1 ? ws : NULL;
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

/* P(m, kn) = exp(S - lse) row by row, masked entries 0. */
static void probs_from_lse(float *S, const float *lse, int i0, int m, int kn, int causal, int T)
{
    for (int r = 0; r < m; r++) {
        float *s = S + (size_t)r * kn;
        int n = causal ? i0 + r + 1 : T;
        exp_sub_row(s, s, n, lse[i0 + r]);
        memset(s + n, 0, (size_t)(kn - n) * sizeof *s);
    }
}

/* dP(m, kn) becomes dS = P * (dP - rowsum(dO * O)). Cloned like
 * exp_sub_row. */
DT_CPU_CLONES static void
score_grads(float *dP, const float *P, const float *dout, const float *out, const struct head *hd,
            int i0, int m, int kn, int Dh)
{
    for (int r = 0; r < m; r++) {
        const float *doi = dout + hd->o + (size_t)(i0 + r) * hd->ldo;
        const float *oi = out + hd->o + (size_t)(i0 + r) * hd->ldo;
        float delta = 0.0f;
        for (int d = 0; d < Dh; d++)
            delta += doi[d] * oi[d];
        float *ds = dP + (size_t)r * kn;
        const float *p = P + (size_t)r * kn;
        int j = 0;
        for (; j + DT_CPU_LANES <= kn; j += DT_CPU_LANES) {
            float t[DT_CPU_LANES];
            for (int k = 0; k < DT_CPU_LANES; k++)
                t[k] = p[j + k] * (ds[j + k] - delta);
            for (int k = 0; k < DT_CPU_LANES; k++)
                ds[j + k] = t[k];
        }
        for (; j < kn; j++)
            ds[j] = p[j] * (ds[j] - delta);
    }
}

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
    float *dq = dqkv + hd.q, *dk = dqkv + hd.k, *dv = dqkv + hd.v;
    const float *k = qkv + hd.k, *v = qkv + hd.v, *dO;
    zero_rows(dk, T, Dh, hd.ld);
    zero_rows(dv, T, Dh, hd.ld);
    for (int i0 = 0; i0 < T; i0 += QB) {
        int m = T - i0 < QB ? T - i0 : QB, kn = causal ? i0 + m : T;
        dO = dout + hd.o + (size_t)i0 * hd.ldo;
        block_scores(P, qkv, &hd, i0, m, kn, Dh, scale);
        probs_from_lse(P, lse + hd.l, i0, m, kn, causal, T);
        /* dV[0:kn] += P^T dO */
        dt_cpu_sgemm1(1, 0, kn, Dh, m, 1.0f, P, kn, dO,
                    hd.ldo, 1.0f, dv, hd.ld);
        /* dP = dO V[0:kn]^T, then dS in its place */
        dt_cpu_sgemm1(0, 1, m, kn, Dh, 1.0f, dO, hd.ldo, v,
                    hd.ld, 0.0f, dP, kn);
        score_grads(dP, P, dout, out, &hd, i0, m, kn, Dh);
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
