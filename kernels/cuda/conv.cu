/*
 * conv.cu - 2-d convolution on the GPU through cuDNN's convolution API:
 * forward (y = conv(x, w)), backward data (dx, written) and backward
 * filter (dw, ACCUMULATED: cuDNN's beta = 1 adds into dw, so micro-batches
 * sum into one gradient as ops.h asks).
 *
 * Algorithms are chosen once per shape and kept in the backend, in a small
 * table keyed by struct dt_conv2d_shape (with the tensor, filter and
 * convolution descriptors, so a step builds nothing). The choice comes
 * from cuDNN's heuristics (cudnnGetConvolution*Algorithm_v7), not from
 * timing runs (cudnnFind*): the heuristics are a pure function of shape
 * and device, so every run and every rank picks the same algorithms, a
 * shape that falls out of the table and comes back gets the same ones,
 * and the workspace conv2d_workspace reported stays right. Of the
 * candidates, in cuDNN's order, that work with a workspace within WS_LIMIT
 * (and 1/WS_MEM_SHARE of device memory), the first that cuDNN calls
 * deterministic and that is not an FFT or Winograd algorithm is taken
 * (those round further from the direct sum); failing that the first
 * deterministic one; only where none is deterministic does another serve,
 * with a warning, because its results (backward ALGO_0 and ALGO_3 add with
 * atomics) differ in the last bits from run to run.
 *
 * conv2d_workspace reports the largest workspace the three algorithms of a
 * shape need, so the model can carve it from its activation memory; the
 * ops use the `ws` they are given and never allocate during a step. The
 * model sizes that workspace for its largest micro-batch, but a plan is
 * keyed by the whole shape, so a smaller batch (the short last piece of an
 * evaluation) is a shape of its own whose best algorithm may want more:
 * a plan made inside an op therefore chooses within the workspace that op
 * was given, and a remembered plan that needs more than it is made again
 * within it. The choice stays a pure function of shape, device and that
 * workspace, which every rank reserves alike.
 *
 * Math: TF32 tensor cores only when the backend's allow_tf32 is set; else
 * the descriptors ask for CUDNN_FMA_MATH, full fp32. In this version the
 * tensors are fp32 whatever train.precision says: bf16/fp16 convolutions
 * (rounding the operands as linear.cu does) are a later step; this keeps
 * them correct rather than fast.
 *
 * The legacy convolution API is deprecated in cuDNN 9 (the graph API
 * replaces it) but is present throughout 9.x.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_impl.h"

extern "C" {
#include "core/log.h"
}

#ifdef DT_HAVE_CUDNN

#define CONV_PLANS 64                /* shapes remembered per backend */
#define WS_LIMIT ((size_t)256 << 20) /* most workspace one algorithm may use */
#define WS_MEM_SHARE 16              /* and no more than this share of the device */
#define MAX_CANDIDATES 16            /* algorithms asked of the heuristics */

enum conv_dir { FWD, BWD_DATA, BWD_FILTER, NDIR };
static const char *const dir_name[NDIR] = {"forward", "backward data", "backward filter"};

struct conv_plan {
    struct dt_conv2d_shape shape;
    int used;
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    int algo[NDIR];
    cudnnMathType_t math[NDIR];
    size_t ws[NDIR];
};

struct dt_cuda_conv_plans {
    struct conv_plan plan[CONV_PLANS];
    int next; /* the slot a new shape takes once all are used */
};

/* One heuristic candidate, whichever direction. */
struct candidate {
    int algo;
    cudnnStatus_t status;
    cudnnDeterminism_t det;
    cudnnMathType_t math;
};

#define SHAPE_FMT                                                                                  \
    "N=%d C=%d H=%d W=%d K=%d R=%d S=%d stride=%dx%d pad=%dx%d dil=%dx%d groups=%d P=%d Q=%d"
#define SHAPE_ARGS(s)                                                                              \
    (s)->N, (s)->C, (s)->H, (s)->W, (s)->K, (s)->R, (s)->S, (s)->stride_h, (s)->stride_w,          \
        (s)->pad_h, (s)->pad_w, (s)->dil_h, (s)->dil_w, (s)->groups, (s)->P, (s)->Q

/* The checks of every convolution op: positive sizes, groups dividing C
 * and K, and P, Q as dt_conv_out_dim gives them. */
static dt_status check_shape(const char *op, const struct dt_conv2d_shape *s)
{
    return dt_check_conv2d("cuda", op, s);
}

static void plan_clear(struct conv_plan *p)
{
    if (p->x)
        (void)cudnnDestroyTensorDescriptor(p->x);
    if (p->y)
        (void)cudnnDestroyTensorDescriptor(p->y);
    if (p->w)
        (void)cudnnDestroyFilterDescriptor(p->w);
    if (p->conv)
        (void)cudnnDestroyConvolutionDescriptor(p->conv);
    memset(p, 0, sizeof *p);
}

void dt_cuda_conv_release(struct cuda_backend *cb)
{
    if (!cb->conv_plans)
        return;
    for (int i = 0; i < CONV_PLANS; i++)
        plan_clear(&cb->conv_plans->plan[i]);
    free(cb->conv_plans);
    cb->conv_plans = NULL;
}

/* The descriptors of shape s in p; checks that cuDNN sees the same output
 * size. */
static dt_status describe(struct cuda_backend *cb, const char *op, struct conv_plan *p,
                          const struct dt_conv2d_shape *s)
{
    const struct dt_conv2d_shape *q = s;
    cudnnStatus_t st = cudnnCreateTensorDescriptor(&p->x);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnCreateTensorDescriptor(&p->y);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnCreateFilterDescriptor(&p->w);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnCreateConvolutionDescriptor(&p->conv);
    if (st == CUDNN_STATUS_SUCCESS)
        st = dt_cudnn_tensor4d(p->x, q->N, q->C, q->H, q->W);
    if (st == CUDNN_STATUS_SUCCESS)
        st = dt_cudnn_tensor4d(p->y, q->N, q->K, q->P, q->Q);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnSetFilter4dDescriptor(p->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, q->K,
                                        q->C / q->groups, q->R, q->S);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnSetConvolution2dDescriptor(p->conv, q->pad_h, q->pad_w, q->stride_h, q->stride_w,
                                             q->dil_h, q->dil_w, CUDNN_CROSS_CORRELATION,
                                             CUDNN_DATA_FLOAT);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnSetConvolutionGroupCount(p->conv, q->groups);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnSetConvolutionMathType(p->conv,
                                         cb->allow_tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH);
    if (st != CUDNN_STATUS_SUCCESS)
        return dt_cudnn_status(cb, st, op, "describing " SHAPE_FMT, SHAPE_ARGS(q));
    int n = 0, k = 0, h = 0, w = 0;
    st = cudnnGetConvolution2dForwardOutputDim(p->conv, p->x, p->w, &n, &k, &h, &w);
    if (st != CUDNN_STATUS_SUCCESS)
        return dt_cudnn_status(cb, st, op, "output size of " SHAPE_FMT, SHAPE_ARGS(q));
    if (n != q->N || k != q->K || h != q->P || w != q->Q)
        return dt_set_error(DT_ERR_INTERNAL,
                            "cuda %s: cuDNN computes a (%d,%d,%d,%d) output where dtrain "
                            "computes (%d,%d,%d,%d) (" SHAPE_FMT ")",
                            op, n, k, h, w, q->N, q->K, q->P, q->Q, SHAPE_ARGS(q));
    return DT_OK;
}

/* cuDNN's heuristic candidates for one direction, best first. */
static cudnnStatus_t candidates(cudnnHandle_t h, const struct conv_plan *p, enum conv_dir d,
                                struct candidate *c, int *count)
{
    int got = 0;
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    *count = 0;
    if (d == FWD) {
        cudnnConvolutionFwdAlgoPerf_t r[MAX_CANDIDATES];
        st = cudnnGetConvolutionForwardAlgorithm_v7(h, p->x, p->w, p->conv, p->y, MAX_CANDIDATES,
                                                    &got, r);
        for (int i = 0; st == CUDNN_STATUS_SUCCESS && i < got; i++)
            c[i] = (struct candidate){(int)r[i].algo, r[i].status, r[i].determinism, r[i].mathType};
    } else if (d == BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t r[MAX_CANDIDATES];
        st = cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p->w, p->y, p->conv, p->x,
                                                         MAX_CANDIDATES, &got, r);
        for (int i = 0; st == CUDNN_STATUS_SUCCESS && i < got; i++)
            c[i] = (struct candidate){(int)r[i].algo, r[i].status, r[i].determinism, r[i].mathType};
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t r[MAX_CANDIDATES];
        st = cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p->x, p->y, p->conv, p->w,
                                                           MAX_CANDIDATES, &got, r);
        for (int i = 0; st == CUDNN_STATUS_SUCCESS && i < got; i++)
            c[i] = (struct candidate){(int)r[i].algo, r[i].status, r[i].determinism, r[i].mathType};
    }
    if (st == CUDNN_STATUS_SUCCESS)
        *count = got < MAX_CANDIDATES ? got : MAX_CANDIDATES;
    return st;
}

/* Workspace of algorithm `algo` in direction d at the descriptor's current
 * math type. */
static cudnnStatus_t workspace_of(cudnnHandle_t h, const struct conv_plan *p, enum conv_dir d,
                                  int algo, size_t *bytes)
{
    if (d == FWD)
        return cudnnGetConvolutionForwardWorkspaceSize(h, p->x, p->w, p->conv, p->y,
                                                       (cudnnConvolutionFwdAlgo_t)algo, bytes);
    if (d == BWD_DATA)
        return cudnnGetConvolutionBackwardDataWorkspaceSize(
            h, p->w, p->y, p->conv, p->x, (cudnnConvolutionBwdDataAlgo_t)algo, bytes);
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(
        h, p->x, p->y, p->conv, p->w, (cudnnConvolutionBwdFilterAlgo_t)algo, bytes);
}

/* 1 for the FFT and Winograd algorithms: they compute through a
 * transform, whose rounding strays further from the direct sum than the
 * GEMM-like algorithms do. */
static int transform_algo(enum conv_dir d, int algo)
{
    switch (d) {
    case FWD:
        return algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT ||
               algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
               algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD ||
               algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
    case BWD_DATA:
        return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT ||
               algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
               algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD ||
               algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
    default:
        return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT ||
               algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
               algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
    }
}

/* Picks the algorithm of direction d (see the top of the file), needing
 * at most `budget` bytes of workspace. */
static dt_status choose(struct cuda_backend *cb, cudnnHandle_t h, const char *op,
                        struct conv_plan *p, enum conv_dir d, size_t budget)
{
    struct candidate c[MAX_CANDIDATES];
    int count = 0;
    /* the same math type asked for every direction, whatever the last
     * direction settled on, so the heuristics see the same question */
    cudnnStatus_t st = cudnnSetConvolutionMathType(p->conv, cb->allow_tf32 ? CUDNN_TENSOR_OP_MATH
                                                                           : CUDNN_FMA_MATH);
    if (st == CUDNN_STATUS_SUCCESS)
        st = candidates(h, p, d, c, &count);
    if (st != CUDNN_STATUS_SUCCESS)
        return dt_cudnn_status(cb, st, op, "%s algorithms for " SHAPE_FMT, dir_name[d],
                               SHAPE_ARGS(&p->shape));
    size_t limit = cb->total_mem / WS_MEM_SHARE;
    if (limit > WS_LIMIT)
        limit = WS_LIMIT;
    if (limit > budget)
        limit = budget;
    /* pass 0: deterministic direct algorithms; 1: deterministic ones with
     * transforms too; 2: any that works */
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; i < count; i++) {
            if (c[i].status != CUDNN_STATUS_SUCCESS ||
                (pass < 2 && c[i].det != CUDNN_DETERMINISTIC) ||
                (pass == 0 && transform_algo(d, c[i].algo)))
                continue;
            /* Without TF32 every algorithm runs in FMA math (full fp32). */
            const cudnnMathType_t math = cb->allow_tf32 ? c[i].math : CUDNN_FMA_MATH;
            size_t bytes = 0;
            if (cudnnSetConvolutionMathType(p->conv, math) != CUDNN_STATUS_SUCCESS ||
                workspace_of(h, p, d, c[i].algo, &bytes) != CUDNN_STATUS_SUCCESS || bytes > limit)
                continue;
            p->algo[d] = c[i].algo;
            p->math[d] = math;
            p->ws[d] = bytes;
            if (pass == 2)
                DT_LOG_WARN("cuda",
                            "cuDNN has no deterministic %s convolution algorithm within %zu bytes "
                            "of workspace for " SHAPE_FMT
                            ": using algorithm %d, so results may differ in the last bits "
                            "between runs",
                            dir_name[d], limit, SHAPE_ARGS(&p->shape), c[i].algo);
            return DT_OK;
        }
    }
    return dt_set_error(DT_ERR_UNSUPPORTED,
                        "cuda %s: cuDNN offers no %s convolution algorithm that works within "
                        "%zu bytes of workspace for " SHAPE_FMT
                        " (%d candidates); try a smaller train.micro_batch",
                        op, dir_name[d], limit, SHAPE_ARGS(&p->shape), count);
}

/* The most workspace a plan's three algorithms need. */
static size_t plan_workspace(const struct conv_plan *p)
{
    size_t most = 0;
    for (int d = 0; d < NDIR; d++)
        most = p->ws[d] > most ? p->ws[d] : most;
    return most;
}

/* The plan of shape s whose algorithms need at most `budget` bytes of
 * workspace (SIZE_MAX: the device's own limit): found in the table, or
 * made (descriptors and the three algorithms) in a free slot or the oldest
 * one; a remembered plan of the shape that needs more is made again in its
 * slot. */
static dt_status plan_for(struct cuda_backend *cb, const char *op, const struct dt_conv2d_shape *s,
                          size_t budget, cudnnHandle_t *h, struct conv_plan **out)
{
    dt_status st = check_shape(op, s);
    if (st != DT_OK)
        return st;
    st = dt_cuda_dnn(cb, op, h);
    if (st != DT_OK)
        return st;
    if (!cb->conv_plans) {
        cb->conv_plans = (struct dt_cuda_conv_plans *)calloc(1, sizeof *cb->conv_plans);
        if (!cb->conv_plans)
            return dt_set_error(DT_ERR_NOMEM,
                                "cuda %s: out of host memory for the "
                                "convolution plans",
                                op);
    }
    struct dt_cuda_conv_plans *t = cb->conv_plans;
    int slot = -1;
    for (int i = 0; i < CONV_PLANS && slot < 0; i++) {
        if (t->plan[i].used && !memcmp(&t->plan[i].shape, s, sizeof *s)) {
            if (plan_workspace(&t->plan[i]) <= budget) {
                *out = &t->plan[i];
                return DT_OK;
            }
            slot = i;
        }
    }
    for (int i = 0; i < CONV_PLANS && slot < 0; i++)
        if (!t->plan[i].used)
            slot = i;
    if (slot < 0) {
        slot = t->next;
        t->next = (t->next + 1) % CONV_PLANS;
    }
    struct conv_plan *p = &t->plan[slot];
    plan_clear(p);
    p->shape = *s;
    st = describe(cb, op, p, s);
    for (int d = 0; d < NDIR && st == DT_OK; d++)
        st = choose(cb, *h, op, p, d == 0 ? FWD : d == 1 ? BWD_DATA : BWD_FILTER, budget);
    if (st != DT_OK) {
        plan_clear(p);
        return st;
    }
    p->used = 1;
    DT_LOG_DEBUG("cuda",
                 "convolution " SHAPE_FMT ": algorithms %d/%d/%d (forward/data/filter), "
                 "workspace %zu/%zu/%zu bytes",
                 SHAPE_ARGS(s), p->algo[FWD], p->algo[BWD_DATA], p->algo[BWD_FILTER], p->ws[FWD],
                 p->ws[BWD_DATA], p->ws[BWD_FILTER]);
    *out = p;
    return DT_OK;
}

/* The plan, the math type of direction d set, and the workspace checked. */
static dt_status prepare(struct cuda_backend *cb, const char *op, const struct dt_conv2d_shape *s,
                         enum conv_dir d, const void *ws, size_t ws_bytes, cudnnHandle_t *h,
                         struct conv_plan **out)
{
    struct conv_plan *p = NULL;
    dt_status st = plan_for(cb, op, s, ws ? ws_bytes : 0, h, &p);
    if (st != DT_OK)
        return st;
    if (ws_bytes < p->ws[d] || (p->ws[d] > 0 && !ws))
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cuda %s: the workspace is %zu bytes%s but this shape's %s "
                            "algorithm needs %zu (conv2d_workspace tells how much) (" SHAPE_FMT ")",
                            op, ws_bytes, ws ? "" : " (NULL)", dir_name[d], p->ws[d],
                            SHAPE_ARGS(s));
    cudnnStatus_t cst = cudnnSetConvolutionMathType(p->conv, p->math[d]);
    if (cst != CUDNN_STATUS_SUCCESS)
        return dt_cudnn_status(cb, cst, op, "setting the math type, " SHAPE_FMT, SHAPE_ARGS(s));
    *out = p;
    return DT_OK;
}

dt_status dt_cuda_conv2d_workspace(dt_backend_t *be, const struct dt_conv2d_shape *s, size_t *bytes)
{
    DT_CUDA_REQUIRE(bytes, "conv2d_workspace", "bytes must not be NULL");
    *bytes = 0;
    struct cuda_backend *cb = dt_cuda_of(be);
    struct conv_plan *p = NULL;
    cudnnHandle_t h = NULL;
    dt_status st = plan_for(cb, "conv2d_workspace", s, SIZE_MAX, &h, &p);
    if (st != DT_OK)
        return st;
    *bytes = plan_workspace(p);
    return DT_OK;
}

/* y(N,K,P,Q) = conv(x(N,C,H,W), w(K,C/groups,R,S)) (written) */
dt_status dt_cuda_conv2d_fwd(dt_backend_t *be, float *y, const float *x, const float *w,
                             const struct dt_conv2d_shape *s, void *ws, size_t ws_bytes)
{
    DT_CUDA_REQUIRE(y && x && w, "conv2d_fwd", "pointers must not be NULL");
    struct cuda_backend *cb = dt_cuda_of(be);
    struct conv_plan *p = NULL;
    cudnnHandle_t h = NULL;
    dt_status st = prepare(cb, "conv2d_fwd", s, FWD, ws, ws_bytes, &h, &p);
    if (st != DT_OK)
        return st;
    const float one = 1.0f, zero = 0.0f;
    return dt_cudnn_status(cb,
                           cudnnConvolutionForward(h, &one, p->x, x, p->w, w, p->conv,
                                                   (cudnnConvolutionFwdAlgo_t)p->algo[FWD], ws,
                                                   ws_bytes, &zero, p->y, y),
                           "conv2d_fwd", SHAPE_FMT, SHAPE_ARGS(s));
}

/* dx(N,C,H,W) = the input gradient for dy(N,K,P,Q) (written) */
dt_status dt_cuda_conv2d_bwd_data(dt_backend_t *be, float *dx, const float *dy, const float *w,
                                  const struct dt_conv2d_shape *s, void *ws, size_t ws_bytes)
{
    DT_CUDA_REQUIRE(dx && dy && w, "conv2d_bwd_data", "pointers must not be NULL");
    struct cuda_backend *cb = dt_cuda_of(be);
    struct conv_plan *p = NULL;
    cudnnHandle_t h = NULL;
    dt_status st = prepare(cb, "conv2d_bwd_data", s, BWD_DATA, ws, ws_bytes, &h, &p);
    if (st != DT_OK)
        return st;
    const float one = 1.0f, zero = 0.0f;
    return dt_cudnn_status(
        cb,
        cudnnConvolutionBackwardData(h, &one, p->w, w, p->y, dy, p->conv,
                                     (cudnnConvolutionBwdDataAlgo_t)p->algo[BWD_DATA], ws, ws_bytes,
                                     &zero, p->x, dx),
        "conv2d_bwd_data", SHAPE_FMT, SHAPE_ARGS(s));
}

/* dw(K,C/groups,R,S) += the filter gradient (beta = 1) */
dt_status dt_cuda_conv2d_bwd_filter(dt_backend_t *be, float *dw, const float *dy, const float *x,
                                    const struct dt_conv2d_shape *s, void *ws, size_t ws_bytes)
{
    DT_CUDA_REQUIRE(dw && dy && x, "conv2d_bwd_filter", "pointers must not be NULL");
    struct cuda_backend *cb = dt_cuda_of(be);
    struct conv_plan *p = NULL;
    cudnnHandle_t h = NULL;
    dt_status st = prepare(cb, "conv2d_bwd_filter", s, BWD_FILTER, ws, ws_bytes, &h, &p);
    if (st != DT_OK)
        return st;
    const float one = 1.0f;
    return dt_cudnn_status(
        cb,
        cudnnConvolutionBackwardFilter(h, &one, p->x, x, p->y, dy, p->conv,
                                       (cudnnConvolutionBwdFilterAlgo_t)p->algo[BWD_FILTER], ws,
                                       ws_bytes, &one, p->w, dw),
        "conv2d_bwd_filter", SHAPE_FMT, SHAPE_ARGS(s));
}

#endif
