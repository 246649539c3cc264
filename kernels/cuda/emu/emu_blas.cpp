/*
 * emu_blas.cpp - cublasGemmEx and the handle calls around it, on the host,
 * for the emulation build (-DDTRAIN_CUDA=EMU), so that the CUDA backend's
 * GEMM call sites (transposes, m/n/k, leading dimensions, alpha/beta, data
 * and compute types) are exercised with cuBLAS's documented semantics:
 *
 *   C(m x n) = alpha * op(A)(m x k) * op(B)(k x n) + beta * C, column-major,
 *   op(X) = X or X^T; A is lda x (k or m) as stored, B ldb x (n or k).
 *
 * Checked as cuBLAS checks them: m, n, k >= 0; lda >= max(1, rows of A as
 * stored), likewise ldb and ldc >= max(1, m); the supported type triples
 * (fp32, or bf16/fp16 operands with an fp32 or same-type C, compute 32F or
 * a 32F_FAST variant). Beyond cuBLAS, each operand's whole extent must lie
 * inside one device allocation, so a leading dimension or size that reads
 * past a buffer fails here (CUBLAS_STATUS_INVALID_VALUE and a message)
 * where a GPU would read whatever lies there.
 *
 * The arithmetic: operands converted to fp32 (exactly, from bf16/fp16);
 * with CUBLAS_COMPUTE_32F_FAST_TF32, or the TF32 math mode with fp32
 * operands, rounded to TF32 (10 mantissa bits, to nearest, ties to even);
 * each element of C summed in fp32 over k in order; beta = 0 does not read
 * C. The order differs from cuBLAS's own, so results agree with a GPU's to
 * rounding, not bit for bit.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "emu_impl.h"

struct dt_emu_blas {
    cudaStream_t stream;
    cublasMath_t math;
};

namespace
{

using dt_emu::report;

size_t type_bytes(cudaDataType t)
{
    switch (t) {
    case CUDA_R_32F:
        return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF:
        return 2;
    }
    return 0;
}

float tf32(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return x; /* inf and NaN unchanged */
    u += 0xfffu + ((u >> 13) & 1u);
    u &= ~0x1fffu;
    memcpy(&x, &u, 4);
    return x;
}

float load(const void *p, cudaDataType t, size_t i)
{
    switch (t) {
    case CUDA_R_32F:
        return ((const float *)p)[i];
    case CUDA_R_16BF: {
        __nv_bfloat16 b;
        memcpy(&b, (const char *)p + 2 * i, 2);
        return __bfloat162float(b);
    }
    case CUDA_R_16F: {
        __half h;
        memcpy(&h, (const char *)p + 2 * i, 2);
        return __half2float(h);
    }
    }
    return 0.0f;
}

void store(void *p, cudaDataType t, size_t i, float v)
{
    switch (t) {
    case CUDA_R_32F:
        ((float *)p)[i] = v;
        break;
    case CUDA_R_16BF: {
        __nv_bfloat16 b = __float2bfloat16_rn(v);
        memcpy((char *)p + 2 * i, &b, 2);
        break;
    }
    case CUDA_R_16F: {
        __half h = __float2half_rn(v);
        memcpy((char *)p + 2 * i, &h, 2);
        break;
    }
    }
}

/* A stored rows x cols column-major matrix with leading dimension ld
 * spans ld * (cols - 1) + rows elements. */
bool inside(const char *name, const void *p, cudaDataType t, int rows, int cols, int ld)
{
    if (rows == 0 || cols == 0) return true;
    const size_t elems = (size_t)ld * (size_t)(cols - 1) + (size_t)rows;
    if (dt_emu::find_device(p, elems * type_bytes(t))) return true;
    report("cublasGemmEx: %s (%d x %d as stored, leading dimension %d, %zu elements from %p) "
           "is not inside one device allocation",
           name, rows, cols, ld, elems, p);
    return false;
}

/* C = alpha op(A) op(B) + beta C in fp32 (C is not read when beta is 0),
 * column-major, the inputs rounded to TF32 first when round_tf32. */
void gemm(bool ta, bool tb, int m, int n, int k, float al, const void *A, cudaDataType Atype,
          int lda, const void *B, cudaDataType Btype, int ldb, float be, void *C,
          cudaDataType Ctype, int ldc, bool round_tf32)
{
    /* op(A) as m x k and op(B) as k x n, column-major, in fp32 */
    std::vector<float> a((size_t)m * (size_t)k), b((size_t)k * (size_t)n);
    for (int l = 0; l < k; l++)
        for (int i = 0; i < m; i++) {
            const size_t src = ta ? (size_t)l + (size_t)i * lda : (size_t)i + (size_t)l * lda;
            const float v = load(A, Atype, src);
            a[(size_t)i + (size_t)l * m] = round_tf32 ? tf32(v) : v;
        }
    for (int j = 0; j < n; j++)
        for (int l = 0; l < k; l++) {
            const size_t src = tb ? (size_t)j + (size_t)l * ldb : (size_t)l + (size_t)j * ldb;
            const float v = load(B, Btype, src);
            b[(size_t)l + (size_t)j * k] = round_tf32 ? tf32(v) : v;
        }
    std::vector<float> acc((size_t)m);
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < m; i++)
            acc[(size_t)i] = 0.0f;
        if (al != 0.0f)
            for (int l = 0; l < k; l++) {
                const float bv = b[(size_t)l + (size_t)j * k];
                const float *ac = &a[(size_t)l * m];
                for (int i = 0; i < m; i++)
                    acc[(size_t)i] += ac[i] * bv;
            }
        for (int i = 0; i < m; i++) {
            const size_t ci = (size_t)i + (size_t)j * ldc;
            float v = al * acc[(size_t)i];
            if (be != 0.0f) v += be * load(C, Ctype, ci);
            store(C, Ctype, ci, v);
        }
    }
}

} // namespace

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        *handle = nullptr;
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    *handle = new dt_emu_blas{nullptr, CUBLAS_DEFAULT_MATH};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_DEFAULT_MATH && mode != CUBLAS_PEDANTIC_MATH &&
        mode != CUBLAS_TF32_TENSOR_OP_MATH)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

/* The emulation stands in for cuBLAS 13.0.0. */
cublasStatus_t cublasGetProperty(libraryPropertyType type, int *value)
{
    if (!value) return CUBLAS_STATUS_INVALID_VALUE;
    switch (type) {
    case MAJOR_VERSION:
        *value = 13;
        return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION:
        *value = 0;
        return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL:
        *value = 0;
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

const char *cublasGetStatusName(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
        return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS:
        return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR:
        return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "the functionality requested is not supported";
    }
    return "unknown error";
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo)
{
    (void)algo;
    std::lock_guard<std::recursive_mutex> g(dt_emu::lock());
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (dt_emu::sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;
    const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
    const int a_rows = ta ? k : m, a_cols = ta ? m : k;
    const int b_rows = tb ? n : k, b_cols = tb ? k : n;
    if ((transa != CUBLAS_OP_N && transa != CUBLAS_OP_T && transa != CUBLAS_OP_C) ||
        (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T && transb != CUBLAS_OP_C) || m < 0 ||
        n < 0 || k < 0 || lda < (a_rows > 1 ? a_rows : 1) || ldb < (b_rows > 1 ? b_rows : 1) ||
        ldc < (m > 1 ? m : 1) || !alpha || !beta) {
        report("cublasGemmEx: invalid arguments (op %d/%d, m=%d n=%d k=%d, lda=%d ldb=%d ldc=%d)",
               (int)transa, (int)transb, m, n, k, lda, ldb, ldc);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const bool half_in = Atype == CUDA_R_16F || Atype == CUDA_R_16BF;
    const bool types_ok =
        Atype == Btype && type_bytes(Atype) && (Ctype == CUDA_R_32F || (half_in && Ctype == Atype));
    const bool compute_ok = computeType == CUBLAS_COMPUTE_32F ||
                            computeType == CUBLAS_COMPUTE_32F_PEDANTIC ||
                            (Atype == CUDA_R_32F && (computeType == CUBLAS_COMPUTE_32F_FAST_TF32 ||
                                                     computeType == CUBLAS_COMPUTE_32F_FAST_16F ||
                                                     computeType == CUBLAS_COMPUTE_32F_FAST_16BF));
    if (!types_ok || !compute_ok) {
        report("cublasGemmEx: types A=%d B=%d C=%d with compute type %d are not supported",
               (int)Atype, (int)Btype, (int)Ctype, (int)computeType);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    const float al = *(const float *)alpha, be = *(const float *)beta;
    if (!inside("C", C, Ctype, m, n, ldc) || (k > 0 && al != 0.0f &&
                                              (!inside("A", A, Atype, a_rows, a_cols, lda) ||
                                               !inside("B", B, Btype, b_rows, b_cols, ldb))))
        return CUBLAS_STATUS_INVALID_VALUE;
    const bool round_tf32 =
        Atype == CUDA_R_32F && computeType != CUBLAS_COMPUTE_32F_PEDANTIC &&
        (computeType == CUBLAS_COMPUTE_32F_FAST_TF32 ||
         (computeType == CUBLAS_COMPUTE_32F && handle->math == CUBLAS_TF32_TENSOR_OP_MATH));
    /* queued on the handle's stream; alpha and beta are read now (host
     * pointer mode) */
    dt_emu::enqueue(handle->stream, [=]() {
        gemm(ta, tb, m, n, k, al, A, Atype, lda, B, Btype, ldb, be, C, Ctype, ldc, round_tf32);
    });
    return CUBLAS_STATUS_SUCCESS;
}

} /* extern "C" */
