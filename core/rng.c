/*
 * rng.c - Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy
 * as 1, 2, 3", SC'11). Ten rounds of a multiply-xor bijection on a 128-bit
 * counter under a 64-bit key; the standard constants give Crush-resistant
 * output. The key is the seed mixed with purpose and stream; the counter is
 * (index, sub, step).
 */
#include "rng.h"

#include <math.h>

/* splitmix64 finaliser: spreads purpose/stream bits over the whole key. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void dt_rng_stream_init(const struct dt_rng_key *key, uint32_t sub, struct dt_rng_stream *s)
{
    uint64_t k = mix64(key->seed ^ mix64(((uint64_t)key->purpose << 32) | key->stream));
    uint64_t hi = mix64(key->step + 0x9E3779B97F4A7C15ull) ^ sub;
    s->k0 = (uint32_t)k;
    s->k1 = (uint32_t)(k >> 32);
    s->c2 = (uint32_t)hi;
    s->c3 = (uint32_t)(hi >> 32);
}

void dt_rng_block(const struct dt_rng_key *key, uint64_t index, uint32_t sub, uint32_t out[4])
{
    struct dt_rng_stream s;
    dt_rng_stream_init(key, sub, &s);
    dt_rng_stream_block(&s, index, out);
}

float dt_rng_uniform(const struct dt_rng_key *key, uint64_t index)
{
    uint32_t r[4];
    dt_rng_block(key, index, 0, r);
    return dt_rng_u32_to_unit(r[0]);
}

float dt_rng_normal(const struct dt_rng_key *key, uint64_t index)
{
    uint32_t r[4];
    dt_rng_block(key, index, 0, r);
    /* u1 in (0, 1] so log() is finite */
    double u1 = ((double)r[0] + 1.0) / 4294967296.0;
    double u2 = (double)r[1] / 4294967296.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

uint64_t dt_rng_below(const struct dt_rng_key *key, uint64_t index, uint64_t n)
{
    /* Rejection on a 64-bit draw; retries use the sub-counter. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    for (uint32_t sub = 0;; sub++) {
        uint32_t r[4];
        dt_rng_block(key, index, sub, r);
        uint64_t x = ((uint64_t)r[1] << 32) | r[0];
        if (x < limit)
            return x % n;
    }
}

void dt_rng_permutation(uint64_t seed, uint64_t epoch, uint64_t *perm, uint64_t n)
{
    dt_rng_permutation_stream(seed, epoch, 0, perm, n);
}

void dt_rng_permutation_stream(uint64_t seed, uint64_t epoch, uint32_t stream, uint64_t *perm,
                               uint64_t n)
{
    struct dt_rng_key key = {
        .seed = seed, .purpose = DT_RNG_SHUFFLE, .stream = stream, .step = epoch};
    for (uint64_t i = 0; i < n; i++)
        perm[i] = i;
    for (uint64_t i = n; i > 1; i--) {
        uint64_t j = dt_rng_below(&key, i - 1, i);
        uint64_t t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
}
