/*
 * reducer.c - the gradient reducer: sums the flat fp32 gradient buffer over
 * all ranks in buckets, overlapping communication with backward.
 *
 * The bucket plan is fixed at creation and is a pure function of the
 * buffer size and the options, so every rank cuts the buffer the same way
 * and starts the same all-reduces in the same order. That order is what
 * MPI requires of collectives, and it makes the sums bit-identical run to
 * run for one world size, whatever the timing of ready() calls on each
 * rank. Gradients arrive pre-scaled, so the reduction is a plain SUM.
 * With a bf16 wire each bucket is packed right before its all-reduce and
 * unpacked as soon as it completes, so the fp32 buffer is final after
 * finish() either way.
 *
 * Sharded (opts.shard, communicators with a ring): each bucket is only
 * reduce-scattered, so after finish() this rank holds the sum of its own
 * chunk of every bucket (dt_reducer_owned) and partial sums elsewhere; the
 * optimizer updates those chunks only, and dt_reducer_gather then copies
 * every rank's updated chunks to all (the ring's all-gather, on the
 * parameters instead of the gradients). The traffic is an all-reduce's,
 * and each rank's optimizer work is 1/N of the model's.
 *
 * Sharded gradients (opts.shard_grads) go one step further: there is no
 * flat gradient buffer. Buckets end at parameter boundaries, and each
 * bucket gets a place in a staging area when backward places its first
 * parameter (dt_reducer_place, zeroed then), keeps it while layers add
 * into it, and gives it back once its reduce-scatter has completed and
 * this rank's chunk has been copied (first micro-batch) or added (later
 * ones) into the packed shard of summed gradients. Every micro-batch is
 * reduced, so nothing outlives a backward but the shard.
 *   The staging area is a ring: a bucket goes at the cursor, or past the
 * buckets still being written; buckets whose reduce-scatter is in flight
 * are waited for (oldest first) when their place is needed. Where nothing
 * in flight would make room, the area grows (after waiting for the
 * buckets in flight, since their requests point into it) to what the
 * buckets being written need plus one bucket of room for the one in
 * flight. Where a bucket goes depends only on the order of the calls,
 * never on timing, so the first step sizes the area for every later one
 * (a tied parameter, placed early by the layer that shares it and final
 * only at its owner, simply stays live meanwhile).
 *
 * State per step: buckets [0, next) have been started; reqs[k] is non-NULL
 * while bucket k is in flight; buckets before `oldest` are all complete.
 */
#include "reducer.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/alloc.h"
#include "core/clock.h"

#define MIB_BYTES 1048576.0
#define GRAD_BYTES 4.0 /* fp32 */

struct dt_reducer {
    dt_comm_t *comm;
    float *grads;
    size_t total;
    int overlap;
    struct dt_reducer_wire wire; /* wire.pack NULL: fp32 on the wire */
    size_t nbuckets;
    size_t *start;        /* nbuckets + 1 offsets; start[nbuckets] == total */
    dt_comm_req_t **reqs; /* per bucket, non-NULL while in flight */
    size_t next;          /* first bucket not yet started */
    size_t oldest;        /* first bucket that may still be in flight */
    int in_step;          /* between begin() and finish() */
    int shard;            /* reduce-scatter only: see the file comment */
    /* sharded gradients (see the file comment) */
    int shard_grads;
    float *stage; /* the staging area, cap floats */
    size_t cap, cursor, room;
    size_t *at;            /* per bucket: its place in the staging area */
    unsigned char *state;  /* per bucket: enum bucket_state */
    float *sgrad;          /* this rank's chunks of the summed gradients, packed */
    size_t nsgrad, *sbase; /* per bucket: where its chunk starts in sgrad */
    int acc;               /* micro-batches reduced since dt_reducer_clear */
    int gathering;         /* the requests are dt_reducer_gather's, not buckets' */
    /* sharded parameters (see "sharded parameters" below) */
    int shard_params;
    float *sparam;          /* this rank's chunks of the parameters, packed as sgrad */
    struct pslot *slots;    /* gather slots, nslots of them (at most nbuckets) */
    size_t nslots;
    size_t *slot_of;        /* per bucket: the slot holding it, or NO_SLOT */
    uint64_t tick;          /* fetches so far: a slot's age */
};

/* A gather slot: one bucket of parameters gathered from every rank. */
struct pslot {
    float *buf;
    size_t cap;            /* floats */
    size_t bucket;         /* the bucket it holds, or NO_SLOT */
    dt_comm_req_t *req;    /* its all-gather while in flight */
    int pinned;            /* fetched since the last release */
    int fresh;             /* gathered ahead and not fetched since */
    uint64_t used;         /* tick of its last fetch */
};

#define NO_SLOT SIZE_MAX
#define MIN_SLOTS 3 /* the layer running, the next one, one kept */

/* A bucket in one micro-batch of sharded gradients. */
enum bucket_state {
    B_IDLE, /* no place yet */
    B_LIVE, /* placed, layers may still add into it */
    B_SENT, /* its reduce-scatter started */
    B_DONE  /* summed and copied out; its place is free */
};

#define STAGE_ALIGN 64 /* floats: every bucket's place starts on 256 bytes */

size_t dt_bucket_plan(size_t total, size_t first_elems, size_t bucket_elems, size_t *offsets,
                      size_t max)
{
    /* Zero-sized buckets would never cover anything: treat them as 1. */
    size_t first = first_elems ? first_elems : 1, bucket = bucket_elems ? bucket_elems : 1;
    if (total == 0) return 0;
    size_t rest = total > first ? total - first : 0;
    size_t n = 1 + rest / bucket + (rest % bucket != 0);
    for (size_t k = 0; k < n && k < max; k++)
        offsets[k] = k == 0 ? 0 : first + (k - 1) * bucket;
    return n;
}

size_t dt_bucket_plan_cuts(size_t total, const size_t *cuts, size_t ncuts, size_t first_elems,
                           size_t bucket_elems, size_t *offsets, size_t max)
{
    size_t n = 0, lo = 0, want = first_elems ? first_elems : 1;
    if (total == 0) return 0;
    for (size_t i = 0; i <= ncuts; i++) {
        size_t c = i < ncuts ? cuts[i] : total; /* the end closes the last bucket */
        if (c <= lo || c > total) continue;
        if (c - lo < want && i < ncuts) continue;
        if (n < max) offsets[n] = lo;
        n++;
        lo = c;
        want = bucket_elems ? bucket_elems : 1;
    }
    return n;
}

/* Elements of fp32 in `mb` MiB, at least 1. */
static size_t mib_to_elems(double mb)
{
    double e = mb * MIB_BYTES / GRAD_BYTES;
    if (!(e >= 1.0)) return 1;
    if (e >= (double)SIZE_MAX) return SIZE_MAX;
    return (size_t)e;
}

static dt_status check_opts(const float *grads, size_t total, const struct dt_reducer_opts *o)
{
    if (!grads && total > 0 && !o->shard_grads)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "gradient reducer: the gradient buffer is NULL "
                            "but has %zu elements",
                            total);
    if (o->shard_params && !o->shard_grads)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "gradient reducer: sharded parameters take sharded gradients");
    if (o->shard_grads && (!o->shard || (!o->param_off && o->nparams > 0)))
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "gradient reducer: sharded gradients take a sharded update and the "
                            "parameters' offsets");
    if (!(o->bucket_mb > 0) || !isfinite(o->bucket_mb))
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "gradient reducer: comm.bucket_mb is %g; it must be a positive "
                            "number of MiB",
                            o->bucket_mb);
    if (o->wire && (!o->wire->pack || !o->wire->unpack || (!o->wire->wire && total > 0)))
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "gradient reducer: a bf16 wire needs pack, unpack and a buffer");
    if (o->shard && o->wire)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "gradient reducer: a sharded update takes fp32 gradients on the wire");
    if (!(o->first_bucket_mb > 0) || !(o->first_bucket_mb <= o->bucket_mb))
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "gradient reducer: the first bucket (%g MiB) must be positive and "
                            "no larger than comm.bucket_mb (%g MiB)",
                            o->first_bucket_mb, o->bucket_mb);
    return DT_OK;
}

static int by_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

/* Sharded gradients: the per-bucket tables and the packed shard; the
 * staging area itself starts empty and grows in the first step, leaving
 * `room` floats for the bucket in flight. */
static dt_status open_staging(dt_reducer_t *r, size_t room)
{
    size_t n = r->nbuckets;
    dt_status st;
    r->shard_grads = 1;
    r->room = room;
    DT_CHECK(dt_calloc(n + 1, sizeof *r->at, "gradient staging", (void **)&r->at));
    DT_CHECK(dt_calloc(n + 1, sizeof *r->state, "gradient staging", (void **)&r->state));
    DT_CHECK(dt_calloc(n + 1, sizeof *r->sbase, "gradient staging", (void **)&r->sbase));
    for (size_t k = 0; k < n; k++) {
        size_t lo, hi;
        dt_reducer_owned(r, k, &lo, &hi);
        r->sbase[k] = r->nsgrad;
        r->nsgrad += hi - lo;
    }
    st = dt_calloc(r->nsgrad + 1, sizeof *r->sgrad, "this rank's shard of the gradients",
                   (void **)&r->sgrad);
out:
    return st;
}

/* Sharded parameters: the packed shard and the slot tables. */
static dt_status open_params(dt_reducer_t *r)
{
    dt_status st;
    r->shard_params = 1;
    DT_CHECK(dt_calloc(r->nsgrad + 1, sizeof *r->sparam, "this rank's shard of the parameters",
                       (void **)&r->sparam));
    DT_CHECK(dt_calloc(r->nbuckets + 1, sizeof *r->slots, "parameter gather slots",
                       (void **)&r->slots));
    DT_CHECK(dt_calloc(r->nbuckets + 1, sizeof *r->slot_of, "parameter gather slots",
                       (void **)&r->slot_of));
    for (size_t k = 0; k < r->nbuckets; k++)
        r->slot_of[k] = NO_SLOT;
    for (size_t i = 0; i <= r->nbuckets; i++)
        r->slots[i].bucket = NO_SLOT;
out:
    return st;
}

dt_status dt_reducer_create(dt_comm_t *c, float *grads, size_t total,
                            const struct dt_reducer_opts *o, dt_reducer_t **out)
{
    dt_reducer_t *r = NULL;
    size_t *cuts = NULL;
    *out = NULL;
    dt_status st = check_opts(grads, total, o);
    if (st != DT_OK) goto out;
    if (o->shard && !dt_comm_has_ring(c)) {
        st = dt_set_error(DT_ERR_UNSUPPORTED,
                          "gradient reducer: the %s communicator cannot reduce-scatter buckets "
                          "for a sharded update",
                          dt_comm_backend(c));
        goto out;
    }
    size_t first = mib_to_elems(o->first_bucket_mb), bucket = mib_to_elems(o->bucket_mb);
    if (o->shard_grads) {
        DT_CHECK(dt_calloc(o->nparams + 1, sizeof *cuts, "gradient bucket cuts", (void **)&cuts));
        memcpy(cuts, o->param_off, o->nparams * sizeof *cuts);
        qsort(cuts, o->nparams, sizeof *cuts, by_size);
    }
    size_t n = o->shard_grads ? dt_bucket_plan_cuts(total, cuts, o->nparams, first, bucket, NULL, 0)
                              : dt_bucket_plan(total, first, bucket, NULL, 0);
    if (n > DT_REDUCER_MAX_BUCKETS) {
        st = dt_set_error(DT_ERR_INVALID_ARG,
                          "gradient reducer: %zu gradients in buckets of %g MiB make %zu "
                          "buckets, more than the %d allowed; raise comm.bucket_mb",
                          total, o->bucket_mb, n, DT_REDUCER_MAX_BUCKETS);
        goto out;
    }
    DT_CHECK(dt_calloc(1, sizeof *r, "the gradient reducer", (void **)&r));
    DT_CHECK(dt_calloc(n + 1, sizeof *r->start, "gradient bucket offsets", (void **)&r->start));
    DT_CHECK(dt_calloc(n + 1, sizeof *r->reqs, "gradient bucket requests", (void **)&r->reqs));
    *r = (struct dt_reducer){.comm = c,
                             .grads = grads,
                             .total = total,
                             .overlap = o->overlap,
                             .shard = o->shard,
                             .wire = o->wire ? *o->wire : (struct dt_reducer_wire){0},
                             .nbuckets = n,
                             .start = r->start,
                             .reqs = r->reqs};
    if (o->shard_grads)
        dt_bucket_plan_cuts(total, cuts, o->nparams, first, bucket, r->start, n);
    else
        dt_bucket_plan(total, first, bucket, r->start, n);
    r->start[n] = total;
    if (o->shard_grads) DT_CHECK(open_staging(r, bucket));
    if (o->shard_params) DT_CHECK(open_params(r));
    DT_LOG_DEBUG("comm", "gradient reducer: %zu floats in %zu buckets (first %zu, then %zu)", total,
                 n, first, bucket);
    *out = r;
    r = NULL;
out:
    free(cuts);
    dt_reducer_destroy(r);
    return st;
}

size_t dt_reducer_bucket_count(const dt_reducer_t *r)
{
    return r->nbuckets;
}

void dt_reducer_bucket(const dt_reducer_t *r, size_t k, size_t *lo, size_t *hi)
{
    *lo = r->start[k];
    *hi = r->start[k + 1];
}

static dt_status bucket_error(const dt_reducer_t *r, dt_status st, size_t k)
{
    return dt_error_context(st, "gradient bucket %zu of %zu (elements %zu..%zu)", k, r->nbuckets,
                            r->start[k], r->start[k + 1]);
}

static dt_status stage_alloc(dt_reducer_t *r, size_t k);
static dt_status slots_progress(dt_reducer_t *r);

static dt_status start_bucket(dt_reducer_t *r)
{
    size_t k = r->next, lo = r->start[k], hi = r->start[k + 1];
    dt_status st = DT_OK;
    if (r->shard_grads) { /* no layer placed it (empty batch, failure): zeros */
        if (r->state[k] == B_IDLE) st = stage_alloc(r, k);
        if (st == DT_OK)
            st = dt_comm_iring(r->comm, r->stage + r->at[k], hi - lo, DT_F32,
                               DT_RING_REDUCE_SCATTER, &r->reqs[k]);
        if (st == DT_OK) r->state[k] = B_SENT;
    } else if (r->wire.pack) {
        st = r->wire.pack(r->wire.ctx, r->wire.wire + lo, r->grads + lo, hi - lo);
        if (st == DT_OK)
            st = dt_comm_iallreduce(r->comm, r->wire.wire + lo, hi - lo, DT_BF16,
                                    DT_COMM_SUM, &r->reqs[k]);
    } else if (r->shard) {
        st = dt_comm_iring(r->comm, r->grads + lo, hi - lo, DT_F32, DT_RING_REDUCE_SCATTER,
                           &r->reqs[k]);
    } else {
        st = dt_comm_iallreduce(r->comm, r->grads + lo, hi - lo, DT_F32, DT_COMM_SUM,
                                &r->reqs[k]);
    }
    if (st != DT_OK) return bucket_error(r, st, k);
    r->next = k + 1;
    return DT_OK;
}

/* Bucket k's sum has arrived: widen it back from the wire. */
static dt_status bucket_done(dt_reducer_t *r, size_t k)
{
    size_t lo = r->start[k], hi = r->start[k + 1];
    if (r->gathering) return DT_OK;
    if (r->shard_grads) { /* this rank's chunk into the shard */
        size_t a, b;
        dt_reducer_owned(r, k, &a, &b);
        const float *src = r->stage + r->at[k] + (a - lo);
        float *dst = r->sgrad + r->sbase[k];
        if (r->acc == 0)
            memcpy(dst, src, (b - a) * sizeof *dst);
        else
            for (size_t i = 0; i < b - a; i++)
                dst[i] += src[i];
        r->state[k] = B_DONE;
        return DT_OK;
    }
    if (!r->wire.unpack) return DT_OK;
    return r->wire.unpack(r->wire.ctx, r->grads + lo, r->wire.wire + lo, hi - lo);
}

/* Tests the oldest buckets in flight, in order, stopping at the first one
 * still running: one test is enough to let MPI progress all of them. */
static dt_status progress(dt_reducer_t *r)
{
    for (; r->oldest < r->next; r->oldest++) {
        size_t k = r->oldest;
        int done = 0;
        if (!r->reqs[k]) continue;
        dt_status st = dt_comm_test(r->comm, r->reqs[k], &done);
        if (st != DT_OK || done) r->reqs[k] = NULL; /* test frees the request either way */
        if (st != DT_OK) return bucket_error(r, st, k);
        if (!done) break;
        if ((st = bucket_done(r, k)) != DT_OK) return bucket_error(r, st, k);
    }
    return DT_OK;
}

/* Waits for every bucket in flight, even after a failure, so that no
 * request outlives the step; the first error (and its message) wins. */
static dt_status drain(dt_reducer_t *r)
{
    dt_status first = DT_OK;
    char msg[1024] = "";
    for (size_t k = r->oldest; k < r->next; k++) {
        if (!r->reqs[k]) continue;
        dt_status st = dt_comm_wait(r->comm, r->reqs[k]);
        r->reqs[k] = NULL;
        if (st == DT_OK && first == DT_OK) st = bucket_done(r, k);
        if (st != DT_OK && first == DT_OK) {
            first = bucket_error(r, st, k);
            snprintf(msg, sizeof msg, "%s", dt_last_error());
        }
    }
    r->oldest = r->next;
    return first == DT_OK ? DT_OK : dt_set_error(first, "%s", msg);
}

dt_status dt_reducer_begin(dt_reducer_t *r)
{
    dt_status st = drain(r);
    r->next = r->oldest = 0;
    r->in_step = 1;
    if (r->shard_grads) memset(r->state, B_IDLE, r->nbuckets);
    if (st != DT_OK) return dt_error_context(st, "gradient reducer: the previous step's buckets");
    return DT_OK;
}

dt_status dt_reducer_ready(dt_reducer_t *r, size_t done)
{
    if (!r->in_step)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "dt_reducer_ready called outside a step (call dt_reducer_begin first)");
    if (done > r->total)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "dt_reducer_ready: %zu gradients done, but the buffer has %zu", done,
                            r->total);
    while (r->overlap && r->next < r->nbuckets && r->start[r->next + 1] <= done) {
        dt_status st = start_bucket(r);
        if (st != DT_OK) return st;
    }
    if (r->shard_params) {
        dt_status st = slots_progress(r);
        if (st != DT_OK) return st;
    }
    return progress(r);
}

dt_status dt_reducer_finish(dt_reducer_t *r, double *wait_s)
{
    double t0 = dt_now();
    dt_status st = DT_OK;
    if (!r->in_step) {
        st = dt_set_error(DT_ERR_INVALID_ARG,
                          "dt_reducer_finish called outside a step (call dt_reducer_begin first)");
        goto out;
    }
    while (st == DT_OK && r->next < r->nbuckets)
        st = start_bucket(r);
    if (st == DT_OK) {
        st = drain(r);
    } else { /* the start failure's message wins over the drain's */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        (void)drain(r);
        dt_set_error(st, "%s", msg);
    }
    r->in_step = 0;
    if (st == DT_OK) r->acc++;
out:
    if (wait_s) *wait_s = dt_now() - t0;
    return st;
}

/* ---- sharded gradients: the staging area --------------------------------- */

static size_t blen(const dt_reducer_t *r, size_t k)
{
    return r->start[k + 1] - r->start[k];
}

static size_t align_up(size_t x)
{
    return (x + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN;
}

static int overlaps(const dt_reducer_t *r, size_t j, size_t p, size_t len)
{
    return r->at[j] < p + len && p < r->at[j] + blen(r, j);
}

/* A bucket still being written overlapping [p, p + len): its index, or
 * nbuckets when none. */
static size_t live_in(const dt_reducer_t *r, size_t p, size_t len)
{
    for (size_t j = 0; j < r->nbuckets; j++)
        if (r->state[j] == B_LIVE && overlaps(r, j, p, len)) return j;
    return r->nbuckets;
}

/* Completes the buckets in flight up to and including bucket `last`,
 * oldest first, copying out their chunks. */
static dt_status complete_through(dt_reducer_t *r, size_t last)
{
    for (; r->oldest < r->next && r->oldest <= last; r->oldest++) {
        size_t k = r->oldest;
        if (!r->reqs[k]) continue;
        dt_status st = dt_comm_wait(r->comm, r->reqs[k]);
        r->reqs[k] = NULL;
        if (st == DT_OK) st = bucket_done(r, k);
        if (st != DT_OK) {
            r->oldest++;
            return bucket_error(r, st, k);
        }
    }
    return DT_OK;
}

/* Grows the staging area so that `len` more floats fit past the buckets
 * being written, with room for one in flight; the buckets in flight are
 * completed first, since their requests point into the area. *p gets the
 * new bucket's place. */
static dt_status stage_grow(dt_reducer_t *r, size_t len, size_t *p)
{
    dt_status st = r->next ? complete_through(r, r->next - 1) : DT_OK;
    if (st != DT_OK) return st;
    size_t end = 0;
    for (size_t j = 0; j < r->nbuckets; j++)
        if (r->state[j] == B_LIVE && r->at[j] + blen(r, j) > end) end = r->at[j] + blen(r, j);
    *p = align_up(end);
    size_t want = align_up(*p + len) + align_up(r->room);
    if (want <= r->cap) return DT_OK;
    float *grown = NULL;
    if (posix_memalign((void **)&grown, STAGE_ALIGN * sizeof(float), want * sizeof(float)) != 0)
        return dt_set_error(DT_ERR_NOMEM,
                            "gradient reducer: out of memory growing the gradient staging area "
                            "to %.1f MiB (lower comm.bucket_mb)",
                            (double)want * GRAD_BYTES / MIB_BYTES);
    for (size_t j = 0; j < r->nbuckets; j++) /* only the live buckets hold anything */
        if (r->state[j] == B_LIVE)
            memcpy(grown + r->at[j], r->stage + r->at[j], blen(r, j) * sizeof(float));
    DT_LOG_DEBUG("comm", "gradient staging area: %.1f -> %.1f MiB",
                 (double)r->cap * GRAD_BYTES / MIB_BYTES, (double)want * GRAD_BYTES / MIB_BYTES);
    free(r->stage);
    r->stage = grown;
    r->cap = want;
    return DT_OK;
}

/* Gives bucket k a zeroed place in the staging area (see the file
 * comment for where). */
static dt_status stage_alloc(dt_reducer_t *r, size_t k)
{
    size_t len = blen(r, k), p = align_up(r->cursor), j;
    int wrapped = 0;
    dt_status st = DT_OK;
    for (;;) {
        if (p + len > r->cap) {
            if (wrapped) {
                st = stage_grow(r, len, &p);
                break;
            }
            p = 0;
            wrapped = 1;
        } else if ((j = live_in(r, p, len)) < r->nbuckets) {
            p = align_up(r->at[j] + blen(r, j));
        } else {
            break;
        }
    }
    size_t last = r->nbuckets; /* the newest bucket in flight in the way */
    for (j = 0; st == DT_OK && j < r->next; j++)
        if (r->state[j] == B_SENT && overlaps(r, j, p, len)) last = j;
    if (st == DT_OK && last < r->nbuckets) st = complete_through(r, last);
    if (st != DT_OK) return dt_error_context(st, "placing gradient bucket %zu", k);
    memset(r->stage + p, 0, len * sizeof(float));
    r->at[k] = p;
    r->state[k] = B_LIVE;
    r->cursor = p + len;
    return DT_OK;
}

/* Whether elements [off, off + n) (n > 0) lie in one bucket, *k: the
 * bucket holding off (start[k] <= off < start[k + 1]). */
static int in_one_bucket(const dt_reducer_t *r, size_t off, size_t n, size_t *k)
{
    size_t lo = 0, hi = r->nbuckets;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->start[mid] <= off)
            lo = mid;
        else
            hi = mid;
    }
    *k = lo;
    return r->nbuckets > 0 && n > 0 && off + n <= r->start[lo + 1];
}

dt_status dt_reducer_place(dt_reducer_t *r, size_t off, size_t n, float **g)
{
    *g = NULL;
    if (!r->shard_grads || !r->in_step)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "dt_reducer_place: only for sharded gradients, within a step");
    size_t k;
    if (!in_one_bucket(r, off, n, &k))
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "dt_reducer_place: gradients [%zu, %zu) are not within one bucket", off,
                            off + n);
    if (r->state[k] == B_SENT || r->state[k] == B_DONE)
        return dt_set_error(DT_ERR_INTERNAL,
                            "gradient reducer: a gradient in bucket %zu was placed after the "
                            "bucket was reduced (backward's order and the bucket plan disagree)",
                            k);
    if (r->state[k] == B_IDLE) {
        dt_status st = stage_alloc(r, k);
        if (st != DT_OK) return st;
    }
    *g = r->stage + r->at[k] + (off - r->start[k]);
    return DT_OK;
}

void dt_reducer_clear(dt_reducer_t *r)
{
    r->acc = 0;
    if (r->sgrad) memset(r->sgrad, 0, r->nsgrad * sizeof *r->sgrad);
}

float *dt_reducer_shard_grads(dt_reducer_t *r, size_t *n)
{
    *n = r->shard_grads ? r->nsgrad : 0;
    return r->shard_grads ? r->sgrad : NULL;
}

size_t dt_reducer_staging_bytes(const dt_reducer_t *r)
{
    return r->cap * sizeof(float);
}

int dt_reducer_sharded(const dt_reducer_t *r)
{
    return r->shard;
}

void dt_reducer_owned(const dt_reducer_t *r, size_t k, size_t *lo, size_t *hi)
{
    size_t a = 0, b = 0;
    if (r->shard) {
        dt_comm_ring_owned(r->comm, r->start[k + 1] - r->start[k], &a, &b);
    } else {
        b = r->start[k + 1] - r->start[k];
    }
    *lo = r->start[k] + a;
    *hi = r->start[k] + b;
}

dt_status dt_reducer_gather(dt_reducer_t *r, float *buf, const char *what)
{
    dt_status st = DT_OK;
    if (!r->shard) return DT_OK;
    if (r->in_step || r->oldest < r->next)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "dt_reducer_gather called while gradient buckets are in flight");
    size_t k = 0;
    for (; k < r->nbuckets && st == DT_OK; k++) {
        size_t lo = r->start[k], hi = r->start[k + 1];
        st = dt_comm_iring(r->comm, buf + lo, hi - lo, DT_F32, DT_RING_ALLGATHER, &r->reqs[k]);
        if (st != DT_OK) {
            st = dt_error_context(st, "gathering the %s of bucket %zu of %zu", what, k,
                                  r->nbuckets);
            break;
        }
    }
    r->oldest = 0;
    r->next = k; /* drain waits for what started, even after a failure */
    char msg[1024] = "";
    if (st != DT_OK) snprintf(msg, sizeof msg, "%s", dt_last_error());
    r->gathering = 1;
    dt_status dst = drain(r);
    r->gathering = 0;
    r->oldest = r->next = 0;
    if (st != DT_OK) return dt_set_error(st, "%s", msg);
    return dst == DT_OK ? DT_OK : dt_error_context(dst, "gathering the %s", what);
}

void dt_reducer_destroy(dt_reducer_t *r)
{
    if (!r) return;
    if (r->reqs && r->oldest < r->next) {
        DT_LOG_WARN("comm", "gradient reducer destroyed with buckets in flight; waiting for them");
        (void)drain(r);
    }
    free(r->reqs);
    free(r->start);
    free(r->stage);
    free(r->at);
    free(r->state);
    free(r->sgrad);
    free(r->sbase);
    if (r->slots) {
        (void)dt_reducer_params_changed(r);
        for (size_t i = 0; i < r->nslots; i++)
            free(r->slots[i].buf);
    }
    free(r->slots);
    free(r->slot_of);
    free(r->sparam);
    free(r);
}

/* ---- sharded parameters: gather slots ------------------------------------ */
/*
 * With sharded parameters (opts.shard_params) this rank keeps only its
 * chunks of the parameters, packed as its gradients' shard; a layer's
 * parameters are read from gather slots, each holding one bucket
 * assembled from every rank's chunks by the ring's all-gather. A fetch of
 * a bucket no slot holds takes a free slot, a new one while there are
 * fewer than MIN_SLOTS, else the least recently fetched one not pinned
 * (waiting for its gather if it is in flight), else a new one (every slot
 * pinned by the layer running). A fetch ahead starts a gather into a
 * free slot or a new one below MIN_SLOTS, else into the least recently
 * fetched slot neither pinned nor gathered ahead and not fetched since
 * (waiting for its gather if it is still in flight), and does nothing
 * when there is none. Whether a gather has completed never enters these
 * choices: which slot a bucket goes to and when its gather starts depend
 * only on the order of the calls, so every rank starts the same gathers
 * in the same order and waits for them in the same order; in-flight
 * gathers are tested as the reducer progresses.
 */

/* Slot s holds no bucket any more. */
static void slot_empty(dt_reducer_t *r, struct pslot *s)
{
    if (s->bucket != NO_SLOT) r->slot_of[s->bucket] = NO_SLOT;
    s->bucket = NO_SLOT;
}

static dt_status slot_wait(dt_reducer_t *r, struct pslot *s)
{
    if (!s->req) return DT_OK;
    dt_status st = dt_comm_wait(r->comm, s->req);
    s->req = NULL;
    if (st != DT_OK) {
        st = dt_error_context(st, "gathering the parameters of bucket %zu of %zu", s->bucket,
                              r->nbuckets);
        slot_empty(r, s); /* its contents are not whole */
    }
    return st;
}

/* Tests the gathers in flight (lets the ring advance them). */
static dt_status slots_progress(dt_reducer_t *r)
{
    for (size_t i = 0; i < r->nslots; i++) {
        struct pslot *s = &r->slots[i];
        int done = 0;
        if (!s->req) continue;
        dt_status st = dt_comm_test(r->comm, s->req, &done);
        if (st != DT_OK || done) s->req = NULL;
        if (st != DT_OK) {
            slot_empty(r, s);
            return dt_error_context(st, "gathering the parameters of a bucket");
        }
    }
    return DT_OK;
}

/* A slot for bucket k (see above); *out NO_SLOT when `forced` is 0 and
 * none is to be had without waiting or growing. */
static dt_status slot_take(dt_reducer_t *r, size_t k, int forced, size_t *out)
{
    size_t pick = NO_SLOT, len = blen(r, k);
    *out = NO_SLOT;
    for (size_t i = 0; i < r->nslots && pick == NO_SLOT; i++)
        if (r->slots[i].bucket == NO_SLOT) pick = i;
    if (pick == NO_SLOT && r->nslots < MIN_SLOTS) pick = r->nslots++;
    size_t oldest = NO_SLOT; /* the least recently fetched slot that may go */
    for (size_t i = 0; i < r->nslots && pick == NO_SLOT; i++) {
        const struct pslot *s = &r->slots[i];
        if (s->pinned || (!forced && s->fresh)) continue;
        if (oldest == NO_SLOT || s->used < r->slots[oldest].used) oldest = i;
    }
    if (pick == NO_SLOT) pick = oldest;
    if (pick == NO_SLOT && !forced) return DT_OK;
    if (pick == NO_SLOT) pick = r->nslots++; /* every slot pinned: at most one per bucket */
    struct pslot *s = &r->slots[pick];
    dt_status st = slot_wait(r, s);
    if (st != DT_OK) return st;
    slot_empty(r, s);
    if (s->cap < len) {
        float *grown = NULL;
        if (posix_memalign((void **)&grown, STAGE_ALIGN * sizeof(float), len * sizeof(float)))
            return dt_set_error(DT_ERR_NOMEM,
                                "gradient reducer: out of memory for a parameter gather slot of "
                                "%.1f MiB (lower comm.bucket_mb)",
                                (double)len * GRAD_BYTES / MIB_BYTES);
        free(s->buf);
        s->buf = grown;
        s->cap = len;
    }
    *out = pick;
    return DT_OK;
}

/* Starts gathering bucket k into slot i: this rank's chunk from the
 * shard, the others' from the ring. */
static dt_status slot_gather(dt_reducer_t *r, size_t k, size_t i)
{
    struct pslot *s = &r->slots[i];
    size_t a, b, lo = r->start[k];
    dt_reducer_owned(r, k, &a, &b);
    memcpy(s->buf + (a - lo), r->sparam + r->sbase[k], (b - a) * sizeof(float));
    dt_status st =
        dt_comm_iring(r->comm, s->buf, blen(r, k), DT_F32, DT_RING_ALLGATHER, &s->req);
    if (st != DT_OK)
        return dt_error_context(st, "gathering the parameters of bucket %zu of %zu", k,
                                r->nbuckets);
    s->bucket = k;
    r->slot_of[k] = i;
    return DT_OK;
}

static dt_status check_fetch(const dt_reducer_t *r, size_t off, size_t n, size_t *k)
{
    if (!r->shard_params)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "dt_reducer_fetch: only for sharded parameters");
    if (!in_one_bucket(r, off, n, k))
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "dt_reducer_fetch: parameters [%zu, %zu) are not within one bucket",
                            off, off + n);
    return DT_OK;
}

dt_status dt_reducer_fetch(dt_reducer_t *r, size_t off, size_t n, float **p)
{
    size_t k, i;
    *p = NULL;
    dt_status st = check_fetch(r, off, n, &k);
    if (st != DT_OK) return st;
    i = r->slot_of[k];
    if (i == NO_SLOT) {
        if ((st = slot_take(r, k, 1, &i)) != DT_OK) return st;
        if ((st = slot_gather(r, k, i)) != DT_OK) return st;
    }
    struct pslot *s = &r->slots[i];
    if ((st = slot_wait(r, s)) != DT_OK) return st;
    s->pinned = 1;
    s->fresh = 0;
    s->used = ++r->tick;
    *p = s->buf + (off - r->start[k]);
    return DT_OK;
}

dt_status dt_reducer_fetch_ahead(dt_reducer_t *r, size_t off, size_t n)
{
    size_t k, i;
    dt_status st = check_fetch(r, off, n, &k);
    if (st != DT_OK || r->slot_of[k] != NO_SLOT) return st;
    if ((st = slot_take(r, k, 0, &i)) != DT_OK || i == NO_SLOT) return st;
    if ((st = slot_gather(r, k, i)) != DT_OK) return st;
    r->slots[i].used = ++r->tick;
    r->slots[i].fresh = 1;
    return slots_progress(r);
}

dt_status dt_reducer_release(dt_reducer_t *r)
{
    for (size_t i = 0; i < r->nslots; i++)
        r->slots[i].pinned = 0;
    return r->shard_params ? slots_progress(r) : DT_OK;
}

dt_status dt_reducer_params_changed(dt_reducer_t *r)
{
    dt_status first = DT_OK;
    for (size_t i = 0; i < r->nslots; i++) {
        struct pslot *s = &r->slots[i];
        dt_status st = slot_wait(r, s);
        if (st != DT_OK && first == DT_OK) first = st;
        slot_empty(r, s);
        s->pinned = 0;
        s->fresh = 0;
    }
    return first;
}

float *dt_reducer_shard_params(dt_reducer_t *r, size_t *n)
{
    *n = r->shard_params ? r->nsgrad : 0;
    return r->shard_params ? r->sparam : NULL;
}

size_t dt_reducer_gather_bytes(const dt_reducer_t *r)
{
    size_t b = 0;
    for (size_t i = 0; i < r->nslots; i++)
        b += r->slots[i].cap * sizeof(float);
    return b;
}
