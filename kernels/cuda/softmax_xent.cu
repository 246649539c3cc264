/*
 * softmax_xent.cu - fused softmax and cross-entropy on the GPU: the math of
 * kernels/cpu/softmax_xent.c (its fast version: float exponentials, one
 * reciprocal per row, the loss term in double).
 *
 * Forward, in two kernels so the totals come out the same on every run:
 *   1. one thread block per row (B, C): the row's argmax (lowest index on
 *      ties), max-subtracted exponentials written to probs and summed by a
 *      fixed tree, then normalised; thread 0 stores the row's loss
 *      logsumexp - logit[label] (double), hit and label check in the
 *      backend's scratch (dt_cuda_scratch, used in stream order);
 *   2. one thread block adds the B row results in a fixed order (strided
 *      partial sums, then a fixed tree) and adds loss and hits to the
 *      backend's running totals on the device (cb->xent_acc_dev), which
 *      also keep the first row with a label outside [0, C).
 * No floating-point atomics anywhere, so the loss is bit-identical run to
 * run for the same inputs. The forward does not wait for the device: it
 * queues a copy of the running totals into their pinned host mirror, and
 * the next wait for the stream (dt_cuda_sync_op: a download, sync, the
 * gradient norm) adds them to *loss_sum and *correct, or reports the first
 * bad label (DT_ERR_INVALID_ARG). Forwards in a row into the same
 * loss_sum and correct share one wait; one into other pointers waits for
 * the pending totals first. Labels live on the device, so this is the
 * only place they can be checked without an extra copy.
 *
 * Backward, dlogits = (probs - onehot(labels)) * scale, is elementwise and
 * does not synchronise, so it cannot report a bad label: it trusts the
 * forward's check on the same labels and gives a label outside [0, C) no
 * onehot (it never reads out of bounds).
 *
 * No parameters; the activation gradient (dlogits) is WRITTEN (=).
 */
#include <cuda_runtime.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_impl.h"

#define XENT_THREADS DT_CUDA_THREADS /* per row, and for the totals */
#define WARP 32
#define XENT_WARPS (XENT_THREADS / WARP)
#define FULL_MASK 0xffffffffu
#define NO_INDEX (-1) /* an argmax candidate that holds nothing */

/* One row's share of the forward (in the scratch). */
struct xent_row {
    double loss; /* logsumexp - logit[label]; 0 for a bad label */
    int32_t hit; /* argmax == label */
    int32_t bad; /* label outside [0, C) */
};

/* The totals of one forward, and the running totals since the last wait
 * (cb->xent_acc_dev; its pinned host mirror and the value it is reset to
 * are cb->xent_acc_host[0] and [1]). */
struct xent_total {
    double loss;
    long long hits;
    int bad_row; /* first row with a bad label, or INT_MAX */
    int bad_label;
};

/* ---- block reductions (fixed order: the same tree on every run) ------- */

/* Whether candidate (vb, ib) wins over (va, ia) for the CPU's argmax_first
 * (a running `x[c] > x[arg]`): the larger value, the lower index on ties,
 * and a NaN after every number (it never replaces a number). */
static __device__ int argmax_wins(float vb, int ib, float va, int ia)
{
    if (ib == NO_INDEX)
        return 0;
    if (ia == NO_INDEX)
        return 1;
    if (isnan(vb))
        return isnan(va) && ib < ia;
    if (isnan(va))
        return 1;
    return vb > va || (vb == va && ib < ia);
}

/* Every thread's (v, i) becomes the block's winner. sh: XENT_WARPS + 1. */
static __device__ void block_argmax(float *v, int *i, float *sh_v, int *sh_i)
{
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    for (int o = WARP / 2; o > 0; o /= 2) {
        float ov = __shfl_down_sync(FULL_MASK, *v, o);
        int oi = __shfl_down_sync(FULL_MASK, *i, o);
        if (argmax_wins(ov, oi, *v, *i))
            *v = ov, *i = oi;
    }
    if (lane == 0)
        sh_v[warp] = *v, sh_i[warp] = *i;
    __syncthreads();
    if (warp == 0) {
        *v = lane < XENT_WARPS ? sh_v[lane] : 0.0f;
        *i = lane < XENT_WARPS ? sh_i[lane] : NO_INDEX;
        for (int o = WARP / 2; o > 0; o /= 2) {
            float ov = __shfl_down_sync(FULL_MASK, *v, o);
            int oi = __shfl_down_sync(FULL_MASK, *i, o);
            if (argmax_wins(ov, oi, *v, *i))
                *v = ov, *i = oi;
        }
        if (lane == 0)
            sh_v[XENT_WARPS] = *v, sh_i[XENT_WARPS] = *i;
    }
    __syncthreads();
    *v = sh_v[XENT_WARPS];
    *i = sh_i[XENT_WARPS];
    __syncthreads(); /* sh may be reused */
}

/* The block's sum of v, returned to every thread. sh: XENT_WARPS + 1. */
static __device__ float block_sum(float v, float *sh)
{
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    for (int o = WARP / 2; o > 0; o /= 2)
        v += __shfl_down_sync(FULL_MASK, v, o);
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < XENT_WARPS ? sh[lane] : 0.0f;
        for (int o = WARP / 2; o > 0; o /= 2)
            v += __shfl_down_sync(FULL_MASK, v, o);
        if (lane == 0)
            sh[XENT_WARPS] = v;
    }
    __syncthreads();
    v = sh[XENT_WARPS];
    __syncthreads();
    return v;
}

/* Adds b into a: sums, and the lower bad row. */
static __device__ void total_add(struct xent_total *a, const struct xent_total *b)
{
    a->loss += b->loss;
    a->hits += b->hits;
    if (b->bad_row < a->bad_row)
        a->bad_row = b->bad_row;
}

static __device__ void total_shfl_down(struct xent_total *t, int o)
{
    struct xent_total other;
    other.loss = __shfl_down_sync(FULL_MASK, t->loss, o);
    other.hits = __shfl_down_sync(FULL_MASK, t->hits, o);
    other.bad_row = __shfl_down_sync(FULL_MASK, t->bad_row, o);
    total_add(t, &other);
}

/* Thread 0's t becomes the block's total. sh: XENT_WARPS. Lanes past the
 * end of a warp read their own value, which only lanes other than 0 use. */
static __device__ void block_total(struct xent_total *t, struct xent_total *sh)
{
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    for (int o = WARP / 2; o > 0; o /= 2)
        total_shfl_down(t, o);
    if (lane == 0)
        sh[warp] = *t;
    __syncthreads();
    if (warp == 0) {
        if (lane < XENT_WARPS) {
            *t = sh[lane];
        } else {
            t->loss = 0.0;
            t->hits = 0;
            t->bad_row = INT_MAX;
        }
        for (int o = WARP / 2; o > 0; o /= 2)
            total_shfl_down(t, o);
    }
}

/* ---- kernels ---------------------------------------------------------- */

/* Per row b of logits(B, C): probs[b] = softmax(logits[b]) and rows[b]. */
static __global__ void xent_row_kernel(float *probs, const float *logits, const int32_t *labels,
                                       int B, int C, struct xent_row *rows)
{
    __shared__ float sh_v[XENT_WARPS + 1];
    __shared__ int sh_i[XENT_WARPS + 1];
    for (int b = blockIdx.x; b < B; b += gridDim.x) {
        const float *x = logits + (size_t)b * C; /* (C) */
        float *pr = probs + (size_t)b * C;       /* (C) */

        float v = 0.0f;
        int arg = NO_INDEX;
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            if (argmax_wins(x[c], c, v, arg))
                v = x[c], arg = c;
        block_argmax(&v, &arg, sh_v, sh_i);
        if (isnan(x[0])) /* the CPU's running comparison never leaves a NaN at 0 */
            arg = 0;
        const float m = x[arg];

        float part = 0.0f;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float e = expf(x[c] - m);
            pr[c] = e;
            part += e;
        }
        const float s = block_sum(part, sh_v);
        const float inv = 1.0f / s;
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            pr[c] *= inv;

        if (threadIdx.x == 0) {
            const int32_t label = labels[b];
            struct xent_row r = {0.0, 0, 1};
            if (label >= 0 && label < C) {
                /* -log softmax[label] = (max - x[label]) + log(s) */
                r.loss = ((double)m - x[label]) + log((double)s);
                r.hit = arg == label;
                r.bad = 0;
            }
            rows[b] = r;
        }
    }
}

/* acc += the sums over rows(B) (the loss's divided by per, as the cpu
 * does); acc keeps the first bad row it was given (one block). */
static __global__ void xent_total_kernel(const struct xent_row *rows, const int32_t *labels,
                                         int B, int per, struct xent_total *acc)
{
    __shared__ struct xent_total sh[XENT_WARPS];
    struct xent_total t = {0.0, 0, INT_MAX, 0};
    for (int b = threadIdx.x; b < B; b += blockDim.x) {
        struct xent_row r = rows[b];
        t.loss += r.loss;
        t.hits += r.hit;
        if (r.bad && b < t.bad_row)
            t.bad_row = b;
    }
    block_total(&t, sh);
    if (threadIdx.x == 0) {
        acc->loss += t.loss / per;
        acc->hits += t.hits;
        if (t.bad_row < B && acc->bad_row == INT_MAX) {
            acc->bad_row = t.bad_row;
            acc->bad_label = labels[t.bad_row];
        }
    }
}

/* dlogits(B,C) = (probs(B,C) - onehot(labels)) * scale, over n = B*C */
static __global__ void xent_bwd_kernel(float *dlogits, const float *probs, const int32_t *labels,
                                       int C, size_t n, float scale)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)blockDim.x * gridDim.x) {
        size_t b = i / (size_t)C;
        int c = (int)(i - b * (size_t)C);
        float onehot = c == labels[b] ? 1.0f : 0.0f;
        dlogits[i] = (probs[i] - onehot) * scale;
    }
}

/* ---- launchers -------------------------------------------------------- */

/* The running totals and their host copies, made on first use: the device
 * record is reset from the pinned initial value, queued without a wait. */
static dt_status acc_buffers(struct cuda_backend *cb)
{
    if (cb->xent_acc_dev)
        return DT_OK;
    cudaError_t err = cudaMallocHost(&cb->xent_acc_host, 2 * sizeof(struct xent_total));
    if (err != cudaSuccess) {
        cb->xent_acc_host = NULL;
        return dt_cuda_status(cb, err, 0, "softmax_xent_fwd", "the loss totals' host copy");
    }
    struct xent_total *h = (struct xent_total *)cb->xent_acc_host;
    h[0].loss = h[1].loss = 0.0;
    h[0].hits = h[1].hits = 0;
    h[0].bad_row = h[1].bad_row = INT_MAX;
    h[0].bad_label = h[1].bad_label = 0;
    err = cudaMalloc(&cb->xent_acc_dev, sizeof(struct xent_total));
    if (err != cudaSuccess) {
        cb->xent_acc_dev = NULL;
        return dt_cuda_status(cb, err, sizeof(struct xent_total), "softmax_xent_fwd",
                              "the loss totals");
    }
    err = cudaMemcpyAsync(cb->xent_acc_dev, &h[1], sizeof *h, cudaMemcpyHostToDevice, cb->stream);
    return dt_cuda_status(cb, err, 0, "softmax_xent_fwd", "clearing the loss totals");
}

size_t dt_cuda_xent_scratch(size_t B) { return B * sizeof(struct xent_row); }

dt_status dt_cuda_xent_result(struct cuda_backend *cb)
{
    if (!cb->xent_pending)
        return DT_OK;
    cb->xent_pending = 0;
    struct xent_total *h = (struct xent_total *)cb->xent_acc_host;
    const struct xent_total t = h[0];
    /* queued before any later forward adds to the device record */
    cudaError_t err = cudaMemcpyAsync(cb->xent_acc_dev, &h[1], sizeof *h,
                                      cudaMemcpyHostToDevice, cb->stream);
    if (err != cudaSuccess)
        return dt_cuda_status(cb, err, 0, "softmax_xent_fwd", "clearing the loss totals");
    if (t.bad_row != INT_MAX)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cuda softmax_xent_fwd: label %d of row %d is outside [0, %d) (wrong "
                            "number of classes in the model or the dataset?)",
                            t.bad_label, t.bad_row, cb->xent_classes);
    *cb->xent_loss_out += t.loss;
    *cb->xent_correct_out += (int64_t)t.hits;
    return DT_OK;
}

void dt_cuda_xent_release(struct cuda_backend *cb)
{
    if (cb->xent_acc_dev)
        (void)cudaFree(cb->xent_acc_dev);
    if (cb->xent_acc_host)
        (void)cudaFreeHost(cb->xent_acc_host);
    cb->xent_acc_dev = cb->xent_acc_host = NULL;
    cb->xent_pending = 0;
}

dt_status dt_cuda_softmax_xent_fwd(dt_backend_t *be, float *probs, const float *logits,
                                   const int32_t *labels, int B, int C, int per,
                                   double *loss_sum, int64_t *correct)
{
    DT_CUDA_REQUIRE(probs && logits && labels && loss_sum && correct, "softmax_xent_fwd",
                    "pointers must not be NULL");
    DT_CUDA_REQUIRE(B >= 0 && C >= 1, "softmax_xent_fwd", "need B >= 0 and C >= 1 (B=%d, C=%d)",
                    B, C);
    DT_CUDA_REQUIRE(per >= 1, "softmax_xent_fwd", "need per >= 1 (per=%d)", per);
    if (B == 0)
        return DT_OK;
    struct cuda_backend *cb = dt_cuda_of(be);
    dt_status st = DT_OK;
    if (cb->xent_pending &&
        (cb->xent_loss_out != loss_sum || cb->xent_correct_out != correct || cb->xent_classes != C))
        st = dt_cuda_sync_op(cb, "softmax_xent_fwd"); /* the pending totals go elsewhere */
    if (st == DT_OK)
        st = acc_buffers(cb);
    void *scratch = NULL;
    if (st == DT_OK)
        st = dt_cuda_scratch(cb, dt_cuda_xent_scratch((size_t)B), &scratch);
    if (st != DT_OK)
        return st;
    struct xent_row *rows = (struct xent_row *)scratch;
    struct xent_total *acc = (struct xent_total *)cb->xent_acc_dev;
    unsigned grid = B < DT_CUDA_MAX_BLOCKS ? (unsigned)B : DT_CUDA_MAX_BLOCKS;

    DT_CUDA_LAUNCH(xent_row_kernel, grid, XENT_THREADS, 0, cb->stream, probs, logits, labels, B, C, rows);
    st = DT_CUDA_LAUNCHED(cb, "softmax_xent_fwd", "rows (B=%d, C=%d)", B, C);
    if (st != DT_OK)
        return st;
    DT_CUDA_LAUNCH(xent_total_kernel, 1, XENT_THREADS, 0, cb->stream, rows, labels, B, per, acc);
    st = DT_CUDA_LAUNCHED(cb, "softmax_xent_fwd", "totals (B=%d, C=%d)", B, C);
    if (st != DT_OK)
        return st;
    cudaError_t err = cudaMemcpyAsync(cb->xent_acc_host, acc, sizeof *acc, cudaMemcpyDeviceToHost,
                                      cb->stream);
    st = dt_cuda_status(cb, err, 0, "softmax_xent_fwd", "copying the totals (B=%d, C=%d)", B, C);
    if (st != DT_OK)
        return st;
    cb->xent_pending = 1;
    cb->results_marked = 0; /* after the results event: settle waits for the stream */
    cb->xent_loss_out = loss_sum;
    cb->xent_correct_out = correct;
    cb->xent_classes = C;
    return DT_OK;
}

dt_status dt_cuda_softmax_xent_bwd(dt_backend_t *be, float *dlogits, const float *probs,
                                   const int32_t *labels, int B, int C, float scale)
{
    DT_CUDA_REQUIRE(dlogits && probs && labels, "softmax_xent_bwd", "pointers must not be NULL");
    DT_CUDA_REQUIRE(B >= 0 && C >= 1, "softmax_xent_bwd", "need B >= 0 and C >= 1 (B=%d, C=%d)",
                    B, C);
    const size_t n = (size_t)B * (size_t)C;
    if (n == 0)
        return DT_OK;
    struct cuda_backend *cb = dt_cuda_of(be);
    DT_CUDA_LAUNCH(xent_bwd_kernel, dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream, dlogits, probs, labels, C, n, scale);
    return DT_CUDA_LAUNCHED(cb, "softmax_xent_bwd", "B=%d, C=%d", B, C);
}
