/*
 * test_cuda_host.cu - the CUDA backend's __host__ __device__ code
 * (kernels/cuda/philox.cuh), compiled by nvcc and run on the CPU, so every
 * CUDA build checks it even on a machine without a GPU.
 *
 * The dropout kernels must keep exactly the elements the CPU keeps. This
 * suite checks the pieces they are made of against core/rng.h and the
 * CPU backend: the Philox block for many keys and counters (indices past
 * 2^32 included, and the Random123 known answers), the keep decision for
 * every 24-bit value a word can give, and the per-block dropout step,
 * driven over a whole tensor the way the kernel's threads drive it, against
 * the CPU reference op bit for bit. What only a GPU can show (that nvcc's
 * device code computes the same) is tests/gpu/test_gpu_ops.c's job.
 */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The dtrain headers are C: their functions have C linkage. */
extern "C" {
#include "kernels/backend.h"
#include "core/rng.h"
#include "core/status.h"
}
#include "kernels/cuda/philox.cuh"
#include "tests/unit/cu_util.h"

#define NKEYS 300
#define SENTINEL 12345.0f /* guard values around an output */
#define GUARD 8

static struct dt_rng_key test_key(uint64_t i)
{
    struct dt_rng_key k;
    k.seed = 99;
    k.purpose = DT_RNG_TEST;
    k.stream = 7;
    k.step = i;
    return k;
}

/* 64 random bits, draw i of the test key. */
static uint64_t rand64(uint64_t i)
{
    struct dt_rng_key k = test_key(0);
    uint32_t w[4];
    dt_rng_block(&k, i, 0, w);
    return ((uint64_t)w[1] << 32) | w[0];
}

/* Random123's known answers, counter (c0, c1, c2, c3) under key (k0, k1). */
static void test_philox_known_answers(void)
{
    static const uint32_t kat[][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        struct dt_rng_stream s;
        s.c2 = kat[i][2];
        s.c3 = kat[i][3];
        s.k0 = kat[i][4];
        s.k1 = kat[i][5];
        uint32_t out[DT_PHILOX_WORDS];
        dt_philox_block(&s, ((uint64_t)kat[i][1] << 32) | kat[i][0], out);
        for (int k = 0; k < DT_PHILOX_WORDS; k++)
            CU_ASSERT_EQUAL(out[k], kat[i][6 + k]);
    }
}

/* dt_philox_block == dt_rng_stream_block == dt_rng_block for many keys,
 * sub-counters and indices (both counter words, and the edges of each). */
static void test_philox_matches_rng(void)
{
    const uint64_t fixed[] = {0,           1,           3,
                              0xffffffffu, 1ull << 32,  (1ull << 32) + 1,
                              1ull << 40,  1ull << 63,  UINT64_MAX};
    const uint32_t subs[] = {0, 1, 2, 0x80000000u};
    size_t bad = 0, checked = 0;
    uint64_t draw = 1000;
    for (int k = 0; k < NKEYS; k++) {
        struct dt_rng_key key;
        key.seed = k < 4 ? (uint64_t)k : rand64(draw++);
        key.purpose = k % 5 == 0 ? (uint32_t)DT_RNG_DROPOUT : (uint32_t)rand64(draw++);
        key.stream = (uint32_t)rand64(draw++);
        key.step = k % 3 == 0 ? (uint64_t)k : rand64(draw++);
        uint32_t sub = subs[k % 4];
        struct dt_rng_stream s;
        dt_rng_stream_init(&key, sub, &s);
        for (int j = 0; j < 40; j++) {
            uint64_t index = j < 9 ? fixed[j] : j % 2 ? rand64(draw++) : rand64(draw++) >> 40;
            uint32_t a[4], b[4], c[DT_PHILOX_WORDS];
            dt_rng_stream_block(&s, index, a);
            dt_rng_block(&key, index, sub, b);
            dt_philox_block(&s, index, c);
            bad += memcmp(a, c, sizeof a) != 0 || memcmp(b, c, sizeof b) != 0;
            checked++;
        }
    }
    if (bad)
        printf("\n  philox: %zu of %zu blocks differ from core/rng.h\n", bad, checked);
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(checked, (size_t)NKEYS * 40);
}

/* The unit value and keep decision for every 24-bit value a word can have
 * (low bits varied too), for probabilities on and off the 2^-24 grid. */
static void test_keep_matches_unit(void)
{
    const float ps[] = {1e-9f, 0.1f, 0.25f, 0.3f, 0.5f, 0.9f, 0.99999994f,
                        3.0f / 16777216.0f, 8388607.0f / 16777216.0f,
                        nextafterf(0.5f, 0.0f), nextafterf(0.5f, 1.0f)};
    const int np = (int)(sizeof ps / sizeof ps[0]);
    size_t bad_unit = 0, bad_keep = 0, kept_half = 0;
    for (uint32_t hi = 0; hi < (1u << 24); hi++) {
        uint32_t x = (hi << 8) | (hi * 37u & 0xffu);
        float u = dt_rng_u32_to_unit(x), v = dt_philox_unit(x);
        bad_unit += memcmp(&u, &v, sizeof u) != 0;
        for (int j = 0; j < np; j++)
            bad_keep += dt_dropout_keep(x, ps[j]) != (dt_rng_u32_to_unit(x) >= ps[j]);
        kept_half += dt_dropout_keep(x, 0.5f);
    }
    CU_ASSERT_EQUAL(bad_unit, 0);
    CU_ASSERT_EQUAL(bad_keep, 0);
    CU_ASSERT_EQUAL(kept_half, (size_t)1 << 23); /* exactly the upper half of the grid */
    CU_ASSERT_EQUAL(dt_dropout_keep(0xffffffffu, 0.99999994f), 1);
    CU_ASSERT_EQUAL(dt_dropout_keep(0x000000ffu, 1e-9f), 0);
}

static void test_block_range(void)
{
    CU_ASSERT_EQUAL(dt_dropout_block_count(0, 0), 0);
    CU_ASSERT_EQUAL(dt_dropout_block_count(5, 0), 0);
    CU_ASSERT_EQUAL(dt_dropout_block_count(0, 1), 1);
    CU_ASSERT_EQUAL(dt_dropout_block_count(0, 4), 1);
    CU_ASSERT_EQUAL(dt_dropout_block_count(0, 5), 2);
    CU_ASSERT_EQUAL(dt_dropout_block_count(3, 2), 2);  /* elements 3, 4 */
    CU_ASSERT_EQUAL(dt_dropout_block_count(7, 10), 4); /* 7 .. 16 */
    CU_ASSERT_EQUAL(dt_dropout_first_block(7), 1);
    CU_ASSERT_EQUAL(dt_dropout_first_block((1ull << 34) + 3), 1ull << 32);
}

/* The kernel's work on the host: the blocks of [e0, e0 + n) in the order
 * given by `reverse` (threads run in any order). */
static void host_dropout(float *out, const float *in, int rows, int cols, float p,
                         const struct dt_rng_key *key, uint64_t row0, int reverse)
{
    struct dt_rng_stream s;
    dt_rng_stream_init(key, 0, &s);
    const uint64_t n = (uint64_t)rows * (uint64_t)cols, e0 = row0 * (uint64_t)cols;
    const uint64_t first = dt_dropout_first_block(e0), nb = dt_dropout_block_count(e0, n);
    const float scale = dt_dropout_scale(p);
    for (uint64_t j = 0; j < nb; j++) {
        uint64_t blk = first + (reverse ? nb - 1 - j : j);
        dt_dropout_block(&s, blk, e0, n, p, scale, out, in);
    }
}

static int guards_intact(const float *buf, size_t n)
{
    for (int g = 0; g < GUARD; g++)
        if (buf[g] != SENTINEL || buf[GUARD + n + g] != SENTINEL)
            return 0;
    return 1;
}

/* The per-block step against the CPU reference op, bit for bit: odd
 * shapes, rows whose Philox blocks straddle rows, row0 past 2^32 elements,
 * every element written once (NaN before), nothing outside the tensor. */
static void test_dropout_matches_cpu(void)
{
    const int shapes[][2] = {{1, 1}, {1, 3}, {3, 5}, {5, 7}, {17, 33}, {37, 129}, {64, 1021}};
    const uint64_t row0s[] = {0, 1, 3, 5, 123456789, (1ull << 33) + 1, 1ull << 40};
    const float ps[] = {0.1f, 0.3f, 0.5f, 0.9f};
    struct dt_backend_opts o;
    memset(&o, 0, sizeof o);
    o.threads = 1;
    o.reference_kernels = 1;
    dt_backend_t *cpu = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_backend_create("cpu", &o, &cpu), DT_OK);
    const struct dt_ops *ops = dt_backend_ops(cpu);
    struct dt_rng_key key;
    key.seed = 2024;
    key.purpose = DT_RNG_DROPOUT;
    key.stream = 3;
    key.step = 17;
    size_t cases = 0, bad = 0;
    uint64_t draw = 1u << 20;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int rows = shapes[si][0], cols = shapes[si][1];
        size_t n = (size_t)rows * cols;
        float *in = (float *)malloc(n * sizeof(float));
        float *ref = (float *)malloc(n * sizeof(float));
        float *buf = (float *)malloc((n + 2 * GUARD) * sizeof(float));
        CU_ASSERT_FATAL(in && ref && buf);
        for (size_t i = 0; i < n; i++) /* never 0: a 0 means dropped */
            in[i] = 0.5f + (float)(rand64(draw++) >> 40) / 16777216.0f;
        for (size_t ri = 0; ri < sizeof row0s / sizeof row0s[0]; ri++)
            for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++)
                for (int reverse = 0; reverse < 2; reverse++) {
                    uint64_t row0 = row0s[ri];
                    float p = ps[pi];
                    CU_ASSERT_EQUAL_FATAL(
                        ops->dropout_fwd(cpu, ref, in, rows, cols, p, &key, row0), DT_OK);
                    for (size_t i = 0; i < n + 2 * GUARD; i++)
                        buf[i] = SENTINEL;
                    float *out = buf + GUARD;
                    for (size_t i = 0; i < n; i++)
                        out[i] = NAN;
                    host_dropout(out, in, rows, cols, p, &key, row0, reverse);
                    int same = memcmp(out, ref, n * sizeof(float)) == 0 && guards_intact(buf, n);
                    /* in place */
                    memcpy(out, in, n * sizeof(float));
                    host_dropout(out, out, rows, cols, p, &key, row0, reverse);
                    same &= memcmp(out, ref, n * sizeof(float)) == 0 && guards_intact(buf, n);
                    if (!same)
                        printf("\n  dropout %dx%d row0=%llu p=%g: differs from the CPU\n", rows,
                               cols, (unsigned long long)row0, (double)p);
                    bad += !same;
                    cases++;
                }
        free(in), free(ref), free(buf);
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT(cases > 0);
    dt_backend_destroy(cpu);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite("cuda_host_philox", NULL, NULL);
    CU_ADD(s, test_philox_known_answers);
    CU_ADD(s, test_philox_matches_rng);
    CU_ADD(s, test_keep_matches_unit);
    CU_ADD(s, test_block_range);
    CU_ADD(s, test_dropout_matches_cpu);
    return cu_run_all();
}
