/*
 * rng.h - counter-based random numbers (Philox4x32-10).
 *
 * Every random draw in dtrain is a pure function of a key and an index:
 * the key is (seed, purpose, stream, step), the index is usually a sample
 * or element number. Nothing depends on how many draws came before or on
 * how many ranks share the work, so 1 rank and N ranks draw the same
 * numbers for the same sample, and a resumed run draws what an
 * uninterrupted one would. Thread-safe (no state).
 */
#ifndef DT_RNG_H
#define DT_RNG_H

#include <stdint.h>

/* The inline functions below compile for the GPU too (the CUDA dropout
 * draws the same words as the CPU's). */
#ifdef __CUDACC__
#define DT_RNG_HD __host__ __device__
#else
#define DT_RNG_HD
#endif

enum dt_rng_purpose {
    DT_RNG_INIT = 1,    /* parameter initialisation; stream = parameter tensor id */
    DT_RNG_SHUFFLE = 2, /* per-epoch data permutation; step = epoch */
    DT_RNG_DROPOUT = 3, /* dropout masks; stream = layer id, step = optimizer step */
    DT_RNG_AUGMENT = 4, /* input augmentation (crop, flip); step = epoch, index = sample */
    DT_RNG_SAMPLE = 5,  /* text generation: the draw of each new token; index = its number */
    DT_RNG_TEST = 99,   /* tests */
};

struct dt_rng_key {
    uint64_t seed;
    uint32_t purpose;
    uint32_t stream;
    uint64_t step;
};

/* A key with its mixing done once, for drawing many blocks in a loop. */
struct dt_rng_stream {
    uint32_t k0, k1; /* Philox key */
    uint32_t c2, c3; /* high counter words: step and sub-counter */
};

#define DT_PHILOX_M0 0xD2511F53u
#define DT_PHILOX_M1 0xCD9E8D57u
#define DT_PHILOX_W0 0x9E3779B9u
#define DT_PHILOX_W1 0xBB67AE85u
#define DT_PHILOX_ROUNDS 10

void dt_rng_stream_init(const struct dt_rng_key *key, uint32_t sub, struct dt_rng_stream *s);

/* Same four words as dt_rng_block(key, index, sub) for the stream's key and sub. */
static inline DT_RNG_HD void dt_rng_stream_block(const struct dt_rng_stream *s, uint64_t index,
                                       uint32_t out[4])
{
    uint32_t c0 = (uint32_t)index, c1 = (uint32_t)(index >> 32), c2 = s->c2, c3 = s->c3;
    uint32_t k0 = s->k0, k1 = s->k1;
    for (int r = 0; r < DT_PHILOX_ROUNDS; r++) {
        uint64_t p0 = (uint64_t)DT_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)DT_PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += DT_PHILOX_W0;
        k1 += DT_PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* Four 32-bit random words for counter `index` (and sub-counter `sub`). */
void dt_rng_block(const struct dt_rng_key *key, uint64_t index, uint32_t sub, uint32_t out[4]);

/* Uniform float in [0, 1) with 24 random bits. */
float dt_rng_uniform(const struct dt_rng_key *key, uint64_t index);

/* Standard normal (Box-Muller on one block). */
float dt_rng_normal(const struct dt_rng_key *key, uint64_t index);

/* Uniform integer in [0, n) without modulo bias (n > 0). */
uint64_t dt_rng_below(const struct dt_rng_key *key, uint64_t index, uint64_t n);

/* Converts one random word to a float in [0, 1). */
static inline DT_RNG_HD float dt_rng_u32_to_unit(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

/* Fills perm[0..n) with the permutation of 0..n-1 for (seed, epoch):
 * a Fisher-Yates shuffle whose i-th swap uses draw i of the key. */
void dt_rng_permutation(uint64_t seed, uint64_t epoch, uint64_t *perm, uint64_t n);
/* The same shuffle drawn from stream `stream` of DT_RNG_SHUFFLE (0 is
 * dt_rng_permutation's): independent permutations for the same epoch. */
void dt_rng_permutation_stream(uint64_t seed, uint64_t epoch, uint32_t stream, uint64_t *perm,
                               uint64_t n);

#endif
