/*
 * cuda_impl.h - internal header of the CUDA compute backend (CUDA C++
 * only): the backend's state, the error helpers every op uses, and the op
 * functions that backend_cuda.cu puts into the op table. The op files have
 * the same stems as the CPU backend's (linear.cu, activation.cu, ...).
 *
 * Every op is queued on the backend's one stream and returns without
 * waiting, except those that hand a scalar back to the host (softmax_xent
 * forward, sumsq, all_finite) and embedding_fwd (which checks its token
 * ids), which synchronise that stream. Argument checks match the CPU ops:
 * DT_ERR_INVALID_ARG naming the op.
 *
 * With DT_HAVE_CUDNN (cuDNN found at configure time) the backend also holds
 * a cuDNN handle and the convolution algorithms chosen per shape, and has
 * the convolution and pooling ops; without it those stay out of the op
 * table.
 */
#ifndef DT_CUDA_IMPL_H
#define DT_CUDA_IMPL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#ifdef DT_HAVE_CUDNN
#include <cudnn.h>
#endif
#include <stddef.h>
#include <stdint.h>

#include "cuda_launch.h"

/* The runtime headers are plain C; everything declared from here on has C
 * linkage, whichever .cu file includes it. */
#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/backend_impl.h"
#include "kernels/ops_check.h"

#define DT_CUDA_THREADS 256 /* threads per block for element-wise kernels */
#define DT_CUDA_MAX_BLOCKS 4096 /* grid-stride loops cover the rest */
#define DT_CUDA_STAGING 2 /* pinned host staging buffers for uploads */

struct cuda_backend {
    struct dt_backend base;
    int device;          /* ordinal among the visible devices */
    int cc_major, cc_minor;
    size_t total_mem;
    int sm_count;
    cudaStream_t stream; /* every op and copy */
    cublasHandle_t blas; /* bound to stream */
    int allow_tf32;
    enum dt_dtype precision;
    /* GEMM operands rounded to bf16/fp16, grown on demand, kept. */
    void *gemm_scratch;
    size_t gemm_scratch_bytes;
    /* Device scalars for reductions, and a pinned host mirror. */
    void *dscalars;
    void *hscalars;
    /* Pinned staging for uploads from pageable memory: a ring whose slots
     * are reused once their event shows the copy out of them is done. */
    void *staging[DT_CUDA_STAGING];
    size_t staging_bytes[DT_CUDA_STAGING];
    cudaEvent_t staging_done[DT_CUDA_STAGING];
    int staging_next;
    /* Per-row results of softmax_xent_fwd (owned by softmax_xent.cu,
     * grown on demand, freed with the backend). */
    void *xent_rows;
    size_t xent_rows_bytes;
    /* Device memory in use, the most seen (dt_cuda_note_usage). */
    size_t peak_used;
#ifdef DT_HAVE_CUDNN
    /* cuDNN, bound to stream; created by the first convolution or pooling
     * op (dt_cuda_dnn), so jobs without them never load it. */
    cudnnHandle_t dnn;
    /* The convolution algorithms chosen per shape (owned by conv.cu). */
    struct dt_cuda_conv_plans *conv_plans;
#endif
};
#define DT_CUDA_SCALAR_BYTES 256 /* size of dscalars and hscalars */

static inline struct cuda_backend *dt_cuda_of(dt_backend_t *be)
{
    return (struct cuda_backend *)be->impl;
}

/* A status for a failed CUDA call: CUDA's own text, the device, the op and
 * (printf-style) its shapes. Out of memory adds requested (`bytes`, 0 if
 * unknown), free and total device memory and what to change in the job;
 * a missing kernel image adds the device's compute capability and how to
 * rebuild; an old driver adds both versions. cudaSuccess gives DT_OK. */
dt_status dt_cuda_status(struct cuda_backend *cb, cudaError_t err, size_t bytes, const char *op,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* The same for cuBLAS. */
dt_status dt_cublas_status(struct cuda_backend *cb, cublasStatus_t st, const char *op,
                           const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* After a kernel launch: the launch error, if any, as a status. */
#define DT_CUDA_LAUNCHED(cb, op, ...) dt_cuda_status((cb), cudaGetLastError(), 0, (op), __VA_ARGS__)

/* Returns DT_ERR_INVALID_ARG with "cuda <op>: <why>" when cond is false,
 * as DT_CPU_REQUIRE does on the CPU. op and the format are string literals. */
#define DT_CUDA_REQUIRE(cond, op, ...)                                                             \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return dt_set_error(DT_ERR_INVALID_ARG, "cuda " op ": " __VA_ARGS__);                  \
    } while (0)

/* Grid size for n elements in a grid-stride loop of DT_CUDA_THREADS. */
static inline unsigned dt_cuda_blocks(size_t n)
{
    size_t b = (n + DT_CUDA_THREADS - 1) / DT_CUDA_THREADS;
    if (b < 1) b = 1;
    return (unsigned)(b > DT_CUDA_MAX_BLOCKS ? DT_CUDA_MAX_BLOCKS : b);
}

/* The GEMM scratch, grown to at least `bytes` (synchronises the stream
 * before freeing a smaller one). */
dt_status dt_cuda_scratch(struct cuda_backend *cb, size_t bytes, void **out);

/* Waits for the stream; a failure there carries `op`. */
dt_status dt_cuda_sync_op(struct cuda_backend *cb, const char *op);
/* Samples the device memory in use into cb->peak_used (after allocations
 * and synchronisations; failures to read it are ignored). */
void dt_cuda_note_usage(struct cuda_backend *cb);

/* ---- ops (kernels/ops.h has the contract of each) ------------------- */
/* Every op of the list in kernels/ops.h as dt_cuda_<op> (linear.cu,
 * activation.cu, dropout.cu, flatten.cu, softmax_xent.cu, optim.cu,
 * reduce.cu, cast.cu, elementwise.cu, norm.cu, embedding.cu, attention.cu;
 * conv.cu and pool.cu in builds with cuDNN, which alone define the
 * convolution and pooling ops). */
#define DT_CUDA_OP_PROTO(name, params) dt_status dt_cuda_##name params;
DT_OP_LIST(DT_CUDA_OP_PROTO)
#undef DT_CUDA_OP_PROTO

#ifdef DT_HAVE_CUDNN
/* dnn.cu: the backend's cuDNN handle, created on first use and bound to
 * the stream; `op` names the asking op in an error. */
dt_status dt_cuda_dnn(struct cuda_backend *cb, const char *op, cudnnHandle_t *out);
/* The same as dt_cuda_status for cuDNN (its own text and its last error
 * message). */
dt_status dt_cudnn_status(struct cuda_backend *cb, cudnnStatus_t st, const char *op,
                          const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* A 4-d NCHW fp32 tensor descriptor of (n, c, h, w). */
cudnnStatus_t dt_cudnn_tensor4d(cudnnTensorDescriptor_t d, int n, int c, int h, int w);
/* Frees the handle and everything conv.cu keeps (backend destroy). */
void dt_cuda_dnn_release(struct cuda_backend *cb);
/* conv.cu */
void dt_cuda_conv_release(struct cuda_backend *cb);
#endif

#ifdef __cplusplus
}
#endif

#endif
