/*
 * gemm.c - matrix products on the rank's threads (dt_cpu_sgemm, see
 * cpu_ops.h).
 *
 * BLAS runs on one thread (backend_cpu.c); a product large enough to
 * share is cut into as many blocks as there are threads, along the longer
 * side of C: blocks of rows (A's rows, C's rows) or of columns (B's
 * columns, C's columns), each a multiple of 16 so BLAS's kernels see whole
 * tiles. Every element of C is still one BLAS dot product over all of K,
 * so the sums run as BLAS runs them; whether BLAS sums an element in the
 * same order whatever the block it sits in is up to BLAS (OpenBLAS does
 * for the shapes dtrain's tests check, but does not promise it).
 */
#include "cpu_ops.h"

#include <cblas.h>
#undef I

/* M * N * K below which one thread does it all (about 10 us of work). */
#define GEMM_SPLIT_MIN (64.0 * 64 * 64)
#define GEMM_TILE 16

/* OpenBLAS (0.3.21, its AVX-512 kernels) hands products of at most 100^3
 * multiply-adds to its small-matrix kernels, whose sums for an element of
 * C depend on the product's shape: a 128x10 output over 512 terms cut into
 * two 64-row blocks differs from the uncut product in most elements. A
 * product is cut only when every block stays above that size, where the
 * blocks' elements come out as the uncut product's (on every shape
 * tried). This holds also with tiny tasks: it is about the bits, not the
 * cost. */
#define GEMM_BLAS_SMALL (100.0 * 100 * 100)

struct gemm_job {
    int transa, transb, M, N, K, rows, block;
    float alpha, beta;
    const float *A, *B;
    float *C;
    int lda, ldb, ldc;
};

static void one(int transa, int transb, int M, int N, int K, float alpha, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc)
{
    cblas_sgemm(CblasRowMajor, transa ? CblasTrans : CblasNoTrans,
                transb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void gemm_task(void *a, int t, int thread)
{
    const struct gemm_job *j = a;
    int dim = j->rows ? j->M : j->N;
    int lo = t * j->block, hi = lo + j->block < dim ? lo + j->block : dim;
    if (lo >= hi)
        return;
    if (j->rows)
        one(j->transa, j->transb, hi - lo, j->N, j->K, j->alpha,
            j->transa ? j->A + lo : j->A + (size_t)lo * j->lda, j->lda, j->B, j->ldb, j->beta,
            j->C + (size_t)lo * j->ldc, j->ldc);
    else
        one(j->transa, j->transb, j->M, hi - lo, j->K, j->alpha, j->A, j->lda,
            j->transb ? j->B + (size_t)lo * j->ldb : j->B + lo, j->ldb, j->beta, j->C + lo, j->ldc);
}

void dt_cpu_sgemm(dt_backend_t *be, int transa, int transb, int M, int N, int K, float alpha,
                  const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    int threads = dt_cpu_threads(be), tiny = dt_cpu_tiny_tasks(be);
    int rows = M >= N, dim = rows ? M : N, tile = tiny ? 1 : GEMM_TILE;
    int blocks = threads < dim / tile ? threads : dim / tile;
    int block = blocks > 0 ? ((dim + blocks - 1) / blocks + tile - 1) / tile * tile : dim;
    int last = dim > 0 ? dim - (dim - 1) / block * block : 0; /* the smallest block */
    if (threads == 1 || blocks < 2 || (!tiny && (double)M * N * K < GEMM_SPLIT_MIN) ||
        (double)last * (rows ? N : M) * K <= GEMM_BLAS_SMALL) {
        one(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    struct gemm_job j = {.transa = transa, .transb = transb, .M = M, .N = N, .K = K,
                         .rows = rows, .block = block, .alpha = alpha, .beta = beta,
                         .A = A, .B = B, .C = C, .lda = lda, .ldb = ldb, .ldc = ldc};
    dt_cpu_run(be, (dim + block - 1) / block, gemm_task, &j);
}
