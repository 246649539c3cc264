/*
 * gemm.c - matrix products on the rank's threads (dt_cpu_sgemm, see
 * cpu_ops.h).
 *
 * BLAS runs on one thread (backend_cpu.c); a product large enough to
 * share is cut into as many blocks of rows (A's rows, C's rows) as there
 * are threads, each a one-thread BLAS call. Every element of C is still
 * one BLAS dot product over all of K, but whether BLAS sums it in the
 * same order whatever block it sits in depends on its kernels: OpenBLAS's
 * sgemm kernels give an element the uncut product's bits only when the
 * blocks start at multiples of their tile along that side (16 rows for
 * its AVX-512 kernels, 24 for its Haswell and Zen ones), and cut into
 * columns they differ on every kernel tried here. So the cut is always
 * into rows, at multiples of a tile found once per process by trying the
 * BLAS the program runs with (split_tile below); a BLAS that gives other
 * bits at every tile tried is not cut at all. The products the own tiles
 * take (dt_cpu_sgemm_tiles, gemm_tiles.c) are cut into blocks of
 * GEMM_TILES_ROWS rows (with C transposed, dt_cpu_sgemm_tiles_ct: of A's
 * rows, C's columns): any cut keeps their bits.
 */
#include "cpu_ops.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#undef I

/* M * N * K below which one thread does it all (about 10 us of work). */
#define GEMM_SPLIT_MIN (64.0 * 64 * 64)

/* OpenBLAS (0.3.21, its AVX-512 kernels) hands products of at most 100^3
 * multiply-adds to its small-matrix kernels, whose sums for an element of
 * C depend on the product's shape: a 128x10 output over 512 terms cut into
 * two 64-row blocks differs from the uncut product in most elements. A
 * product is cut only when every block stays above that size, where the
 * blocks' elements come out as the uncut product's (on every shape
 * tried). This holds also with tiny tasks: it is about the bits, not the
 * cost. */
#define GEMM_BLAS_SMALL (100.0 * 100 * 100)

/* Rows per block where the own tiles run (gemm_tiles.c): any cut keeps
 * their bits; a multiple of their 6 rows leaves no short tile inside. */
#define GEMM_TILES_ROWS 24

struct gemm_job {
    int transa, transb, M, N, K, block, tiles; /* tiles: 1, or 2 with C transposed */
    float alpha, beta;
    const float *A, *B, *bias;
    float *C;
    int lda, ldb, ldc;
};

void dt_cpu_sgemm1(int transa, int transb, int M, int N, int K, float alpha, const float *A,
                   int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    if (beta == 0.0f && M > 0 && N > 0) {
        if (ldc == N)
            memset(C, 0, (size_t)M * N * sizeof *C);
        else
            for (int i = 0; i < M; i++)
                memset(C + (size_t)i * ldc, 0, (size_t)N * sizeof *C);
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, transa ? CblasTrans : CblasNoTrans,
                transb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* The tiles tried, smallest first: a block of rows starts at a multiple
 * of the first one whose cut products match the uncut ones bit for bit. */
static const int split_tiles[] = {16, 24, 32, 48, 64, 96};
static int split_tile_found;
static pthread_once_t split_tile_once = PTHREAD_ONCE_INIT;

/* Whether C(M,N) cut into blocks of `tile` rows equals the uncut product
 * bit for bit, for op(A), op(B) as ta, tb say and beta 0 and 1. */
static int same_bits_cut(int tile, int M, int N, int K, int ta, int tb, float *a, float *b,
                         float *c1, float *c2)
{
    int lda = ta ? M : K, ldb = tb ? K : N;
    for (int beta = 0; beta < 2; beta++) {
        for (size_t i = 0; i < (size_t)M * N; i++)
            c1[i] = c2[i] = (float)(i % 7) * 0.25f;
        dt_cpu_sgemm1(ta, tb, M, N, K, 1.0f, a, lda, b, ldb, (float)beta, c1, N);
        for (int lo = 0; lo < M; lo += tile) {
            int m = lo + tile < M ? tile : M - lo;
            dt_cpu_sgemm1(ta, tb, m, N, K, 1.0f, ta ? a + lo : a + (size_t)lo * lda, lda, b, ldb,
                          (float)beta, c2 + (size_t)lo * N, N);
        }
        if (memcmp(c1, c2, (size_t)M * N * sizeof *c1) != 0)
            return 0;
    }
    return 1;
}

/* split_tile_found = the first of split_tiles at which every probe keeps
 * the bits, or 0. The probes are cuts dt_cpu_sgemm makes: 2.5 tiles of
 * rows (two whole blocks and a half one), every block above
 * GEMM_BLAS_SMALL, both transposes of each operand, K below and above
 * the kernels' blocks of K. */
static void find_split_tile(void)
{
    enum { N_MAX = 1000, K_MAX = 700 };
    const int M = 3 * split_tiles[sizeof split_tiles / sizeof split_tiles[0] - 1];
    const int shapes[][2] = {{N_MAX, 129}, {200, K_MAX}}; /* N, K */
    float *a = malloc((size_t)M * K_MAX * sizeof *a), *b = malloc((size_t)K_MAX * N_MAX * sizeof *b);
    float *c1 = malloc((size_t)M * N_MAX * sizeof *c1), *c2 = malloc((size_t)M * N_MAX * sizeof *c2);
    if (!a || !b || !c1 || !c2)
        goto out; /* no cut: the bits are safe */
    uint32_t r = 12345;
    for (size_t i = 0; i < (size_t)M * K_MAX; i++)
        r = r * 1664525u + 1013904223u, a[i] = (float)(r >> 8) / 16777216.0f - 0.5f;
    for (size_t i = 0; i < (size_t)K_MAX * N_MAX; i++)
        r = r * 1664525u + 1013904223u, b[i] = (float)(r >> 8) / 16777216.0f - 0.5f;
    for (size_t t = 0; t < sizeof split_tiles / sizeof split_tiles[0]; t++) {
        int tile = split_tiles[t], rows = 2 * tile + tile / 2, ok = 1;
        for (int s = 0; s < 2 && ok; s++)
            for (int ta = 0; ta < 2 && ok; ta++)
                for (int tb = 0; tb < 2 && ok; tb++)
                    ok = same_bits_cut(tile, rows, shapes[s][0], shapes[s][1], ta, tb, a, b, c1,
                                       c2);
        if (ok) {
            split_tile_found = tile;
            break;
        }
    }
out:
    free(a), free(b), free(c1), free(c2);
}

int dt_cpu_gemm_split_tile(void)
{
    pthread_once(&split_tile_once, find_split_tile);
    return split_tile_found;
}

/* One block of rows of a product the tiles take (C = A op(B), + bias
 * where it is not NULL); where they cannot have their buffers, the same
 * by BLAS (C filled with the bias first). */
static void tiles1(int transb, int M, int N, int K, const float *A, int lda, const float *B,
                   int ldb, const float *bias, float *C, int ldc)
{
    if (dt_cpu_gemm_tiles(transb, M, N, K, A, lda, B, ldb, bias, C, ldc))
        return;
    for (int i = 0; i < M && bias; i++)
        memcpy(C + (size_t)i * ldc, bias, (size_t)N * sizeof *C);
    dt_cpu_sgemm1(0, transb, M, N, K, 1.0f, A, lda, B, ldb, bias ? 1.0f : 0.0f, C, ldc);
}

/* The same with C transposed (dt_cpu_gemm_tiles_ct): C(N,M) = (A
 * op(B))^T, + bias[m] on column m; by BLAS where the tiles cannot have
 * their buffers (C filled with the bias first). */
static void tiles_ct1(int transb, int M, int N, int K, const float *A, int lda, const float *B,
                      int ldb, const float *bias, float *C, int ldc)
{
    if (dt_cpu_gemm_tiles_ct(transb, M, N, K, A, lda, B, ldb, bias, C, ldc))
        return;
    for (int i = 0; i < N && bias; i++)
        memcpy(C + (size_t)i * ldc, bias, (size_t)M * sizeof *C);
    /* C(N,M) = op(B)^T A^T */
    dt_cpu_sgemm1(!transb, 1, N, M, K, 1.0f, B, ldb, A, lda, bias ? 1.0f : 0.0f, C, ldc);
}

/* Rows per block when M rows are cut for the pool's threads at multiples
 * of tile (as many blocks as threads, fewer where M is short); M or more
 * when the product is not cut. */
static int row_block(int threads, int M, int tile)
{
    int blocks = tile && threads < M / tile ? threads : tile ? M / tile : 0;
    return blocks > 1 ? ((M + blocks - 1) / blocks + tile - 1) / tile * tile : M;
}

static void gemm_task(void *a, int t, int thread)
{
    const struct gemm_job *j = a;
    int lo = t * j->block, hi = lo + j->block < j->M ? lo + j->block : j->M;
    if (lo >= hi)
        return;
    if (j->tiles == 2)
        tiles_ct1(j->transb, hi - lo, j->N, j->K, j->A + (size_t)lo * j->lda, j->lda, j->B,
                  j->ldb, j->bias ? j->bias + lo : NULL, j->C + lo, j->ldc);
    else if (j->tiles)
        tiles1(j->transb, hi - lo, j->N, j->K, j->A + (size_t)lo * j->lda, j->lda, j->B, j->ldb,
               j->bias, j->C + (size_t)lo * j->ldc, j->ldc);
    else
        dt_cpu_sgemm1(j->transa, j->transb, hi - lo, j->N, j->K, j->alpha,
                      j->transa ? j->A + lo : j->A + (size_t)lo * j->lda, j->lda, j->B, j->ldb,
                      j->beta, j->C + (size_t)lo * j->ldc, j->ldc);
}

void dt_cpu_sgemm(dt_backend_t *be, int transa, int transb, int M, int N, int K, float alpha,
                  const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    int threads = dt_cpu_threads(be), tiny = dt_cpu_tiny_tasks(be);
    int block = row_block(threads, M, threads > 1 ? dt_cpu_gemm_split_tile() : 0);
    int last = M > 0 ? M - (M - 1) / block * block : 0; /* the smallest block */
    if (block >= M || (!tiny && (double)M * N * K < GEMM_SPLIT_MIN) ||
        (double)last * N * K <= GEMM_BLAS_SMALL) {
        dt_cpu_sgemm1(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    struct gemm_job j = {.transa = transa, .transb = transb, .M = M, .N = N, .K = K,
                         .block = block, .alpha = alpha, .beta = beta,
                         .A = A, .B = B, .C = C, .lda = lda, .ldb = ldb, .ldc = ldc};
    dt_cpu_run(be, (M + block - 1) / block, gemm_task, &j);
}

/* A product the tiles take (tiles: 1, or 2 with C transposed) on the
 * pool's threads, in blocks of A's rows (C's rows, or its columns). */
static void sgemm_tiles_run(dt_backend_t *be, int tiles, int transb, int M, int N, int K,
                            const float *A, int lda, const float *B, int ldb, const float *bias,
                            float *C, int ldc)
{
    int threads = dt_cpu_threads(be), tiny = dt_cpu_tiny_tasks(be);
    int block = row_block(threads, M, GEMM_TILES_ROWS);
    if (!tiny && (double)M * N * K < GEMM_SPLIT_MIN)
        block = M;
    struct gemm_job j = {.transb = transb, .M = M, .N = N, .K = K, .block = block, .tiles = tiles,
                         .A = A, .B = B, .bias = bias, .C = C, .lda = lda, .ldb = ldb, .ldc = ldc};
    if (block >= M)
        gemm_task(&j, 0, 0);
    else
        dt_cpu_run(be, (M + block - 1) / block, gemm_task, &j);
}

int dt_cpu_sgemm_tiles(dt_backend_t *be, int transb, int M, int N, int K, const float *A, int lda,
                       const float *B, int ldb, const float *bias, float *C, int ldc)
{
    if (!dt_cpu_gemm_tiles_take(M, K))
        return 0;
    sgemm_tiles_run(be, 1, transb, M, N, K, A, lda, B, ldb, bias, C, ldc);
    return 1;
}

int dt_cpu_sgemm_tiles_ct(dt_backend_t *be, int transb, int M, int N, int K, const float *A,
                          int lda, const float *B, int ldb, const float *bias, float *C, int ldc)
{
    if (!dt_cpu_gemm_tiles_ct_take(M, N, K))
        return 0;
    sgemm_tiles_run(be, 2, transb, M, N, K, A, lda, B, ldb, bias, C, ldc);
    return 1;
}
