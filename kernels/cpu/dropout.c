/*
 * dropout.c - inverted dropout on the CPU.
 *
 * The mask is not stored: it is a pure function of (key, global element
 * index), so backward recomputes it, a CUDA kernel reproduces it bit for
 * bit, and a batch split across calls, micro-batches or ranks gets the
 * same mask as one call over the whole batch. For a (rows, cols) block
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

/* Philox for PHILOX_LANES consecutive counters at once, in GCC vector
 * types so each round is a handful of SIMD instructions; built for
 * AVX-512, AVX2 and the baseline, picked at load time. Same bits as
 * dt_rng_stream_block. keep[4*l + k] says whether word k of block
 * first + l passes: u >= p with u = (x >> 8) * 2^-24, which for integer
 * x >> 8 is exactly (x >> 8) >= ceil(p * 2^24) = thr. */
#define PHILOX_LANES 64
#define GROUP_ELEMS (PHILOX_LANES * WORDS_PER_BLOCK)

typedef uint32_t u32xl __attribute__((vector_size(PHILOX_LANES * 4)));
typedef uint64_t u64xl __attribute__((vector_size(PHILOX_LANES * 8)));

static inline __attribute__((always_inline)) void
philox_lanes(const struct dt_rng_stream *s, uint64_t first, uint32_t thr,
             uint32_t keep[GROUP_ELEMS])
{
    u64xl idx;
    for (int l = 0; l < PHILOX_LANES; l++)
        idx[l] = first + (uint64_t)l;
    u32xl c0 = __builtin_convertvector(idx, u32xl);
    u32xl c1 = __builtin_convertvector(idx >> 32, u32xl);
    u32xl c2 = (u32xl){0} + s->c2, c3 = (u32xl){0} + s->c3;
    uint32_t k0 = s->k0, k1 = s->k1;
    for (int r = 0; r < DT_PHILOX_ROUNDS; r++) {
        u64xl p0 = __builtin_convertvector(c0, u64xl) * (uint64_t)DT_PHILOX_M0;
        u64xl p1 = __builtin_convertvector(c2, u64xl) * (uint64_t)DT_PHILOX_M1;
        c0 = __builtin_convertvector(p1 >> 32, u32xl) ^ c1 ^ k0;
        c2 = __builtin_convertvector(p0 >> 32, u32xl) ^ c3 ^ k1;
        c1 = __builtin_convertvector(p1, u32xl);
        c3 = __builtin_convertvector(p0, u32xl);
        k0 += DT_PHILOX_W0;
        k1 += DT_PHILOX_W1;
    }
    u32xl m0 = (u32xl)((c0 >> 8) >= thr), m1 = (u32xl)((c1 >> 8) >= thr);
    u32xl m2 = (u32xl)((c2 >> 8) >= thr), m3 = (u32xl)((c3 >> 8) >= thr);
    for (int l = 0; l < PHILOX_LANES; l++) {
        keep[4 * l + 0] = m0[l];
        keep[4 * l + 1] = m1[l];
        keep[4 * l + 2] = m2[l];
        keep[4 * l + 3] = m3[l];
    }
}

/* dst[j] = src[j] * scale where kept, +0 where dropped, for elements
 * [off, off + count) of the group of GROUP_ELEMS elements starting at
 * block `first`; src and dst point at element off. */
__attribute__((target_clones("avx512f", "avx2", "default"))) static void
dropout_group(const struct dt_rng_stream *s, uint64_t first, uint32_t thr, float scale,
              const float *src, float *dst, int off, int count)
{
    uint32_t keep[GROUP_ELEMS];
    philox_lanes(s, first, thr, keep);
    const uint32_t *m = keep + off;
    if (count == GROUP_ELEMS) {
        for (int j = 0; j < GROUP_ELEMS; j++)
            dst[j] = m[j] ? src[j] * scale : 0.0f;
        return;
    }
    for (int j = 0; j < count; j++)
        dst[j] = m[j] ? src[j] * scale : 0.0f;
}

/* Same mask as the reference. The block is contiguous in the global index
 * e, so walk it in groups of GROUP_ELEMS elements starting at a multiple
 * of 4: one vectorised generator call per group. */
static void dropout_fast(float *out, const float *in, int rows, int cols, float p,
                         const struct dt_rng_key *key, uint64_t row0)
{
    const float scale = 1.0f / (1.0f - p);
    const uint64_t e0 = row0 * (uint64_t)cols;
    const uint64_t e_end = e0 + (uint64_t)rows * (uint64_t)cols;
    const uint32_t thr = (uint32_t)ceilf(p * 16777216.0f);
    struct dt_rng_stream rs;
    dt_rng_stream_init(key, 0, &rs);
    for (uint64_t g = e0 - e0 % WORDS_PER_BLOCK; g < e_end; g += GROUP_ELEMS) {
        uint64_t lo = g < e0 ? e0 : g;
        uint64_t hi = g + GROUP_ELEMS < e_end ? g + GROUP_ELEMS : e_end;
        dropout_group(&rs, g / WORDS_PER_BLOCK, thr, scale, in + (lo - e0), out + (lo - e0),
                      (int)(lo - g), (int)(hi - lo));
    }
}

dt_status dt_cpu_dropout_fwd_ref(dt_backend_t *be, float *out, const float *in, int rows, int cols,
                                 float p, const struct dt_rng_key *key, uint64_t row0)
{
    dt_status st = check_dropout("dropout_fwd", out, in, rows, cols, p, key);
    if (st != DT_OK)
        return st;
    if (p == 0.0f)
        copy_block(out, in, (size_t)rows * cols);
    else
        dropout_ref(out, in, rows, cols, p, key, row0);
    return DT_OK;
}

dt_status dt_cpu_dropout_bwd_ref(dt_backend_t *be, float *din, const float *dout, int rows,
                                 int cols, float p, const struct dt_rng_key *key, uint64_t row0)
{
    dt_status st = check_dropout("dropout_bwd", din, dout, rows, cols, p, key);
    if (st != DT_OK)
        return st;
    if (p == 0.0f)
        copy_block(din, dout, (size_t)rows * cols);
    else
        dropout_ref(din, dout, rows, cols, p, key, row0);
    return DT_OK;
}

dt_status dt_cpu_dropout_fwd(dt_backend_t *be, float *out, const float *in, int rows, int cols,
                             float p, const struct dt_rng_key *key, uint64_t row0)
{
    dt_status st = check_dropout("dropout_fwd", out, in, rows, cols, p, key);
    if (st != DT_OK)
        return st;
    if (p == 0.0f)
        copy_block(out, in, (size_t)rows * cols);
    else
        dropout_fast(out, in, rows, cols, p, key, row0);
    return DT_OK;
}

dt_status dt_cpu_dropout_bwd(dt_backend_t *be, float *din, const float *dout, int rows, int cols,
                             float p, const struct dt_rng_key *key, uint64_t row0)
{
    dt_status st = check_dropout("dropout_bwd", din, dout, rows, cols, p, key);
    if (st != DT_OK)
        return st;
    if (p == 0.0f)
        copy_block(din, dout, (size_t)rows * cols);
    else
        dropout_fast(din, dout, rows, cols, p, key, row0);
    return DT_OK;
}
