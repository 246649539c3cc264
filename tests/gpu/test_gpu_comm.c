/*
 * test_gpu_comm.c - the nccl communicator on one GPU with one rank (MPI as
 * a singleton): every collective, dtype and reduction the trainer uses,
 * with results checked on the host; the non-blocking path and the gradient
 * reducer over NCCL; the stream ordering dt_comm_bind_stream promises
 * (work queued on the compute stream before a collective is seen by it),
 * and the whole-device ordering without a bound stream; an NCCL error
 * turning into a status that names the call, after which the communicator
 * refuses work. Gradients in bf16 on the wire (comm.grad_dtype=bf16): an
 * all-reduce of bf16 bits made on the device by the backend's to_bf16, and
 * the reducer with a bf16 wire, whose result must be the bf16-rounded
 * gradients (an fp32 wire would leave them unrounded). With one rank a
 * reduction returns its input, so the ordering checks use the out-of-place
 * collectives (allgather, reduce-scatter), whose copy NCCL really
 * performs. Several ranks need a GPU each and run as multi-GPU jobs.
 *
 * Exits 77 (skipped) where no usable GPU is present.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/allreduce_perf.h"
#include "collectives/comm.h"
#include "collectives/comm_impl.h"
#include "collectives/reducer.h"
#include "kernels/backend.h"
#include "core/bf16.h"
#include "tests/unit/cu_util.h"

#define SKIP_EXIT 77
#define COMM_TIMEOUT_S 60.0
#define BIG_N ((size_t)1000003)   /* odd, several NCCL chunks */
#define BUSY_N ((size_t)64 << 20) /* floats kept busy before an ordered fill */
#define BUSY_ROUNDS 40            /* scale passes over them (~10 GB of traffic) */
#define ORDER_N ((size_t)4 << 20) /* floats checked after an ordered fill */

static dt_backend_t *be;
static const struct dt_ops *ops;
static dt_comm_t *comm;
static float *busy; /* BUSY_N floats of device memory */

/* ---- helpers ------------------------------------------------------------------ */

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_backend_alloc(be, bytes, &p), DT_OK);
    return p;
}

static void *host_alloc(size_t bytes)
{
    void *p = calloc(1, bytes);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    return p;
}

static void upload(void *dst, const void *src, size_t bytes)
{
    CU_ASSERT_EQUAL_FATAL(dt_backend_copy(be, dst, src, bytes, DT_COPY_H2D), DT_OK);
}

static void download(void *dst, const void *src, size_t bytes)
{
    CU_ASSERT_EQUAL_FATAL(dt_backend_copy(be, dst, src, bytes, DT_COPY_D2H), DT_OK);
    CU_ASSERT_EQUAL_FATAL(dt_backend_sync(be), DT_OK);
}

/* Queues some milliseconds of work on the compute stream, so that a
 * collective not ordered after what follows would overtake it. */
static void queue_busy_work(void)
{
    for (int i = 0; i < BUSY_ROUNDS; i++)
        CU_ASSERT_EQUAL_FATAL(ops->scale(be, busy, BUSY_N, 1.0f), DT_OK);
}

/* Counts the elements of d (n floats, device) that are not v. */
static size_t count_not(const float *d, size_t n, float v)
{
    float *h = host_alloc(n * sizeof *h);
    size_t bad = 0;
    download(h, d, n * sizeof *h);
    for (size_t i = 0; i < n; i++)
        bad += h[i] != v;
    free(h);
    return bad;
}

/* ---- identity --------------------------------------------------------------- */

static void test_identity(void)
{
    CU_ASSERT_STRING_EQUAL(dt_comm_backend(comm), "nccl");
    CU_ASSERT_EQUAL(dt_comm_rank(comm), 0);
    CU_ASSERT_EQUAL(dt_comm_size(comm), 1);
    CU_ASSERT_EQUAL(dt_comm_local_rank(comm), 0);
    CU_ASSERT_EQUAL(dt_comm_local_size(comm), 1);
    CU_ASSERT(strlen(dt_comm_host(comm)) > 0);
    CU_ASSERT_EQUAL(dt_comm_device_buffers(comm), 1);
    CU_ASSERT_PTR_NOT_NULL(dt_comm_mpi_handle(comm));
    CU_ASSERT_EQUAL(comm->max_count, SIZE_MAX);
    CU_ASSERT_EQUAL(dt_comm_barrier(comm), DT_OK);
}

/* ---- all-reduce ------------------------------------------------------------- */

/* One rank: every reduction returns its input, blocking or not. */
static void check_allreduce_f32(enum dt_comm_op op, int nonblocking)
{
    float *h = host_alloc(BIG_N * sizeof *h), *back = host_alloc(BIG_N * sizeof *h);
    float *d = dev_alloc(BIG_N * sizeof *d);
    for (size_t i = 0; i < BIG_N; i++)
        h[i] = (float)((long)(i % 1999) - 999) * 0.25f;
    upload(d, h, BIG_N * sizeof *h);
    if (nonblocking) {
        dt_comm_req_t *req = NULL;
        CU_ASSERT_EQUAL_FATAL(dt_comm_iallreduce(comm, d, BIG_N, DT_F32, op, &req), DT_OK);
        CU_ASSERT_EQUAL(dt_comm_wait(comm, req), DT_OK);
    } else {
        CU_ASSERT_EQUAL(dt_comm_allreduce(comm, d, BIG_N, DT_F32, op), DT_OK);
    }
    download(back, d, BIG_N * sizeof *back);
    CU_ASSERT_EQUAL(memcmp(h, back, BIG_N * sizeof *h), 0);
    dt_backend_free(be, d);
    free(h);
    free(back);
}

static void test_allreduce_f32(void)
{
    const enum dt_comm_op all[] = {DT_COMM_SUM, DT_COMM_AVG, DT_COMM_MAX, DT_COMM_MIN};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        check_allreduce_f32(all[k], 0);
        check_allreduce_f32(all[k], 1);
    }
}

/* int64 values above 2^32 survive (a 32-bit path would truncate them). */
static void test_allreduce_i64(void)
{
    enum { N = 4097 };
    int64_t h[N], back[N];
    int64_t *d = dev_alloc(sizeof h);
    for (int i = 0; i < N; i++)
        h[i] = ((int64_t)1 << 40) + (int64_t)i * 7 - 3 * (i % 5);
    const enum dt_comm_op all[] = {DT_COMM_SUM, DT_COMM_MAX, DT_COMM_MIN};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        upload(d, h, sizeof h);
        dt_comm_req_t *req = NULL;
        CU_ASSERT_EQUAL(dt_comm_allreduce(comm, d, N, DT_I64, all[k]), DT_OK);
        CU_ASSERT_EQUAL_FATAL(dt_comm_iallreduce(comm, d, N, DT_I64, all[k], &req), DT_OK);
        int done = 0;
        while (!done)
            CU_ASSERT_EQUAL_FATAL(dt_comm_test(comm, req, &done), DT_OK);
        download(back, d, sizeof back);
        CU_ASSERT_EQUAL(memcmp(h, back, sizeof h), 0);
    }
    dt_backend_free(be, d);
}

/* The other dtypes once each, and a buffer that starts mid-allocation. */
static void test_allreduce_dtypes(void)
{
    double hd[33], bd[33];
    int32_t hi[33], bi[33];
    uint8_t hu[33], bu[33];
    for (int i = 0; i < 33; i++) {
        hd[i] = 1e300 / (i + 1);
        hi[i] = -i * 65537;
        hu[i] = (uint8_t)(i * 37);
    }
    char *d = dev_alloc(1024);
    upload(d + 8, hd, sizeof hd);
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, d + 8, 33, DT_F64, DT_COMM_AVG), DT_OK);
    download(bd, d + 8, sizeof bd);
    CU_ASSERT_EQUAL(memcmp(hd, bd, sizeof hd), 0);
    upload(d + 4, hi, sizeof hi);
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, d + 4, 33, DT_I32, DT_COMM_MIN), DT_OK);
    download(bi, d + 4, sizeof bi);
    CU_ASSERT_EQUAL(memcmp(hi, bi, sizeof hi), 0);
    upload(d + 1, hu, sizeof hu);
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, d + 1, 33, DT_U8, DT_COMM_MAX), DT_OK);
    download(bu, d + 1, sizeof bu);
    CU_ASSERT_EQUAL(memcmp(hu, bu, sizeof hu), 0);
    dt_backend_free(be, d);
}

/* Several requests in flight at once, completed out of order; a request
 * of nothing completes at once. */
static void test_iallreduce_many(void)
{
    enum { NREQ = 6, N = 100000 };
    float *d[NREQ];
    dt_comm_req_t *req[NREQ];
    for (int k = 0; k < NREQ; k++) {
        d[k] = dev_alloc(N * sizeof(float));
        CU_ASSERT_EQUAL_FATAL(ops->fill(be, d[k], N, (float)(k + 1)), DT_OK);
        CU_ASSERT_EQUAL_FATAL(dt_comm_iallreduce(comm, d[k], N, DT_F32, DT_COMM_SUM, &req[k]),
                              DT_OK);
    }
    for (int k = NREQ - 1; k >= 0; k--)
        CU_ASSERT_EQUAL(dt_comm_wait(comm, req[k]), DT_OK);
    for (int k = 0; k < NREQ; k++) {
        CU_ASSERT_EQUAL(count_not(d[k], N, (float)(k + 1)), 0);
        dt_backend_free(be, d[k]);
    }
    dt_comm_req_t *none = NULL;
    int done = 0;
    CU_ASSERT_EQUAL_FATAL(dt_comm_iallreduce(comm, NULL, 0, DT_F32, DT_COMM_SUM, &none),
                          DT_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(none);
    CU_ASSERT_EQUAL(dt_comm_test(comm, none, &done), DT_OK);
    CU_ASSERT_EQUAL(done, 1);
}

/* x rounded to bf16 and widened again, as the wire leaves it. */
static float bf16_round(float x)
{
    return dt_bf16_to_float(dt_bf16_from_float(x));
}

/* d_b(n) = bf16 bits of d_f(n) on the device, all-reduced (SUM, one rank,
 * blocking or not), widened into d_f again. */
static void bf16_allreduce(uint16_t *d_b, float *d_f, size_t n, int nonblocking)
{
    CU_ASSERT_EQUAL_FATAL(ops->to_bf16(be, d_b, d_f, n), DT_OK);
    if (nonblocking) {
        dt_comm_req_t *req = NULL;
        int done = 0;
        CU_ASSERT_EQUAL_FATAL(dt_comm_iallreduce(comm, d_b, n, DT_BF16, DT_COMM_SUM, &req),
                              DT_OK);
        while (!done)
            CU_ASSERT_EQUAL_FATAL(dt_comm_test(comm, req, &done), DT_OK);
    } else {
        CU_ASSERT_EQUAL_FATAL(dt_comm_allreduce(comm, d_b, n, DT_BF16, DT_COMM_SUM), DT_OK);
    }
    CU_ASSERT_EQUAL_FATAL(ops->from_bf16(be, d_f, d_b, n), DT_OK);
}

/* bf16 bits through NCCL: the result is the input rounded to bf16, bit for
 * bit, over a whole buffer and a part starting one element in. Only SUM is
 * accepted for bf16. */
static void test_allreduce_bf16(void)
{
    CU_ASSERT_EQUAL(dt_dtype_size(DT_BF16), 2);
    float *h = host_alloc(BIG_N * sizeof *h), *want = host_alloc(BIG_N * sizeof *h);
    float *back = host_alloc(BIG_N * sizeof *h);
    float *d_f = dev_alloc(BIG_N * sizeof *d_f);
    uint16_t *d_b = dev_alloc(BIG_N * sizeof *d_b);
    size_t rounded = 0;
    for (size_t i = 0; i < BIG_N; i++) {
        h[i] = ((float)((long)(i % 2003) - 1001) + 1.0f / 3.0f) * 1e-3f;
        want[i] = bf16_round(h[i]);
        rounded += want[i] != h[i];
    }
    CU_ASSERT(rounded > BIG_N / 2); /* the wire loses bits, so a pass means something */
    for (int nonblocking = 0; nonblocking < 2; nonblocking++) {
        upload(d_f, h, BIG_N * sizeof *h);
        bf16_allreduce(d_b, d_f, BIG_N, nonblocking);
        download(back, d_f, BIG_N * sizeof *back);
        CU_ASSERT_EQUAL(memcmp(back, want, BIG_N * sizeof *back), 0);
        upload(d_f, h, BIG_N * sizeof *h);
        bf16_allreduce(d_b + 1, d_f + 1, BIG_N - 1, nonblocking);
        download(back, d_f, BIG_N * sizeof *back);
        CU_ASSERT_EQUAL(back[0], h[0]); /* outside the part: untouched */
        CU_ASSERT_EQUAL(memcmp(back + 1, want + 1, (BIG_N - 1) * sizeof *back), 0);
    }
    const enum dt_comm_op refused[] = {DT_COMM_AVG, DT_COMM_MAX, DT_COMM_MIN};
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++)
        CU_ASSERT_EQUAL(dt_comm_allreduce(comm, d_b, 8, DT_BF16, refused[k]),
                        DT_ERR_INVALID_ARG);
    dt_backend_free(be, d_f);
    dt_backend_free(be, d_b);
    free(h);
    free(want);
    free(back);
}

/* ---- other collectives ------------------------------------------------------- */

static void test_broadcast_allgather_reduce_scatter(void)
{
    enum { N = 77777 };
    float *h = host_alloc(N * sizeof *h), *back = host_alloc(N * sizeof *h);
    float *a = dev_alloc(N * sizeof *a), *b = dev_alloc(N * sizeof *b);
    for (int i = 0; i < N; i++)
        h[i] = (float)i * 0.5f - 17;
    upload(a, h, N * sizeof *h);
    CU_ASSERT_EQUAL(dt_comm_broadcast(comm, a, N * sizeof(float), 0), DT_OK);
    download(back, a, N * sizeof *back);
    CU_ASSERT_EQUAL(memcmp(h, back, N * sizeof *h), 0);
    /* out of place: b starts as zeros and must become a */
    CU_ASSERT_EQUAL(dt_comm_allgather(comm, a, b, N * sizeof(float)), DT_OK);
    download(back, b, N * sizeof *back);
    CU_ASSERT_EQUAL(memcmp(h, back, N * sizeof *h), 0);
    CU_ASSERT_EQUAL(dt_comm_allgather(comm, b, b, N * sizeof(float)), DT_OK); /* in place */
    CU_ASSERT_EQUAL(ops->fill(be, b, N, 0), DT_OK);
    CU_ASSERT_EQUAL(dt_comm_reduce_scatter(comm, a, b, N, DT_F32, DT_COMM_SUM), DT_OK);
    download(back, b, N * sizeof *back);
    CU_ASSERT_EQUAL(memcmp(h, back, N * sizeof *h), 0);
    CU_ASSERT_EQUAL(ops->fill(be, b, N, 0), DT_OK);
    CU_ASSERT_EQUAL(dt_comm_reduce_scatter(comm, a, b, N, DT_F32, DT_COMM_AVG), DT_OK);
    download(back, b, N * sizeof *back);
    CU_ASSERT_EQUAL(memcmp(h, back, N * sizeof *h), 0);
    dt_backend_free(be, a);
    dt_backend_free(be, b);
    free(h);
    free(back);
}

/* ---- stream ordering ---------------------------------------------------------- */

/* Bound stream: a fill queued behind milliseconds of compute work is what
 * the collective reads, and work queued after it completes sees its result
 * (the scale below runs on the compute stream after the copy). */
static void test_bound_stream_order(void)
{
    float *src = dev_alloc(ORDER_N * sizeof(float)), *dst = dev_alloc(ORDER_N * sizeof(float));
    queue_busy_work();
    CU_ASSERT_EQUAL_FATAL(ops->fill(be, src, ORDER_N, 7.0f), DT_OK);
    CU_ASSERT_EQUAL(dt_comm_allgather(comm, src, dst, ORDER_N * sizeof(float)), DT_OK);
    CU_ASSERT_EQUAL_FATAL(ops->scale(be, dst, ORDER_N, 2.0f), DT_OK);
    CU_ASSERT_EQUAL(count_not(dst, ORDER_N, 14.0f), 0);

    /* the same through a non-blocking all-reduce started behind the fill
     * and a reduce-scatter queued behind it on the comm stream */
    dt_comm_req_t *req = NULL;
    queue_busy_work();
    CU_ASSERT_EQUAL_FATAL(ops->fill(be, src, ORDER_N, 3.0f), DT_OK);
    CU_ASSERT_EQUAL_FATAL(dt_comm_iallreduce(comm, src, ORDER_N, DT_F32, DT_COMM_SUM, &req),
                          DT_OK);
    CU_ASSERT_EQUAL(dt_comm_reduce_scatter(comm, src, dst, ORDER_N, DT_F32, DT_COMM_SUM),
                    DT_OK);
    CU_ASSERT_EQUAL(dt_comm_wait(comm, req), DT_OK);
    CU_ASSERT_EQUAL(count_not(dst, ORDER_N, 3.0f), 0);
    CU_ASSERT_EQUAL(count_not(src, ORDER_N, 3.0f), 0);
    dt_backend_free(be, src);
    dt_backend_free(be, dst);
}

/* No bound stream: a collective waits for everything the device was doing. */
static void test_unbound_order(void)
{
    float *src = dev_alloc(ORDER_N * sizeof(float)), *dst = dev_alloc(ORDER_N * sizeof(float));
    CU_ASSERT_EQUAL_FATAL(dt_comm_bind_stream(comm, NULL), DT_OK);
    queue_busy_work();
    CU_ASSERT_EQUAL_FATAL(ops->fill(be, src, ORDER_N, 9.0f), DT_OK);
    CU_ASSERT_EQUAL(dt_comm_allgather(comm, src, dst, ORDER_N * sizeof(float)), DT_OK);
    CU_ASSERT_EQUAL(count_not(dst, ORDER_N, 9.0f), 0);
    CU_ASSERT_EQUAL_FATAL(dt_comm_bind_stream(comm, dt_backend_stream(be)), DT_OK);
    dt_backend_free(be, src);
    dt_backend_free(be, dst);
}

/* ---- reducer over NCCL ---------------------------------------------------------- */

/* Buckets started from ready() while the compute stream is still writing
 * later buckets; each bucket is filled with its own value just before it
 * is declared ready, so a bucket read too early would show. */
static void test_reducer_nccl(void)
{
    enum { N = 600000 };
    float *g = dev_alloc(N * sizeof *g);
    float *h = host_alloc(N * sizeof *h);
    struct dt_reducer_opts o = {.bucket_mb = 0.5, .first_bucket_mb = 0.1, .overlap = 1};
    dt_reducer_t *r = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_reducer_create(comm, g, N, &o, &r), DT_OK);
    size_t nb = dt_reducer_bucket_count(r), off[16];
    CU_ASSERT_FATAL(nb >= 4 && nb <= 16);
    dt_bucket_plan(N, 26214, 131072, off, 16); /* 0.1 and 0.5 MiB of floats */
    for (int step = 0; step < 2; step++) {
        CU_ASSERT_EQUAL_FATAL(dt_reducer_begin(r), DT_OK);
        for (size_t k = 0; k < nb; k++) {
            size_t lo = off[k], hi = k + 1 < nb ? off[k + 1] : N;
            queue_busy_work();
            CU_ASSERT_EQUAL_FATAL(ops->fill(be, g + lo, hi - lo, (float)(k + 1 + step)), DT_OK);
            CU_ASSERT_EQUAL_FATAL(dt_reducer_ready(r, hi), DT_OK);
        }
        double wait_s = -1;
        CU_ASSERT_EQUAL_FATAL(dt_reducer_finish(r, &wait_s), DT_OK);
        CU_ASSERT(wait_s >= 0);
        download(h, g, N * sizeof *h);
        size_t bad = 0;
        for (size_t k = 0; k < nb; k++)
            for (size_t i = off[k]; i < (k + 1 < nb ? off[k + 1] : N); i++)
                bad += h[i] != (float)(k + 1 + step);
        CU_ASSERT_EQUAL(bad, 0);
    }
    dt_reducer_destroy(r);
    dt_backend_free(be, g);
    free(h);
}

/* The sharded update's halves over NCCL (comm.shard: optimizer): each
 * bucket reduce-scattered as grouped ncclReduce calls, then a buffer
 * gathered as grouped ncclBroadcast calls. With one rank every chunk is
 * this rank's, so the sums are the values themselves and the owned
 * ranges tile the buffer; a bucket read before its fill, or a chunk
 * rooted at the wrong rank (an NCCL error), would show. */
static void test_reducer_nccl_sharded(void)
{
    enum { N = 600000 };
    float *g = dev_alloc(N * sizeof *g), *p = dev_alloc(N * sizeof *p);
    float *h = host_alloc(N * sizeof *h);
    struct dt_reducer_opts o = {.bucket_mb = 0.5, .first_bucket_mb = 0.1, .overlap = 1, .shard = 1};
    dt_reducer_t *r = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_reducer_create(comm, g, N, &o, &r), DT_OK);
    CU_ASSERT_TRUE(dt_reducer_sharded(r));
    size_t nb = dt_reducer_bucket_count(r), covered = 0;
    CU_ASSERT_EQUAL_FATAL(dt_reducer_begin(r), DT_OK);
    for (size_t k = 0; k < nb; k++) {
        size_t lo, hi, a, b;
        dt_reducer_bucket(r, k, &lo, &hi);
        dt_reducer_owned(r, k, &a, &b);
        CU_ASSERT(a == lo && b == hi);
        covered += b - a;
        queue_busy_work();
        CU_ASSERT_EQUAL_FATAL(ops->fill(be, g + lo, hi - lo, (float)(k + 1)), DT_OK);
        CU_ASSERT_EQUAL_FATAL(dt_reducer_ready(r, hi), DT_OK);
    }
    CU_ASSERT_EQUAL(covered, (size_t)N);
    CU_ASSERT_EQUAL_FATAL(dt_reducer_finish(r, NULL), DT_OK);
    download(h, g, N * sizeof *h);
    size_t bad = 0;
    for (size_t k = 0; k < nb; k++) {
        size_t lo, hi;
        dt_reducer_bucket(r, k, &lo, &hi);
        for (size_t i = lo; i < hi; i++)
            bad += h[i] != (float)(k + 1);
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL_FATAL(ops->fill(be, p, N, 2.5f), DT_OK);
    CU_ASSERT_EQUAL_FATAL(dt_reducer_gather(r, p, "parameters"), DT_OK);
    download(h, p, N * sizeof *h);
    bad = 0;
    for (size_t i = 0; i < N; i++)
        bad += h[i] != 2.5f;
    CU_ASSERT_EQUAL(bad, 0);
    dt_reducer_destroy(r);
    dt_backend_free(be, g);
    dt_backend_free(be, p);
    free(h);
}

/* The reducer's bf16 wire on the device: the backend's cast ops, queued on
 * the compute stream like the trainer's. */
static dt_status wire_pack(void *ctx, uint16_t *wire, const float *g, size_t n)
{
    dt_backend_t *b = ctx;
    return dt_backend_ops(b)->to_bf16(b, wire, g, n);
}

static dt_status wire_unpack(void *ctx, float *g, const uint16_t *wire, size_t n)
{
    dt_backend_t *b = ctx;
    return dt_backend_ops(b)->from_bf16(b, g, wire, n);
}

/* k + step + 1/3: never a bf16 value (1/3 needs every mantissa bit). */
static float bucket_value(size_t k, int step)
{
    return (float)(k + 1 + (size_t)step) + 1.0f / 3.0f;
}

/* As test_reducer_nccl, with gradients bf16 on the wire: every bucket comes
 * back as its value rounded to bf16 (which it is not already), so a bucket
 * sent in fp32 or packed before its fill (holding the last step's value)
 * would show. */
static void test_reducer_nccl_bf16(void)
{
    enum { N = 600000 };
    float *g = dev_alloc(N * sizeof *g);
    float *h = host_alloc(N * sizeof *h);
    struct dt_reducer_wire wire = {.pack = wire_pack,
                                   .unpack = wire_unpack,
                                   .ctx = be,
                                   .wire = dev_alloc(N * sizeof(uint16_t))};
    struct dt_reducer_opts o = {
        .bucket_mb = 0.5, .first_bucket_mb = 0.1, .overlap = 1, .wire = &wire};
    dt_reducer_t *r = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_reducer_create(comm, g, N, &o, &r), DT_OK);
    size_t nb = dt_reducer_bucket_count(r), off[16];
    CU_ASSERT_FATAL(nb >= 4 && nb <= 16);
    dt_bucket_plan(N, 26214, 131072, off, 16); /* 0.1 and 0.5 MiB of floats */
    for (int step = 0; step < 2; step++) {
        CU_ASSERT_EQUAL_FATAL(dt_reducer_begin(r), DT_OK);
        for (size_t k = 0; k < nb; k++) {
            size_t lo = off[k], hi = k + 1 < nb ? off[k + 1] : N;
            queue_busy_work();
            CU_ASSERT_EQUAL_FATAL(ops->fill(be, g + lo, hi - lo, bucket_value(k, step)), DT_OK);
            CU_ASSERT_EQUAL_FATAL(dt_reducer_ready(r, hi), DT_OK);
        }
        double wait_s = -1;
        CU_ASSERT_EQUAL_FATAL(dt_reducer_finish(r, &wait_s), DT_OK);
        CU_ASSERT(wait_s >= 0);
        download(h, g, N * sizeof *h);
        size_t bad = 0;
        for (size_t k = 0; k < nb; k++) {
            const float v = bucket_value(k, step), want = bf16_round(v);
            CU_ASSERT(want != v);
            for (size_t i = off[k]; i < (k + 1 < nb ? off[k + 1] : N); i++)
                bad += h[i] != want;
        }
        CU_ASSERT_EQUAL(bad, 0);
    }
    dt_reducer_destroy(r);
    dt_backend_free(be, wire.wire);
    dt_backend_free(be, g);
    free(h);
}

/* ---- the benchmark ------------------------------------------------------------ */

static void test_bench_nccl(void)
{
    dt_comm_t *ctl = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_comm_create("mpi", &ctl), DT_OK);
    struct dt_bench_device dev = {.be = be,
                                  .alloc = dt_backend_alloc,
                                  .free = dt_backend_free,
                                  .copy = dt_backend_copy,
                                  .sync = dt_backend_sync};
    struct dt_bench_allreduce_opts o = {
        .max_bytes = (size_t)1 << 20, .iters = 3, .warmup = 1, .device = &dev, .control = ctl};
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(mem);
    CU_ASSERT_EQUAL(dt_bench_allreduce(comm, &o, mem), DT_OK);
    fclose(mem);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "backend nccl"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "# wrong values: 0"));
    free(text);
    dt_comm_destroy(ctl);
}

/* ---- timeouts and errors ------------------------------------------------------- */

/* A short limit does not fail collectives that finish in time. */
static void test_short_timeout(void)
{
    float *d = dev_alloc(1024 * sizeof(float));
    dt_comm_set_timeout(comm, 0.5);
    for (int i = 0; i < 20; i++)
        CU_ASSERT_EQUAL(dt_comm_allreduce(comm, d, 1024, DT_F32, DT_COMM_SUM), DT_OK);
    dt_comm_set_timeout(comm, COMM_TIMEOUT_S);
    dt_backend_free(be, d);
}

/* An NCCL error (a root NCCL rejects, past comm.c's check) becomes
 * DT_ERR_COMM naming the call; the communicator is aborted and refuses
 * later work; the other communicator is unaffected. */
static void test_nccl_error(void)
{
    dt_comm_t *c2 = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_comm_create("nccl", &c2), DT_OK);
    CU_ASSERT_EQUAL(dt_comm_bind_stream(c2, dt_backend_stream(be)), DT_OK);
    float *d = dev_alloc(64);
    CU_ASSERT_EQUAL(c2->ops->broadcast(c2, d, 8, 3), DT_ERR_COMM);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "ncclBroadcast of 8 bytes from root 3"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "failed on rank 0"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "aborted"));
    CU_ASSERT_EQUAL(dt_comm_allreduce(c2, d, 2, DT_F32, DT_COMM_SUM), DT_ERR_COMM);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "aborted after an earlier failure"));
    dt_comm_destroy(c2);
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, d, 2, DT_F32, DT_COMM_SUM), DT_OK);
    dt_backend_free(be, d);
}

int main(int argc, char **argv)
{
    int provided = 0, rc = 1;
    char why[512];
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    if (!dt_cuda_usable(why, sizeof why)) {
        printf("test_gpu_comm: SKIPPED: %s\n", why);
        MPI_Finalize();
        return SKIP_EXIT;
    }
    struct dt_backend_opts o = {.threads = 1, .device = 0};
    if (dt_backend_create("cuda", &o, &be) != DT_OK || dt_comm_create("nccl", &comm) != DT_OK ||
        dt_comm_bind_stream(comm, dt_backend_stream(be)) != DT_OK ||
        dt_backend_alloc(be, BUSY_N * sizeof(float), (void **)&busy) != DT_OK) {
        fprintf(stderr, "test_gpu_comm: %s\n", dt_last_error());
        goto out;
    }
    dt_comm_set_timeout(comm, COMM_TIMEOUT_S);
    ops = dt_backend_ops(be);
    if (CU_initialize_registry() != CUE_SUCCESS) goto out;
    CU_pSuite s = CU_add_suite("nccl_one_gpu", NULL, NULL);
    CU_ADD(s, test_identity);
    CU_ADD(s, test_allreduce_f32);
    CU_ADD(s, test_allreduce_i64);
    CU_ADD(s, test_allreduce_dtypes);
    CU_ADD(s, test_allreduce_bf16);
    CU_ADD(s, test_iallreduce_many);
    CU_ADD(s, test_broadcast_allgather_reduce_scatter);
    CU_ADD(s, test_bound_stream_order);
    CU_ADD(s, test_unbound_order);
    CU_ADD(s, test_reducer_nccl);
    CU_ADD(s, test_reducer_nccl_bf16);
    CU_ADD(s, test_reducer_nccl_sharded);
    CU_ADD(s, test_bench_nccl);
    CU_ADD(s, test_short_timeout);
    CU_ADD(s, test_nccl_error);
    rc = cu_run_all();
out:
    dt_comm_destroy(comm);
    if (busy) dt_backend_free(be, busy);
    dt_backend_destroy(be);
    MPI_Finalize();
    return rc;
}
