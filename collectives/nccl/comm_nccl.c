/*
 * comm_nccl.c - the "nccl" communicator: collectives on device buffers
 * with NCCL, bootstrapped over MPI.
 *
 * Set-up: a duplicate of MPI_COMM_WORLD (errors return; it is also the
 * mpi_handle and what barrier runs on), rank 0's ncclUniqueId broadcast
 * over it, then a non-blocking ncclCommInitRankConfig polled to the end
 * with a time limit. The ranks agree after each local step (device, init),
 * so either every rank gets a communicator or every rank gets a status,
 * and none is left waiting in a set-up collective.
 *
 * Streams: every collective runs on the communicator's own non-blocking
 * stream, created with the device's highest priority so that the blocks of
 * an all-reduce are scheduled before backward's queued ones. With a bound (compute) stream it starts after the work queued
 * there (an event recorded on it, waited for by the comm stream), and when
 * it completes the bound stream waits for its done event, so later compute
 * sees the result while backward work queued meanwhile overlaps it.
 * Without one it starts after everything the device was doing: the comm
 * stream is drained (polled, with the time limit), then the device is
 * synchronised, since compute streams may be non-blocking ones that the
 * legacy default stream does not wait for.
 *
 * Completion is observed from the host, by polling the done event and
 * NCCL's asynchronous error state (no helper thread, no blocking wait on a
 * collective), so a wait can give up: past dt_comm_set_timeout's limit
 * (0: none; set-up has its own, NCCL_INIT_TIMEOUT_S), or on an NCCL error,
 * the NCCL communicator is aborted (which also stops its kernels) and the
 * call fails; every later call then fails at once naming the first error.
 * Done events come from a small pool. Requests in flight are kept in a
 * list so destroy can drain and free them.
 */
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "collectives/comm_impl.h"

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)

#define NCCL_INIT_TIMEOUT_S 600.0   /* longest ncclCommInitRankConfig may take */
#define NCCL_DESTROY_TIMEOUT_S 60.0 /* draining at destroy, when no timeout is set */
#define NCCL_EVENT_POOL 16          /* done events kept for reuse */
#define NCCL_SPIN_S 0.02            /* a wait polls with sched_yield this long, */
#define NCCL_POLL_SLEEP_NS 50000L   /* then sleeps 50 us between polls */
#define NCCL_WHAT 160               /* "ncclAllReduce of N floats (sum)" */
#define NCCL_MSG 1024

/* ncclBfloat16 (2 bytes) is 9 in every NCCL from 2.10 on, so in every one
 * this file builds with. Older headers declare the name only where
 * cuda_bf16.h defined __CUDA_BF16_TYPES_EXIST__, which it does for C++ and
 * never for C, as this file is; there the value is spelled out. (2.28, the
 * NCCL checked, declares it for C as well.) An NCCL built without bf16
 * (CUDA 10) rejects it at the call, with its own message. */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0) || defined(__CUDA_BF16_TYPES_EXIST__)
#define NCCL_BF16 ncclBfloat16
#else
#define NCCL_BF16 ((ncclDataType_t)9)
#endif

struct nccl_comm {
    struct dt_comm base; /* first, so a dt_comm_t * is a struct nccl_comm * */
    MPI_Comm world;      /* bootstrap: duplicate of MPI_COMM_WORLD, errors return */
    ncclComm_t nccl;     /* NULL before init and once aborted */
    int device;
    cudaStream_t stream; /* the collectives' own stream (non-blocking) */
    cudaStream_t bound;  /* dt_comm_bind_stream; NULL: after the whole device */
    cudaEvent_t ready;   /* recorded on `bound` before each collective */
    cudaEvent_t pool[NCCL_EVENT_POOL];
    int npool;
    struct dt_comm_req *live; /* requests in flight */
    char broken[NCCL_MSG];    /* why the NCCL communicator was aborted; "" while healthy */
};

struct dt_comm_req {
    struct nccl_comm *owner;
    struct dt_comm_req *prev, *next;
    cudaEvent_t done; /* NULL when nothing was queued (count 0) */
    char what[NCCL_WHAT];
};

enum coll_kind {
    COLL_ALLREDUCE,
    COLL_BROADCAST,
    COLL_ALLGATHER,
    COLL_REDUCE_SCATTER,
    COLL_RING_REDUCE_SCATTER, /* dt_comm_iring's halves, in place, the ring's chunks */
    COLL_RING_ALLGATHER
};

/* One collective call; count is in elements (bytes for broadcast and
 * allgather, per rank for allgather and reduce-scatter, the whole buffer
 * for the ring's halves). */
struct coll {
    enum coll_kind kind;
    const void *send;
    void *recv;
    size_t count;
    enum dt_dtype dtype;
    enum dt_comm_op op;
    int root;
};

static struct nccl_comm *impl(dt_comm_t *c)
{
    return (struct nccl_comm *)c;
}

static ncclDataType_t nccl_dtype(enum dt_dtype t)
{
    switch (t) {
    case DT_F32:
        return ncclFloat32;
    case DT_F64:
        return ncclFloat64;
    case DT_I32:
        return ncclInt32;
    case DT_I64:
        return ncclInt64;
    case DT_U8:
        return ncclUint8;
    case DT_BF16:
        return NCCL_BF16;
    default: /* check_reduce admits no other type */
        break;
    }
    DT_ASSERT(0 && "unknown dtype");
    return ncclUint8;
}

static ncclRedOp_t nccl_op(enum dt_comm_op op)
{
    switch (op) {
    case DT_COMM_SUM:
        return ncclSum;
    case DT_COMM_AVG:
        return ncclAvg;
    case DT_COMM_MAX:
        return ncclMax;
    case DT_COMM_MIN:
        return ncclMin;
    }
    DT_ASSERT(0 && "unknown reduction");
    return ncclSum;
}

static const char *dtype_plural(enum dt_dtype t)
{
    static const char *const names[] = {"floats", "doubles", "int32s", "int64s", "bytes", "bf16s"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "elements";
}

static const char *op_name(enum dt_comm_op op)
{
    static const char *const names[] = {"sum", "avg", "max", "min"};
    return (unsigned)op < sizeof names / sizeof names[0] ? names[op] : "?";
}

/* "ncclAllReduce of 1024 floats (sum)", for messages. */
static void describe(const struct coll *k, char *buf, size_t len)
{
    switch (k->kind) {
    case COLL_ALLREDUCE:
        snprintf(buf, len, "ncclAllReduce of %zu %s (%s)", k->count, dtype_plural(k->dtype),
                 op_name(k->op));
        break;
    case COLL_BROADCAST:
        snprintf(buf, len, "ncclBroadcast of %zu bytes from root %d", k->count, k->root);
        break;
    case COLL_ALLGATHER:
        snprintf(buf, len, "ncclAllGather of %zu bytes per rank", k->count);
        break;
    case COLL_REDUCE_SCATTER:
        snprintf(buf, len, "ncclReduceScatter of %zu %s per rank (%s)", k->count,
                 dtype_plural(k->dtype), op_name(k->op));
        break;
    case COLL_RING_REDUCE_SCATTER:
        snprintf(buf, len, "reduce-scatter (grouped ncclReduce) of %zu %s", k->count,
                 dtype_plural(k->dtype));
        break;
    case COLL_RING_ALLGATHER:
        snprintf(buf, len, "all-gather (grouped ncclBroadcast) of %zu %s", k->count,
                 dtype_plural(k->dtype));
        break;
    }
}

/* ---- errors --------------------------------------------------------------- */

/* Aborts the NCCL communicator (stopping its kernels, so no peer waits on
 * this rank in a collective) and remembers why. */
static void abort_nccl(struct nccl_comm *n, const char *why)
{
    if (!n->nccl) return;
    ncclComm_t comm = n->nccl;
    n->nccl = NULL;
    snprintf(n->broken, sizeof n->broken, "%s", why);
    ncclResult_t res = ncclCommAbort(comm);
    if (res != ncclSuccess)
        DT_LOG_WARN("comm", "ncclCommAbort on rank %d failed: %s", n->base.rank,
                    ncclGetErrorString(res));
}

/* DT_ERR_COMM for a failed NCCL call or an asynchronous NCCL error: what,
 * where, NCCL's text for the code and its last error; aborts the
 * communicator. */
static dt_status nccl_fail(struct nccl_comm *n, ncclResult_t res, const char *what)
{
    char msg[NCCL_MSG];
    const char *last = ncclGetLastError(n->nccl);
    snprintf(msg, sizeof msg, "%s failed on rank %d: %s%s%s%s", what, n->base.rank,
             ncclGetErrorString(res), last && last[0] ? " (NCCL: " : "", last ? last : "",
             last && last[0] ? ")" : "");
    if (n->nccl) {
        size_t len = strlen(msg);
        snprintf(msg + len, sizeof msg - len, "; the NCCL communicator was aborted");
    }
    abort_nccl(n, msg);
    return dt_set_error(DT_ERR_COMM, "%s", msg);
}

static dt_status timeout_fail(struct nccl_comm *n, const char *what, double limit_s)
{
    char msg[NCCL_MSG];
    snprintf(msg, sizeof msg,
             "%s did not complete within %g s on rank %d (a peer may have failed or stalled); "
             "the NCCL communicator was aborted so no rank hangs",
             what, limit_s, n->base.rank);
    abort_nccl(n, msg);
    return dt_set_error(DT_ERR_TIMEOUT, "%s", msg);
}

/* DT_ERR_CUDA with CUDA's text: "<call> for <what> failed on rank R: ...".
 * Clears the thread's last error, as the compute backend does, so the next
 * kernel launch is not blamed for it. */
static dt_status cuda_fail(const struct nccl_comm *n, cudaError_t err, const char *call,
                           const char *what)
{
    (void)cudaGetLastError();
    return dt_set_error(DT_ERR_CUDA, "%s for %s failed on rank %d (device %d): %s", call, what,
                        n->base.rank, n->device, cudaGetErrorString(err));
}

/* Every call after an abort fails at once, naming the first error. */
static dt_status broken_fail(const struct nccl_comm *n, const char *what)
{
    return dt_set_error(DT_ERR_COMM,
                        "%s on rank %d: the NCCL communicator was aborted after an earlier "
                        "failure (%s); destroy it and start again",
                        what, n->base.rank, n->broken);
}

/* ---- polling ---------------------------------------------------------------- */

/* A query that finds work still running may leave cudaErrorNotReady as
 * the thread's last error; the compute backend checks each kernel launch
 * with cudaGetLastError, so the next launch would fail with it. Clears
 * that and nothing else. */
static void clear_not_ready(void)
{
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
}

/* Short waits (most collectives) spin, so their end is seen at once;
 * long ones stop taking a core. */
static void backoff(double waited_s)
{
    if (waited_s < NCCL_SPIN_S) {
        sched_yield();
    } else {
        struct timespec nap = {0, NCCL_POLL_SLEEP_NS};
        nanosleep(&nap, NULL);
    }
}

/* NCCL's state; a failure to read it fails like the call it was for. */
static dt_status read_state(struct nccl_comm *n, const char *what, ncclResult_t *state)
{
    *state = ncclSuccess;
    ncclResult_t res = ncclCommGetAsyncError(n->nccl, state);
    if (res == ncclSuccess) return DT_OK;
    char call[NCCL_WHAT + 48];
    snprintf(call, sizeof call, "ncclCommGetAsyncError during %s", what);
    return nccl_fail(n, res, call);
}

/* Fails (and aborts) when NCCL reports an asynchronous error. */
static dt_status check_async(struct nccl_comm *n, const char *what)
{
    ncclResult_t state;
    dt_status st = read_state(n, what, &state);
    if (st != DT_OK) return st;
    if (state != ncclSuccess && state != ncclInProgress) return nccl_fail(n, state, what);
    return DT_OK;
}

/* Polls NCCL's state until a non-blocking call (init, enqueue, finalize)
 * has finished; limit_s <= 0: no limit. */
static dt_status wait_nccl_state(struct nccl_comm *n, const char *what, double limit_s)
{
    double t0 = dt_now();
    for (;;) {
        ncclResult_t state;
        dt_status st = read_state(n, what, &state);
        if (st != DT_OK) return st;
        if (state == ncclSuccess) return DT_OK;
        if (state != ncclInProgress) return nccl_fail(n, state, what);
        double waited = dt_now() - t0;
        if (limit_s > 0 && waited > limit_s) return timeout_fail(n, what, limit_s);
        backoff(waited);
    }
}

/* Polls until `ev` (NULL: the whole comm stream) has completed, checking
 * NCCL's error state meanwhile; limit_s <= 0: no limit. */
static dt_status wait_gpu(struct nccl_comm *n, cudaEvent_t ev, const char *what, double limit_s)
{
    double t0 = dt_now();
    for (;;) {
        cudaError_t err = ev ? cudaEventQuery(ev) : cudaStreamQuery(n->stream);
        if (err == cudaSuccess) return DT_OK;
        if (err != cudaErrorNotReady)
            return cuda_fail(n, err, ev ? "cudaEventQuery" : "cudaStreamQuery", what);
        clear_not_ready();
        dt_status st = check_async(n, what);
        if (st != DT_OK) return st;
        double waited = dt_now() - t0;
        if (limit_s > 0 && waited > limit_s) return timeout_fail(n, what, limit_s);
        backoff(waited);
    }
}

/* ---- events and requests ------------------------------------------------------ */

static dt_status take_event(struct nccl_comm *n, cudaEvent_t *ev, const char *what)
{
    if (n->npool > 0) {
        *ev = n->pool[--n->npool];
        return DT_OK;
    }
    cudaError_t err = cudaEventCreateWithFlags(ev, cudaEventDisableTiming);
    return err == cudaSuccess ? DT_OK : cuda_fail(n, err, "cudaEventCreateWithFlags", what);
}

/* An event that may still be pending (after a failure) is destroyed, not
 * reused: CUDA releases it once it completes. */
static void give_event(struct nccl_comm *n, cudaEvent_t ev, int reuse)
{
    if (!ev) return;
    if (reuse && n->npool < NCCL_EVENT_POOL)
        n->pool[n->npool++] = ev;
    else
        cudaEventDestroy(ev);
}

static void release(struct nccl_comm *n, dt_comm_req_t *r, int reuse_event)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        n->live = r->next;
    if (r->next) r->next->prev = r->prev;
    give_event(n, r->done, reuse_event);
    free(r);
}

/* A completed request: the bound stream waits for it (so later compute
 * on that stream is ordered after the collective), then it is freed. */
static dt_status complete(struct nccl_comm *n, dt_comm_req_t *r)
{
    dt_status st = DT_OK;
    if (r->done && n->bound) {
        cudaError_t err = cudaStreamWaitEvent(n->bound, r->done, 0);
        if (err != cudaSuccess) st = cuda_fail(n, err, "cudaStreamWaitEvent", r->what);
    }
    release(n, r, st == DT_OK);
    return st;
}

/* ---- enqueueing ---------------------------------------------------------------- */

/* Orders the next collective after the work that produced its input: the
 * bound stream's queued work, or (unbound) everything on the device. */
static dt_status order_after_inputs(struct nccl_comm *n, const char *what)
{
    cudaError_t err;
    if (n->bound) {
        err = cudaEventRecord(n->ready, n->bound);
        if (err != cudaSuccess)
            return cuda_fail(n, err, "cudaEventRecord on the bound stream", what);
        err = cudaStreamWaitEvent(n->stream, n->ready, 0);
        return err == cudaSuccess ? DT_OK : cuda_fail(n, err, "cudaStreamWaitEvent", what);
    }
    /* Our own collectives first, with the time limit (they may wait on
     * peers), then the rest of the device, which cannot. */
    char earlier[NCCL_WHAT + 48];
    snprintf(earlier, sizeof earlier, "the collectives queued before %s", what);
    dt_status st = wait_gpu(n, NULL, earlier, n->base.timeout_s);
    if (st != DT_OK) return st;
    err = cudaDeviceSynchronize();
    return err == cudaSuccess ? DT_OK : cuda_fail(n, err, "cudaDeviceSynchronize", what);
}

/* The ring's halves with the ring's chunks, so that each rank holds what
 * dt_comm_ring_owned says (rank r: chunk (r + 1) % size, the chunks
 * uneven where the count does not divide, which ncclReduceScatter and
 * ncclAllGather do not take): each chunk reduced to the rank holding it
 * (ncclReduce, in place), or broadcast from it, all grouped into one
 * launch on the comm stream. */
static ncclResult_t ring_half(struct nccl_comm *n, const struct coll *k)
{
    const int p = n->base.size;
    const size_t esz = dt_dtype_size(k->dtype);
    ncclResult_t res = ncclGroupStart();
    if (res != ncclSuccess) return res;
    for (int c = 0; c < p && res == ncclSuccess; c++) {
        size_t lo = dt_ring_chunk_start(k->count, p, c), hi = dt_ring_chunk_start(k->count, p, c + 1);
        char *at = (char *)k->recv + lo * esz;
        int root = (c + p - 1) % p;
        if (hi == lo) continue;
        res = k->kind == COLL_RING_REDUCE_SCATTER
                  ? ncclReduce(at, at, hi - lo, nccl_dtype(k->dtype), ncclSum, root, n->nccl,
                               n->stream)
                  : ncclBroadcast(at, at, hi - lo, nccl_dtype(k->dtype), root, n->nccl, n->stream);
    }
    ncclResult_t end = ncclGroupEnd(); /* even after a failure: the group must close */
    return res != ncclSuccess ? res : end;
}

static ncclResult_t call_nccl(struct nccl_comm *n, const struct coll *k)
{
    switch (k->kind) {
    case COLL_RING_REDUCE_SCATTER:
    case COLL_RING_ALLGATHER:
        return ring_half(n, k);
    case COLL_ALLREDUCE:
        return ncclAllReduce(k->send, k->recv, k->count, nccl_dtype(k->dtype), nccl_op(k->op),
                             n->nccl, n->stream);
    case COLL_BROADCAST:
        return ncclBroadcast(k->send, k->recv, k->count, ncclUint8, k->root, n->nccl, n->stream);
    case COLL_ALLGATHER:
        return ncclAllGather(k->send, k->recv, k->count, ncclUint8, n->nccl, n->stream);
    case COLL_REDUCE_SCATTER:
        return ncclReduceScatter(k->send, k->recv, k->count, nccl_dtype(k->dtype), nccl_op(k->op),
                                 n->nccl, n->stream);
    }
    DT_ASSERT(0 && "unknown collective");
    return ncclInternalError;
}

/* Queues one collective on the comm stream with a done event after it. */
static dt_status enqueue(struct nccl_comm *n, const struct coll *k, dt_comm_req_t **out)
{
    dt_comm_req_t *r = NULL;
    char what[NCCL_WHAT];
    dt_status st = DT_OK;
    *out = NULL;
    describe(k, what, sizeof what);
    if (!n->nccl) return broken_fail(n, what);
    DT_CHECK(dt_calloc(1, sizeof *r, "an NCCL request", (void **)&r));
    r->owner = n;
    snprintf(r->what, sizeof r->what, "%s", what);
    if (k->count > 0) {
        DT_CHECK(order_after_inputs(n, what));
        ncclResult_t res = call_nccl(n, k);
        if (res == ncclInProgress)
            DT_CHECK(wait_nccl_state(n, what, n->base.timeout_s)); /* until it is queued */
        else if (res != ncclSuccess)
            DT_CHECK(nccl_fail(n, res, what));
        DT_CHECK(take_event(n, &r->done, what));
        cudaError_t err = cudaEventRecord(r->done, n->stream);
        if (err != cudaSuccess) DT_CHECK(cuda_fail(n, err, "cudaEventRecord", what));
    }
    r->next = n->live;
    if (n->live) n->live->prev = r;
    n->live = r;
    *out = r;
    r = NULL;
out:
    if (r) {
        give_event(n, r->done, 0);
        free(r);
    }
    return st;
}

/* ---- collectives --------------------------------------------------------------- */

static dt_status nccl_test(dt_comm_t *c, dt_comm_req_t *r, int *done)
{
    struct nccl_comm *n = impl(c);
    DT_ASSERT(r->owner == n);
    dt_status st = DT_OK;
    if (!n->nccl) {
        st = broken_fail(n, r->what);
        release(n, r, 0);
        return st;
    }
    cudaError_t err = r->done ? cudaEventQuery(r->done) : cudaSuccess;
    if (err == cudaSuccess) {
        st = complete(n, r);
        *done = st == DT_OK;
        return st;
    }
    if (err == cudaErrorNotReady) {
        clear_not_ready();
        st = check_async(n, r->what);
    } else {
        st = cuda_fail(n, err, "cudaEventQuery", r->what);
    }
    if (st != DT_OK) release(n, r, 0);
    return st;
}

static dt_status nccl_wait(dt_comm_t *c, dt_comm_req_t *r)
{
    struct nccl_comm *n = impl(c);
    DT_ASSERT(r->owner == n);
    dt_status st = !n->nccl  ? broken_fail(n, r->what)
                   : r->done ? wait_gpu(n, r->done, r->what, c->timeout_s)
                             : DT_OK;
    if (st != DT_OK) {
        release(n, r, 0);
        return st;
    }
    return complete(n, r);
}

static dt_status run_blocking(dt_comm_t *c, const struct coll *k)
{
    dt_comm_req_t *r = NULL;
    dt_status st = enqueue(impl(c), k, &r);
    return st != DT_OK ? st : nccl_wait(c, r);
}

static dt_status nccl_iallreduce(dt_comm_t *c, void *buf, size_t count, enum dt_dtype t,
                                 enum dt_comm_op op, dt_comm_req_t **req)
{
    struct coll k = {
        .kind = COLL_ALLREDUCE, .send = buf, .recv = buf, .count = count, .dtype = t, .op = op};
    return enqueue(impl(c), &k, req);
}

static dt_status nccl_allreduce(dt_comm_t *c, void *buf, size_t count, enum dt_dtype t,
                                enum dt_comm_op op)
{
    struct coll k = {
        .kind = COLL_ALLREDUCE, .send = buf, .recv = buf, .count = count, .dtype = t, .op = op};
    return run_blocking(c, &k);
}

static dt_status nccl_broadcast(dt_comm_t *c, void *buf, size_t bytes, int root)
{
    struct coll k = {.kind = COLL_BROADCAST,
                     .send = buf,
                     .recv = buf,
                     .count = bytes,
                     .dtype = DT_U8,
                     .root = root};
    return run_blocking(c, &k);
}

static dt_status nccl_allgather(dt_comm_t *c, const void *send, void *recv, size_t bytes)
{
    struct coll k = {
        .kind = COLL_ALLGATHER, .send = send, .recv = recv, .count = bytes, .dtype = DT_U8};
    return run_blocking(c, &k);
}

static dt_status nccl_reduce_scatter(dt_comm_t *c, const void *send, void *recv, size_t count,
                                     enum dt_dtype t, enum dt_comm_op op)
{
    struct coll k = {.kind = COLL_REDUCE_SCATTER,
                     .send = send,
                     .recv = recv,
                     .count = count,
                     .dtype = t,
                     .op = op};
    return run_blocking(c, &k);
}

static dt_status nccl_iring(dt_comm_t *c, void *buf, size_t count, enum dt_dtype t,
                            enum dt_comm_ring_part part, dt_comm_req_t **req)
{
    struct coll k = {.send = buf, .recv = buf, .count = count, .dtype = t, .op = DT_COMM_SUM};
    if (part == DT_RING_ALL) { /* both halves are one all-reduce */
        k.kind = COLL_ALLREDUCE;
    } else {
        k.kind = part == DT_RING_REDUCE_SCATTER ? COLL_RING_REDUCE_SCATTER : COLL_RING_ALLGATHER;
    }
    return enqueue(impl(c), &k, req);
}

/* NCCL has no barrier; the bootstrap communicator does. */
static dt_status nccl_barrier(dt_comm_t *c)
{
    return dt_mpi_check(MPI_Barrier(impl(c)->world), c->rank, "MPI_Barrier");
}

static dt_status nccl_bind_stream(dt_comm_t *c, void *stream)
{
    impl(c)->bound = (cudaStream_t)stream;
    return DT_OK;
}

/* ---- life cycle ------------------------------------------------------------------ */

static void nccl_abort(dt_comm_t *c, int exit_code)
{
    struct nccl_comm *n = impl(c);
    /* The pointer is left in place: the process ends below, and another
     * thread (a watchdog) may be polling it. */
    if (n->nccl) ncclCommAbort(n->nccl);
    if (dt_mpi_usable())
        MPI_Abort(n->world != MPI_COMM_NULL ? n->world : MPI_COMM_WORLD, exit_code);
}

/* Finalizes and destroys the NCCL communicator, or aborts it when that
 * fails or takes longer than limit_s. */
static void close_nccl(struct nccl_comm *n, double limit_s)
{
    if (!n->nccl) return;
    dt_status st = wait_gpu(n, NULL, "the collectives still queued at destroy", limit_s);
    if (st == DT_OK) {
        ncclResult_t res = ncclCommFinalize(n->nccl);
        if (res == ncclInProgress)
            st = wait_nccl_state(n, "ncclCommFinalize", limit_s);
        else if (res != ncclSuccess)
            st = nccl_fail(n, res, "ncclCommFinalize");
    }
    if (st != DT_OK) {
        DT_LOG_WARN("comm", "%s", dt_last_error());
        abort_nccl(n, "destroyed");
        return;
    }
    ncclResult_t res = ncclCommDestroy(n->nccl);
    n->nccl = NULL;
    if (res != ncclSuccess && res != ncclInProgress)
        DT_LOG_WARN("comm", "ncclCommDestroy on rank %d failed: %s", n->base.rank,
                    ncclGetErrorString(res));
}

/* Frees everything; keeps the calling thread's error message, so a caller
 * that destroys after a failure can still report it. */
static void free_comm(struct nccl_comm *n)
{
    char saved[NCCL_MSG];
    snprintf(saved, sizeof saved, "%s", dt_last_error());
    double limit = n->base.timeout_s > 0 ? n->base.timeout_s : NCCL_DESTROY_TIMEOUT_S;
    close_nccl(n, limit);
    int left = 0;
    while (n->live) {
        release(n, n->live, 0);
        left++;
    }
    if (left)
        DT_LOG_WARN("comm", "nccl communicator destroyed with %d collective%s never waited for",
                    left, left == 1 ? "" : "s");
    while (n->npool > 0)
        cudaEventDestroy(n->pool[--n->npool]);
    if (n->ready) cudaEventDestroy(n->ready);
    if (n->stream) cudaStreamDestroy(n->stream);
    if (dt_mpi_usable() && n->world != MPI_COMM_NULL && MPI_Comm_free(&n->world) != MPI_SUCCESS)
        DT_LOG_WARN("comm", "MPI_Comm_free of the NCCL bootstrap communicator failed");
    free(n);
    if (saved[0])
        dt_set_error(DT_ERR_INTERNAL, "%s", saved);
    else
        dt_clear_error();
}

static void nccl_destroy(dt_comm_t *c)
{
    free_comm(impl(c));
}

static const struct dt_comm_ops nccl_ops = {
    .name = "nccl",
    .allreduce = nccl_allreduce,
    .iallreduce = nccl_iallreduce,
    .iring = nccl_iring,
    .test = nccl_test,
    .wait = nccl_wait,
    .broadcast = nccl_broadcast,
    .allgather = nccl_allgather,
    .reduce_scatter = nccl_reduce_scatter,
    .barrier = nccl_barrier,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
    .bind_stream = nccl_bind_stream,
    .caps = &dt_nccl_comm_caps,
};

/* ---- set-up --------------------------------------------------------------------- */

/* Every rank passes its own outcome; all get OK, or the failure of the
 * rank with the highest status code (its own message there, a pointer to
 * that rank elsewhere). */
static dt_status agree(struct nccl_comm *n, dt_status mine, const char *what)
{
    struct {
        int status, rank;
    } in = {(int)mine, n->base.rank}, res = {0, 0};
    dt_status st = dt_mpi_check(MPI_Allreduce(&in, &res, 1, MPI_2INT, MPI_MAXLOC, n->world),
                                n->base.rank, "MPI_Allreduce agreeing on the NCCL set-up");
    if (st != DT_OK || res.status == DT_OK) return st;
    if (mine != DT_OK) return mine;
    return dt_set_error((dt_status)res.status,
                        "rank %d could not %s (%s there; that rank's message says why)", res.rank,
                        what, dt_status_str((dt_status)res.status));
}

/* Why CUDA found no device, in words. */
static const char *no_device_reason(cudaError_t err)
{
    int driver = 0;
    if (err == cudaSuccess || err == cudaErrorNoDevice) return "no CUDA device is visible";
    if (err == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess &&
        driver == 0)
        return "no NVIDIA driver is installed";
    return cudaGetErrorString(err);
}

/* The device the caller selected, the comm stream and the ready event. */
static dt_status prepare_device(struct nccl_comm *n)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        return dt_set_error(DT_ERR_UNSUPPORTED,
                            "the nccl communicator needs a CUDA GPU on every rank, but rank %d "
                            "has no usable GPU (%s); use the mpi backend, or run on GPU nodes",
                            n->base.rank, no_device_reason(err));
    }
    const char *what = "the NCCL communicator";
    err = cudaGetDevice(&n->device);
    if (err != cudaSuccess) return cuda_fail(n, err, "cudaGetDevice", what);
    /* the highest priority the device has (the numerically least), so a
     * bucket's all-reduce is scheduled ahead of backward's queued blocks */
    int least = 0, greatest = 0;
    err = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (err != cudaSuccess) return cuda_fail(n, err, "cudaDeviceGetStreamPriorityRange", what);
    err = cudaStreamCreateWithPriority(&n->stream, cudaStreamNonBlocking, greatest);
    if (err != cudaSuccess) return cuda_fail(n, err, "cudaStreamCreateWithPriority", what);
    err = cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming);
    if (err != cudaSuccess) return cuda_fail(n, err, "cudaEventCreateWithFlags", what);
    return DT_OK;
}

/* This rank's part of the non-blocking init, polled to the end. */
static dt_status init_rank(struct nccl_comm *n, const ncclUniqueId *id)
{
    char what[NCCL_WHAT];
    snprintf(what, sizeof what, "ncclCommInitRankConfig (rank %d of %d, device %d)", n->base.rank,
             n->base.size, n->device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t res = ncclCommInitRankConfig(&comm, n->base.size, *id, n->base.rank, &config);
    n->nccl = comm;
    if (res != ncclSuccess && res != ncclInProgress) return nccl_fail(n, res, what);
    if (!n->nccl)
        return dt_set_error(DT_ERR_COMM, "%s on rank %d returned no communicator", what,
                            n->base.rank);
    return wait_nccl_state(n, what, NCCL_INIT_TIMEOUT_S);
}

/* Rank 0's unique id to every rank, then the init, agreed. */
static dt_status start_nccl(struct nccl_comm *n)
{
    struct {
        int32_t ok;
        ncclUniqueId id;
    } boot;
    dt_status mine = DT_OK, st;
    memset(&boot, 0, sizeof boot);
    if (n->base.rank == 0) {
        ncclResult_t res = ncclGetUniqueId(&boot.id);
        if (res != ncclSuccess) mine = nccl_fail(n, res, "ncclGetUniqueId");
        boot.ok = mine == DT_OK;
    }
    st = dt_mpi_check(MPI_Bcast(&boot, (int)sizeof boot, MPI_BYTE, 0, n->world), n->base.rank,
                      "MPI_Bcast of the NCCL unique id");
    if (st != DT_OK) return st;
    if (!boot.ok)
        return n->base.rank == 0 ? mine
                                 : dt_set_error(DT_ERR_COMM, "rank 0 could not make an NCCL "
                                                             "unique id (ncclGetUniqueId failed "
                                                             "there), so NCCL did not start");
    st = agree(n, init_rank(n, &boot.id), "start its NCCL communicator");
    if (st != DT_OK) abort_nccl(n, "set-up failed");
    return st;
}

dt_status dt_nccl_comm_create(dt_comm_t **out)
{
    struct nccl_comm *n = NULL;
    dt_status st = DT_OK;
    *out = NULL;
    if (!dt_mpi_usable()) {
        st = dt_set_error(DT_ERR_INVALID_ARG, "the nccl communicator needs MPI initialised (and "
                                              "not yet finalised) before dt_comm_create");
        goto out;
    }
    DT_CHECK(dt_calloc(1, sizeof *n, "the nccl communicator", (void **)&n));
    n->world = MPI_COMM_NULL;
    n->base.ops = &nccl_ops;
    n->base.max_count = SIZE_MAX; /* NCCL counts are size_t */
    n->base.mpi_handle = &n->world;
    DT_CHECK(dt_mpi_bootstrap(&n->base, &n->world));
    DT_CHECK(agree(n, prepare_device(n), "prepare its GPU for NCCL"));
    DT_CHECK(start_nccl(n));
    DT_LOG_DEBUG("comm",
                 "nccl communicator: rank %d of %d, local %d of %d on %s, device %d, NCCL %d",
                 n->base.rank, n->base.size, n->base.local_rank, n->base.local_size, n->base.host,
                 n->device, NCCL_VERSION_CODE);
    *out = &n->base;
    n = NULL;
out:
    if (n) free_comm(n);
    return st;
}

#else /* NCCL older than 2.14: no non-blocking communicators */

dt_status dt_nccl_comm_create(dt_comm_t **out)
{
    *out = NULL;
    return dt_set_error(DT_ERR_UNSUPPORTED,
                        "this dtrain was built against NCCL %d.%d, but the nccl communicator "
                        "needs NCCL 2.14 or newer (non-blocking communicators); use the mpi "
                        "backend, or rebuild with a newer NCCL",
                        NCCL_MAJOR, NCCL_MINOR);
}

#endif
