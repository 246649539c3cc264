/*
 * tiles.h - the own matrix-product tile of the CPU backend and its
 * packers, shared by `linear`'s products (gemm_tiles.c) and attention's
 * (attention.c): AVX2 and FMA, compiled for them by a target attribute
 * whatever the build's flags, run only where the CPU has both
 * (dt_cpu_tiles_on, cpu_ops.h).
 *
 * The tile is 6 rows by 16 columns of C in 12 vector accumulators: per k,
 * 2 vector loads of B's packed row k, 6 broadcasts of A's column k and
 * 12 multiply-adds, each element of C summed over k in order, one FMA
 * per term (rounded once), so the last bits depend on the CPU, as a
 * BLAS product's do, but not on where the element sits in C.
 */
#ifndef DT_CPU_TILES_H
#define DT_CPU_TILES_H

#include <stddef.h>
#include <string.h>

#include "cpu_ops.h"

#define GT_MR 6
#define GT_NR 16

#if defined(__x86_64__) && defined(__GNUC__)
#define DT_TILES_X86 1
#include <immintrin.h>

#define TILES __attribute__((target("avx2,fma")))

/* The 6 x 16 tile: acc = sum over k < K of A(r, k) B(k, 0..15), A(r, k)
 * at a[r * ars + k * aks], B(k, j) at b[k * 16 + j]; then C's 6 x 16
 * block (row stride ldc) = alpha acc, plus C's own values when add, or
 * plus bias[j] when bias is not NULL. Inlined with constant strides (and
 * alpha), so that the loop's addresses are plain increments and alpha 1
 * costs nothing. */
static inline __attribute__((always_inline)) TILES void
dt_tile_body(int K, const float *a, size_t ars, size_t aks, const float *b, float *c, size_t ldc,
             int add, const float *bias, float alpha)
{
    __m256 acc[GT_MR][2];
#pragma GCC unroll 6
    for (int r = 0; r < GT_MR; r++) {
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        _mm_prefetch((const char *)(c + r * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + r * ldc + GT_NR - 1), _MM_HINT_T0);
    }
    for (int k = 0; k < K; k++) {
        const float *bk = b + (size_t)k * GT_NR, *ak = a + (size_t)k * aks;
        __m256 b0 = _mm256_loadu_ps(bk), b1 = _mm256_loadu_ps(bk + 8);
#pragma GCC unroll 6
        for (int r = 0; r < GT_MR; r++) {
            __m256 x = _mm256_broadcast_ss(ak + r * ars);
            acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < GT_MR; r++) {
        float *cr = c + r * ldc;
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256 v = acc[r][h];
            if (alpha != 1.0f)
                v = _mm256_mul_ps(v, _mm256_set1_ps(alpha));
            if (add)
                v = _mm256_add_ps(_mm256_loadu_ps(cr + 8 * h), v);
            else if (bias)
                v = _mm256_add_ps(_mm256_loadu_ps(bias + 8 * h), v);
            _mm256_storeu_ps(cr + 8 * h, v);
        }
    }
}

/* Panel rows k (kc of them) of 16 columns of B: dst[k * 16 + j] =
 * B[k * ldb + j] for j < n, zero past n. */
static inline TILES void dt_tile_pack_bn(float *dst, const float *B, size_t ldb, int kc, int n)
{
    for (int k = 0; k < kc; k++) {
        const float *src = B + (size_t)k * ldb;
        float *d = dst + (size_t)k * GT_NR;
        if (n == GT_NR) {
            _mm256_storeu_ps(d, _mm256_loadu_ps(src));
            _mm256_storeu_ps(d + 8, _mm256_loadu_ps(src + 8));
        } else {
            for (int j = 0; j < GT_NR; j++)
                d[j] = j < n ? src[j] : 0.0f;
        }
    }
}

/* The same for B transposed: dst[k * 16 + j] = B[j * ldb + k] for j < n,
 * zero past n; blocks of 8 x 8 through registers. */
static inline TILES void dt_tile_pack_bt(float *dst, const float *B, size_t ldb, int kc, int n)
{
    int k = 0;
    if (n == GT_NR)
        for (; k + 8 <= kc; k += 8)
            for (int j0 = 0; j0 < GT_NR; j0 += 8) {
                f32x8 r[8], t[8];
                for (int m = 0; m < 8; m++)
                    memcpy(&r[m], B + (size_t)(j0 + m) * ldb + k, sizeof r[m]);
                dt_cpu_transpose8(t, r);
                for (int m = 0; m < 8; m++)
                    memcpy(dst + (size_t)(k + m) * GT_NR + j0, &t[m], sizeof t[m]);
            }
    for (; k < kc; k++)
        for (int j = 0; j < GT_NR; j++)
            dst[(size_t)k * GT_NR + j] = j < n ? B[(size_t)j * ldb + k] : 0.0f;
}

/* op(B)'s rows k0 .. k0+kc, columns n0 .. n0+nc (of N), into panels of
 * 16 columns at P (kc x 16 floats each, zero past column N); op(B) = B,
 * or B transposed when transb. */
static inline void dt_tile_pack_panels(int transb, const float *B, size_t ldb, int k0, int kc,
                                       int n0, int nc, int N, float *P)
{
    for (int p = 0; p < nc; p += GT_NR) {
        int n = N - (n0 + p) < GT_NR ? N - (n0 + p) : GT_NR;
        if (transb)
            dt_tile_pack_bt(P + (size_t)p * kc, B + (size_t)(n0 + p) * ldb + k0, ldb, kc, n);
        else
            dt_tile_pack_bn(P + (size_t)p * kc, B + (size_t)k0 * ldb + n0 + p, ldb, kc, n);
    }
}
#else
#define DT_TILES_X86 0
#endif

#endif
