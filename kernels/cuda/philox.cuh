/*
 * philox.cuh - Philox4x32-10 and the dropout mask as __host__ __device__
 * functions, shared by the dropout kernels (dropout.cu) and a test that
 * runs them on the CPU (tests/gpu/test_cuda_host.cu).
 *
 * The CUDA dropout must keep exactly the elements the CPU keeps, so it
 * draws its words with core/rng.h's own inline Philox (marked host and
 * device there) and nothing else: the key is still mixed once on the host by
 * dt_rng_stream_init and handed to the kernel by value. All arithmetic is
 * on integers, except the word-to-unit conversion (exact: a 24-bit
 * integer times 2^-24), the comparison u >= p, and one multiply by a
 * scale the host computes as the CPU does; each is one correctly rounded
 * IEEE operation on both sides, so the results are the same bits.
 */
#ifndef DT_CUDA_PHILOX_CUH
#define DT_CUDA_PHILOX_CUH

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "core/rng.h"
#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#define DT_HD __host__ __device__
#else
#define DT_HD
#endif

/* A Philox block holds four 32-bit words; dropout element e uses word
 * e % 4 of block e / 4. */
#define DT_PHILOX_WORDS 4

/* The four words of counter (index, s->c2, s->c3) under key (s->k0, s->k1):
 * core/rng.h's dt_rng_stream_block, compiled for host and device. */
static inline DT_HD void dt_philox_block(const struct dt_rng_stream *s, uint64_t index,
                                         uint32_t out[DT_PHILOX_WORDS])
{
    dt_rng_stream_block(s, index, out);
}

/* dt_rng_u32_to_unit: the top 24 bits of x as a float in [0, 1). */
static inline DT_HD float dt_philox_unit(uint32_t x) { return dt_rng_u32_to_unit(x); }

/* Dropout keeps an element whose word x gives u >= p. */
static inline DT_HD int dt_dropout_keep(uint32_t x, float p) { return dt_philox_unit(x) >= p; }

/* The factor kept values are multiplied by, computed (on the host) with
 * the CPU's expression. */
static inline float dt_dropout_scale(float p) { return 1.0f / (1.0f - p); }

/* One Philox block's share of a dropout: out[i] = in[i] * scale where
 * kept, +0 where dropped, for the elements e = 4*blk .. 4*blk + 3 that lie
 * in the call's range [e0, e0 + n); element e is out[e - e0]. Each element
 * is read and written by this call only, so out == in works. */
static inline DT_HD void dt_dropout_block(const struct dt_rng_stream *s, uint64_t blk,
                                          uint64_t e0, uint64_t n, float p, float scale,
                                          float *out, const float *in)
{
    uint32_t w[DT_PHILOX_WORDS];
    dt_philox_block(s, blk, w);
    for (int k = 0; k < DT_PHILOX_WORDS; k++) {
        uint64_t i = blk * DT_PHILOX_WORDS + (uint64_t)k - e0; /* wraps when e < e0 */
        if (i < n)
            out[i] = dt_dropout_keep(w[k], p) ? in[i] * scale : 0.0f;
    }
}

/* The Philox blocks that elements [e0, e0 + n) use: dt_dropout_block_count
 * of them (0 when n == 0), from dt_dropout_first_block on. */
static inline DT_HD uint64_t dt_dropout_first_block(uint64_t e0) { return e0 / DT_PHILOX_WORDS; }
static inline DT_HD uint64_t dt_dropout_block_count(uint64_t e0, uint64_t n)
{
    if (n == 0)
        return 0;
    return (e0 + n - 1) / DT_PHILOX_WORDS - e0 / DT_PHILOX_WORDS + 1;
}

#endif
