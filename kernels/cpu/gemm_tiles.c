/*
 * gemm_tiles.c - matrix products C = A op(B) (or + a bias per column) by
 * own tiles, for A tall (at least GT_TALL rows, not transposed) and a
 * product over at most GT_DEEP terms, on CPUs with AVX2 and FMA but no
 * AVX-512 (where OpenBLAS's kernels are twice as wide): `linear`'s
 * forward and input gradient over a batch of tokens or samples
 * (dt_cpu_sgemm_tiles in gemm.c), and its forward over a short batch with
 * the product transposed (dt_cpu_gemm_tiles_ct, below).
 *
 * C is computed in tiles of 6 rows by 16 columns, 12 vector accumulators:
 * per k, 2 vector loads of op(B)'s row k, 6 broadcasts of A's column k
 * and 12 multiply-adds. op(B) is packed into panels of 16 columns (zero
 * past N), once per block; A is read where it lies, 6 rows at a time,
 * but for its last rows (fewer than 6, packed with zeros). A BLAS packs
 * both operands; with A tall, packing op(B) alone costs little, and the
 * tiles also write the bias with the product (no pass that fills C with
 * it first) and write C without a pass that zeroes it.
 *
 * K runs in blocks of GT_KC (and N in blocks of GT_NC within them) so
 * that a block of op(B) stays in the core's second-level cache, and a
 * tile's 6 rows of A in its first while the tile moves along the block.
 * Each element of C is summed in one fixed order: over k in order within
 * a block, the first block's sum written (added to the bias), each later
 * block's added to C. That order does not depend on where the element's
 * row or column sits, so C cut into blocks of rows (the pool's threads)
 * has the uncut product's bits. The multiply-adds are FMA instructions
 * (rounded once), so the last bits depend on the CPU, as a BLAS
 * product's do.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"
#include "tiles.h"

/* k per block: a panel of op(B) (GT_KC x 16 floats, 16 KiB) and a tile's
 * 6 rows of A fit the first-level cache together. */
#define GT_KC 256
/* Columns per block of N: GT_KC x GT_NC floats of op(B), 256 KiB, in the
 * second-level cache. */
#define GT_NC 256
/* The products the tiles take: A of at least GT_TALL rows (op(B)'s
 * packing is then at most a 512th of the multiply-adds), over at most
 * GT_DEEP terms (two blocks of K: deeper products, as GPT-2's layers'
 * of 768 to 3072 terms, ran at 0.95 to 1.00 of OpenBLAS's speed). */
#define GT_TALL 512
#define GT_DEEP 512
/* The products the tiles take with C transposed (dt_cpu_gemm_tiles_ct):
 * a short batch (N of at most GT_CT_SHORT rows) against a layer's
 * weights (at least GT_CT_WIDE outputs, the M side, and as many inputs,
 * at most GT_CT_DEEP): there OpenBLAS's kernels ran at 0.74 to 0.93 of
 * their speed on a batch of 128 (32 to 64 rows), and these at 1.03 to
 * 1.34 times OpenBLAS's (32 to 96 rows, layers of 512 to 3072; 8 rows
 * 1.08 to 1.17, 24 rows 0.98 to 1.08).
 * Layers of 256 ran at 0.88 to 1.10, a batch of 128 as fast as OpenBLAS
 * (1.00), of 256 slower (0.96): left to it. */
#define GT_CT_SHORT 96
#define GT_CT_WIDE 384
#define GT_CT_DEEP 3072

#if DT_TILES_X86
static int cpu_has_tiles(void)
{
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           !__builtin_cpu_supports("avx512f");
}

/* A read where it lies (row r at a + r * lda), or from a packed panel
 * (6 floats per k). */
static TILES void tile_rows(int K, const float *a, size_t lda, const float *b, float *c,
                            size_t ldc, int add, const float *bias)
{
    dt_tile_body(K, a, lda, 1, b, c, ldc, add, bias, 1.0f);
}

static TILES void tile_packed(int K, const float *a, const float *b, float *c, size_t ldc,
                              int add, const float *bias)
{
    dt_tile_body(K, a, 1, GT_MR, b, c, ldc, add, bias, 1.0f);
}

#else
static int cpu_has_tiles(void)
{
    return 0;
}
#endif

static int tiles_off;

int dt_cpu_gemm_tiles_pin(int on)
{
    tiles_off = !on;
    return !on || cpu_has_tiles();
}

int dt_cpu_tiles_on(void)
{
    static int has = -1;
    if (has < 0)
        has = cpu_has_tiles();
    return has && !tiles_off;
}

int dt_cpu_gemm_tiles_take(int M, int K)
{
    return dt_cpu_tiles_on() && M >= GT_TALL && K >= 1 && K <= GT_DEEP;
}

int dt_cpu_gemm_tiles_ct_take(int M, int N, int K)
{
    return dt_cpu_tiles_on() && M >= GT_CT_WIDE && N >= 1 && N <= GT_CT_SHORT &&
           K >= GT_CT_WIDE && K <= GT_CT_DEEP;
}

#if DT_TILES_X86
/* A's rows m0 .. m0+mr (mr < 6, zero past them), columns k0 .. k0+kc,
 * into a panel of 6 floats per k. */
static void pack_a(const float *A, int lda, int m0, int mr, int k0, int kc, float *P)
{
    for (int k = 0; k < kc; k++)
        for (int r = 0; r < GT_MR; r++)
            P[(size_t)k * GT_MR + r] = r < mr ? A[(size_t)(m0 + r) * lda + k0 + k] : 0.0f;
}

/* One tile of C at c: A's rows at a (lda apart) or, when packed, at ap;
 * mr x nr of its 6 x 16 inside C (a tile past C's edge goes through a
 * 6 x 16 copy). */
static void tile(int kc, const float *a, int lda, const float *ap, const float *b, float *c,
                 int ldc, int mr, int nr, int add, const float *bias)
{
    if (mr == GT_MR && nr == GT_NR) {
        tile_rows(kc, a, lda, b, c, ldc, add, bias);
        return;
    }
    float edge[GT_MR * GT_NR] = {0}, eb[GT_NR] = {0};
    for (int r = 0; r < mr && add; r++)
        memcpy(edge + r * GT_NR, c + (size_t)r * ldc, (size_t)nr * sizeof *c);
    if (bias)
        memcpy(eb, bias, (size_t)nr * sizeof *eb);
    if (mr == GT_MR)
        tile_rows(kc, a, lda, b, edge, GT_NR, add, bias ? eb : NULL);
    else
        tile_packed(kc, ap, b, edge, GT_NR, add, bias ? eb : NULL);
    for (int r = 0; r < mr; r++)
        memcpy(c + (size_t)r * ldc, edge + r * GT_NR, (size_t)nr * sizeof *c);
}

int dt_cpu_gemm_tiles(int transb, int M, int N, int K, const float *A, int lda, const float *B,
                      int ldb, const float *bias, float *C, int ldc)
{
    if (M <= 0 || N <= 0)
        return 1;
    int kc_max = K < GT_KC ? K : GT_KC;
    int nc_max = N < GT_NC ? (N + GT_NR - 1) / GT_NR * GT_NR : GT_NC;
    float *bp = malloc((size_t)kc_max * nc_max * sizeof *bp);
    float *ap = malloc((size_t)kc_max * GT_MR * sizeof *ap);
    if (!bp || !ap) {
        free(bp), free(ap);
        return 0;
    }
    for (int k0 = 0; k0 < K; k0 += GT_KC) {
        int kc = K - k0 < GT_KC ? K - k0 : GT_KC, add = k0 > 0;
        for (int n0 = 0; n0 < N; n0 += GT_NC) {
            int nc = N - n0 < GT_NC ? N - n0 : GT_NC;
            dt_tile_pack_panels(transb, B, ldb, k0, kc, n0, nc, N, bp);
            for (int m0 = 0; m0 < M; m0 += GT_MR) {
                int mr = M - m0 < GT_MR ? M - m0 : GT_MR;
                if (mr < GT_MR)
                    pack_a(A, lda, m0, mr, k0, kc, ap);
                for (int p = 0; p < nc; p += GT_NR)
                    tile(kc, A + (size_t)m0 * lda + k0, lda, ap, bp + (size_t)p * kc,
                         C + (size_t)m0 * ldc + n0 + p, ldc, mr, nc - p < GT_NR ? nc - p : GT_NR,
                         add, add || !bias ? NULL : bias + n0 + p);
            }
        }
    }
    free(bp), free(ap);
    return 1;
}

/* t's rows r < mr (16 floats each) = bias[r] + the row, as the tile adds
 * a bias. */
static TILES void add_row_bias(float *t, const float *bias, int mr)
{
    for (int r = 0; r < mr; r++) {
        __m256 b = _mm256_set1_ps(bias[r]);
        for (int h = 0; h < GT_NR; h += 8)
            _mm256_storeu_ps(t + r * GT_NR + h, _mm256_add_ps(b, _mm256_loadu_ps(t + r * GT_NR + h)));
    }
}

/* A tile of C^T (6 rows by 16 columns, row stride 16) into C: column j of
 * the tile is C's row j, its rows r C's columns; mr x nr of it. Whole
 * rows through two 8 x 8 transposes in registers. */
static TILES void store_ct(const float *t, int mr, int nr, float *c, int ldc)
{
    if (mr < GT_MR) {
        for (int j = 0; j < nr; j++)
            for (int r = 0; r < mr; r++)
                c[(size_t)j * ldc + r] = t[r * GT_NR + j];
        return;
    }
    for (int h = 0; h < nr; h += 8) {
        f32x8 rows[8] = {0}, cols[8];
        for (int r = 0; r < GT_MR; r++)
            memcpy(&rows[r], t + r * GT_NR + h, sizeof rows[r]);
        dt_cpu_transpose8(cols, rows);
        for (int j = 0; j < 8 && h + j < nr; j++)
            memcpy(c + (size_t)(h + j) * ldc, &cols[j], GT_MR * sizeof *c);
    }
}

int dt_cpu_gemm_tiles_ct(int transb, int M, int N, int K, const float *A, int lda, const float *B,
                         int ldb, const float *bias, float *C, int ldc)
{
    if (M <= 0 || N <= 0)
        return 1;
    size_t n16 = (size_t)(N + GT_NR - 1) / GT_NR * GT_NR;
    float *bp = malloc((size_t)K * n16 * sizeof *bp);
    float *ap = malloc((size_t)K * GT_MR * sizeof *ap);
    if (!bp || !ap) {
        free(bp), free(ap);
        return 0;
    }
    /* op(B) whole: block k0 (kc rows) at bp + k0 * n16, its panel p at
     * + p * kc, as gemm_tiles packs one block */
    for (int k0 = 0; k0 < K; k0 += GT_KC) {
        int kc = K - k0 < GT_KC ? K - k0 : GT_KC;
        dt_tile_pack_panels(transb, B, ldb, k0, kc, 0, N, N, bp + (size_t)k0 * n16);
    }
    float t[GT_MR * GT_NR];
    for (int m0 = 0; m0 < M; m0 += GT_MR) {
        int mr = M - m0 < GT_MR ? M - m0 : GT_MR;
        const float *a = A + (size_t)m0 * lda;
        if (mr < GT_MR)
            pack_a(A, lda, m0, mr, 0, K, ap);
        for (int p = 0; p < N; p += GT_NR) {
            /* each element summed as dt_cpu_gemm_tiles sums it: over the
             * blocks of GT_KC terms in order, the first block's sum added
             * to the bias, each later one's to the running value */
            for (int k0 = 0; k0 < K; k0 += GT_KC) {
                int kc = K - k0 < GT_KC ? K - k0 : GT_KC;
                const float *b = bp + (size_t)k0 * n16 + (size_t)p * kc;
                if (mr == GT_MR)
                    tile_rows(kc, a + k0, lda, b, t, GT_NR, k0 > 0, NULL);
                else
                    tile_packed(kc, ap + (size_t)k0 * GT_MR, b, t, GT_NR, k0 > 0, NULL);
                if (k0 == 0 && bias)
                    add_row_bias(t, bias + m0, mr);
            }
            store_ct(t, mr, N - p < GT_NR ? N - p : GT_NR, C + (size_t)p * ldc + m0, ldc);
        }
    }
    free(bp), free(ap);
    return 1;
}
#else
int dt_cpu_gemm_tiles(int transb, int M, int N, int K, const float *A, int lda, const float *B,
                      int ldb, const float *bias, float *C, int ldc)
{
    (void)transb, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)ldb, (void)bias;
    (void)C, (void)ldc;
    return 0;
}

int dt_cpu_gemm_tiles_ct(int transb, int M, int N, int K, const float *A, int lda, const float *B,
                         int ldb, const float *bias, float *C, int ldc)
{
    (void)transb, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)ldb, (void)bias;
    (void)C, (void)ldc;
    return 0;
}
#endif
