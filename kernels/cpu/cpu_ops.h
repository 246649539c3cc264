/*
 * cpu_ops.h - internal header of the CPU backend: every op of kernels/ops.h
 * in two versions, and the argument checks they share.
 *
 *   dt_cpu_<op>_ref  plain C that reads like the math; the reference the
 *                    fast path and the CUDA ops are tested against.
 *   dt_cpu_<op>      the fast path (BLAS for linear, blocked loops that the
 *                    compiler vectorises for the rest). Where nothing is
 *                    faster than the reference (softmax-xent backward,
 *                    RMS norm), only the _ref exists and the fast table
 *                    points at it.
 *
 * backend_cpu.c puts one set or the other into the backend's op table
 * (dt_backend_opts.reference_kernels). Both sets check their arguments the
 * same way and fail with DT_ERR_INVALID_ARG naming the op.
 *
 * Gradients of parameters accumulate (+=); gradients of activations are
 * written (=). Elementwise ops accept out == in (in place); partially
 * overlapping buffers are not supported.
 */
#ifndef DT_CPU_OPS_H
#define DT_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include <string.h>

#include "core/bf16.h"
#include "kernels/ops.h"

/* The fast loops work on blocks of this many floats (one cache line, one
 * AVX-512 register). A loop with a constant trip count that is a multiple
 * of the vector width is one GCC vectorises at -O2 (its "very cheap" cost
 * model), so the blocked loops need no -O3 and no intrinsics. */
#define DT_CPU_LANES 16

/* Vectors of 8 and 4 floats, and of as many ints (lane masks, shuffle
 * indices), for the loops that move or compare lanes with
 * __builtin_shuffle (conv.c's strided copies, pool.c's 2x2 windows). */
typedef float f32x8 __attribute__((vector_size(32)));
typedef int i32x8 __attribute__((vector_size(32)));
typedef float f32x4 __attribute__((vector_size(16)));
typedef int i32x4 __attribute__((vector_size(16)));

/* out[j] = column j of the 8x8 block r[0..7], in registers (the direct
 * convolution's dy, the matrix-product tiles' transposed operands). */
static inline __attribute__((always_inline)) void dt_cpu_transpose8(f32x8 *out, const f32x8 *r)
{
    const i32x8 lo = {0, 8, 1, 9, 4, 12, 5, 13}, hi = {2, 10, 3, 11, 6, 14, 7, 15};
    const i32x8 even = {0, 1, 8, 9, 4, 5, 12, 13}, odd = {2, 3, 10, 11, 6, 7, 14, 15};
    const i32x8 low = {0, 1, 2, 3, 8, 9, 10, 11}, high = {4, 5, 6, 7, 12, 13, 14, 15};
    f32x8 t[8], u[8];
#pragma GCC unroll 4
    for (int m = 0; m < 8; m += 2) {
        t[m] = __builtin_shuffle(r[m], r[m + 1], lo);
        t[m + 1] = __builtin_shuffle(r[m], r[m + 1], hi);
    }
#pragma GCC unroll 2
    for (int m = 0; m < 8; m += 4) {
        u[m] = __builtin_shuffle(t[m], t[m + 2], even);
        u[m + 1] = __builtin_shuffle(t[m], t[m + 2], odd);
        u[m + 2] = __builtin_shuffle(t[m + 1], t[m + 3], even);
        u[m + 3] = __builtin_shuffle(t[m + 1], t[m + 3], odd);
    }
#pragma GCC unroll 4
    for (int m = 0; m < 4; m++) {
        out[m] = __builtin_shuffle(u[m], u[m + 4], low);
        out[m + 4] = __builtin_shuffle(u[m], u[m + 4], high);
    }
}

/* A function built three times, for AVX-512, AVX2 and the x86-64 baseline
 * (SSE2), the one the CPU has picked when the program loads; the blocked
 * loops then run 16, 8 or 4 floats to an instruction. Files that use it
 * are compiled without FMA contraction (CMakeLists.txt), so every build
 * gives the baseline's bits. */
#if defined(__x86_64__) && defined(__GNUC__)
#define DT_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DT_CPU_CLONES
#endif

/* Returns DT_ERR_INVALID_ARG with "cpu <op>: <why>" when cond is false.
 * op and the format are string literals. */
#define DT_CPU_REQUIRE(cond, op, ...)                                                              \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return dt_set_error(DT_ERR_INVALID_ARG, "cpu " op ": " __VA_ARGS__);                   \
    } while (0)

/* Matmul operands at reduced precision (train.precision bf16/fp16): the
 * CPU rounds them to the nearest bf16/fp16 value (ties to even, overflow
 * to infinity) and multiplies those in fp32. The products of two bf16 or
 * fp16 values are exact in fp32, so this is what a GPU's tensor cores
 * compute, up to the order of the fp32 sums. */
static inline float dt_cpu_round_bf16(float x)
{
    return x != x ? x : dt_bf16_to_float(dt_bf16_from_float(x)); /* NaN stays as it is */
}

static inline float dt_cpu_round_fp16(float x) { return (float)(_Float16)x; }

/* Operand x (n floats) as the backend's precision has the GEMM see it:
 * x itself in fp32, else a rounded copy in the backend's scratch slot
 * `slot` (0..DT_CPU_OPERANDS-1), valid until the slot's next use. */
#define DT_CPU_OPERANDS 3
dt_status dt_cpu_operand(dt_backend_t *be, int slot, const float *x, size_t n, const float **out);

/* Threads. The fast ops cut their work into tasks of the backend's pool
 * (core/threads.h); the reference ops and a NULL backend run on the
 * calling thread. A pool has at most DT_CPU_MAX_SCRATCH threads. */
#define DT_CPU_MAX_SCRATCH 1024
int dt_cpu_threads(const dt_backend_t *be);
/* dt_backend_opts.tiny_tasks: every op cut as finely as it can be. */
int dt_cpu_tiny_tasks(const dt_backend_t *be);

/* Channels per task of a per-channel sum over x(N, C, HW) that visits
 * each sample's planes of its channels in memory order: about
 * DT_CPU_GRAIN floats, and at least a share of two tasks per thread, so
 * that a task's planes of one sample are a run of memory long enough to
 * stream (a 7x7 plane is 196 bytes, and the same channel's plane of the
 * next sample C*196 bytes on). Each channel's sum is the same whatever
 * the blocks. */
size_t dt_cpu_channel_grain(const dt_backend_t *be, int N, int C, int HW);

/* fn(arg, lo, hi) over [0, n) in blocks of `grain` elements, the blocks
 * shared by the pool's threads; inline when n <= grain. Block boundaries
 * depend on n and grain alone, never on the thread count. */
typedef void (*dt_cpu_range_fn)(void *arg, size_t lo, size_t hi);
void dt_cpu_for(dt_backend_t *be, size_t n, size_t grain, dt_cpu_range_fn fn, void *arg);

/* fn(arg, task, thread) for task in [0, tasks) on the backend's pool. */
void dt_cpu_run(dt_backend_t *be, int tasks, void (*fn)(void *arg, int task, int thread),
                void *arg);

/* Per-thread scratch: dt_cpu_scratch_reserve (called before a run, on the
 * submitting thread) makes each thread's block at least `bytes` (256-byte
 * aligned, contents undefined); a task takes its own with
 * dt_cpu_scratch(be, thread). Not with a NULL backend. */
dt_status dt_cpu_scratch_reserve(dt_backend_t *be, size_t bytes);
void *dt_cpu_scratch(dt_backend_t *be, int thread);

/* Direct convolution (conv_direct.c) for stride 1 and "same" padding, on
 * CPUs with AVX2 and FMA: dt_cpu_conv_direct_ok says whether it runs a
 * shape (an odd filter of at most DT_CPU_DIRECT_TAPS taps, padded by half
 * its size); dt_cpu_conv_direct_pack writes the filter (K, C/groups, R, S) in the
 * order a pass reads it (as many floats as the filter), for the
 * forward or, with bwd_data, the input gradient; dt_cpu_conv_direct_image
 * runs that pass on one image, forward x(C, H, W) -> y(K, H, W) or
 * dy(K, H, W) -> dx(C, H, W) (written), and
 * dt_cpu_conv_direct_filter_image adds its filter gradient to a sum
 * (transposed, (C/groups*R*S, K/groups) per group), each in a workspace of
 * dt_cpu_conv_direct_ws floats. */
#define DT_CPU_DIRECT_TAPS 49
int dt_cpu_conv_direct_ok(const struct dt_conv2d_shape *s);
/* dt_cpu_conv_direct_pin(0) turns the direct convolution off (every shape
 * is lowered to BLAS products), (1) on again where the CPU runs it, and
 * returns whether it will run. For tests, which compare both; not
 * thread-safe. */
int dt_cpu_conv_direct_pin(int on);
size_t dt_cpu_conv_direct_ws(const struct dt_conv2d_shape *s);
void dt_cpu_conv_direct_pack(float *wp, const float *w, const struct dt_conv2d_shape *s,
                             int bwd_data);
void dt_cpu_conv_direct_image(float *out, const float *in, const float *wp,
                              const struct dt_conv2d_shape *s, int bwd_data, float *ws);
void dt_cpu_conv_direct_filter_image(float *dw, const float *dy, const float *x,
                                     const struct dt_conv2d_shape *s, float *ws);

/* Dropout's versions of its Philox rounds (kernels/cpu/dropout.c), all
 * with the same bits: dt_cpu_dropout_pin makes later calls run the one
 * named (DT_CPU_DROPOUT_BEST, the default: the best the CPU has) and
 * returns 1, or returns 0 and changes nothing when the CPU cannot run it.
 * For tests, which compare them; not thread-safe. */
enum { DT_CPU_DROPOUT_BEST, DT_CPU_DROPOUT_AVX512, DT_CPU_DROPOUT_AVX2, DT_CPU_DROPOUT_GENERIC };
int dt_cpu_dropout_pin(int version);

/* Dropout's masks, kept from forward for backward (one byte per element,
 * 1 kept, 0 dropped). A mask is a pure function of (key, row0, rows, cols,
 * p), so one found under the same five is the mask backward would draw
 * again. dt_cpu_mask_store gives forward a block to fill for them (the
 * least recently used of DT_CPU_MASKS slots; NULL when the block would be
 * larger than DT_CPU_MASK_MAX bytes, memory runs out, or be is NULL: then
 * nothing is kept); dt_cpu_mask_find gives the block stored under the
 * same five, or NULL. */
#define DT_CPU_MASKS 8
#define DT_CPU_MASK_MAX ((size_t)64 << 20)
uint8_t *dt_cpu_mask_store(dt_backend_t *be, const struct dt_rng_key *key, uint64_t row0, int rows,
                           int cols, float p);
const uint8_t *dt_cpu_mask_find(dt_backend_t *be, const struct dt_rng_key *key, uint64_t row0,
                                int rows, int cols, float p);

/* Grains: element-wise passes split into blocks of this many floats
 * (64 KiB: enough work to pay for a task, small enough to balance). */
#define DT_CPU_GRAIN 16384

/* C(M,N) = alpha op(A) op(B) + beta C, row-major, as cblas_sgemm, cut into
 * blocks of rows shared by the pool's threads, each a one-thread BLAS call
 * starting at a multiple of dt_cpu_gemm_split_tile(); inline when small
 * or when that is 0. */
/* The multiple of rows at which the BLAS's products cut into blocks give
 * each element of C the uncut product's bits (16, 24, ...; found once, on
 * the first call), or 0: none found, products are never cut. */
int dt_cpu_gemm_split_tile(void);
/* kernels/cpu/gemm_tiles.c: products C(M,N) = A op(B) (A not
 * transposed), or + bias (one value per column) where bias is not NULL,
 * by own tiles, on CPUs with AVX2 and FMA and without AVX-512, for A of
 * at least 512 rows and K from 1 to 512: dt_cpu_gemm_tiles_take(M, K)
 * says whether they take such a product (any cut of it into blocks of
 * rows keeps their bits, so the whole product's M decides for its
 * blocks). dt_cpu_gemm_tiles does one on the calling thread and returns
 * 1; 0 when it could not have its buffers (nothing written).
 * dt_cpu_gemm_tiles_pin(0) turns the own tiles off, these and
 * attention's (for tests, not thread-safe), (1) on again; it returns
 * whether the tiles then run on this CPU, or 1 for off. */
int dt_cpu_gemm_tiles_take(int M, int K);
int dt_cpu_gemm_tiles(int transb, int M, int N, int K, const float *A, int lda, const float *B,
                      int ldb, const float *bias, float *C, int ldc);
int dt_cpu_gemm_tiles_pin(int on);
/* The same tiles with C transposed: C(N,M) = (A op(B))^T, or + bias[m]
 * on C's column m, each element with the bits dt_cpu_gemm_tiles gives it
 * (so `linear` over a short batch, its weights as A, matches it over a
 * long one); A is read where it lies, op(B) packed whole.
 * dt_cpu_gemm_tiles_ct_take(M, N, K) says whether they take it: N from 1
 * to 96 (a short batch), M and K at least 384 (a layer's outputs and
 * inputs), K at most 3072. */
int dt_cpu_gemm_tiles_ct_take(int M, int N, int K);
int dt_cpu_gemm_tiles_ct(int transb, int M, int N, int K, const float *A, int lda, const float *B,
                         int ldb, const float *bias, float *C, int ldc);
/* Whether the own tiles (tiles.h) run: the CPU has them and
 * dt_cpu_gemm_tiles_pin has not turned them off. */
int dt_cpu_tiles_on(void);
/* One BLAS call on the calling thread, C(M,N) = alpha op(A) op(B) + beta
 * C as cblas_sgemm. With beta = 0, C is zeroed first and the product
 * added to it (beta = 1): OpenBLAS's own beta = 0 pass writes C one
 * float at a time, and adding to zeros gives the same floats. */
void dt_cpu_sgemm1(int transa, int transb, int M, int N, int K, float alpha, const float *A,
                   int lda, const float *B, int ldb, float beta, float *C, int ldc);
void dt_cpu_sgemm(dt_backend_t *be, int transa, int transb, int M, int N, int K, float alpha,
                  const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
/* C(M,N) = A op(B), + bias where it is not NULL, by the own tiles on the
 * pool's threads (blocks of rows), where they take it
 * (dt_cpu_gemm_tiles_take(M, K)): returns 1; else 0, nothing written. */
int dt_cpu_sgemm_tiles(dt_backend_t *be, int transb, int M, int N, int K, const float *A, int lda,
                       const float *B, int ldb, const float *bias, float *C, int ldc);
/* The same with C transposed (dt_cpu_gemm_tiles_ct_take(M, N, K)). */
int dt_cpu_sgemm_tiles_ct(dt_backend_t *be, int transb, int M, int N, int K, const float *A,
                          int lda, const float *B, int ldb, const float *bias, float *C, int ldc);

/* The backend's step gate (step_gate sets it; the gated sgd_update and
 * adamw_update read it). A NULL backend has none: it never skips. */
int dt_cpu_gate_skips(const dt_backend_t *be);
void dt_cpu_set_gate(dt_backend_t *be, int skip);

/* Every op of the list in kernels/ops.h, in both versions: dt_cpu_<op>_ref
 * and dt_cpu_<op> (linear.c, activation.c, dropout.c, flatten.c,
 * softmax_xent.c, optim.c, reduce.c, cast.c, elementwise.c, conv.c, pool.c,
 * norm.c, embedding.c, attention.c), except the ops named here, which have
 * one version that both tables take (backend_cpu.c):
 *   DT_CPU_ONE_<op>  ONLY, REF   dt_cpu_<op>_ref alone
 *                    ONLY, FAST  dt_cpu_<op> alone
 * so nothing is declared that is not defined. */
#define DT_CPU_ONE_attention_workspace ONLY, FAST
#define DT_CPU_ONE_attention_decode ONLY, FAST
#define DT_CPU_ONE_to_bf16 ONLY, FAST
#define DT_CPU_ONE_from_bf16 ONLY, FAST

/* DT_CPU_VERSIONS(op) is REF or FAST for the ops above, BOTH otherwise:
 * DT_CPU_ONE_<op> expands to two arguments only where it is defined. */
#define DT_CPU_SECOND(a, b, ...) b
#define DT_CPU_SECOND_OF(...) DT_CPU_SECOND(__VA_ARGS__)
#define DT_CPU_VERSIONS(name) DT_CPU_SECOND_OF(DT_CPU_ONE_##name, BOTH, ~)
#define DT_CPU_CAT(a, b) DT_CPU_CAT_(a, b)
#define DT_CPU_CAT_(a, b) a##b

#define DT_CPU_PROTO_BOTH(name, params)                                                            \
    dt_status dt_cpu_##name##_ref params;                                                          \
    dt_status dt_cpu_##name params;
#define DT_CPU_PROTO_REF(name, params) dt_status dt_cpu_##name##_ref params;
#define DT_CPU_PROTO_FAST(name, params) dt_status dt_cpu_##name params;
#define DT_CPU_OP_PROTOS(name, params)                                                             \
    DT_CPU_CAT(DT_CPU_PROTO_, DT_CPU_VERSIONS(name))(name, params)
DT_OP_LIST(DT_CPU_OP_PROTOS)
#undef DT_CPU_OP_PROTOS

#endif
