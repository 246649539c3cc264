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
 * (same mask, same bits, a small fraction of the generator work); see
 * "Philox for 16 consecutive counters" below for its versions.
 *
 * No parameters; the activation gradient (din) is WRITTEN (=):
 * din = dout * mask / (1 - p), which is the forward applied to dout.
 */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PHILOX_X86 1
#endif

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

/* Philox for 16 consecutive counters at once. The generic version is
 * written in GCC vector types: each 64-bit lane holds two 32-bit counter
 * words (even lane low), so the 32x32->64 products are 64-bit multiplies
 * of the low and high halves. GCC 12 does not see that those operands fit
 * in 32 bits and builds each product from three 32-bit multiplies and
 * shifts, so where the CPU has AVX-512 or AVX2, the rounds run in
 * versions written with the vector unit's 32x32->64 multiply
 * (philox_avx512, eight_blocks_avx2), chosen when a call starts: forward
 * 0.66 and 0.92 ns an element on one AMD EPYC core against 1.56 and 7.5
 * for the generic version's AVX-512 and AVX2 builds. All give the bits of
 * dt_rng_stream_block: the arithmetic is on integers.
 *
 * A word x keeps its element when u = (x >> 8) * 2^-24 >= p, which for the
 * integer x >> 8 is exactly (x >> 8) >= ceil(p * 2^24) = thr. */
#define LANES 16
#define GROUP_ELEMS (LANES * WORDS_PER_BLOCK)

typedef uint32_t u32v __attribute__((vector_size(LANES * 4)));
typedef uint64_t u64v __attribute__((vector_size(LANES * 4)));
typedef float f32v __attribute__((vector_size(LANES * 4)));

#define LO32 0xffffffffull

/* What every group of one call shares: the round keys (the scalar key
 * schedule and its broadcast would otherwise run again in every group),
 * and round 0's terms that depend on the high counter words alone, which
 * are the same in every block: c2 * M1's halves and c3 ^ k1. Each is kept
 * as a 32-bit word and twice over in a 64-bit one (both halves of the
 * generic version's lanes). */
struct philox_plan {
    uint32_t k0[DT_PHILOX_ROUNDS], k1[DT_PHILOX_ROUNDS];
    uint32_t hi2_k0, lo2, c3_k1; /* round 0 */
    uint64_t k0x2[DT_PHILOX_ROUNDS], k1x2[DT_PHILOX_ROUNDS];
    uint64_t hi2_k0x2, lo2x2, c3_k1x2;
    uint32_t thr;
};

static uint64_t both_halves(uint32_t k) { return (uint64_t)k | ((uint64_t)k << 32); }

static void plan_philox(const struct dt_rng_stream *s, uint32_t thr, struct philox_plan *pl)
{
    uint32_t k0 = s->k0, k1 = s->k1;
    for (int r = 0; r < DT_PHILOX_ROUNDS; r++) {
        pl->k0[r] = k0;
        pl->k1[r] = k1;
        pl->k0x2[r] = both_halves(k0);
        pl->k1x2[r] = both_halves(k1);
        k0 += DT_PHILOX_W0;
        k1 += DT_PHILOX_W1;
    }
    uint64_t p2 = (uint64_t)DT_PHILOX_M1 * s->c2;
    pl->hi2_k0 = (uint32_t)(p2 >> 32) ^ s->k0;
    pl->lo2 = (uint32_t)p2;
    pl->c3_k1 = s->c3 ^ s->k1;
    pl->hi2_k0x2 = both_halves(pl->hi2_k0);
    pl->lo2x2 = both_halves(pl->lo2);
    pl->c3_k1x2 = both_halves(pl->c3_k1);
    pl->thr = thr;
}

/* The counter words of blocks first .. first + n - 1: low and high. */
static inline __attribute__((always_inline)) void counters(uint64_t first, int n, uint32_t *w0,
                                                           uint32_t *w1)
{
    for (int l = 0; l < n; l++) {
        w0[l] = (uint32_t)(first + (uint64_t)l);
        w1[l] = (uint32_t)((first + (uint64_t)l) >> 32);
    }
}

/* w[k] lane l: word k of block first + l, in GCC vector types */
static inline __attribute__((always_inline)) void
philox_generic(const struct philox_plan *pl, uint64_t first, u32v w[4])
{
    uint32_t w0[LANES], w1[LANES];
    counters(first, LANES, w0, w1);
    u64v c0, c1, c2, c3;
    memcpy(&c0, w0, sizeof c0);
    memcpy(&c1, w1, sizeof c1);
    /* round 0: c2 and c3 are the stream's, the same in every lane */
    u64v e0 = (c0 & LO32) * DT_PHILOX_M0, o0 = (c0 >> 32) * DT_PHILOX_M0;
    c0 = c1 ^ pl->hi2_k0x2;
    c2 = ((e0 >> 32) | (o0 & ~LO32)) ^ pl->c3_k1x2;
    c1 = (u64v){0} + pl->lo2x2;
    c3 = (e0 & LO32) | (o0 << 32);
    for (int r = 1; r < DT_PHILOX_ROUNDS; r++) {
        e0 = (c0 & LO32) * DT_PHILOX_M0, o0 = (c0 >> 32) * DT_PHILOX_M0;
        u64v e2 = (c2 & LO32) * DT_PHILOX_M1, o2 = (c2 >> 32) * DT_PHILOX_M1;
        u64v hi0 = (e0 >> 32) | (o0 & ~LO32), lo0 = (e0 & LO32) | (o0 << 32);
        u64v hi2 = (e2 >> 32) | (o2 & ~LO32), lo2 = (e2 & LO32) | (o2 << 32);
        c0 = hi2 ^ c1 ^ pl->k0x2[r];
        c2 = hi0 ^ c3 ^ pl->k1x2[r];
        c1 = lo2;
        c3 = lo0;
    }
    w[0] = (u32v)c0;
    w[1] = (u32v)c1;
    w[2] = (u32v)c2;
    w[3] = (u32v)c3;
}

#ifdef PHILOX_X86
/* hi, lo: the high and low words of c * m in each 32-bit lane (m the same
 * in every lane): the even lanes' products, then the odd lanes' shifted
 * down, each a 32x32->64 multiply of the 64-bit lanes' low halves. */
__attribute__((target("avx512f"))) static inline void mul_hilo_512(__m512i c, __m512i m,
                                                                   __m512i *hi, __m512i *lo)
{
    __m512i even = _mm512_mul_epu32(c, m);
    __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(c, 32), m);
    *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
    *lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
}

__attribute__((target("avx512f"))) static inline void
philox_avx512(const struct philox_plan *pl, uint64_t first, u32v w[4])
{
    uint32_t w0[LANES], w1[LANES];
    counters(first, LANES, w0, w1);
    const __m512i m0 = _mm512_set1_epi32((int)DT_PHILOX_M0), m1 = _mm512_set1_epi32((int)DT_PHILOX_M1);
    __m512i c0 = _mm512_loadu_si512(w0), c1 = _mm512_loadu_si512(w1), c2, c3, hi0, lo0, hi2, lo2;
    mul_hilo_512(c0, m0, &hi0, &lo0);
    c0 = _mm512_xor_si512(c1, _mm512_set1_epi32((int)pl->hi2_k0));
    c2 = _mm512_xor_si512(hi0, _mm512_set1_epi32((int)pl->c3_k1));
    c1 = _mm512_set1_epi32((int)pl->lo2);
    c3 = lo0;
    for (int r = 1; r < DT_PHILOX_ROUNDS; r++) {
        mul_hilo_512(c0, m0, &hi0, &lo0);
        mul_hilo_512(c2, m1, &hi2, &lo2);
        c0 = _mm512_ternarylogic_epi32(hi2, c1, _mm512_set1_epi32((int)pl->k0[r]), 0x96);
        c2 = _mm512_ternarylogic_epi32(hi0, c3, _mm512_set1_epi32((int)pl->k1[r]), 0x96);
        c1 = lo2;
        c3 = lo0;
    }
    _mm512_storeu_si512(&w[0], c0);
    _mm512_storeu_si512(&w[1], c1);
    _mm512_storeu_si512(&w[2], c2);
    _mm512_storeu_si512(&w[3], c3);
}

__attribute__((target("avx2"))) static inline void mul_hilo_256(__m256i c, __m256i m, __m256i *hi,
                                                                __m256i *lo)
{
    __m256i even = _mm256_mul_epu32(c, m);
    __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(c, 32), m);
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
    *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

/* Eight blocks from `first` (32 elements) on AVX2, whole: GCC's lowering
 * of the 16-lane vector types to two AVX2 registers takes the shuffles
 * and compares apart lane by lane, so this version is written out for
 * eight lanes: the rounds, the four words of each block turned into
 * element order (element 4l + k is word k of block l), the masks, the
 * scaling and the mask's bytes. */
__attribute__((target("avx2"))) static inline void
eight_blocks_avx2(const struct philox_plan *pl, uint64_t first, float scale, const float *src,
                  float *dst, uint8_t *mask)
{
    uint32_t w0[8], w1[8];
    counters(first, 8, w0, w1);
    const __m256i m0 = _mm256_set1_epi32((int)DT_PHILOX_M0), m1 = _mm256_set1_epi32((int)DT_PHILOX_M1);
    __m256i c0 = _mm256_loadu_si256((const __m256i *)w0);
    __m256i c1 = _mm256_loadu_si256((const __m256i *)w1), c2, c3, hi0, lo0, hi2, lo2;
    mul_hilo_256(c0, m0, &hi0, &lo0);
    c0 = _mm256_xor_si256(c1, _mm256_set1_epi32((int)pl->hi2_k0));
    c2 = _mm256_xor_si256(hi0, _mm256_set1_epi32((int)pl->c3_k1));
    c1 = _mm256_set1_epi32((int)pl->lo2);
    c3 = lo0;
    for (int r = 1; r < DT_PHILOX_ROUNDS; r++) {
        mul_hilo_256(c0, m0, &hi0, &lo0);
        mul_hilo_256(c2, m1, &hi2, &lo2);
        c0 = _mm256_xor_si256(_mm256_xor_si256(hi2, c1), _mm256_set1_epi32((int)pl->k0[r]));
        c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32((int)pl->k1[r]));
        c1 = lo2;
        c3 = lo0;
    }
    /* 4 x 8 words to element order: blocks (0,4), (1,5), (2,6), (3,7) per
     * 128-bit half, then the halves regrouped */
    __m256i a = _mm256_unpacklo_epi32(c0, c1), b = _mm256_unpackhi_epi32(c0, c1);
    __m256i c = _mm256_unpacklo_epi32(c2, c3), d = _mm256_unpackhi_epi32(c2, c3);
    __m256i e0 = _mm256_unpacklo_epi64(a, c), e1 = _mm256_unpackhi_epi64(a, c);
    __m256i e2 = _mm256_unpacklo_epi64(b, d), e3 = _mm256_unpackhi_epi64(b, d);
    __m256i v[4] = {_mm256_permute2x128_si256(e0, e1, 0x20), _mm256_permute2x128_si256(e2, e3, 0x20),
                    _mm256_permute2x128_si256(e0, e1, 0x31), _mm256_permute2x128_si256(e2, e3, 0x31)};
    /* (x >> 8) >= thr, as a signed compare with thr - 1 (x >> 8 < 2^24, thr >= 1) */
    const __m256i thr1 = _mm256_set1_epi32((int)pl->thr - 1);
    const __m256 sc = _mm256_set1_ps(scale);
    __m256i keep[4];
    for (int q = 0; q < 4; q++) {
        keep[q] = _mm256_cmpgt_epi32(_mm256_srli_epi32(v[q], 8), thr1);
        __m256 x = _mm256_mul_ps(_mm256_loadu_ps(src + 8 * q), sc);
        _mm256_storeu_ps(dst + 8 * q, _mm256_and_ps(x, _mm256_castsi256_ps(keep[q])));
    }
    if (mask) {
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(keep[0], keep[1]),
                                       _mm256_packs_epi32(keep[2], keep[3]));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)mask, _mm256_and_si256(p, _mm256_set1_epi8(1)));
    }
}

__attribute__((target("avx2"))) static void
dropout_whole_avx2(const struct philox_plan *pl, uint64_t first, uint64_t groups, float scale,
                   const float *src, float *dst, uint8_t *mask)
{
    for (uint64_t q = 0; q < 2 * groups; q++) {
        size_t at = (size_t)q * (GROUP_ELEMS / 2);
        eight_blocks_avx2(pl, first + q * (LANES / 2), scale, src + at, dst + at,
                          mask ? mask + at : NULL);
    }
}
#endif

/* mask[k] lane l: word k passes (all ones) or not (0) */
static inline __attribute__((always_inline)) void word_masks(const u32v w[4], uint32_t thr,
                                                             u32v mask[4])
{
    for (int k = 0; k < 4; k++)
        mask[k] = (u32v)((w[k] >> 8) >= thr);
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

/* keep[v] lane l: element LANES * v + l of the group whose words are w
 * is kept (all ones) or dropped (0). */
static inline __attribute__((always_inline)) void group_keep(const u32v w[4], uint32_t thr,
                                                             u32v keep[4])
{
    u32v m[4];
    word_masks(w, thr, m);
    interleave(m, keep);
}

/* dst[j] = src[j] * scale where kept, +0 where dropped, for the
 * GROUP_ELEMS elements of a group */
static inline __attribute__((always_inline)) void group_apply(const u32v keep[4], float scale,
                                                              const float *src, float *dst)
{
    for (int v = 0; v < 4; v++) {
        f32v x;
        memcpy(&x, src + LANES * v, sizeof x);
        u32v y = (u32v)(x * scale) & keep[v];
        memcpy(dst + LANES * v, &y, sizeof y);
    }
}

/* mask(GROUP_ELEMS) = 1 where kept, 0 where dropped */
static inline __attribute__((always_inline)) void bytes_generic(const u32v keep[4], uint8_t *mask)
{
    for (int v = 0; v < 4; v++) {
        uint8_t m8[LANES];
        for (int l = 0; l < LANES; l++)
            m8[l] = (uint8_t)(keep[v][l] & 1u);
        memcpy(mask + LANES * v, m8, sizeof m8);
    }
}

#ifdef PHILOX_X86
/* The same narrowed by the vector unit: the byte loop above runs through
 * the stack without AVX512BW, which the avx512f build does not assume. */
__attribute__((target("avx512f"))) static inline void bytes_avx512(const u32v keep[4],
                                                                   uint8_t *mask)
{
    for (int v = 0; v < 4; v++) {
        __m512i k;
        memcpy(&k, &keep[v], sizeof k);
        __m128i b = _mm512_cvtepi32_epi8(_mm512_and_si512(k, _mm512_set1_epi32(1)));
        _mm_storeu_si128((__m128i *)(mask + LANES * v), b);
    }
}
#endif

/* `groups` whole groups in a row from block `first` on, one call for the
 * run (mask, when not NULL: 1 kept, 0 dropped), built with each version
 * of the rounds and of the bytes. */
typedef void whole_fn(const struct philox_plan *pl, uint64_t first, uint64_t groups, float scale,
                      const float *src, float *dst, uint8_t *mask);

#define DROPOUT_WHOLE(name, attr, rounds, bytes)                                                   \
    attr static void name(const struct philox_plan *pl, uint64_t first, uint64_t groups,          \
                          float scale, const float *src, float *dst, uint8_t *mask)                 \
    {                                                                                              \
        for (uint64_t q = 0; q < groups; q++) {                                                    \
            size_t at = (size_t)q * GROUP_ELEMS;                                                   \
            u32v w[4], keep[4];                                                                    \
            rounds(pl, first + q * LANES, w);                                                      \
            group_keep(w, pl->thr, keep);                                                          \
            group_apply(keep, scale, src + at, dst + at);                                          \
            if (mask)                                                                              \
                bytes(keep, mask + at);                                                            \
        }                                                                                          \
    }

DROPOUT_WHOLE(dropout_whole, DT_CPU_CLONES, philox_generic, bytes_generic)
#ifdef PHILOX_X86
DROPOUT_WHOLE(dropout_whole_avx512, __attribute__((target("avx512f"))), philox_avx512,
              bytes_avx512)
#endif

/* The version of the whole groups a call runs: the best this CPU has,
 * unless dt_cpu_dropout_pin asked for another (tests compare them). */
static int dropout_pin = DT_CPU_DROPOUT_BEST;

static int cpu_has(int version)
{
#ifdef PHILOX_X86
    if (version == DT_CPU_DROPOUT_AVX512)
        return __builtin_cpu_supports("avx512f");
    if (version == DT_CPU_DROPOUT_AVX2)
        return __builtin_cpu_supports("avx2");
#endif
    return version == DT_CPU_DROPOUT_GENERIC || version == DT_CPU_DROPOUT_BEST;
}

int dt_cpu_dropout_pin(int version)
{
    if (!cpu_has(version))
        return 0;
    dropout_pin = version;
    return 1;
}

/* version runs here: pinned, or the pin leaves the choice open, and the
 * CPU has it */
static int runs(int version)
{
    return (dropout_pin == DT_CPU_DROPOUT_BEST || dropout_pin == version) && cpu_has(version);
}

static whole_fn *whole_for_cpu(void)
{
#ifdef PHILOX_X86
    if (runs(DT_CPU_DROPOUT_AVX512))
        return dropout_whole_avx512;
    if (runs(DT_CPU_DROPOUT_AVX2))
        return dropout_whole_avx2;
#endif
    return dropout_whole;
}

/* Part of a group: elements [off, off + count) of the group of
 * GROUP_ELEMS elements starting at block `first`; src and dst (and mask)
 * point at element off. */
DT_CPU_CLONES static void
dropout_part(const struct philox_plan *pl, uint64_t first, float scale, const float *src,
             float *dst, uint8_t *mask, int off, int count)
{
    u32v w[4], keep[4];
    philox_generic(pl, first, w);
    group_keep(w, pl->thr, keep);
    uint32_t flat[GROUP_ELEMS];
    memcpy(flat, keep, sizeof flat);
    for (int j = 0; j < count; j++) {
        dst[j] = flat[off + j] ? src[j] * scale : 0.0f;
        if (mask)
            mask[j] = (uint8_t)(flat[off + j] & 1u);
    }
}

/* out(n) = in * scale where mask is 1, +0 where it is 0: the same bits as
 * the forward's. Built for AVX2 and the baseline only: the loop reads a
 * byte per element, and without AVX512BW (which the avx512f build of
 * DT_CPU_CLONES does not assume) GCC runs its AVX-512 build on 16-byte
 * registers through the stack, three times slower than the AVX2 one. */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("avx2", "default")))
#endif
static void masked_scale(float *out, const float *in, const uint8_t *mask, size_t n, float scale)
{
    size_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        float t[LANES];
        for (int l = 0; l < LANES; l++) {
            float v = in[i + l] * scale;
            t[l] = mask[i + l] ? v : 0.0f;
        }
        memcpy(out + i, t, sizeof t);
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
            whole_for_cpu()(&pl, g / WORDS_PER_BLOCK, groups, scale, in + (g - e0),
                            out + (g - e0), mask ? mask + (g - e0) : NULL);
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
