/*
 * test_rng.c - the counter-based generator: Philox4x32-10 known answers,
 * distribution sanity, independence of keys, and the epoch permutation.
 */
#include <string.h>

#include "core/rng.h"
#include "cu_util.h"

/* Known-answer vectors of Philox4x32-10 (Salmon et al., Random123). */
static void test_philox_known_answers(void)
{
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        struct dt_rng_stream s = {.k0 = kat[i].key[0], .k1 = kat[i].key[1],
                                  .c2 = kat[i].ctr[2], .c3 = kat[i].ctr[3]};
        uint32_t out[4];
        dt_rng_stream_block(&s, ((uint64_t)kat[i].ctr[1] << 32) | kat[i].ctr[0], out);
        for (int k = 0; k < 4; k++)
            CU_ASSERT_EQUAL(out[k], kat[i].out[k]);
    }
}

static void test_block_matches_stream(void)
{
    struct dt_rng_key key = {.seed = 77, .purpose = DT_RNG_DROPOUT, .stream = 3, .step = 9};
    struct dt_rng_stream s;
    dt_rng_stream_init(&key, 2, &s);
    for (uint64_t i = 0; i < 100; i++) {
        uint32_t a[4], b[4];
        dt_rng_block(&key, i * 1000003, 2, a);
        dt_rng_stream_block(&s, i * 1000003, b);
        CU_ASSERT_EQUAL(memcmp(a, b, sizeof a), 0);
    }
}

static void test_keys_are_independent(void)
{
    struct dt_rng_key a = {.seed = 1, .purpose = DT_RNG_INIT, .stream = 0, .step = 0};
    struct dt_rng_key variants[4] = {a, a, a, a};
    variants[0].seed = 2;
    variants[1].purpose = DT_RNG_DROPOUT;
    variants[2].stream = 1;
    variants[3].step = 1;
    uint32_t base[4];
    dt_rng_block(&a, 0, 0, base);
    for (int v = 0; v < 4; v++) {
        uint32_t o[4];
        dt_rng_block(&variants[v], 0, 0, o);
        CU_ASSERT_NOT_EQUAL(memcmp(o, base, sizeof o), 0);
    }
    uint32_t again[4];
    dt_rng_block(&a, 0, 0, again);
    CU_ASSERT_EQUAL(memcmp(again, base, sizeof base), 0);
}

static void test_distributions(void)
{
    struct dt_rng_key key = {.seed = 5, .purpose = DT_RNG_TEST};
    enum { N = 200000 };
    double su = 0, sn = 0, sn2 = 0;
    float umin = 1, umax = 0;
    long counts[7] = {0};
    for (uint64_t i = 0; i < N; i++) {
        float u = dt_rng_uniform(&key, i);
        umin = u < umin ? u : umin;
        umax = u > umax ? u : umax;
        su += u;
        double z = dt_rng_normal(&key, i + N);
        sn += z;
        sn2 += z * z;
        counts[dt_rng_below(&key, i + 2 * N, 7)]++;
    }
    CU_ASSERT(umin >= 0.0f && umax < 1.0f);
    CU_ASSERT_DOUBLE_EQUAL(su / N, 0.5, 0.005);
    CU_ASSERT_DOUBLE_EQUAL(sn / N, 0.0, 0.01);
    CU_ASSERT_DOUBLE_EQUAL(sn2 / N, 1.0, 0.02);
    for (int k = 0; k < 7; k++)
        CU_ASSERT_DOUBLE_EQUAL((double)counts[k] / N, 1.0 / 7, 0.005);
}

static void test_permutation(void)
{
    enum { N = 1000 };
    static uint64_t p[N], q[N], r[N];
    dt_rng_permutation(42, 3, p, N);
    dt_rng_permutation(42, 3, q, N);
    dt_rng_permutation(42, 4, r, N);
    CU_ASSERT_EQUAL(memcmp(p, q, sizeof p), 0);
    CU_ASSERT_NOT_EQUAL(memcmp(p, r, sizeof p), 0);
    static int seen[N];
    memset(seen, 0, sizeof seen);
    int fixed = 0;
    for (int i = 0; i < N; i++) {
        CU_ASSERT_FATAL(p[i] < N);
        seen[p[i]]++;
        fixed += p[i] == (uint64_t)i;
    }
    for (int i = 0; i < N; i++)
        CU_ASSERT_EQUAL(seen[i], 1);
    CU_ASSERT(fixed < 10); /* a shuffle, not the identity (expected ~1) */
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("rng", NULL, NULL);
    CU_ADD(s, test_philox_known_answers);
    CU_ADD(s, test_block_matches_stream);
    CU_ADD(s, test_keys_are_independent);
    CU_ADD(s, test_distributions);
    CU_ADD(s, test_permutation);
    return cu_run_all();
}
