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
 * above. The fast version draws each block once and uses its four words
 * for four consecutive elements (same mask, same bits, a quarter of the
 * generator work).
 *
 * No parameters; the activation gradient (din) is WRITTEN (=):
 * din = dout * mask / (1 - p), which is the forward applied to dout.
 */
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

/* Same mask; the block is contiguous in the global index, so walk it from
 * e0 = row0 * cols and refill the four words at each multiple of 4. */
static void dropout_fast(float *out, const float *in, int rows, int cols, float p,
                         const struct dt_rng_key *key, uint64_t row0)
{
    const float scale = 1.0f / (1.0f - p);
    const uint64_t e0 = row0 * (uint64_t)cols;
    const size_t n = (size_t)rows * cols;
    size_t i = 0;
    struct dt_rng_stream rs;
    dt_rng_stream_init(key, 0, &rs);
    while (i < n) {
        uint64_t e = e0 + i;
        uint32_t word[WORDS_PER_BLOCK];
        dt_rng_stream_block(&rs, e / WORDS_PER_BLOCK, word);
        for (unsigned k = (unsigned)(e % WORDS_PER_BLOCK); k < WORDS_PER_BLOCK && i < n; k++, i++)
            out[i] = dt_rng_u32_to_unit(word[k]) >= p ? in[i] * scale : 0.0f;
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
