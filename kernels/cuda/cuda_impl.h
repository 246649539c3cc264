/*
 * cuda_impl.h - internal header of the CUDA compute backend (CUDA C++
 * only): the backend's state, the error helpers every op uses, and the op
 * functions that backend_cuda.cu puts into the op table. The op files have
 * the same stems as the CPU backend's (linear.cu, activation.cu, ...).
 *
 * Every op is queued on the backend's one stream and returns without
 * waiting, except those that hand a scalar back to the host (sumsq,
 * all_finite), which synchronise that stream; softmax_xent's forward
 * leaves its totals for the next wait (dt_cuda_sync_op). Argument checks
 * match the CPU ops: DT_ERR_INVALID_ARG naming the op.
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
#include <pthread.h>
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
    cudaStream_t stream; /* every op and copy but the uploads ahead */
    /* dt_backend_upload_ahead's stream, and per input slot the event after
     * the compute that last reads it (dt_backend_slot_free), once marked */
    cudaStream_t copy_stream;
    cudaEvent_t slot_free[DT_BACKEND_INPUT_SLOTS];
    int slot_marked[DT_BACKEND_INPUT_SLOTS];
    cublasHandle_t blas; /* bound to stream */
    int allow_tf32;
    enum dt_dtype precision;
    /* Scratch for one op at a time, grown on demand, kept: GEMM operands
     * rounded to bf16/fp16 (linear.cu), the partial sums of sumsq
     * (reduce.cu) and of the column sums (colsum.cu), the per-row results
     * of softmax_xent_fwd. */
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
    /* softmax_xent_fwd's running totals (owned by softmax_xent.cu): the
     * device record, its pinned host mirror and reset value, whether a
     * forward was queued since the last wait for the stream (which adds
     * the totals to these host pointers, dt_cuda_sync_op), and the class
     * count for the message about a bad label. */
    void *xent_acc_dev;
    void *xent_acc_host;
    int xent_pending;
    double *xent_loss_out;
    int64_t *xent_correct_out;
    int xent_classes;
    /* Waits for the device: how many, and the time spent in them. */
    uint64_t waits;
    double wait_s;
    /* embedding_fwd's token-id check (owned by embedding.cu): a device
     * record, its pinned host mirror, and whether a check was queued since
     * the last wait for the stream, which reads it (dt_cuda_sync_op). */
    void *emb_check_dev;
    void *emb_check_host;
    int emb_check_pending;
    /* The step gate (owned by reduce.cu): a record in the device scalars
     * (dt_cuda_gate_of) that the gated updates read, mirrored to the host
     * scalars; whether a step_gate was queued since the last wait, which
     * fills gate_out from the mirror (gate_decided: with a decision); and
     * the event after the mirror's copy, which dt_backend_settle waits for
     * instead of the stream while results_marked (no result was queued to
     * come back after it). */
    int gate_pending, gate_decided;
    struct dt_gate *gate_out;
    cudaEvent_t results_done;
    int results_marked;
    /* The parameters (dt_backend_set_params) and their copy rounded to
     * the precision (linear.cu's weights read it), fresh while mirror_gen
     * == params_gen; a write into the parameters bumps params_gen
     * (dt_cuda_params_written). */
    const float *params;
    size_t nparams;
    void *mirror;
    uint64_t params_gen, mirror_gen;
    /* Pinned host buffers from dt_backend_host_alloc (backend_cuda.cu),
     * each with the event after the last upload out of it; loader workers
     * ask about them (host_idle) while uploads record, so under pinned_mu. */
    struct dt_cuda_pinned *pinned;
    int npinned, pinned_cap;
    pthread_mutex_t pinned_mu;
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

/* One pinned host buffer (dt_backend_host_alloc). */
struct dt_cuda_pinned {
    char *p;
    size_t bytes;
    cudaEvent_t read; /* recorded after each upload out of it */
};

/* The step gate's record (kernels/ops.h step_gate), at this offset of the
 * device scalars and of their host mirror, clear of the scalars sumsq and
 * all_finite hand back from offset 0. */
struct dt_cuda_gate {
    double sumsq;
    float factor;
    int skip;
};
#define DT_CUDA_GATE_OFFSET 128
#define dt_cuda_gate_of(scalars) ((struct dt_cuda_gate *)((char *)(scalars) + DT_CUDA_GATE_OFFSET))

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

/* The scratch, grown to at least `bytes` (synchronises the stream before
 * freeing a smaller one). An op may use it until its kernels end: every
 * user is queued on the one stream. */
dt_status dt_cuda_scratch(struct cuda_backend *cb, size_t bytes, void **out);

/* Launch shape of a kernel over the planes of an (N, C, HW) tensor: plane
 * p = n*C + c is blockIdx.y * blockDim.y + threadIdx.y (a grid-stride loop
 * beyond gridDim.y * blockDim.y planes), its elements are strided over by
 * blockIdx.x * blockDim.x + threadIdx.x, so the channel is known per plane
 * and no element needs a division. A block is HW rounded up to a warp
 * wide (at most DT_CUDA_THREADS) and takes as many planes as fill
 * DT_CUDA_THREADS threads; the grid has at most about DT_CUDA_MAX_BLOCKS
 * blocks. */
#define DT_CUDA_WARP 32
#define DT_CUDA_MAX_GRID_Y 65535u /* CUDA's limit on gridDim.y */
struct dt_cuda_planes {
    dim3 grid, block;
};
static inline struct dt_cuda_planes dt_cuda_plane_shape(size_t planes, size_t hw)
{
    size_t bx = (hw + DT_CUDA_WARP - 1) / DT_CUDA_WARP * DT_CUDA_WARP;
    if (bx > DT_CUDA_THREADS) bx = DT_CUDA_THREADS;
    const size_t by = DT_CUDA_THREADS / bx;
    size_t gx = (hw + bx - 1) / bx;
    if (gx > DT_CUDA_MAX_BLOCKS) gx = DT_CUDA_MAX_BLOCKS;
    size_t gy = (planes + by - 1) / by, gy_max = DT_CUDA_MAX_BLOCKS / gx;
    if (gy_max < 1) gy_max = 1;
    if (gy > gy_max) gy = gy_max;
    if (gy > DT_CUDA_MAX_GRID_Y) gy = DT_CUDA_MAX_GRID_Y;
    if (gx < 1) gx = 1;
    if (gy < 1) gy = 1;
    struct dt_cuda_planes s;
    s.grid = dim3((unsigned)gx, (unsigned)gy);
    s.block = dim3((unsigned)bx, (unsigned)by);
    return s;
}

/* The loops of a kernel launched with dt_cuda_plane_shape over the planes
 * of an (N, C, HW) tensor (planes = N*C):
 *     for (DT_CUDA_PLANES(p, c, planes, C))    plane p, its channel c = p % C
 *         for (DT_CUDA_PLANE_ELEMS(i, HW))     element i of the plane
 * c is divided out once per thread and stepped on with p. */
#define DT_CUDA_PLANES(p, c, planes, C)                                                            \
    size_t p = (size_t)blockIdx.y * blockDim.y + threadIdx.y, c = p % (C),                         \
           p##_step = (size_t)gridDim.y * blockDim.y, c##_step = p##_step % (C);                   \
    p < (planes);                                                                                  \
    p += p##_step, c = c + c##_step >= (C) ? c + c##_step - (C) : c + c##_step
#define DT_CUDA_PLANE_ELEMS(i, HW)                                                                 \
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;                                      \
    i < (HW);                                                                                      \
    i += (size_t)gridDim.x * blockDim.x

/* colsum.cu: column sums of (rows, cols) row-major matrices, in a fixed
 * two-pass order (see there), ADDED to the outputs (+=). */
enum dt_cuda_colsum_kind {
    DT_CUDA_COLSUM_PLAIN,     /* out0 += sum over rows of a */
    DT_CUDA_COLSUM_LAYERNORM, /* out0 += sum of a*((x - mean[r])*rstd[r]), out1 += sum of a */
    DT_CUDA_COLSUM_RMSNORM,   /* out0 += sum of a*(x*rstd[r]) */
};
struct dt_cuda_colsum {
    const char *op; /* names the op in errors */
    enum dt_cuda_colsum_kind kind;
    float *out0, *out1;       /* (cols); either may be NULL, out1 only for LAYERNORM */
    const float *a, *x;       /* (rows, cols); x unused by PLAIN */
    const float *mean, *rstd; /* (rows); mean only for LAYERNORM, rstd unused by PLAIN */
    int rows, cols;           /* >= 0 */
};
/* Queues both passes on the stream; its partials take the scratch. */
dt_status dt_cuda_colsum(struct cuda_backend *cb, const struct dt_cuda_colsum *s);
/* Scratch bytes a column sum of these shapes takes (dt_cuda_reserve). */
size_t dt_cuda_colsum_scratch(enum dt_cuda_colsum_kind kind, int rows, int cols);
/* Scratch bytes linear_fwd/linear_bwd take at these shapes: the rounded
 * operands in bf16/fp16, none in fp32 (linear.cu). */
size_t dt_cuda_linear_scratch(const struct cuda_backend *cb, size_t B, size_t In, size_t Out);
/* Scratch bytes of softmax_xent_fwd's per-row results (softmax_xent.cu)
 * and of sumsq's partials (reduce.cu). */
size_t dt_cuda_xent_scratch(size_t B);
size_t dt_cuda_sumsq_scratch(size_t n);
/* step_gate's, over `count` ranges of at most n elements in all. */
size_t dt_cuda_gate_scratch(size_t n, size_t count);

/* Waits for the stream (counted in cb->waits and cb->wait_s); a failure
 * there carries `op`. The loss totals softmax_xent_fwd queued since the
 * last wait reach its loss_sum and correct here, and a token id an
 * embedding_fwd or a label a softmax_xent_fwd found out of range is
 * reported here (DT_ERR_INVALID_ARG, that op's message). */
dt_status dt_cuda_sync_op(struct cuda_backend *cb, const char *op);
/* Counts a wait for the device that took `seconds` (waits other than
 * dt_cuda_sync_op's: an upload buffer coming free). */
void dt_cuda_note_wait(struct cuda_backend *cb, double seconds);
/* embedding.cu: the queued id checks' verdict, after the stream has been
 * waited for; and freeing the check's buffers (backend destroy). */
dt_status dt_cuda_emb_check_result(struct cuda_backend *cb);
void dt_cuda_emb_release(struct cuda_backend *cb);
/* softmax_xent.cu: the queued loss totals, after the stream has been
 * waited for, into the forward's loss_sum and correct; and freeing their
 * buffers (backend destroy). */
dt_status dt_cuda_xent_result(struct cuda_backend *cb);
void dt_cuda_xent_release(struct cuda_backend *cb);
/* reduce.cu: the queued step gate into step_gate's out, after the wait. */
void dt_cuda_gate_result(struct cuda_backend *cb);
/* The wait dt_backend_settle makes: for the results event while it is
 * marked (step_gate), else for the stream; then as dt_cuda_sync_op. */
dt_status dt_cuda_settle(struct cuda_backend *cb);
/* A write into [p, p + bytes) was queued: when it touches the parameters,
 * their rounded copy is stale (backend_cuda.cu). */
void dt_cuda_params_written(struct cuda_backend *cb, const void *p, size_t bytes);
/* dt_backend_set_params (linear.cu). */
dt_status dt_cuda_set_params(dt_backend_t *be, const float *p, size_t n);
/* The rounded copy of w (n floats), when w lies within the parameters and
 * the precision rounds: made fresh if it is stale, else NULL (linear.cu). */
dt_status dt_cuda_rounded_weight(struct cuda_backend *cb, const float *w, size_t n,
                                 const void **out);
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
