/*
 * embedding.cu - token embedding lookup on the GPU, out(N,D) = w(V,D)[ids],
 * and its backward, the scatter-add of dout into the rows of dw that the
 * ids picked: the math of kernels/cpu/embedding.c.
 *
 * Token ids are floats holding whole numbers (every tensor of the op table
 * is fp32; ids below 2^24 are exact). They live on the device, so the
 * forward checks them there without waiting: one block scans the N ids
 * and, when one is not a whole number in [0, V) (NaN included) and no
 * earlier check has found one, writes its position, value and V into the
 * backend's id-check record, whose copy to pinned host memory is queued
 * behind it. The next wait for the stream (the loss, the gradient norm, a
 * download, sync: dt_cuda_sync_op) reads the mirror and reports such an
 * id as DT_ERR_INVALID_ARG naming its position and value, so a bad id
 * still stops the step, one wait later, without a wait of its own in
 * every forward. out has been written by then, with zeros in the rows of
 * bad ids; the gather itself never reads outside the table.
 *
 * The backward does not synchronise, so it cannot report: it trusts the
 * forward's check on the same ids and skips an id outside the table (it
 * never writes outside dw).
 *
 * The backward is deterministic without atomics and without sorting:
 * thread (d, p) of the grid owns column d of the rows v of dw with
 * v % EMB_PARTS == p. It walks the ids n = 0..N-1 in order (read in tiles
 * through shared memory) and adds dout(n, d) to dw(ids[n], d) whenever
 * ids[n] is one of its rows. Every element of dw thus gets its
 * contributions one at a time in the order n = 0..N-1, exactly as the CPU
 * reference adds them: the results are bit-identical to the CPU's and the
 * same on every run. Splitting the rows over EMB_PARTS block rows gives
 * the GPU D * EMB_PARTS threads to run, at the cost of each reading all
 * N ids (cheap: one shared-memory broadcast per id).
 *
 * The table's gradient (dw) ACCUMULATES (+=); the output is WRITTEN (=).
 */
#include <cuda_runtime.h>
#include <limits.h>
#include <stddef.h>

#include "cuda_impl.h"

#define EMB_MAX_V (1 << 24) /* ids must be exact in a float */
#define EMB_THREADS 128     /* columns per block of the backward */
#define EMB_PARTS 64        /* row classes (v % EMB_PARTS) of the backward */
#define EMB_ID_TILE 1024    /* ids staged in shared memory at a time */
#define EMB_CHECK_THREADS DT_CUDA_THREADS

static_assert((EMB_CHECK_THREADS & (EMB_CHECK_THREADS - 1)) == 0,
              "the id check's tree needs a power-of-two block size");

/* What the id check leaves in cb->emb_check_dev (and, copied, emb_check_host). */
struct emb_check {
    int bad_pos; /* first position with a bad id, or INT_MAX */
    float bad_id;
    int V; /* the vocabulary it was checked against */
};

/* The row an id names, or -1 when it is not a whole number in [0, V). */
static __device__ int id_row(float id, int V)
{
    if (!(id >= 0.0f && id < (float)V) || id != floorf(id))
        return -1;
    return (int)id;
}

/* One block: *out = the first n of ids(N) that id_row refuses, unless
 * *out already holds an earlier check's. */
static __global__ void emb_check_kernel(const float *ids, int N, int V, struct emb_check *out)
{
    __shared__ int first[EMB_CHECK_THREADS];
    int mine = INT_MAX;
    for (int n = threadIdx.x; n < N; n += EMB_CHECK_THREADS)
        if (id_row(ids[n], V) < 0) {
            mine = n;
            break;
        }
    first[threadIdx.x] = mine;
    __syncthreads();
    for (int h = EMB_CHECK_THREADS / 2; h > 0; h /= 2) {
        if ((int)threadIdx.x < h && first[threadIdx.x + h] < first[threadIdx.x])
            first[threadIdx.x] = first[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0 && first[0] < N && out->bad_pos == INT_MAX) {
        struct emb_check c;
        c.bad_pos = first[0];
        c.bad_id = ids[first[0]];
        c.V = V;
        *out = c;
    }
}

/* out(n, d) = w(ids[n], d), 0 for a bad id; over e = n*D + d < N*D */
static __global__ void emb_fwd_kernel(float *out, const float *ids, const float *w, size_t total,
                                      int V, int D)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t n = e / (size_t)D, d = e - n * (size_t)D;
        const int v = id_row(ids[n], V);
        out[e] = v < 0 ? 0.0f : w[(size_t)v * D + d];
    }
}

/* Thread (d = blockIdx.x*EMB_THREADS + threadIdx.x, p = blockIdx.y):
 * dw(v, d) += dout(n, d) for n = 0..N-1 in order, v = ids[n], v % gridDim.y == p. */
static __global__ void emb_bwd_kernel(float *dw, const float *dout, const float *ids, int N, int V,
                                      int D)
{
    __shared__ int rows[EMB_ID_TILE];
    const int d = blockIdx.x * EMB_THREADS + threadIdx.x;
    const int parts = (int)gridDim.y, p = (int)blockIdx.y;
    for (int n0 = 0; n0 < N; n0 += EMB_ID_TILE) {
        const int len = N - n0 < EMB_ID_TILE ? N - n0 : EMB_ID_TILE;
        __syncthreads(); /* the previous tile has been read */
        for (int k = threadIdx.x; k < len; k += EMB_THREADS)
            rows[k] = id_row(ids[n0 + k], V);
        __syncthreads();
        if (d >= D)
            continue;
        for (int k = 0; k < len; k++) {
            const int v = rows[k];
            if (v >= 0 && v % parts == p)
                dw[(size_t)v * D + d] += dout[(size_t)(n0 + k) * D + d];
        }
    }
}

/* The sizes both directions accept, as the CPU ops do. */
static dt_status check_sizes(const char *op, int N, int V, int D)
{
    if (N < 0 || V < 1 || D < 1)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cuda %s: need N >= 0, V >= 1 and D >= 1 (N=%d, V=%d, D=%d)", op, N, V,
                            D);
    if (V > EMB_MAX_V)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cuda %s: vocabulary size V=%d is above 2^24, the largest whose token "
                            "ids a float holds exactly",
                            op, V);
    return DT_OK;
}

/* The id-check record and its mirror, made by the first forward, set to
 * "nothing found". */
static dt_status check_buffers(struct cuda_backend *cb)
{
    if (cb->emb_check_dev)
        return DT_OK;
    cudaError_t err = cudaMalloc(&cb->emb_check_dev, sizeof(struct emb_check));
    if (err != cudaSuccess) {
        cb->emb_check_dev = NULL;
        return dt_cuda_status(cb, err, sizeof(struct emb_check), "embedding_fwd",
                              "the token-id check");
    }
    err = cudaMallocHost(&cb->emb_check_host, sizeof(struct emb_check));
    if (err != cudaSuccess) {
        cb->emb_check_host = NULL;
        return dt_cuda_status(cb, err, 0, "embedding_fwd", "the token-id check's host copy");
    }
    struct emb_check *h = (struct emb_check *)cb->emb_check_host;
    h->bad_pos = INT_MAX;
    h->bad_id = 0.0f;
    h->V = 0;
    /* from pinned memory, so queued without a wait; nothing reuses h before
     * the stream has passed this copy */
    err = cudaMemcpyAsync(cb->emb_check_dev, h, sizeof *h, cudaMemcpyHostToDevice, cb->stream);
    return dt_cuda_status(cb, err, 0, "embedding_fwd", "clearing the token-id check");
}

dt_status dt_cuda_emb_check_result(struct cuda_backend *cb)
{
    if (!cb->emb_check_pending)
        return DT_OK;
    cb->emb_check_pending = 0;
    struct emb_check *h = (struct emb_check *)cb->emb_check_host;
    if (h->bad_pos == INT_MAX)
        return DT_OK;
    const struct emb_check c = *h;
    h->bad_pos = INT_MAX;
    /* the next forward's copy into h is queued behind this one */
    cudaError_t err = cudaMemcpyAsync(cb->emb_check_dev, h, sizeof *h, cudaMemcpyHostToDevice,
                                      cb->stream);
    if (err != cudaSuccess)
        return dt_cuda_status(cb, err, 0, "embedding_fwd", "clearing the token-id check");
    return dt_set_error(DT_ERR_INVALID_ARG,
                        "cuda embedding_fwd: token id %.9g at position %d is not a whole "
                        "number in [0, %d) (is the data's vocabulary larger than the model's?)",
                        (double)c.bad_id, c.bad_pos, c.V);
}

void dt_cuda_emb_release(struct cuda_backend *cb)
{
    if (cb->emb_check_dev)
        (void)cudaFree(cb->emb_check_dev);
    if (cb->emb_check_host)
        (void)cudaFreeHost(cb->emb_check_host);
    cb->emb_check_dev = cb->emb_check_host = NULL;
}

dt_status dt_cuda_embedding_fwd(dt_backend_t *be, float *out, const float *ids, const float *w,
                                int N, int V, int D)
{
    DT_CUDA_REQUIRE(out && ids && w, "embedding_fwd", "out, ids and w must not be NULL");
    dt_status st = check_sizes("embedding_fwd", N, V, D);
    if (st != DT_OK || N == 0)
        return st;
    struct cuda_backend *cb = dt_cuda_of(be);
    st = check_buffers(cb);
    if (st != DT_OK)
        return st;
    struct emb_check *dcheck = (struct emb_check *)cb->emb_check_dev;
    DT_CUDA_LAUNCH(emb_check_kernel, 1, EMB_CHECK_THREADS, 0, cb->stream, ids, N, V, dcheck);
    st = DT_CUDA_LAUNCHED(cb, "embedding_fwd", "checking ids (N=%d, V=%d)", N, V);
    if (st != DT_OK)
        return st;
    const size_t total = (size_t)N * (size_t)D;
    DT_CUDA_LAUNCH(emb_fwd_kernel, dt_cuda_blocks(total), DT_CUDA_THREADS, 0, cb->stream, out, ids, w, total, V, D);
    st = DT_CUDA_LAUNCHED(cb, "embedding_fwd", "N=%d, V=%d, D=%d", N, V, D);
    if (st != DT_OK)
        return st;
    cudaError_t err = cudaMemcpyAsync(cb->emb_check_host, dcheck, sizeof *dcheck,
                                      cudaMemcpyDeviceToHost, cb->stream);
    st = dt_cuda_status(cb, err, 0, "embedding_fwd", "copying the id check (N=%d)", N);
    if (st == DT_OK) {
        cb->emb_check_pending = 1;
        cb->results_marked = 0; /* after the results event: settle waits for the stream */
    }
    return st;
}

dt_status dt_cuda_embedding_bwd(dt_backend_t *be, float *dw, const float *dout, const float *ids,
                                int N, int V, int D)
{
    DT_CUDA_REQUIRE(dw && dout && ids, "embedding_bwd", "dw, dout and ids must not be NULL");
    dt_status st = check_sizes("embedding_bwd", N, V, D);
    if (st != DT_OK || N == 0)
        return st;
    struct cuda_backend *cb = dt_cuda_of(be);
    dim3 grid((unsigned)((D + EMB_THREADS - 1) / EMB_THREADS),
              (unsigned)(V < EMB_PARTS ? V : EMB_PARTS));
    DT_CUDA_LAUNCH(emb_bwd_kernel, grid, EMB_THREADS, 0, cb->stream, dw, dout, ids, N, V, D);
    return DT_CUDA_LAUNCHED(cb, "embedding_bwd", "N=%d, V=%d, D=%d", N, V, D);
}
