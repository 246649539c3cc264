/*
 * bench_gemm_cut.c - whether the BLAS gives a matrix product cut into
 * blocks the bits of the uncut product: the check behind the row tile of
 * kernels/cpu/gemm.c (dt_cpu_gemm_split_tile), over many shapes.
 *
 *   bench_gemm_cut            the shapes below, every transpose of A and B,
 *                             beta 0 or 1, cut into rows and into columns
 *                             at every multiple of 8 to 96 that leaves two
 *                             blocks or more
 *   bench_gemm_cut M N K      one shape: for each block size 8 .. 96, how
 *                             many elements of C(M,N) differ, rows and
 *                             columns
 * First prints the row tile dtrain finds for this BLAS and how long
 * finding it took; then the block sizes at which no element differed in
 * any case. BLAS runs on one thread.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"

#include <cblas.h>
#undef I

int dt_cpu_gemm_split_tile(void); /* kernels/cpu/gemm.c */

enum { NBLK = 12 };
static const int blocks[NBLK] = {8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96};

static void prod(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B,
                 int ldb, float beta, float *C, int ldc)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M,
                N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

/* Elements of C(M,N) that differ between the uncut product and the one
 * cut into blocks of blk rows (rows) or columns. */
static long cut_differs(int ta, int tb, int M, int N, int K, float beta, int blk, int rows)
{
    int lda = ta ? M : K, ldb = tb ? K : N;
    float *A = malloc(sizeof(float) * (size_t)M * K), *B = malloc(sizeof(float) * (size_t)K * N);
    float *C1 = malloc(sizeof(float) * (size_t)M * N), *C2 = malloc(sizeof(float) * (size_t)M * N);
    if (!A || !B || !C1 || !C2) {
        fprintf(stderr, "bench_gemm_cut: out of memory\n");
        exit(71);
    }
    uint32_t r = 7;
    for (size_t i = 0; i < (size_t)M * K; i++)
        r = r * 1664525u + 1013904223u, A[i] = (float)(r >> 8) / 16777216.0f - 0.5f;
    for (size_t i = 0; i < (size_t)K * N; i++)
        r = r * 1664525u + 1013904223u, B[i] = (float)(r >> 8) / 16777216.0f - 0.5f;
    for (size_t i = 0; i < (size_t)M * N; i++)
        C1[i] = C2[i] = (float)(i % 5) * 0.5f;
    prod(ta, tb, M, N, K, A, lda, B, ldb, beta, C1, N);
    int dim = rows ? M : N;
    for (int lo = 0; lo < dim; lo += blk) {
        int m = lo + blk < dim ? blk : dim - lo;
        if (rows)
            prod(ta, tb, m, N, K, ta ? A + lo : A + (size_t)lo * lda, lda, B, ldb, beta,
                 C2 + (size_t)lo * N, N);
        else
            prod(ta, tb, M, m, K, A, lda, tb ? B + (size_t)lo * ldb : B + lo, ldb, beta, C2 + lo,
                 N);
    }
    long bad = 0;
    for (size_t i = 0; i < (size_t)M * N; i++)
        bad += memcmp(&C1[i], &C2[i], sizeof *C1) != 0;
    free(A), free(B), free(C1), free(C2);
    return bad;
}

int main(int argc, char **argv)
{
#ifdef OPENBLAS_VERSION
    openblas_set_num_threads(1);
#endif
    double t0 = dt_now();
    int tile = dt_cpu_gemm_split_tile();
    printf("dtrain's row tile for this BLAS: %d (found in %.1f ms)\n", tile, (dt_now() - t0) * 1e3);
    if (argc == 4) {
        int M = atoi(argv[1]), N = atoi(argv[2]), K = atoi(argv[3]);
        if (M < 1 || N < 1 || K < 1) {
            fprintf(stderr, "usage: bench_gemm_cut [M N K]\n");
            return 64;
        }
        printf("C(%d,%d) over %d terms, A and B not transposed, beta 0: elements that differ\n", M,
               N, K);
        for (int b = 0; b < NBLK; b++)
            printf("blocks of %3d: rows %8ld  columns %8ld\n", blocks[b],
                   blocks[b] < M ? cut_differs(0, 0, M, N, K, 0.0f, blocks[b], 1) : 0L,
                   blocks[b] < N ? cut_differs(0, 0, M, N, K, 0.0f, blocks[b], 0) : 0L);
    } else if (argc != 1) {
        fprintf(stderr, "usage: bench_gemm_cut [M N K]\n");
        return 64;
    } else {
        static const int shapes[][3] = {
            {260, 130, 300}, {300, 260, 130}, {2048, 128, 384}, {2048, 512, 128}, {128, 512, 2048},
            {512, 128, 2048}, {384, 128, 2048}, {128, 784, 128}, {512, 784, 128}, {128, 512, 784},
            {100, 100, 100}, {1000, 60, 700}, {97, 300, 513}, {1024, 96, 64}, {64, 1024, 96},
            {144, 64, 1568}, {16, 784, 144}, {576, 196, 32}};
        const int ns = (int)(sizeof shapes / sizeof shapes[0]);
        for (int rows = 1; rows >= 0; rows--) {
            printf("cut into %s, %d shapes x 4 transposes x beta 0 and 1: ", rows ? "rows" : "columns",
                   ns);
            int any = 0;
            for (int b = 0; b < NBLK; b++) {
                long bad = 0;
                for (int s = 0; s < ns; s++)
                    for (int t = 0; t < 8; t++) {
                        const int *d = shapes[s];
                        if (blocks[b] < (rows ? d[0] : d[1]))
                            bad += cut_differs(t & 1, (t >> 1) & 1, d[0], d[1], d[2],
                                               (float)(t >> 2), blocks[b], rows);
                    }
                if (!bad)
                    printf("%s%d", any++ ? ", " : "same bits at blocks of ", blocks[b]);
            }
            printf("%s\n", any ? "" : "other bits at every block size");
        }
    }
    return 0;
}
