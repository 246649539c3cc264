/*
 * comm_mpi.c - the "mpi" communicator: collectives on host buffers with
 * MPI.
 *
 * It works on a duplicate of MPI_COMM_WORLD whose error handler is
 * MPI_ERRORS_RETURN, so a failing MPI call comes back here and becomes
 * DT_ERR_COMM with the operation, the sizes, the rank and MPI's own text,
 * instead of killing the job from inside the library. MPI counts are ints:
 * larger calls are split into pieces of at most max_count elements
 * (non-blocking ones become one request per piece), except reduce-scatter,
 * whose strided layout would need derived datatypes in a reduction; it
 * refuses such sizes clearly. AVG is MPI_SUM followed by a division by the
 * world size, done when the data is final (after the wait for iallreduce).
 * dt_mpi_bootstrap (the duplicate, rank, node-local rank, host) is shared
 * with the nccl backend, which bootstraps over MPI the same way.
 *
 * Non-blocking all-reduces of fp32 or bf16 sums of at least ring_min_bytes
 * (the gradient buckets) run as a ring of point-to-point messages instead
 * of MPI_Iallreduce: a reduce-scatter of P chunks in P-1 steps, then an
 * all-gather in P-1 steps, each step one Isend to the right neighbour and
 * one Irecv from the left, advanced by test and wait. Each rank sends and
 * sums 1/P of the buffer per step, so the work is the same on every rank;
 * Open MPI's non-blocking all-reduce on few ranks reduces to one root and
 * broadcasts back, which leaves the root with the whole sum and the others
 * waiting (about twice the time of the ring for a 2.7 MB bucket on two
 * ranks of one node). Chunk c is summed in ring order starting at rank c
 * and then copied everywhere, so every rank gets the same bits and the sum
 * is the same run to run. The ring's messages go over a communicator of
 * their own, one tag per request, so buckets in flight together never
 * match each other's messages.
 *
 * With a timeout set (dt_comm_set_timeout), no wait is unbounded: the
 * blocking collectives run as their non-blocking forms, and every wait
 * polls MPI_Testall (yielding at first, then napping) until the requests
 * are done or the limit has passed, as the nccl backend does. A wait that
 * gives up fails with DT_ERR_TIMEOUT naming the collective, the limit and
 * the rank; the communicator is then broken (MPI cannot cancel a
 * collective): every later call fails at once with the same status, so the
 * caller gets to abort() without waiting again. Without a timeout the
 * blocking MPI calls are used as they are.
 */
#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/bf16.h"
#include "core/log.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "collectives/comm_impl.h"

#define RING_TAGS 32768 /* MPI guarantees tags up to 32767 */

/* A receive buffer of the ring, kept between steps so that a bucket's
 * megabytes are not mapped and faulted in again every step. */
struct scratch {
    void *p;
    size_t bytes;
    int busy;
};

struct mpi_comm {
    struct dt_comm base; /* first, so a dt_comm_t * is a struct mpi_comm * */
    MPI_Comm world;      /* duplicate of MPI_COMM_WORLD, errors return */
    MPI_Comm ring;       /* another duplicate, for the ring's messages */
    MPI_Op bf16_sum;     /* SUM on bf16 bits (MPI has no bf16 type) */
    int broken;          /* a wait timed out: collectives are out of step */
    unsigned ring_seq;   /* ring all-reduces started: the next tag */
    struct scratch *scratch; /* the ring's receive buffers, nscratch of them */
    int nscratch;
};

/* A bounded wait tests without pause (yielding the CPU) for its first
 * MPI_SPIN_S, then naps MPI_POLL_SLEEP_NS between tests. MPI progresses a
 * non-blocking collective only inside MPI calls, so the spin is what
 * MPI_Waitall itself does, and it covers an ordinary collective and the
 * usual imbalance between ranks; the naps spare the CPU in long waits. */
#define MPI_SPIN_S 0.1
#define MPI_POLL_SLEEP_NS 50000L

/* One iallreduce: a request per piece, and what AVG needs at the end; or,
 * when ring is set, the ring's state (parts[0..1]: the step's receive and
 * send). */
struct dt_comm_req {
    struct mpi_comm *owner;
    void *buf;
    size_t count;
    enum dt_dtype dtype;
    enum dt_comm_op op;
    int ring;         /* 1: the ring below, not MPI_Iallreduce */
    int tag, step;    /* ring: its tag; the next step (of 2(P-1) in all) */
    int end;          /* ring: the step it stops before (P-1 after a reduce-scatter) */
    int posted;       /* ring: parts hold the current step's requests */
    int tmp;          /* ring: its receive buffer in owner->scratch; -1: none */
    int nparts;
    MPI_Request parts[];
};

static struct mpi_comm *impl(dt_comm_t *c)
{
    return (struct mpi_comm *)c;
}

static MPI_Datatype mpi_dtype(enum dt_dtype t)
{
    switch (t) {
    case DT_F32:
        return MPI_FLOAT;
    case DT_F64:
        return MPI_DOUBLE;
    case DT_I32:
        return MPI_INT32_T;
    case DT_I64:
        return MPI_INT64_T;
    case DT_U8:
        return MPI_UINT8_T;
    case DT_BF16:
        return MPI_UINT16_T;
    default: /* check_reduce admits no other type */
        break;
    }
    DT_ASSERT(0 && "unknown dtype");
    return MPI_DATATYPE_NULL;
}

static const char *dtype_plural(enum dt_dtype t)
{
    static const char *const names[] = {"floats", "doubles", "int32s", "int64s", "bytes",
                                        "bf16s"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "elements";
}

/* inout[i] = bf16(inout[i] + in[i]): the sum in fp32, rounded once. */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type)
{
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = dt_bf16_from_float(dt_bf16_to_float(a[i]) + dt_bf16_to_float(b[i]));
}

/* comm.c lets only SUM through for bf16. */
static MPI_Op mpi_op(const struct mpi_comm *m, enum dt_comm_op op, enum dt_dtype t)
{
    if (t == DT_BF16)
        return m->bf16_sum;
    switch (op) {
    case DT_COMM_SUM:
    case DT_COMM_AVG:
        return MPI_SUM;
    case DT_COMM_MAX:
        return MPI_MAX;
    case DT_COMM_MIN:
        return MPI_MIN;
    }
    DT_ASSERT(0 && "unknown reduction");
    return MPI_OP_NULL;
}

/* Largest count one MPI call gets here. */
static size_t piece_limit(const dt_comm_t *c)
{
    DT_ASSERT(c->max_count > 0);
    return c->max_count < (size_t)INT_MAX ? c->max_count : (size_t)INT_MAX;
}

/* Records DT_ERR_COMM for a failed call: "<what> failed on rank R: <MPI's
 * text>", e.g. "MPI_Bcast of 64 bytes from root 3 failed on rank 1:
 * MPI_ERR_ROOT: invalid root". */
static dt_status __attribute__((format(printf, 3, 4)))
mpi_fail(int rc, int rank, const char *fmt, ...)
{
    char what[256], text[MPI_MAX_ERROR_STRING];
    int len = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error code %d", rc);
    return dt_set_error(DT_ERR_COMM, "%s failed on rank %d: %s", what, rank, text);
}

static dt_status check_rc(int rc, int rank, const char *what)
{
    return rc == MPI_SUCCESS ? DT_OK : mpi_fail(rc, rank, "%s", what);
}

dt_status dt_mpi_check(int rc, int rank, const char *what)
{
    return check_rc(rc, rank, what);
}

/* " (piece a..b of n)" when a call was split into pieces, else "". */
static const char *piece_note(char *buf, size_t len, size_t off, size_t n, size_t total)
{
    if (n == total) return "";
    snprintf(buf, len, " (piece %zu..%zu of %zu)", off, off + n, total);
    return buf;
}

static void scale_avg(void *buf, size_t count, enum dt_dtype t, int size)
{
    if (t == DT_F32) {
        float *p = buf, n = (float)size;
        for (size_t i = 0; i < count; i++)
            p[i] /= n;
    } else if (t == DT_F64) {
        double *p = buf, n = (double)size;
        for (size_t i = 0; i < count; i++)
            p[i] /= n;
    }
}

/* ---- bounded waits ---------------------------------------------------------- */

/* DT_ERR_TIMEOUT for any call on a communicator whose earlier wait timed
 * out. */
static dt_status check_broken(dt_comm_t *c, const char *call)
{
    if (!impl(c)->broken) return DT_OK;
    return dt_set_error(DT_ERR_TIMEOUT,
                        "%s on rank %d: refused, an earlier collective on this communicator "
                        "timed out and the ranks are out of step",
                        call, c->rank);
}

static dt_status timeout_fail(dt_comm_t *c, const char *what, double limit_s)
{
    impl(c)->broken = 1;
    return dt_set_error(DT_ERR_TIMEOUT,
                        "%s did not complete within %g s on rank %d (runtime.timeout_s; a peer "
                        "may have failed or stalled)",
                        what, limit_s, c->rank);
}

/* Completes n requests: MPI_Waitall without a timeout, else MPI_Testall
 * until done or past the limit. `what` names the collective for messages. */
static dt_status wait_reqs(dt_comm_t *c, int n, MPI_Request *reqs, const char *what)
{
    double limit = c->timeout_s;
    if (limit <= 0) {
        int rc = MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
        return rc == MPI_SUCCESS ? DT_OK : mpi_fail(rc, c->rank, "MPI_Waitall on %s", what);
    }
    double t0 = dt_now();
    for (;;) {
        int flag = 0;
        int rc = MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, c->rank, "MPI_Testall on %s", what);
        if (flag) return DT_OK;
        double waited = dt_now() - t0;
        if (waited > limit) return timeout_fail(c, what, limit);
        if (waited < MPI_SPIN_S) {
            sched_yield();
        } else {
            struct timespec nap = {0, MPI_POLL_SLEEP_NS};
            nanosleep(&nap, NULL);
        }
    }
}

/* A collective started as a non-blocking call (rc, *req), waited for
 * within the timeout. */
static dt_status bounded(dt_comm_t *c, int rc, MPI_Request *req, const char *what)
{
    if (rc != MPI_SUCCESS) return mpi_fail(rc, c->rank, "%s", what);
    return wait_reqs(c, 1, req, what);
}

/* ---- blocking collectives ----------------------------------------------- */

static dt_status mpi_allreduce(dt_comm_t *c, void *buf, size_t count, enum dt_dtype t,
                               enum dt_comm_op op)
{
    size_t lim = piece_limit(c), esz = dt_dtype_size(t);
    char note[96], what[192];
    dt_status st = check_broken(c, "MPI_Allreduce");
    for (size_t off = 0; off < count && st == DT_OK; off += lim) {
        size_t n = count - off < lim ? count - off : lim;
        void *p = (char *)buf + off * esz;
        MPI_Request req = MPI_REQUEST_NULL;
        snprintf(what, sizeof what, "MPI_Allreduce of %zu %s%s", n, dtype_plural(t),
                 piece_note(note, sizeof note, off, n, count));
        if (c->timeout_s > 0)
            st = bounded(c,
                         MPI_Iallreduce(MPI_IN_PLACE, p, (int)n, mpi_dtype(t),
                                        mpi_op(impl(c), op, t), impl(c)->world, &req),
                         &req, what);
        else
            st = check_rc(MPI_Allreduce(MPI_IN_PLACE, p, (int)n, mpi_dtype(t),
                                        mpi_op(impl(c), op, t), impl(c)->world),
                          c->rank, what);
    }
    if (st != DT_OK) return st;
    if (op == DT_COMM_AVG) scale_avg(buf, count, t, c->size);
    return DT_OK;
}

static dt_status mpi_broadcast(dt_comm_t *c, void *buf, size_t bytes, int root)
{
    size_t lim = piece_limit(c);
    char note[96], what[192];
    dt_status st = check_broken(c, "MPI_Bcast");
    for (size_t off = 0; off < bytes && st == DT_OK; off += lim) {
        size_t n = bytes - off < lim ? bytes - off : lim;
        MPI_Request req = MPI_REQUEST_NULL;
        snprintf(what, sizeof what, "MPI_Bcast of %zu bytes from root %d%s", n, root,
                 piece_note(note, sizeof note, off, n, bytes));
        if (c->timeout_s > 0)
            st = bounded(
                c, MPI_Ibcast((char *)buf + off, (int)n, MPI_BYTE, root, impl(c)->world, &req),
                &req, what);
        else
            st = check_rc(MPI_Bcast((char *)buf + off, (int)n, MPI_BYTE, root, impl(c)->world),
                          c->rank, what);
    }
    return st;
}

/* In pieces of at most piece_limit bytes each way, the same number of
 * calls on both sides of every pair (each side knows both sizes). */
static dt_status mpi_sendrecv(dt_comm_t *c, const void *send, size_t sbytes, int to, void *recv,
                              size_t rbytes, int from)
{
    size_t lim = piece_limit(c), most = sbytes > rbytes ? sbytes : rbytes;
    char what[192];
    dt_status st = check_broken(c, "MPI_Sendrecv");
    for (size_t off = 0; (off < most || off == 0) && st == DT_OK; off += lim) {
        size_t ns = off < sbytes ? (sbytes - off < lim ? sbytes - off : lim) : 0;
        size_t nr = off < rbytes ? (rbytes - off < lim ? rbytes - off : lim) : 0;
        snprintf(what, sizeof what, "MPI_Sendrecv of %zu bytes to rank %d and %zu from rank %d", ns,
                 to, nr, from);
        st = check_rc(MPI_Sendrecv((const char *)send + (ns ? off : 0), (int)ns, MPI_BYTE, to, 0,
                                   (char *)recv + (nr ? off : 0), (int)nr, MPI_BYTE, from, 0,
                                   impl(c)->world, MPI_STATUS_IGNORE),
                      c->rank, what);
        if (most == 0) break;
    }
    return st;
}

/* Bytes [off, off+n) of every rank's block: received through a datatype of
 * n bytes whose extent is a whole block, so rank r's piece lands at
 * r * bytes + off. */
static dt_status allgather_piece(dt_comm_t *c, const char *send, char *recv, size_t bytes,
                                 size_t off, size_t n)
{
    MPI_Datatype piece = MPI_DATATYPE_NULL, strided = MPI_DATATYPE_NULL;
    char note[96];
    int rc = MPI_Type_contiguous((int)n, MPI_BYTE, &piece);
    if (rc == MPI_SUCCESS) rc = MPI_Type_create_resized(piece, 0, (MPI_Aint)bytes, &strided);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&strided);
    dt_status st = check_rc(rc, c->rank, "creating the datatype for a split MPI_Allgather");
    if (st != DT_OK) goto out;
    char what[192];
    snprintf(what, sizeof what, "MPI_Allgather of %zu bytes per rank%s", n,
             piece_note(note, sizeof note, off, n, bytes));
    if (c->timeout_s > 0) {
        MPI_Request req = MPI_REQUEST_NULL;
        st = bounded(c,
                     MPI_Iallgather(send + off, (int)n, MPI_BYTE, recv + off, 1, strided,
                                    impl(c)->world, &req),
                     &req, what);
    } else {
        st = check_rc(
            MPI_Allgather(send + off, (int)n, MPI_BYTE, recv + off, 1, strided, impl(c)->world),
            c->rank, what);
    }
out:
    if (strided != MPI_DATATYPE_NULL) MPI_Type_free(&strided);
    if (piece != MPI_DATATYPE_NULL) MPI_Type_free(&piece);
    return st;
}

static dt_status mpi_allgather(dt_comm_t *c, const void *send, void *recv, size_t bytes)
{
    size_t lim = piece_limit(c);
    if (bytes == 0) return DT_OK;
    dt_status st = check_broken(c, "MPI_Allgather");
    if (st != DT_OK) return st;
    if (bytes > lim) {
        for (size_t off = 0; off < bytes && st == DT_OK; off += lim)
            st = allgather_piece(c, send, recv, bytes, off, bytes - off < lim ? bytes - off : lim);
        return st;
    }
    /* MPI forbids overlapping send and recv unless it is told so. */
    const void *s = send == (const char *)recv + (size_t)c->rank * bytes ? MPI_IN_PLACE : send;
    char what[96];
    snprintf(what, sizeof what, "MPI_Allgather of %zu bytes per rank", bytes);
    if (c->timeout_s > 0) {
        MPI_Request req = MPI_REQUEST_NULL;
        return bounded(c,
                       MPI_Iallgather(s, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE,
                                      impl(c)->world, &req),
                       &req, what);
    }
    return check_rc(
        MPI_Allgather(s, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, impl(c)->world),
        c->rank, what);
}

static dt_status mpi_reduce_scatter(dt_comm_t *c, const void *send, void *recv, size_t count,
                                    enum dt_dtype t, enum dt_comm_op op)
{
    size_t lim = piece_limit(c);
    if (count == 0) return DT_OK;
    dt_status st = check_broken(c, "MPI_Reduce_scatter_block");
    if (st != DT_OK) return st;
    if (count > lim)
        return dt_set_error(DT_ERR_UNSUPPORTED,
                            "dt_comm_reduce_scatter: %zu %s per rank is more than one MPI call "
                            "takes (%zu); split the call into smaller ones",
                            count, dtype_plural(t), lim);
    char what[128];
    snprintf(what, sizeof what, "MPI_Reduce_scatter_block of %zu %s per rank", count,
             dtype_plural(t));
    MPI_Op mop = mpi_op(impl(c), op, t);
    if (c->timeout_s > 0) {
        MPI_Request req = MPI_REQUEST_NULL;
        st = bounded(c,
                     MPI_Ireduce_scatter_block(send, recv, (int)count, mpi_dtype(t), mop,
                                               impl(c)->world, &req),
                     &req, what);
    } else {
        st = check_rc(MPI_Reduce_scatter_block(send, recv, (int)count, mpi_dtype(t), mop,
                                               impl(c)->world),
                      c->rank, what);
    }
    if (st != DT_OK) return st;
    if (op == DT_COMM_AVG) scale_avg(recv, count, t, c->size);
    return DT_OK;
}

static dt_status mpi_barrier(dt_comm_t *c)
{
    dt_status st = check_broken(c, "MPI_Barrier");
    if (st != DT_OK) return st;
    if (c->timeout_s > 0) {
        MPI_Request req = MPI_REQUEST_NULL;
        return bounded(c, MPI_Ibarrier(impl(c)->world, &req), &req, "MPI_Barrier");
    }
    return check_rc(MPI_Barrier(impl(c)->world), c->rank, "MPI_Barrier");
}

/* ---- the ring all-reduce --------------------------------------------- */

/* Frees a request, giving a ring's receive buffer back. */
static void req_free(dt_comm_req_t *r)
{
    if (r->ring && r->tmp >= 0)
        r->owner->scratch[r->tmp].busy = 0;
    free(r);
}

/* First element of chunk k of the ring's P chunks of r's buffer. */
static size_t chunk_lo(const dt_comm_req_t *r, int k)
{
    return dt_ring_chunk_start(r->count, r->owner->base.size, k);
}

static int mod(int a, int p)
{
    return ((a % p) + p) % p;
}

/* The chunks rank `rank` sends and receives at ring step s: the
 * reduce-scatter for s < P-1 (after it, rank r holds the sum of chunk
 * r+1), the all-gather after. */
static void ring_chunks(int rank, int p, int s, int *send, int *recv)
{
    if (s < p - 1) {
        *send = mod(rank - s, p);
        *recv = mod(rank - s - 1, p);
    } else {
        int t = s - (p - 1);
        *send = mod(rank + 1 - t, p);
        *recv = mod(rank - t, p);
    }
}

/* A receive buffer of at least `bytes`, reused when one is free; the pool
 * grows with the requests in flight at once. Sets *out to its index. */
static dt_status take_scratch(struct mpi_comm *m, size_t bytes, int *out)
{
    int pick = -1;
    for (int i = 0; i < m->nscratch; i++) {
        struct scratch *s = &m->scratch[i];
        if (s->busy)
            continue;
        if (s->bytes >= bytes) {
            pick = i;
            break;
        }
        if (pick < 0 || s->bytes > m->scratch[pick].bytes)
            pick = i;
    }
    dt_status st = DT_OK;
    if (pick < 0) {
        struct scratch *more = realloc(m->scratch, ((size_t)m->nscratch + 1) * sizeof *more);
        if (!more)
            return dt_set_error(DT_ERR_NOMEM, "out of memory for the ring all-reduce's buffers");
        m->scratch = more;
        m->scratch[m->nscratch] = (struct scratch){0};
        pick = m->nscratch++;
    }
    struct scratch *s = &m->scratch[pick];
    if (s->bytes < bytes) {
        free(s->p);
        s->p = NULL;
        s->bytes = 0;
        DT_CHECK(dt_malloc(bytes ? bytes : 1, "the ring all-reduce's receive buffer", &s->p));
        s->bytes = bytes;
    }
    s->busy = 1;
    *out = pick;
out:
    return st;
}

/* Posts step r->step's receive (from the left) and send (to the right). */
static dt_status ring_post(dt_comm_t *c, dt_comm_req_t *r)
{
    struct mpi_comm *m = impl(c);
    int p = c->size, sc, rc;
    size_t esz = dt_dtype_size(r->dtype);
    ring_chunks(c->rank, p, r->step, &sc, &rc);
    size_t rlo = chunk_lo(r, rc), rn = chunk_lo(r, rc + 1) - rlo;
    size_t slo = chunk_lo(r, sc), sn = chunk_lo(r, sc + 1) - slo;
    void *into = r->step < p - 1 ? m->scratch[r->tmp].p : (char *)r->buf + rlo * esz;
    MPI_Datatype t = mpi_dtype(r->dtype);
    int rcv = MPI_Irecv(into, (int)rn, t, mod(c->rank - 1, p), r->tag, m->ring, &r->parts[0]);
    if (rcv != MPI_SUCCESS)
        return mpi_fail(rcv, c->rank, "MPI_Irecv of step %d of a ring all-reduce of %zu %s",
                        r->step + 1, r->count, dtype_plural(r->dtype));
    int snd = MPI_Isend((char *)r->buf + slo * esz, (int)sn, t, mod(c->rank + 1, p), r->tag,
                        m->ring, &r->parts[1]);
    if (snd != MPI_SUCCESS) {
        MPI_Cancel(&r->parts[0]);
        MPI_Request_free(&r->parts[0]);
        return mpi_fail(snd, c->rank, "MPI_Isend of step %d of a ring all-reduce of %zu %s",
                        r->step + 1, r->count, dtype_plural(r->dtype));
    }
    r->posted = 1;
    return DT_OK;
}

/* d += a over n floats, built for AVX-512, AVX2 and the baseline (picked
 * at load time): it runs over every chunk the ring receives. */
__attribute__((target_clones("avx512f", "avx2", "default"))) static void
add_f32(float *restrict d, const float *restrict a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] += a[i];
}

/* dst += src over n elements: fp32, or bf16 summed in fp32 and rounded. */
static void ring_add(enum dt_dtype t, void *dst, void *src, size_t n)
{
    if (t == DT_BF16) {
        int len = (int)n;
        bf16_sum(src, dst, &len, NULL);
        return;
    }
    add_f32(dst, src, n);
}

/* "step S of N of a ring all-reduce of C floats", for waits and errors. */
static const char *ring_what(const dt_comm_req_t *r, int steps, char *buf, size_t len)
{
    snprintf(buf, len, "step %d of %d of a ring all-reduce of %zu %s", r->step + 1, steps,
             r->count, dtype_plural(r->dtype));
    return buf;
}

/* Advances the ring as far as it can: waiting for each step when `block`,
 * else only through steps already complete. *done = 1 when every step is. */
static dt_status ring_advance(dt_comm_t *c, dt_comm_req_t *r, int block, int *done)
{
    int p = c->size, steps = 2 * (p - 1);
    *done = 0;
    while (r->step < r->end) {
        if (!r->posted) {
            dt_status st = ring_post(c, r);
            if (st != DT_OK)
                return st;
        }
        char what[128];
        if (block) {
            ring_what(r, steps, what, sizeof what);
            dt_status st = wait_reqs(c, 2, r->parts, what);
            if (st != DT_OK)
                return st;
        } else {
            int flag = 0, rc = MPI_Testall(2, r->parts, &flag, MPI_STATUSES_IGNORE);
            if (rc != MPI_SUCCESS)
                return mpi_fail(rc, c->rank, "MPI_Testall on %s",
                                ring_what(r, steps, what, sizeof what));
            if (!flag)
                return DT_OK;
        }
        r->posted = 0;
        if (r->step < p - 1) {
            int sc, rcv;
            ring_chunks(c->rank, p, r->step, &sc, &rcv);
            size_t lo = chunk_lo(r, rcv), esz = dt_dtype_size(r->dtype);
            ring_add(r->dtype, (char *)r->buf + lo * esz, r->owner->scratch[r->tmp].p,
                     chunk_lo(r, rcv + 1) - lo);
        }
        r->step++;
    }
    *done = 1;
    return DT_OK;
}

/* Starts steps [first, end) of a ring all-reduce; the first is posted at
 * once. */
static dt_status ring_start(dt_comm_t *c, void *buf, size_t count, enum dt_dtype t,
                            enum dt_comm_op op, int first, int end, dt_comm_req_t **out)
{
    struct mpi_comm *m = impl(c);
    dt_comm_req_t *r = NULL;
    dt_status st = DT_OK;
    DT_CHECK(dt_malloc(sizeof *r + 2 * sizeof(MPI_Request), "an allreduce request", (void **)&r));
    *r = (struct dt_comm_req){.owner = m,
                              .buf = buf,
                              .count = count,
                              .dtype = t,
                              .op = op,
                              .ring = 1,
                              .tag = (int)(m->ring_seq++ % RING_TAGS),
                              .step = first,
                              .end = end,
                              .tmp = -1,
                              .nparts = 2};
    if (first < c->size - 1) { /* a reduce-scatter step needs a receive buffer */
        size_t most = count / (size_t)c->size + 1;
        DT_CHECK(take_scratch(m, most * dt_dtype_size(t), &r->tmp));
    }
    if (first < end)
        DT_CHECK(ring_post(c, r));
    *out = r;
    r = NULL;
out:
    if (r)
        req_free(r);
    return st;
}

/* One part of the ring on its own (see comm.h). */
static dt_status mpi_iring(dt_comm_t *c, void *buf, size_t count, enum dt_dtype t,
                           enum dt_comm_ring_part part, dt_comm_req_t **out)
{
    dt_status st = check_broken(c, "a ring all-reduce");
    if (st != DT_OK) return st;
    if (count > piece_limit(c))
        return dt_set_error(DT_ERR_UNSUPPORTED,
                            "dt_comm_iring: %zu %s are more than one MPI call takes (%zu)", count,
                            dtype_plural(t), piece_limit(c));
    int p = c->size;
    int first = part == DT_RING_ALLGATHER ? p - 1 : 0;
    int end = part == DT_RING_REDUCE_SCATTER ? p - 1 : 2 * (p - 1);
    return ring_start(c, buf, count, t, DT_COMM_SUM, first, end, out);
}

/* ---- non-blocking allreduce --------------------------------------------- */

static dt_status mpi_iallreduce(dt_comm_t *c, void *buf, size_t count, enum dt_dtype t,
                                enum dt_comm_op op, dt_comm_req_t **out)
{
    size_t lim = piece_limit(c), esz = dt_dtype_size(t);
    size_t nparts = count / lim + (count % lim != 0);
    dt_comm_req_t *r = NULL;
    int started = 0;
    char note[96];
    dt_status st = check_broken(c, "MPI_Iallreduce");
    if (st != DT_OK) return st;
    if (c->size > 1 && (t == DT_F32 || t == DT_BF16) && (op == DT_COMM_SUM || op == DT_COMM_AVG) &&
        count <= lim && count * esz >= c->ring_min_bytes)
        return ring_start(c, buf, count, t, op, 0, 2 * (c->size - 1), out);
    if (nparts > (size_t)INT_MAX) {
        st = dt_set_error(DT_ERR_UNSUPPORTED, "dt_comm_iallreduce: %zu %s need too many pieces",
                          count, dtype_plural(t));
        goto out;
    }
    DT_CHECK(
        dt_malloc(sizeof *r + nparts * sizeof(MPI_Request), "an allreduce request", (void **)&r));
    *r = (struct dt_comm_req){
        .owner = impl(c), .buf = buf, .count = count, .dtype = t, .op = op, .nparts = (int)nparts};
    for (size_t off = 0; off < count; off += lim, started++) {
        size_t n = count - off < lim ? count - off : lim;
        int rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + off * esz, (int)n, mpi_dtype(t),
                                mpi_op(impl(c), r->op, r->dtype), impl(c)->world,
                                &r->parts[started]);
        if (rc != MPI_SUCCESS) {
            st = mpi_fail(rc, c->rank, "MPI_Iallreduce of %zu %s%s", n, dtype_plural(t),
                          piece_note(note, sizeof note, off, n, count));
            goto out;
        }
    }
    *out = r;
    r = NULL;
out:
    if (r) {
        MPI_Waitall(started, r->parts, MPI_STATUSES_IGNORE);
        free(r);
    }
    return st;
}

/* Completes a request whose pieces have all finished. */
static void req_done(dt_comm_t *c, dt_comm_req_t *r)
{
    if (r->op == DT_COMM_AVG) scale_avg(r->buf, r->count, r->dtype, c->size);
    req_free(r);
}

static dt_status req_fail(dt_comm_t *c, dt_comm_req_t *r, int rc, const char *call)
{
    dt_status st = mpi_fail(rc, c->rank, "%s on an MPI_Iallreduce of %zu %s", call, r->count,
                            dtype_plural(r->dtype));
    req_free(r);
    return st;
}

/* A ring request's test or wait: done or failed, the request is freed. */
static dt_status ring_finish(dt_comm_t *c, dt_comm_req_t *r, int block, int *done)
{
    dt_status st = ring_advance(c, r, block, done);
    if (st != DT_OK)
        req_free(r);
    else if (*done)
        req_done(c, r);
    return st;
}

/* A request on a broken communicator is dropped without waiting: its
 * collective will not complete, and the job is about to be aborted. */
static dt_status req_drop(dt_comm_t *c, dt_comm_req_t *r, const char *call)
{
    req_free(r);
    return check_broken(c, call);
}

static dt_status mpi_test(dt_comm_t *c, dt_comm_req_t *r, int *done)
{
    DT_ASSERT(r->owner == impl(c));
    if (impl(c)->broken) return req_drop(c, r, "MPI_Testall");
    if (r->ring)
        return ring_finish(c, r, 0, done);
    int flag = 0;
    int rc = MPI_Testall(r->nparts, r->parts, &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return req_fail(c, r, rc, "MPI_Testall");
    if (flag) {
        req_done(c, r);
        *done = 1;
    }
    return DT_OK;
}

static dt_status mpi_wait(dt_comm_t *c, dt_comm_req_t *r)
{
    DT_ASSERT(r->owner == impl(c));
    if (impl(c)->broken) return req_drop(c, r, "MPI_Waitall");
    if (r->ring) {
        int done = 0;
        return ring_finish(c, r, 1, &done);
    }
    char what[128];
    snprintf(what, sizeof what, "an MPI_Iallreduce of %zu %s", r->count, dtype_plural(r->dtype));
    dt_status st = wait_reqs(c, r->nparts, r->parts, what);
    if (st != DT_OK) {
        req_free(r);
        return st;
    }
    req_done(c, r);
    return DT_OK;
}

/* ---- life cycle ----------------------------------------------------------- */

int dt_mpi_usable(void)
{
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

int dt_mpi_thread_multiple(void)
{
    int level = MPI_THREAD_SINGLE;
    return dt_mpi_usable() && MPI_Query_thread(&level) == MPI_SUCCESS &&
           level == MPI_THREAD_MULTIPLE;
}

static void mpi_abort(dt_comm_t *c, int exit_code)
{
    if (dt_mpi_usable()) MPI_Abort(impl(c)->world, exit_code);
}

static void free_comm(struct mpi_comm *m)
{
    if (dt_mpi_usable() && m->bf16_sum != MPI_OP_NULL)
        MPI_Op_free(&m->bf16_sum);
    /* after a timeout a collective is still pending on the duplicates:
     * freeing them could wait for it */
    if (dt_mpi_usable() && m->ring != MPI_COMM_NULL && !m->broken &&
        MPI_Comm_free(&m->ring) != MPI_SUCCESS)
        DT_LOG_WARN("comm", "MPI_Comm_free of the ring's duplicate failed");
    for (int i = 0; i < m->nscratch; i++)
        free(m->scratch[i].p);
    free(m->scratch);
    if (dt_mpi_usable() && m->world != MPI_COMM_NULL && !m->broken &&
        MPI_Comm_free(&m->world) != MPI_SUCCESS)
        DT_LOG_WARN("comm", "MPI_Comm_free of the world duplicate failed");
    free(m);
}

static void mpi_destroy(dt_comm_t *c)
{
    free_comm(impl(c));
}

static const struct dt_comm_ops mpi_ops = {
    .name = "mpi",
    .allreduce = mpi_allreduce,
    .iallreduce = mpi_iallreduce,
    .iring = mpi_iring,
    .test = mpi_test,
    .wait = mpi_wait,
    .broadcast = mpi_broadcast,
    .allgather = mpi_allgather,
    .reduce_scatter = mpi_reduce_scatter,
    .barrier = mpi_barrier,
    .sendrecv = mpi_sendrecv,
    .abort = mpi_abort,
    .destroy = mpi_destroy,
    .caps = &dt_mpi_comm_caps,
};

/* The ranks that share this node's memory: local rank and size. */
static dt_status read_local(dt_comm_t *c, MPI_Comm world)
{
    MPI_Comm local = MPI_COMM_NULL;
    dt_status st;
    DT_CHECK(
        check_rc(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &local),
                 c->rank, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)"));
    DT_CHECK(check_rc(MPI_Comm_set_errhandler(local, MPI_ERRORS_RETURN), c->rank,
                      "MPI_Comm_set_errhandler"));
    DT_CHECK(check_rc(MPI_Comm_rank(local, &c->local_rank), c->rank, "MPI_Comm_rank"));
    DT_CHECK(check_rc(MPI_Comm_size(local, &c->local_size), c->rank, "MPI_Comm_size"));
out:
    if (local != MPI_COMM_NULL && MPI_Comm_free(&local) != MPI_SUCCESS)
        DT_LOG_WARN("comm", "MPI_Comm_free of the node-local communicator failed");
    return st;
}

_Static_assert(MPI_MAX_PROCESSOR_NAME <= DT_COMM_HOST_MAX, "host name buffer too small");

static dt_status read_host(dt_comm_t *c)
{
    int len = 0;
    memset(c->host, 0, sizeof c->host);
    return check_rc(MPI_Get_processor_name(c->host, &len), c->rank, "MPI_Get_processor_name");
}

dt_status dt_mpi_bootstrap(dt_comm_t *c, void *world)
{
    MPI_Comm *w = world;
    dt_status st;
    *w = MPI_COMM_NULL;
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank); /* for messages until the dup exists */
    DT_CHECK(check_rc(MPI_Comm_dup(MPI_COMM_WORLD, w), c->rank, "MPI_Comm_dup of MPI_COMM_WORLD"));
    DT_CHECK(check_rc(MPI_Comm_set_errhandler(*w, MPI_ERRORS_RETURN), c->rank,
                      "MPI_Comm_set_errhandler"));
    DT_CHECK(check_rc(MPI_Comm_rank(*w, &c->rank), c->rank, "MPI_Comm_rank"));
    DT_CHECK(check_rc(MPI_Comm_size(*w, &c->size), c->rank, "MPI_Comm_size"));
    DT_CHECK(read_local(c, *w));
    DT_CHECK(read_host(c));
out:
    return st;
}

dt_status dt_mpi_comm_create(dt_comm_t **out)
{
    struct mpi_comm *m = NULL;
    dt_status st = DT_OK;
    *out = NULL;
    if (!dt_mpi_usable()) {
        st = dt_set_error(DT_ERR_INVALID_ARG, "the mpi communicator needs MPI initialised (and "
                                              "not yet finalised) before dt_comm_create");
        goto out;
    }
    DT_CHECK(dt_calloc(1, sizeof *m, "the mpi communicator", (void **)&m));
    m->world = MPI_COMM_NULL;
    m->ring = MPI_COMM_NULL;
    m->bf16_sum = MPI_OP_NULL;
    m->base.ops = &mpi_ops;
    m->base.max_count = INT_MAX;
    m->base.ring_min_bytes = DT_COMM_RING_MIN_BYTES;
    m->base.mpi_handle = &m->world;
    DT_CHECK(dt_mpi_bootstrap(&m->base, &m->world));
    m->base.abort_any_thread = dt_mpi_thread_multiple();
    if (MPI_Op_create(bf16_sum, 1, &m->bf16_sum) != MPI_SUCCESS) {
        m->bf16_sum = MPI_OP_NULL;
        st = dt_set_error(DT_ERR_COMM, "MPI_Op_create of the bf16 sum failed");
        goto out;
    }
    DT_CHECK(check_rc(MPI_Comm_dup(m->world, &m->ring), m->base.rank,
                      "MPI_Comm_dup for the ring all-reduce"));
    DT_LOG_DEBUG("comm", "mpi communicator: rank %d of %d, local %d of %d on %s", m->base.rank,
                 m->base.size, m->base.local_rank, m->base.local_size, m->base.host);
    *out = &m->base;
    m = NULL;
out:
    if (m) free_comm(m);
    return st;
}
