/*
 * reducer.h - the gradient reducer: sums the flat gradient buffer over all
 * ranks in buckets, overlapping communication with backward.
 *
 * The gradient buffer is laid out in the order backward finishes it (last
 * layer first), so the gradients final after each layer form a growing
 * prefix [0, done). The buffer is cut into buckets of about comm.bucket_mb
 * (the first one smaller so communication starts early); as soon as the
 * prefix covers a bucket its non-blocking all-reduce starts, and every
 * later call progresses the ones in flight. finish() starts what is left
 * and waits for all. Gradients arrive pre-scaled by 1/global batch rows, so
 * the sum over ranks is the global mean (fp32, or bf16 on the wire with
 * opts.wire).
 */
#ifndef DT_REDUCER_H
#define DT_REDUCER_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "comm.h"

#define DT_REDUCER_MAX_BUCKETS 4096

typedef struct dt_reducer dt_reducer_t;

/* Gradients on the wire in bf16 (comm.grad_dtype): pack rounds a bucket
 * of the fp32 gradients into `wire` (bf16 bits at the same offsets) just
 * before its all-reduce starts; unpack widens the summed bucket back into
 * the gradients once it has completed. Both are called on the reducer's
 * thread; on a device backend they queue work in stream order. `wire`
 * holds `total` elements in the communicator's kind of memory. */
struct dt_reducer_wire {
    dt_status (*pack)(void *ctx, uint16_t *wire, const float *grads, size_t n);
    dt_status (*unpack)(void *ctx, float *grads, const uint16_t *wire, size_t n);
    void *ctx;
    uint16_t *wire;
};

struct dt_reducer_opts {
    double bucket_mb;       /* target bucket size in MiB of fp32 gradients (> 0) */
    double first_bucket_mb; /* the first bucket's size in MiB (> 0, <= bucket_mb) */
    int overlap;            /* 0: start every bucket only in finish() */
    const struct dt_reducer_wire *wire; /* NULL: fp32 on the wire */
    /* 1: a sharded update (fp32 wire, a communicator with dt_comm_iring):
     * buckets are only reduce-scattered; see dt_reducer_owned. */
    int shard;
    /* 1 (with shard): sharded gradients (comm.shard gradients). There is
     * no flat gradient buffer (grads is NULL): backward asks
     * dt_reducer_place where to write each parameter's gradient, in a
     * staging area that holds the buckets not yet reduce-scattered; every
     * micro-batch is reduced, and this rank keeps only the sums of its own
     * chunks (dt_reducer_shard_grads). Host memory only. Buckets end at
     * parameter boundaries, so each parameter is in one bucket:
     * param_off[i] are the parameters' offsets (any order, each parameter
     * once; a tied parameter is one). */
    int shard_grads;
    const size_t *param_off;
    size_t nparams;
    /* 1 (with shard_grads): sharded parameters (comm.shard parameters).
     * This rank keeps its chunks of the parameters only
     * (dt_reducer_shard_params), and layers read theirs from gather slots
     * (dt_reducer_fetch). */
    int shard_params;
};

/* Cuts `total` elements into buckets: the first of first_elems, the rest of
 * bucket_elems, the last taking what remains. Writes the bucket start
 * offsets to offsets (at most max) and returns the count (0 if total is 0).
 * Pure function, unit-tested. */
size_t dt_bucket_plan(size_t total, size_t first_elems, size_t bucket_elems, size_t *offsets,
                      size_t max);
/* The same cut at parameter boundaries only: `cuts` are the parameters'
 * offsets in increasing order; a bucket ends at the first of them at
 * least first_elems (then bucket_elems) past its start, so a parameter
 * larger than a bucket is a bucket of its own. Pure function, unit-tested. */
size_t dt_bucket_plan_cuts(size_t total, const size_t *cuts, size_t ncuts, size_t first_elems,
                           size_t bucket_elems, size_t *offsets, size_t max);

dt_status dt_reducer_create(dt_comm_t *c, float *grads, size_t total,
                            const struct dt_reducer_opts *o, dt_reducer_t **out);
void dt_reducer_destroy(dt_reducer_t *r);

size_t dt_reducer_bucket_count(const dt_reducer_t *r);
/* Bucket k's elements [*lo, *hi) of the flat buffer. */
void dt_reducer_bucket(const dt_reducer_t *r, size_t k, size_t *lo, size_t *hi);

/* Called before the backward whose gradients will be reduced. */
dt_status dt_reducer_begin(dt_reducer_t *r);
/* Gradients [0, done) are final: start the buckets they cover (with
 * overlap on) and progress those in flight. Cheap when nothing changed. */
dt_status dt_reducer_ready(dt_reducer_t *r, size_t done);
/* Starts the remaining buckets and waits for all. *wait_s gets the time
 * spent waiting here (communication not hidden behind backward). */
dt_status dt_reducer_finish(dt_reducer_t *r, double *wait_s);

/* Sharded: after finish(), this rank holds the summed gradients of
 * [*lo, *hi) of bucket k (its ring chunk) and partial sums elsewhere in the
 * bucket. Not sharded: the whole bucket. */
int dt_reducer_sharded(const dt_reducer_t *r);
void dt_reducer_owned(const dt_reducer_t *r, size_t k, size_t *lo, size_t *hi);
/* Sharded gradients: where backward writes the gradient of the parameter
 * at [off, off + n): its bucket's place in the staging area, zeroed when
 * the bucket's first parameter is placed in a micro-batch. The pointer
 * holds until the bucket is reduce-scattered (ready() covering it). May
 * wait for buckets in flight, to reuse their staging. */
dt_status dt_reducer_place(dt_reducer_t *r, size_t off, size_t n, float **g);
/* Sharded gradients: the start of a step's accumulation (the first
 * micro-batch's sums are copied, later ones added). */
void dt_reducer_clear(dt_reducer_t *r);
/* Sharded gradients: this rank's summed gradients, its own chunks packed
 * in bucket order (*n elements; chunk k at the sum of the earlier
 * chunks' lengths), complete after the step's last finish(). NULL when
 * not sharded. */
float *dt_reducer_shard_grads(dt_reducer_t *r, size_t *n);
/* Sharded gradients: bytes of the staging area (it grows to what the
 * model's backward needs during the first step). */
size_t dt_reducer_staging_bytes(const dt_reducer_t *r);

/* Sharded: every rank's own chunks of `buf` (laid out as the gradients:
 * the parameters, an optimizer state) copied to every rank; collective,
 * between steps. `what` names the buffer in errors. Not sharded: nothing. */
dt_status dt_reducer_gather(dt_reducer_t *r, float *buf, const char *what);

/* Sharded parameters: this rank's chunks of the parameters, packed as
 * the gradients' shard (*n elements): the master copy, which the update
 * changes in place (then call dt_reducer_params_changed). */
float *dt_reducer_shard_params(dt_reducer_t *r, size_t *n);
/* Sharded parameters: where the parameter at [off, off + n) can be read:
 * its bucket, gathered from every rank's chunks into a slot (waiting for
 * the gather). The pointer holds until dt_reducer_release. Collective:
 * every rank fetches the same parameters in the same order. */
dt_status dt_reducer_fetch(dt_reducer_t *r, size_t off, size_t n, float **p);
/* Starts gathering the parameter's bucket where a slot is to be had
 * without waiting; collective as fetch is. */
dt_status dt_reducer_fetch_ahead(dt_reducer_t *r, size_t off, size_t n);
/* The fetched pointers are no longer needed. */
dt_status dt_reducer_release(dt_reducer_t *r);
/* The shard changed (an update, a load): the gathered copies are
 * dropped, after waiting for the gathers in flight. */
dt_status dt_reducer_params_changed(dt_reducer_t *r);
/* Bytes of the parameter gather slots. */
size_t dt_reducer_gather_bytes(const dt_reducer_t *r);

#endif
