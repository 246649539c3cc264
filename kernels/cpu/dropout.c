/*
 * dropout.c - inverted dropout on the CPU.
 *
 * The mask is a pure function of (key, global element index), so
 * backward can draw it again, a CUDA kernel reproduces it bit for bit, and
 * a batch split across calls, micro-batches or ranks gets the same mask as
 * one call over the whole batch. The fast forward also keeps it, a byte
 * per element, in the backend (dt_cpu_mask_store, the last DT_CPU_MASKS
 * of them), and the fast backward with the same arguments applies the
 * kept one instead of drawing it again. For a (rows, cols) block
 * whose first row is global row row0, element e = (row0 + r) * cols + c is
 * kept when
 *     u = dt_rng_u32_to_unit(word e % 4 of dt_rng_block(key, e / 4, 0)) >= p
 * and kept values are scaled by 1 / (1 - p); p == 0 is a plain copy.
 *
 * The reference draws one Philox block per element, exactly as written
 * above. The fast version draws each block once, sixteen blocks at a time
 * in SIMD lanes, and uses its four words for four consecutive elements
 * (same mask, same bits, a small fraction of the generator work).
 *
 * No parameters; the activation gradient (din) is WRITTEN (=):
 * din = dout * mask / (1 - p), which is the forward applied to dout.
 */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"

#define WORDS_PER_BLOCK 4

static dt_status check_dropout(const char *op, const float *out, const float *in, int rows,
                               int cols, float p, const struct dt_rng_key *key)
{
    if (!out || !in)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu %s: pointers must not be NULL", op);
    if (rows < 0 || cols < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu %s: sizes must be >= 0 (rows=%d, cols=%d)",
                            op, rows, cols);
    if (!(p >= 0.0f && p < 1.0f)) /* also rejects NaN */
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu %s: dropout probability %g is outside [0, 1)",
                            op, (double)p);
    if (!key && p > 0.0f)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu %s: the rng key must not be NULL", op);
    return DT_OK;
}

/* p == 0: out = in (memmove: out == in is allowed) */
static void copy_block(float *out, const float *in, size_t n)
{
    if (out != in && n > 0)
        memmove(out, in, n * sizeof *out);
}

/* out(rows, cols) = in * mask / (1 - p), one generator call per element */
static void dropout_ref(float *out, const float *in, int rows, int cols, float p,
                        const struct dt_rng_key *key, uint64_t row0)
{
    const float scale = 1.0f / (1.0f - p);
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) {
            uint64_t e = (row0 + (uint64_t)r) * (uint64_t)cols + (uint64_t)c;
            uint32_t word[WORDS_PER_BLOCK];
            dt_rng_block(key, e / WORDS_PER_BLOCK, 0, word);
            float u = dt_rng_u32_to_unit(word[e % WORDS_PER_BLOCK]);
            size_t i = (size_t)r * cols + c;
            out[i] = u >= p ? in[i] * scale : 0.0f;
        }
    }
}

/* Philox for 16 consecutive counters at once in GCC vector types, so each
 * round is a few SIMD instructions; the functions that use it are built
 * for AVX-512, AVX2 and the baseline and picked at load time. Each 64-bit
 * lane holds two 32-bit counter words (even lane low), so the 32x32->64
 * products are plain 64-bit multiplies of the low and high halves, with no
 * shuffles. Same bits as dt_rng_stream_block.
 *
 * A word x keeps its element when u = (x >> 8) * 2^-24 >= p, which for the
 * integer x >> 8 is exactly (x >> 8) >= ceil(p * 2^24) = thr. */
#define LANES 16
#define GROUP_ELEMS (LANES * WORDS_PER_BLOCK)

typedef uint32_t u32v __attribute__((vector_size(LANES * 4)));
typedef uint64_t u64v __attribute__((vector_size(LANES * 4)));
typedef float f32v __attribute__((vector_size(LANES * 4)));

#define LO32 0xffffffffull


/* What every group of one call shares: the round keys, both 32-bit halves
 * of each 64-bit lane (the scalar key schedule and its broadcast would
 * otherwise run again in every group), and round 0's terms that depend on
 * the high counter words alone, which are the same in every block:
 * c2 * M1's halves and c3 ^ k1. */
struct philox_plan {
    uint64_t k0[DT_PHILOX_ROUNDS], k1[DT_PHILOX_ROUNDS];
    uint64_t hi2_k0, lo2, c3_k1; /* round 0 */
    uint32_t thr;
};

static uint64_t both_halves(uint32_t k) { return (uint64_t)k | ((uint64_t)k << 32); }

static void plan_philox(const struct dt_rng_stream *s, uint32_t thr, struct philox_plan *pl)
{
    uint32_t k0 = s->k0, k1 = s->k1;
    for (int r = 0; r < DT_PHILOX_ROUNDS; r++) {
        pl->k0[r] = both_halves(k0);
        pl->k1[r] = both_halves(k1);
        k0 += DT_PHILOX_W0;
        k1 += DT_PHILOX_W1;
    }
    uint64_t p2 = (uint64_t)DT_PHILOX_M1 * s->c2;
    pl->hi2_k0 = both_halves((uint32_t)(p2 >> 32) ^ s->k0);
    pl->lo2 = both_halves((uint32_t)p2);
    pl->c3_k1 = both_halves(s->c3 ^ s->k1);
    pl->thr = thr;
}

/* mask[k] lane l: word k of block first + l passes (all ones) or not (0) */
static inline __attribute__((always_inline)) void
philox_masks(const struct philox_plan *pl, uint64_t first, u32v mask[4])
{
    uint32_t w0[LANES], w1[LANES];
    for (int l = 0; l < LANES; l++) {
        w0[l] = (uint32_t)(first + (uint64_t)l);
        w1[l] = (uint32_t)((first + (uint64_t)l) >> 32);
    }
    u64v c0, c1, c2, c3;
    memcpy(&c0, w0, sizeof c0);
    memcpy(&c1, w1, sizeof c1);
    /* round 0: c2 and c3 are the stream's, the same in every lane */
    u64v e0 = (c0 & LO32) * DT_PHILOX_M0, o0 = (c0 >> 32) * DT_PHILOX_M0;
    c0 = c1 ^ pl->hi2_k0;
    c2 = ((e0 >> 32) | (o0 & ~LO32)) ^ pl->c3_k1;
    c1 = (u64v){0} + pl->lo2;
    c3 = (e0 & LO32) | (o0 << 32);
    for (int r = 1; r < DT_PHILOX_ROUNDS; r++) {
        e0 = (c0 & LO32) * DT_PHILOX_M0, o0 = (c0 >> 32) * DT_PHILOX_M0;
        u64v e2 = (c2 & LO32) * DT_PHILOX_M1, o2 = (c2 >> 32) * DT_PHILOX_M1;
        u64v hi0 = (e0 >> 32) | (o0 & ~LO32), lo0 = (e0 & LO32) | (o0 << 32);
        u64v hi2 = (e2 >> 32) | (o2 & ~LO32), lo2 = (e2 & LO32) | (o2 << 32);
        c0 = hi2 ^ c1 ^ pl->k0[r];
        c2 = hi0 ^ c3 ^ pl->k1[r];
        c1 = lo2;
        c3 = lo0;
    }
    const uint32_t thr = pl->thr;
    mask[0] = (u32v)(((u32v)c0 >> 8) >= thr);
    mask[1] = (u32v)(((u32v)c1 >> 8) >= thr);
    mask[2] = (u32v)(((u32v)c2 >> 8) >= thr);
    mask[3] = (u32v)(((u32v)c3 >> 8) >= thr);
}

/* Reorders four word masks into element order: element 4*l + k is word k
 * of block l. out[v] covers elements 16v .. 16v+15. */
static inline __attribute__((always_inline)) void interleave(const u32v m[4], u32v out[4])
{
    const u32v lo = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};
    const u32v hi = {8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const u64v q0 = {0, 8, 1, 9, 2, 10, 3, 11}, q1 = {4, 12, 5, 13, 6, 14, 7, 15};
    u64v lo01 = (u64v)__builtin_shuffle(m[0], m[1], lo), hi01 = (u64v)__builtin_shuffle(m[0], m[1], hi);
    u64v lo23 = (u64v)__builtin_shuffle(m[2], m[3], lo), hi23 = (u64v)__builtin_shuffle(m[2], m[3], hi);
    out[0] = (u32v)__builtin_shuffle(lo01, lo23, q0);
    out[1] = (u32v)__builtin_shuffle(lo01, lo23, q1);
    out[2] = (u32v)__builtin_shuffle(hi01, hi23, q0);
    out[3] = (u32v)__builtin_shuffle(hi01, hi23, q1);
}

/* One whole group: dst[j] = src[j] * scale where kept, +0 where dropped,
 * for the GROUP_ELEMS elements starting at block `first` (mask, when not
 * NULL: 1 kept, 0 dropped). */
static inline __attribute__((always_inline)) void
group_whole(const struct philox_plan *pl, uint64_t first, float scale, const float *src,
            float *dst, uint8_t *mask)
{
    u32v m[4], keep[4];
    philox_masks(pl, first, m);
    interleave(m, keep);
    for (int v = 0; v < 4; v++) {
        f32v x;
        memcpy(&x, src + LANES * v, sizeof x);
        u32v y = (u32v)(x * scale) & keep[v];
        memcpy(dst + LANES * v, &y, sizeof y);
        if (mask) {
            uint8_t m8[LANES];
            for (int l = 0; l < LANES; l++)
                m8[l] = (uint8_t)(keep[v][l] & 1u);
            memcpy(mask + LANES * v, m8, sizeof m8);
        }
    }
}

/* `groups` whole groups in a row from block `first` on: one call for the
 * run, so consecutive groups' rounds overlap in the core. */
DT_CPU_CLONES static void
dropout_whole(const struct philox_plan *pl, uint64_t first, uint64_t groups, float scale,
              const float *src, float *dst, uint8_t *mask)
{
    for (uint64_t q = 0; q < groups; q++) {
        size_t at = (size_t)q * GROUP_ELEMS;
        group_whole(pl, first + q * LANES, scale, src + at, dst + at, mask ? mask + at : NULL);
    }
}

/* Part of a group: elements [off, off + count) of the group of
 * GROUP_ELEMS elements starting at block `first`; src and dst (and mask)
 * point at element off. */
DT_CPU_CLONES static void
dropout_part(const struct philox_plan *pl, uint64_t first, float scale, const float *src,
             float *dst, uint8_t *mask, int off, int count)
{
    u32v m[4], keep[4];
    philox_masks(pl, first, m);
    interleave(m, keep);
    uint32_t flat[GROUP_ELEMS];
    memcpy(flat, keep, sizeof flat);
    for (int j = 0; j < count; j++) {
        dst[j] = flat[off + j] ? src[j] * scale : 0.0f;
        if (mask)
            mask[j] = (uint8_t)(flat[off + j] & 1u);
    }
}

/* out(n) = in * scale where mask is 1, +0 where it is 0: the same bits as
 * group_whole's. */
DT_CPU_CLONES static void masked_scale(float *out, const float *in, const uint8_t *mask, size_t n,
                                       float scale)
{
    size_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        uint8_t m8[LANES];
        f32v x;
        memcpy(m8, mask + i, sizeof m8);
        memcpy(&x, in + i, sizeof x);
        u32v keep;
        for (int l = 0; l < LANES; l++)
            keep[l] = 0u - (uint32_t)m8[l];
        u32v y = (u32v)(x * scale) & keep;
        memcpy(out + i, &y, sizeof y);
    }
    for (; i < n; i++)
        out[i] = mask[i] ? in[i] * scale : 0.0f;
}

/* Same mask as the reference. The block is contiguous in the global index
 * e, so walk it in groups of GROUP_ELEMS elements starting at a multiple
 * of 4: one vectorised generator call per group. */
static void dropout_fast(float *out, const float *in, int rows, int cols, float p,
                         const struct dt_rng_key *key, uint64_t row0, uint8_t *mask)
{
    const float scale = 1.0f / (1.0f - p);
    const uint64_t e0 = row0 * (uint64_t)cols;
    const uint64_t e_end = e0 + (uint64_t)rows * (uint64_t)cols;
    const uint32_t thr = (uint32_t)ceilf(p * 16777216.0f);
    struct dt_rng_stream rs;
    struct philox_plan pl;
    dt_rng_stream_init(key, 0, &rs);
    plan_philox(&rs, thr, &pl);
    uint64_t g = e0 - e0 % WORDS_PER_BLOCK;
    while (g < e_end) {
        uint64_t lo = g < e0 ? e0 : g;
        uint64_t hi = g + GROUP_ELEMS < e_end ? g + GROUP_ELEMS : e_end;
        if (lo == g && hi == g + GROUP_ELEMS) {
            uint64_t groups = (e_end - g) / GROUP_ELEMS;
            dropout_whole(&pl, g / WORDS_PER_BLOCK, groups, scale, in + (g - e0), out + (g - e0),
                          mask ? mask + (g - e0) : NULL);
            g += groups * GROUP_ELEMS;
            continue;
        }
        dropout_part(&pl, g / WORDS_PER_BLOCK, scale, in + (lo - e0), out + (lo - e0),
                     mask ? mask + (lo - e0) : NULL, (int)(lo - g), (int)(hi - lo));
        g += GROUP_ELEMS;
    }
}

/* Blocks of rows on the pool's threads: the mask is a function of each
 * element's global index, so any cut gives the same bits. */
struct dropout_job {
    float *out;
    const float *in;
    int cols;
    float p;
    const struct dt_rng_key *key;
    uint64_t row0;
    uint8_t *store;     /* forward: the mask to keep, or NULL */
    const uint8_t *kept; /* backward: the mask forward kept, or NULL (draw it again) */
};

static void dropout_rows(void *a, size_t lo, size_t hi)
{
    const struct dropout_job *j = a;
    size_t off = lo * (size_t)j->cols;
    if (j->kept)
        masked_scale(j->out + off, j->in + off, j->kept + off, (hi - lo) * (size_t)j->cols,
                     1.0f / (1.0f - j->p));
    else
        dropout_fast(j->out + off, j->in + off, (int)(hi - lo), j->cols, j->p, j->key,
                     j->row0 + lo, j->store ? j->store + off : NULL);
}

/* Forward and backward are the same masked scaling (of in, or of dout);
 * the fast forward keeps its mask in the backend (dt_cpu_mask_store) and
 * the fast backward uses it when it is there, instead of drawing it
 * again. */
static dt_status dropout_apply(dt_backend_t *be, const char *op, float *out, const float *in,
                               int rows, int cols, float p, const struct dt_rng_key *key,
                               uint64_t row0, int fast, int backward)
{
    dt_status st = check_dropout(op, out, in, rows, cols, p, key);
    if (st != DT_OK)
        return st;
    if (p == 0.0f)
        copy_block(out, in, (size_t)rows * cols);
    else if (fast) {
        struct dropout_job j = {.out = out, .in = in, .cols = cols, .p = p, .key = key,
                                .row0 = row0};
        if (backward)
            j.kept = dt_cpu_mask_find(be, key, row0, rows, cols, p);
        else
            j.store = dt_cpu_mask_store(be, key, row0, rows, cols, p);
        dt_cpu_for(be, (size_t)rows, 1 + DT_CPU_GRAIN / ((size_t)cols + 1), dropout_rows, &j);
    }
    else
        dropout_ref(out, in, rows, cols, p, key, row0);
    return DT_OK;
}

dt_status dt_cpu_dropout_fwd_ref(dt_backend_t *be, float *out, const float *in, int rows, int cols,
                                 float p, const struct dt_rng_key *key, uint64_t row0)
{
    return dropout_apply(be, "dropout_fwd", out, in, rows, cols, p, key, row0, 0, 0);
}

dt_status dt_cpu_dropout_bwd_ref(dt_backend_t *be, float *din, const float *dout, int rows,
                                 int cols, float p, const struct dt_rng_key *key, uint64_t row0)
{
    return dropout_apply(be, "dropout_bwd", din, dout, rows, cols, p, key, row0, 0, 1);
}

dt_status dt_cpu_dropout_fwd(dt_backend_t *be, float *out, const float *in, int rows, int cols,
                             float p, const struct dt_rng_key *key, uint64_t row0)
{
    return dropout_apply(be, "dropout_fwd", out, in, rows, cols, p, key, row0, 1, 0);
}

dt_status dt_cpu_dropout_bwd(dt_backend_t *be, float *din, const float *dout, int rows, int cols,
                             float p, const struct dt_rng_key *key, uint64_t row0)
{
    return dropout_apply(be, "dropout_bwd", din, dout, rows, cols, p, key, row0, 1, 1);
}
