/*
 * linear.cu - fully connected layer on the GPU: out = in @ w^T through
 * cuBLAS, the bias add that follows it, and their backward passes.
 *
 * cuBLAS is column-major and dtrain is row-major. A row-major (R, C)
 * matrix with leading dimension C is, read column-major, its transpose
 * (C, R) with the same leading dimension, so each product is computed as
 * its transpose and no data moves:
 *
 *   out(B,Out) = in(B,In) @ w(Out,In)^T  ->  out^T(Out,B) = w(Out,In) @ in^T(In,B)
 *       gemm(T, N, m=Out, n=B, k=In, A=w lda=In, B=in ldb=In, C=out ldc=Out)
 *   din(B,In) = dout(B,Out) @ w(Out,In)  ->  din^T(In,B) = w^T(In,Out) @ dout^T(Out,B)
 *       gemm(N, N, m=In, n=B, k=Out, A=w lda=In, B=dout ldb=Out, C=din ldc=In)
 *   dw(Out,In) += dout^T(Out,B) @ in(B,In)  ->  dw^T(In,Out) += in^T(In,B) @ dout(B,Out)
 *       gemm(N, T, m=In, n=Out, k=B, A=in lda=In, B=dout ldb=Out, C=dw ldc=In, beta=1)
 *
 * The backend's precision picks the operand type: fp32 hands the tensors
 * to cuBLAS as they are (TF32 tensor cores only with allow_tf32); bf16 and
 * fp16 round the operands to nearest with a kernel of ours and multiply
 * with fp32 accumulation into fp32 outputs. A weight that is one of the
 * model's parameters is read from the backend's rounded copy of them,
 * made once per update (dt_backend_set_params); the input is rounded by
 * the forward into the layer's in_kept, which the backward reads again;
 * the output gradient (and anything else) is rounded into the scratch
 * at each call.
 *
 * bias_bwd is the fixed two-pass column sum of colsum.cu (row tiles in
 * double, then the tiles in order), so it is deterministic: the same bits
 * on every run and every GPU. The CPU sums each column top to bottom in
 * fp32, so the two differ by rounding, far below fp32 resolution of the
 * sums.
 *
 * Gradients of parameters (dw, db) ACCUMULATE (+=); the gradient of the
 * activation (din) is WRITTEN (=).
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda_impl.h"

/* each rounded operand starts on this byte boundary in the scratch */
#define OPERAND_ALIGN 256
/* the most operands one op rounds (linear_bwd: dout, in, w) */
#define MAX_OPERANDS 3

/* An op's name and shapes, for error messages. */
struct shape {
    const char *op;
    int B, In, Out;
};
#define SHAPE_FMT "B=%d In=%d Out=%d"
#define SHAPE_ARGS(s) (s)->B, (s)->In, (s)->Out

static __global__ void round_bf16(__nv_bfloat16 *dst, const float *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

static __global__ void round_fp16(__half *dst, const float *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2half_rn(src[i]);
}

/* x(B,C) += b(C); element i is column i % C */
static __global__ void bias_add(float *x, const float *b, size_t n, size_t C)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] += b[i % C];
}

static cudaDataType operand_type(enum dt_dtype p)
{
    switch (p) {
    case DT_BF16: return CUDA_R_16BF;
    case DT_F16: return CUDA_R_16F;
    default: break;
    }
    return CUDA_R_32F;
}

/* Bytes of scratch the rounded operands of count tensors of n[i] elements
 * take (none in fp32). */
static size_t operand_bytes(enum dt_dtype precision, const size_t *n, int count)
{
    size_t total = 0;
    if (precision == DT_F32)
        return 0;
    for (int i = 0; i < count; i++)
        total += (n[i] * 2 + OPERAND_ALIGN - 1) / OPERAND_ALIGN * OPERAND_ALIGN;
    return total;
}

size_t dt_cuda_linear_scratch(const struct cuda_backend *cb, size_t B, size_t In, size_t Out)
{
    const size_t n[MAX_OPERANDS] = {B * Out, B * In, Out * In}; /* backward's, the most */
    return operand_bytes(cb->precision, n, MAX_OPERANDS);
}

/* Rounds src(n) into dst in the backend's precision, queued. */
static dt_status round_into(struct cuda_backend *cb, void *dst, const float *src, size_t n,
                            const char *op)
{
    if (n == 0)
        return DT_OK;
    if (cb->precision == DT_BF16)
        DT_CUDA_LAUNCH(round_bf16, dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream, (__nv_bfloat16 *)dst, src, n);
    else
        DT_CUDA_LAUNCH(round_fp16, dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream, (__half *)dst, src, n);
    return DT_CUDA_LAUNCHED(cb, op, "n=%zu, rounding to %s", n, dt_precision_name(cb->precision));
}

/* ---- the parameters' rounded copy ---------------------------------------- */

dt_status dt_cuda_set_params(dt_backend_t *be, const float *p, size_t n)
{
    struct cuda_backend *cb = dt_cuda_of(be);
    if (cb->mirror)
        (void)cudaFree(cb->mirror);
    cb->mirror = NULL;
    cb->params = NULL;
    cb->nparams = 0;
    if (!p || n == 0 || cb->precision == DT_F32)
        return DT_OK;
    const size_t bytes = n * sizeof(uint16_t);
    cudaError_t err = cudaMalloc(&cb->mirror, bytes);
    if (err != cudaSuccess) {
        cb->mirror = NULL;
        return dt_cuda_status(cb, err, bytes, "set_params", "the %s copy of %zu parameters",
                              dt_precision_name(cb->precision), n);
    }
    dt_cuda_note_usage(cb);
    cb->params = p;
    cb->nparams = n;
    cb->mirror_gen = cb->params_gen - 1; /* stale: made at the first GEMM */
    return DT_OK;
}

void dt_cuda_params_written(struct cuda_backend *cb, const void *p, size_t bytes)
{
    const char *lo = (const char *)cb->params, *hi = lo + cb->nparams * sizeof(float);
    const char *a = (const char *)p;
    if (cb->params && a < hi && a + bytes > lo)
        cb->params_gen++;
}

dt_status dt_cuda_rounded_weight(struct cuda_backend *cb, const float *w, size_t n,
                                 const void **out)
{
    *out = NULL;
    if (!cb->mirror || w < cb->params || n > cb->nparams || w - cb->params > (ptrdiff_t)(cb->nparams - n))
        return DT_OK;
    if (cb->mirror_gen != cb->params_gen) {
        dt_status st = round_into(cb, cb->mirror, cb->params, cb->nparams, "the parameters' copy");
        if (st != DT_OK)
            return st;
        cb->mirror_gen = cb->params_gen;
    }
    *out = (const uint16_t *)cb->mirror + (w - cb->params);
    return DT_OK;
}

/* The GEMM operands in the backend's precision: fp32 uses the tensors as
 * they are; bf16/fp16 rounds src[i] (n[i] elements) into its own slice of
 * the scratch, except the weight (index `weight`, -1 for none) when it is
 * one of the parameters, whose rounded copy is read instead, and the input
 * (index `input`) when `kept` is given: forward (fill_kept) rounds it
 * there, backward reads it from there as forward left it. Queued on the
 * stream like the GEMMs that read them. */
static dt_status operands(struct cuda_backend *cb, const struct shape *s, const float *const *src,
                          const size_t *n, int count, int weight, int input, const void *kept,
                          int fill_kept, const void **dst)
{
    if (cb->precision == DT_F32) {
        for (int i = 0; i < count; i++)
            dst[i] = src[i];
        return DT_OK;
    }
    size_t off[MAX_OPERANDS];
    for (int i = 0; i < count; i++)
        off[i] = operand_bytes(cb->precision, n, i);
    void *scratch = NULL;
    dt_status st = dt_cuda_scratch(cb, operand_bytes(cb->precision, n, count), &scratch);
    if (st != DT_OK)
        return dt_error_context(st, "cuda %s (" SHAPE_FMT ", %s operands)", s->op, SHAPE_ARGS(s),
                                dt_precision_name(cb->precision));
    for (int i = 0; i < count; i++) {
        void *p = (char *)scratch + off[i];
        dst[i] = NULL;
        if (i == weight && (st = dt_cuda_rounded_weight(cb, src[i], n[i], &dst[i])) != DT_OK)
            return st;
        if (dst[i])
            continue;
        if (i == input && kept) {
            dst[i] = kept;
            if (!fill_kept)
                continue;
            p = (void *)kept;
        }
        st = round_into(cb, p, src[i], n[i], s->op);
        if (st != DT_OK)
            return dt_error_context(st, SHAPE_FMT " operands", SHAPE_ARGS(s));
        dst[i] = p;
    }
    return DT_OK;
}

/* C(m,n) = op(A) @ op(B) + beta*C, column-major (see the top of the file),
 * alpha = 1, operands in the backend's precision, C in fp32. */
static dt_status gemm(struct cuda_backend *cb, const struct shape *s, cublasOperation_t ta,
                      cublasOperation_t tb, int m, int n, int k, const void *A, int lda,
                      const void *Bm, int ldb, float beta, float *C, int ldc)
{
    const float alpha = 1.0f;
    const cudaDataType type = operand_type(cb->precision);
    const cublasComputeType_t compute = cb->precision == DT_F32 && cb->allow_tf32
                                            ? CUBLAS_COMPUTE_32F_FAST_TF32
                                            : CUBLAS_COMPUTE_32F;
    cublasStatus_t bst = cublasGemmEx(cb->blas, ta, tb, m, n, k, &alpha, A, type, lda, Bm, type,
                                      ldb, &beta, C, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT);
    return dt_cublas_status(cb, bst, s->op, SHAPE_FMT, SHAPE_ARGS(s));
}

/* x(rows, cols) = 0, queued on the stream: an empty sum */
static dt_status zero(struct cuda_backend *cb, const struct shape *s, float *x, int rows, int cols)
{
    cudaError_t err = cudaMemsetAsync(x, 0, (size_t)rows * cols * sizeof *x, cb->stream);
    return dt_cuda_status(cb, err, 0, s->op, SHAPE_FMT, SHAPE_ARGS(s));
}

/* out(B,Out) = in(B,In) @ w(Out,In)^T (+ bias(Out) on every row, added by
 * bias_fwd after the product) */
dt_status dt_cuda_linear_fwd(dt_backend_t *be, float *out, const float *in, const float *w,
                             const float *bias, int B, int In, int Out, void *in_kept)
{
    DT_CUDA_REQUIRE(out && in && w, "linear_fwd", "out, in and w must not be NULL");
    DT_CUDA_REQUIRE(B >= 0 && In >= 0 && Out >= 0, "linear_fwd",
                    "sizes must be >= 0 (B=%d, In=%d, Out=%d)", B, In, Out);
    struct cuda_backend *cb = dt_cuda_of(be);
    const struct shape s = {"linear_fwd", B, In, Out};
    if (B == 0 || Out == 0)
        return DT_OK;
    dt_status st = DT_OK;
    if (In == 0) {
        st = zero(cb, &s, out, B, Out);
    } else {
        const float *src[2] = {w, in};
        const size_t n[2] = {(size_t)Out * In, (size_t)B * In};
        const void *op[2];
        st = operands(cb, &s, src, n, 2, 0, 1, in_kept, 1, op);
        /* out^T(Out,B) = w(Out,In) @ in^T(In,B) */
        if (st == DT_OK)
            st = gemm(cb, &s, CUBLAS_OP_T, CUBLAS_OP_N, Out, B, In, op[0], In, op[1], In, 0.0f,
                      out, Out);
    }
    if (st == DT_OK && bias)
        st = dt_cuda_bias_fwd(be, out, bias, B, Out);
    return st;
}

/* din(B,In) = dout(B,Out) @ w(Out,In)  (written; skipped when din is NULL)
 * dw(Out,In) += dout(B,Out)^T @ in(B,In) */
dt_status dt_cuda_linear_bwd(dt_backend_t *be, float *din, float *dw, const float *dout,
                             const float *in, const float *w, int B, int In, int Out,
                             const void *in_kept)
{
    DT_CUDA_REQUIRE(dw && dout && in, "linear_bwd", "dw, dout and in must not be NULL");
    DT_CUDA_REQUIRE(!din || w, "linear_bwd", "w must not be NULL when din is asked for");
    DT_CUDA_REQUIRE(B >= 0 && In >= 0 && Out >= 0, "linear_bwd",
                    "sizes must be >= 0 (B=%d, In=%d, Out=%d)", B, In, Out);
    struct cuda_backend *cb = dt_cuda_of(be);
    const struct shape s = {"linear_bwd", B, In, Out};
    dt_status st = DT_OK;
    if (din && B > 0 && In > 0 && Out == 0)
        st = zero(cb, &s, din, B, In);
    if (st != DT_OK || B == 0 || In == 0 || Out == 0)
        return st;
    const float *src[MAX_OPERANDS] = {dout, in, w};
    const size_t n[MAX_OPERANDS] = {(size_t)B * Out, (size_t)B * In, (size_t)Out * In};
    const void *op[MAX_OPERANDS];
    st = operands(cb, &s, src, n, din ? 3 : 2, 2, 1, in_kept, 0, op);
    if (st != DT_OK)
        return st;
    if (din) { /* din^T(In,B) = w^T(In,Out) @ dout^T(Out,B) */
        st = gemm(cb, &s, CUBLAS_OP_N, CUBLAS_OP_N, In, B, Out, op[2], In, op[0], Out, 0.0f, din,
                  In);
        if (st != DT_OK)
            return st;
    }
    /* dw^T(In,Out) += in^T(In,B) @ dout(B,Out) */
    return gemm(cb, &s, CUBLAS_OP_N, CUBLAS_OP_T, In, Out, B, op[1], In, op[0], Out, 1.0f, dw, In);
}

static dt_status check_bias(const char *op, const float *x, const float *b, int B, int C)
{
    if (!x || !b)
        return dt_set_error(DT_ERR_INVALID_ARG, "cuda %s: pointers must not be NULL", op);
    if (B < 0 || C < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "cuda %s: sizes must be >= 0 (B=%d, C=%d)", op, B,
                            C);
    return DT_OK;
}

/* x(B,C) += b(C), in place */
dt_status dt_cuda_bias_fwd(dt_backend_t *be, float *x, const float *b, int B, int C)
{
    dt_status st = check_bias("bias_fwd", x, b, B, C);
    if (st != DT_OK || B == 0 || C == 0)
        return st;
    struct cuda_backend *cb = dt_cuda_of(be);
    const size_t n = (size_t)B * C;
    DT_CUDA_LAUNCH(bias_add, dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream, x, b, n, (size_t)C);
    return DT_CUDA_LAUNCHED(cb, "bias_fwd", "B=%d C=%d", B, C);
}

/* db(C) += sum over B of dout(B,C) */
dt_status dt_cuda_bias_bwd(dt_backend_t *be, float *db, const float *dout, int B, int C)
{
    dt_status st = check_bias("bias_bwd", db, dout, B, C);
    if (st != DT_OK || C == 0)
        return st;
    const struct dt_cuda_colsum sum = {"bias_bwd", DT_CUDA_COLSUM_PLAIN, db, NULL, dout, NULL,
                                       NULL, NULL, B, C};
    return dt_cuda_colsum(dt_cuda_of(be), &sum);
}
