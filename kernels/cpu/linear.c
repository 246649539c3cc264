/*
 * linear.c - fully connected layer on the CPU: out = in @ w^T (+ bias), and
 * the bias add on its own, with their backward passes.
 *
 * The reference versions are the textbook triple loops. The fast versions
 * hand the three matrix products to BLAS (OpenBLAS here) with no copies or
 * transposes: row-major in(B,I) and w(O,I) are already the operands sgemm
 * wants, and the weight gradient accumulates through beta = 1. The fast
 * forward starts the product from the bias on every row (beta = 1), which
 * saves the pass over the output that adding it afterwards takes. The bias
 * loops work on fixed blocks of DT_CPU_LANES columns so they vectorise at
 * -O2, and add in the same order as the reference (same bits).
 *
 * The channel bias of a convolution, x(N,C,HW) += b(C), is here too: its
 * forward is one broadcast add per (n, c) plane; its backward sums each
 * plane (one float accumulator per lane in the fast version, one running
 * sum in the reference) into a double per channel.
 *
 * With train.precision bf16 or fp16 the matmul operands are first rounded
 * to that type (dt_cpu_operand), as tensor cores would see them; sums and
 * outputs stay fp32. They are rounded as they are read, so the CPU keeps
 * no rounded input for backward (dt_backend_kept_operand_bytes is 0 and
 * in_kept is not used).
 *
 * Gradients of parameters (dw, db) ACCUMULATE (+=); the gradient of the
 * activation (din) is WRITTEN (=).
 */
#include <string.h>

#include "cpu_ops.h"


/* bias_bwd sums this many columns at a time in a stack buffer. */
#define BIAS_BWD_CHUNK 256

static dt_status check_linear_fwd(const float *out, const float *in, const float *w, int B, int I,
                                  int O)
{
    DT_CPU_REQUIRE(out && in && w, "linear_fwd", "out, in and w must not be NULL");
    DT_CPU_REQUIRE(B >= 0 && I >= 0 && O >= 0, "linear_fwd",
                   "sizes must be >= 0 (B=%d, I=%d, O=%d)", B, I, O);
    return DT_OK;
}

static dt_status check_linear_bwd(const float *din, const float *dw, const float *dout,
                                  const float *in, const float *w, int B, int I, int O)
{
    DT_CPU_REQUIRE(dw && dout && in, "linear_bwd", "dw, dout and in must not be NULL");
    DT_CPU_REQUIRE(!din || w, "linear_bwd", "w must not be NULL when din is asked for");
    DT_CPU_REQUIRE(B >= 0 && I >= 0 && O >= 0, "linear_bwd",
                   "sizes must be >= 0 (B=%d, I=%d, O=%d)", B, I, O);
    return DT_OK;
}

static dt_status check_bias(const char *op, const float *x, const float *b, int B, int C)
{
    if (!x || !b)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu %s: pointers must not be NULL", op);
    if (B < 0 || C < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu %s: sizes must be >= 0 (B=%d, C=%d)", op, B,
                            C);
    return DT_OK;
}

static dt_status check_channel_bias(const char *op, const float *x, const float *b, int N, int C,
                                    int HW)
{
    if (!x || !b)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu %s: pointers must not be NULL", op);
    if (N < 0 || C < 0 || HW < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu %s: sizes must be >= 0 (N=%d, C=%d, HW=%d)",
                            op, N, C, HW);
    return DT_OK;
}

/* Scratch slots of the rounded operands (train.precision bf16/fp16). */
enum { OPERAND_IN, OPERAND_W, OPERAND_DOUT };

/* The forward's operands at the backend's precision. */
static dt_status rounded_fwd_operands(dt_backend_t *be, const float **in, const float **w, int B,
                                      int I, int O)
{
    dt_status st = dt_cpu_operand(be, OPERAND_IN, *in, (size_t)B * I, in);
    if (st == DT_OK)
        st = dt_cpu_operand(be, OPERAND_W, *w, (size_t)O * I, w);
    return st;
}

/* The backward's operands at the backend's precision; w only when the
 * input gradient is asked for. */
static dt_status rounded_bwd_operands(dt_backend_t *be, const float **dout, const float **in,
                                      const float **w, int B, int I, int O)
{
    dt_status st = dt_cpu_operand(be, OPERAND_DOUT, *dout, (size_t)B * O, dout);
    if (st == DT_OK)
        st = dt_cpu_operand(be, OPERAND_IN, *in, (size_t)B * I, in);
    if (st == DT_OK && w)
        st = dt_cpu_operand(be, OPERAND_W, *w, (size_t)O * I, w);
    return st;
}

/* ---- reference ------------------------------------------------------- */

/* out(B,O) = in(B,I) @ w(O,I)^T (+ bias(O)): the sum, then the bias added
 * to it, as a separate bias_fwd would */
dt_status dt_cpu_linear_fwd_ref(dt_backend_t *be, float *out, const float *in, const float *w,
                                const float *bias, int B, int I, int O, void *in_kept)
{
    (void)in_kept; /* operands are rounded as they are read: nothing to keep */
    dt_status st = check_linear_fwd(out, in, w, B, I, O);
    if (st == DT_OK)
        st = rounded_fwd_operands(be, &in, &w, B, I, O);
    if (st != DT_OK)
        return st;
    for (int b = 0; b < B; b++) {
        const float *x = in + (size_t)b * I; /* (I) */
        for (int o = 0; o < O; o++) {
            const float *wo = w + (size_t)o * I; /* (I) */
            float s = 0.0f;
            for (int i = 0; i < I; i++)
                s += x[i] * wo[i];
            out[(size_t)b * O + o] = bias ? s + bias[o] : s;
        }
    }
    return DT_OK;
}

/* din(B,I) = dout(B,O) @ w(O,I);  dw(O,I) += dout(B,O)^T @ in(B,I) */
dt_status dt_cpu_linear_bwd_ref(dt_backend_t *be, float *din, float *dw, const float *dout,
                                const float *in, const float *w, int B, int I, int O,
                                const void *in_kept)
{
    (void)in_kept;
    dt_status st = check_linear_bwd(din, dw, dout, in, w, B, I, O);
    if (st == DT_OK)
        st = rounded_bwd_operands(be, &dout, &in, din ? &w : NULL, B, I, O);
    if (st != DT_OK)
        return st;
    if (din) {
        for (int b = 0; b < B; b++) {
            for (int i = 0; i < I; i++) {
                float s = 0.0f;
                for (int o = 0; o < O; o++)
                    s += dout[(size_t)b * O + o] * w[(size_t)o * I + i];
                din[(size_t)b * I + i] = s;
            }
        }
    }
    for (int o = 0; o < O; o++) {
        for (int i = 0; i < I; i++) {
            float s = 0.0f;
            for (int b = 0; b < B; b++)
                s += dout[(size_t)b * O + o] * in[(size_t)b * I + i];
            dw[(size_t)o * I + i] += s;
        }
    }
    return DT_OK;
}

/* x(B,C) += b(C) */
dt_status dt_cpu_bias_fwd_ref(dt_backend_t *be, float *x, const float *b, int B, int C)
{
    dt_status st = check_bias("bias_fwd", x, b, B, C);
    if (st != DT_OK)
        return st;
    for (int r = 0; r < B; r++)
        for (int c = 0; c < C; c++)
            x[(size_t)r * C + c] += b[c];
    return DT_OK;
}

/* db(C) += sum over rows of dout(B,C) */
dt_status dt_cpu_bias_bwd_ref(dt_backend_t *be, float *db, const float *dout, int B, int C)
{
    dt_status st = check_bias("bias_bwd", db, dout, B, C);
    if (st != DT_OK)
        return st;
    for (int c = 0; c < C; c++) {
        float s = 0.0f;
        for (int r = 0; r < B; r++)
            s += dout[(size_t)r * C + c];
        db[c] += s;
    }
    return DT_OK;
}

/* x(N,C,HW) += b(C) */
dt_status dt_cpu_channel_bias_fwd_ref(dt_backend_t *be, float *x, const float *b, int N, int C,
                                      int HW)
{
    dt_status st = check_channel_bias("channel_bias_fwd", x, b, N, C, HW);
    if (st != DT_OK)
        return st;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            for (int i = 0; i < HW; i++)
                x[((size_t)n * C + c) * HW + i] += b[c];
    return DT_OK;
}

/* db(C) += sum over N and HW of dout(N,C,HW) */
dt_status dt_cpu_channel_bias_bwd_ref(dt_backend_t *be, float *db, const float *dout, int N, int C,
                                      int HW)
{
    dt_status st = check_channel_bias("channel_bias_bwd", db, dout, N, C, HW);
    if (st != DT_OK)
        return st;
    for (int c = 0; c < C; c++) {
        double s = 0.0;
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++)
                s += dout[((size_t)n * C + c) * HW + i];
        db[c] += (float)s;
    }
    return DT_OK;
}

/* ---- fast ------------------------------------------------------------ */

static void fill_rows(dt_backend_t *be, float *x, const float *b, int B, int C);

dt_status dt_cpu_linear_fwd(dt_backend_t *be, float *out, const float *in, const float *w,
                            const float *bias, int B, int I, int O, void *in_kept)
{
    (void)in_kept;
    dt_status st = check_linear_fwd(out, in, w, B, I, O);
    if (st == DT_OK)
        st = rounded_fwd_operands(be, &in, &w, B, I, O);
    if (st != DT_OK)
        return st;
    if (B == 0 || O == 0)
        return DT_OK;
    /* The bias goes into out with the product: written with it by the
     * tiles, or the product's starting value (beta = 1) for BLAS; no pass
     * over out adds it afterwards. */
    if (I > 0 && dt_cpu_sgemm_tiles(be, 1, B, O, I, in, I, w, I, bias, out, O))
        return DT_OK;
    /* a short batch: out^T(O,B) = w(O,I) . in(B,I)^T, the weights read
     * where they lie and the batch packed, by the same tiles */
    if (I > 0 && dt_cpu_sgemm_tiles_ct(be, 1, O, B, I, w, I, in, I, bias, out, O))
        return DT_OK;
    if (bias)
        fill_rows(be, out, bias, B, O);
    if (I == 0) { /* an empty sum; BLAS rejects a leading dimension of 0 */
        if (!bias)
            memset(out, 0, (size_t)B * O * sizeof *out);
        return DT_OK;
    }
    /* out(B,O) (+)= in(B,I) . w(O,I)^T */
    dt_cpu_sgemm(be, 0, 1, B, O, I, 1.0f, in, I, w, I, bias ? 1.0f : 0.0f, out, O);
    return DT_OK;
}

dt_status dt_cpu_linear_bwd(dt_backend_t *be, float *din, float *dw, const float *dout,
                            const float *in, const float *w, int B, int I, int O,
                            const void *in_kept)
{
    (void)in_kept;
    dt_status st = check_linear_bwd(din, dw, dout, in, w, B, I, O);
    if (st == DT_OK)
        st = rounded_bwd_operands(be, &dout, &in, din ? &w : NULL, B, I, O);
    if (st != DT_OK)
        return st;
    if (din && B > 0 && I > 0) {
        if (O == 0)
            memset(din, 0, (size_t)B * I * sizeof *din);
        else if (!dt_cpu_sgemm_tiles(be, 0, B, I, O, dout, O, w, I, NULL, din, I))
            /* din(B,I) = dout(B,O) . w(O,I), by the tiles or here */
            dt_cpu_sgemm(be, 0, 0, B, I, O, 1.0f, dout, O, w, I, 0.0f, din, I);
    }
    if (B > 0 && I > 0 && O > 0) /* dw(O,I) += dout(B,O)^T . in(B,I) */
        dt_cpu_sgemm(be, 1, 0, O, I, B, 1.0f, dout, O, in, I, 1.0f, dw, I);
    return DT_OK;
}

struct bias_job {
    float *x, *db;
    const float *b, *dout;
    int B, C, HW;
};

DT_CPU_CLONES static void bias_fwd_rows(void *a, size_t lo, size_t hi)
{
    const struct bias_job *j = a;
    float *x = j->x;
    const float *b = j->b;
    const int C = j->C;
    for (size_t r = lo; r < hi; r++) {
        float *xr = x + (size_t)r * C; /* (C) */
        int c = 0;
        for (; c + DT_CPU_LANES <= C; c += DT_CPU_LANES) {
            float t[DT_CPU_LANES];
            for (int k = 0; k < DT_CPU_LANES; k++)
                t[k] = xr[c + k] + b[c + k];
            for (int k = 0; k < DT_CPU_LANES; k++)
                xr[c + k] = t[k];
        }
        for (; c < C; c++)
            xr[c] += b[c];
    }
}

static void fill_rows_range(void *a, size_t lo, size_t hi)
{
    const struct bias_job *j = a;
    const size_t C = (size_t)j->C;
    for (size_t r = lo; r < hi; r++)
        memcpy(j->x + r * C, j->b, C * sizeof *j->x);
}

/* x(B,C) = b(C) on every row (linear_fwd's starting value). */
static void fill_rows(dt_backend_t *be, float *x, const float *b, int B, int C)
{
    struct bias_job j = {.x = x, .b = b, .B = B, .C = C};
    dt_cpu_for(be, (size_t)B, C ? DT_CPU_GRAIN / (size_t)C + 1 : (size_t)B + 1, fill_rows_range,
               &j);
}

dt_status dt_cpu_bias_fwd(dt_backend_t *be, float *x, const float *b, int B, int C)
{
    dt_status st = check_bias("bias_fwd", x, b, B, C);
    if (st != DT_OK)
        return st;
    struct bias_job j = {.x = x, .b = b, .B = B, .C = C};
    dt_cpu_for(be, (size_t)B, C ? DT_CPU_GRAIN / (size_t)C + 1 : (size_t)B + 1, bias_fwd_rows, &j);
    return DT_OK;
}

/* Columns summed together down the rows: four vectors, whose sums stay in
 * registers from the first row to the last (a sum in an array would be
 * loaded and stored again for every row). Built for AVX-512, AVX2 and the
 * baseline, picked at load time. */
#define BIAS_BWD_COLS (4 * DT_CPU_LANES)
typedef float bias_vec __attribute__((vector_size(DT_CPU_LANES * sizeof(float))));

DT_CPU_CLONES static void
bias_bwd_cols(float *db, const float *dout, int B, int C)
{
    bias_vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, x0, x1, x2, x3;
    for (int r = 0; r < B; r++) {
        const float *row = dout + (size_t)r * C; /* (BIAS_BWD_COLS) of (C) */
        memcpy(&x0, row, sizeof x0);
        memcpy(&x1, row + DT_CPU_LANES, sizeof x1);
        memcpy(&x2, row + 2 * DT_CPU_LANES, sizeof x2);
        memcpy(&x3, row + 3 * DT_CPU_LANES, sizeof x3);
        a0 += x0;
        a1 += x1;
        a2 += x2;
        a3 += x3;
    }
    float acc[BIAS_BWD_COLS];
    memcpy(acc, &a0, sizeof a0);
    memcpy(acc + DT_CPU_LANES, &a1, sizeof a1);
    memcpy(acc + 2 * DT_CPU_LANES, &a2, sizeof a2);
    memcpy(acc + 3 * DT_CPU_LANES, &a3, sizeof a3);
    for (int k = 0; k < BIAS_BWD_COLS; k++)
        db[k] += acc[k];
}

/* Sums a strip of n <= BIAS_BWD_CHUNK columns over all rows, each column
 * in the reference's order (acc starts at 0, adds the rows in order, then
 * db +=): BIAS_BWD_COLS columns at a time down all rows, then the rest. */
static void bias_bwd_strip(float *db, const float *dout, int B, int C, int n)
{
    int c = 0;
    for (; c + BIAS_BWD_COLS <= n; c += BIAS_BWD_COLS)
        bias_bwd_cols(db + c, dout + c, B, C);
    if (c == n)
        return;
    float acc[BIAS_BWD_COLS] = {0};
    const int m = n - c;
    for (int r = 0; r < B; r++) {
        const float *row = dout + (size_t)r * C + c; /* (m) of (C) */
        for (int k = 0; k < m; k++)
            acc[k] += row[k];
    }
    for (int k = 0; k < m; k++)
        db[c + k] += acc[k];
}

static void bias_bwd_strips(void *a, size_t lo, size_t hi)
{
    const struct bias_job *j = a;
    for (size_t k = lo; k < hi; k++) {
        int c0 = (int)k * BIAS_BWD_CHUNK;
        int n = j->C - c0 < BIAS_BWD_CHUNK ? j->C - c0 : BIAS_BWD_CHUNK;
        bias_bwd_strip(j->db + c0, j->dout + c0, j->B, j->C, n);
    }
}

dt_status dt_cpu_bias_bwd(dt_backend_t *be, float *db, const float *dout, int B, int C)
{
    dt_status st = check_bias("bias_bwd", db, dout, B, C);
    if (st != DT_OK)
        return st;
    struct bias_job j = {.db = db, .dout = dout, .B = B, .C = C};
    size_t strips = ((size_t)C + BIAS_BWD_CHUNK - 1) / BIAS_BWD_CHUNK;
    /* a strip is B * 256 floats: share them once there are enough rows */
    dt_cpu_for(be, strips, B >= 64 ? 1 : strips, bias_bwd_strips, &j);
    return DT_OK;
}

/* Planes [lo, hi) of the (N*C) planes: x += b[c]. */
DT_CPU_CLONES static void channel_bias_planes(void *a, size_t lo, size_t hi)
{
    const struct bias_job *j = a;
    const int HW = j->HW;
    for (size_t p = lo; p < hi; p++) {
        float *xp = j->x + p * HW; /* (HW) */
        const float bc = j->b[p % (size_t)j->C];
        for (int i = 0; i < HW; i++)
            xp[i] += bc;
    }
}

dt_status dt_cpu_channel_bias_fwd(dt_backend_t *be, float *x, const float *b, int N, int C, int HW)
{
    dt_status st = check_channel_bias("channel_bias_fwd", x, b, N, C, HW);
    if (st != DT_OK)
        return st;
    struct bias_job j = {.x = x, .b = b, .B = N, .C = C, .HW = HW};
    dt_cpu_for(be, (size_t)N * C, HW ? DT_CPU_GRAIN / (size_t)HW + 1 : (size_t)N * C + 1,
               channel_bias_planes, &j);
    return DT_OK;
}

/* Sum of one plane of n floats, one float accumulator per lane. */
static inline __attribute__((always_inline)) float plane_sum(const float *v, int n)
{
    float acc[DT_CPU_LANES] = {0};
    int i = 0;
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

/* Channels per block of channel_bias_sums: their sums stay in a stack
 * array while the samples go by. */
#define BIAS_SUM_CHANNELS 64

/* Channels [lo, hi): db[c] += the sum of its N planes, in sample order,
 * the planes visited in memory order (sample by sample, a block of
 * channels within each): each channel's sum as channel by channel. */
DT_CPU_CLONES static void channel_bias_sums(void *a, size_t lo, size_t hi)
{
    const struct bias_job *j = a;
    for (size_t c0 = lo; c0 < hi; c0 += BIAS_SUM_CHANNELS) {
        size_t m = hi - c0 < BIAS_SUM_CHANNELS ? hi - c0 : BIAS_SUM_CHANNELS;
        double s[BIAS_SUM_CHANNELS] = {0};
        for (int n = 0; n < j->B; n++)
            for (size_t k = 0; k < m; k++)
                s[k] += plane_sum(j->dout + ((size_t)n * j->C + c0 + k) * j->HW, j->HW);
        for (size_t k = 0; k < m; k++)
            j->db[c0 + k] += (float)s[k];
    }
}

dt_status dt_cpu_channel_bias_bwd(dt_backend_t *be, float *db, const float *dout, int N, int C,
                                  int HW)
{
    dt_status st = check_channel_bias("channel_bias_bwd", db, dout, N, C, HW);
    if (st != DT_OK)
        return st;
    struct bias_job j = {.db = db, .dout = dout, .B = N, .C = C, .HW = HW};
    dt_cpu_for(be, (size_t)C, dt_cpu_channel_grain(be, N, C, HW), channel_bias_sums, &j);
    return DT_OK;
}
