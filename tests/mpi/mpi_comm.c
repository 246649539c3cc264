/*
 * mpi_comm.c - the mpi communicator, the gradient reducer and the
 * all-reduce benchmark under real mpirun (ctest runs it with 2 and 4
 * ranks).
 *
 * Every rank runs every test; expected values are computed locally from
 * what each rank is known to contribute, so each rank checks its own
 * result. Values are small integers (or multiples of a power of two) whose
 * sums are exact in any order, so results can be compared bit for bit.
 * Assertions that could differ between ranks are never _FATAL around a
 * collective, so one failing rank cannot leave the others waiting. Only
 * rank 0 prints CUnit's report; other ranks print their own failures, and
 * the failure count is summed over ranks so every rank exits non-zero if
 * any failed. The collective tests run twice: as they are, and in the
 * suite "mpi_comm_bounded" with a timeout set (dt_comm_set_timeout), which
 * makes the communicator run its blocking collectives as non-blocking ones
 * polled against the limit; a last test makes rank 0 give up on ranks
 * that come late.
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collectives/allreduce_perf.h"
#include "collectives/comm.h"
#include "collectives/comm_impl.h"
#include "collectives/reducer.h"
#include "core/bf16.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/clock.h"
#include "mpi_cu.h"

/* Open MPI's libraries have no frame pointers: with the fast unwinder the
 * leaks it keeps from start-up get one-frame stacks (often in components
 * it has already unloaded) that tests/lsan.supp cannot match. Sanitizer
 * builds therefore record malloc stacks with the slow unwinder; dtrain's
 * own allocations are still leak-checked at exit. */
#if defined(__SANITIZE_ADDRESS__)
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "fast_unwind_on_malloc=0";
}
#endif

#define HOST_BYTES 256

static dt_comm_t *comm;
static int rank, size;

/* Rank r's contribution at index i: a small integer, rank- and index-
 * dependent, sometimes negative. */
static int64_t ival(int r, size_t i)
{
    return (int64_t)((i + 3 * (size_t)r) % 11) - 5 + r;
}

/* The int64 test adds a term beyond 32 bits. */
static int64_t lval(int r, size_t i)
{
    return ival(r, i) + ((int64_t)(r + 1) << 33);
}

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    return p;
}

/* ---- identity -------------------------------------------------------------- */

static void test_identity(void)
{
    int wr = -1, ws = -1, len = 0;
    char name[MPI_MAX_PROCESSOR_NAME] = {0};
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    MPI_Comm_size(MPI_COMM_WORLD, &ws);
    MPI_Get_processor_name(name, &len);
    CU_ASSERT_EQUAL(dt_comm_rank(comm), wr);
    CU_ASSERT_EQUAL(dt_comm_size(comm), ws);
    CU_ASSERT_STRING_EQUAL(dt_comm_backend(comm), "mpi");
    CU_ASSERT_STRING_EQUAL(dt_comm_host(comm), name);
    CU_ASSERT(dt_comm_local_size(comm) >= 1 && dt_comm_local_size(comm) <= size);
    CU_ASSERT(dt_comm_local_rank(comm) >= 0 && dt_comm_local_rank(comm) < dt_comm_local_size(comm));
    /* The ranks on my host, in world order, give my local rank and size. */
    char mine[HOST_BYTES] = {0}, *all = xcalloc((size_t)size, HOST_BYTES);
    snprintf(mine, sizeof mine, "%s", dt_comm_host(comm));
    CU_ASSERT_EQUAL(dt_comm_allgather(comm, mine, all, HOST_BYTES), DT_OK);
    int same = 0, before = 0;
    for (int r = 0; r < size; r++)
        if (!strcmp(all + (size_t)r * HOST_BYTES, mine)) {
            same++;
            before += r < rank;
        }
    CU_ASSERT_EQUAL(same, dt_comm_local_size(comm));
    CU_ASSERT_EQUAL(before, dt_comm_local_rank(comm));
    free(all);
}

/* ---- allreduce ------------------------------------------------------------- */

/* Expected reduction of lval/ival over all ranks at index i. */
static int64_t expect_int(enum dt_comm_op op, size_t i, int wide)
{
    int64_t acc = wide ? lval(0, i) : ival(0, i);
    for (int r = 1; r < size; r++) {
        int64_t v = wide ? lval(r, i) : ival(r, i);
        acc = op == DT_COMM_MAX   ? (v > acc ? v : acc)
              : op == DT_COMM_MIN ? (v < acc ? v : acc)
                                  : acc + v;
    }
    return acc;
}

static void fill_typed(void *buf, enum dt_dtype t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        switch (t) {
        case DT_F32:
            ((float *)buf)[i] = (float)ival(rank, i);
            break;
        case DT_F64:
            ((double *)buf)[i] = (double)ival(rank, i);
            break;
        case DT_I32:
            ((int32_t *)buf)[i] = (int32_t)ival(rank, i);
            break;
        case DT_I64:
            ((int64_t *)buf)[i] = lval(rank, i);
            break;
        case DT_U8:
            ((uint8_t *)buf)[i] = (uint8_t)(ival(rank, i) + 5);
            break;
        case DT_BF16: /* small integers: every partial sum is exact in bf16 */
            ((uint16_t *)buf)[i] = dt_bf16_from_float((float)ival(rank, i));
            break;
        default: /* not a communicator type */
            break;
        }
    }
}

/* Counts the elements of buf that differ from the exact expected result. */
static size_t count_wrong(const void *buf, enum dt_dtype t, enum dt_comm_op op, size_t n)
{
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t e = expect_int(op == DT_COMM_AVG ? DT_COMM_SUM : op, i, t == DT_I64);
        switch (t) {
        case DT_F32: {
            float want = op == DT_COMM_AVG ? (float)e / (float)size : (float)e;
            wrong += ((const float *)buf)[i] != want;
            break;
        }
        case DT_F64: {
            double want = op == DT_COMM_AVG ? (double)e / size : (double)e;
            wrong += ((const double *)buf)[i] != want;
            break;
        }
        case DT_I32:
            wrong += ((const int32_t *)buf)[i] != (int32_t)e;
            break;
        case DT_I64:
            wrong += ((const int64_t *)buf)[i] != e;
            break;
        case DT_U8: {
            int64_t u = op == DT_COMM_SUM ? e + 5 * size : e + 5;
            wrong += ((const uint8_t *)buf)[i] != (uint8_t)u;
            break;
        }
        case DT_BF16:
            wrong += dt_bf16_to_float(((const uint16_t *)buf)[i]) != (float)e;
            break;
        default: /* not a communicator type: every element is wrong */
            wrong++;
            break;
        }
    }
    return wrong;
}

static void check_allreduce(enum dt_dtype t, enum dt_comm_op op, size_t n)
{
    void *buf = xcalloc(n, dt_dtype_size(t));
    fill_typed(buf, t, n);
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, buf, n, t, op), DT_OK);
    CU_ASSERT_EQUAL(count_wrong(buf, t, op, n), 0);
    free(buf);
}

static void test_allreduce_types(void)
{
    const enum dt_dtype types[] = {DT_F32, DT_F64, DT_I32, DT_I64};
    const enum dt_comm_op ops[] = {DT_COMM_SUM, DT_COMM_AVG, DT_COMM_MAX, DT_COMM_MIN};
    for (size_t t = 0; t < 4; t++)
        for (size_t o = 0; o < 4; o++)
            if (ops[o] != DT_COMM_AVG || types[t] == DT_F32 || types[t] == DT_F64)
                check_allreduce(types[t], ops[o], 1001);
    check_allreduce(DT_U8, DT_COMM_SUM, 333);
    check_allreduce(DT_U8, DT_COMM_MAX, 333);
    check_allreduce(DT_F32, DT_COMM_SUM, 1);
    check_allreduce(DT_F32, DT_COMM_SUM, ((size_t)1 << 20) + 3); /* large-message path */
    check_allreduce(DT_F64, DT_COMM_AVG, ((size_t)1 << 18) + 1);
    int32_t i[3] = {1, 2, 3};
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, i, 3, DT_I32, DT_COMM_AVG), DT_ERR_INVALID_ARG);
    check_allreduce(DT_BF16, DT_COMM_SUM, 1001);
    check_allreduce(DT_BF16, DT_COMM_SUM, ((size_t)1 << 20) + 5);
    uint16_t h[2] = {0x3f80, 0x4000};
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, h, 2, DT_BF16, DT_COMM_MAX), DT_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, h, 2, DT_BF16, DT_COMM_AVG), DT_ERR_INVALID_ARG);
}

/* A bf16 sum rounds each partial sum: 1 + 2^-9 on every rank is 1 in bf16
 * (the addend rounds away), so any number of ranks gives `size` exactly
 * while the fp32 sum keeps the extra bits. */
static void test_allreduce_bf16_rounds(void)
{
    uint16_t h = dt_bf16_from_float(1.0f + 0x1p-9f);
    CU_ASSERT_EQUAL(h, dt_bf16_from_float(1.0f));
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, &h, 1, DT_BF16, DT_COMM_SUM), DT_OK);
    CU_ASSERT_EQUAL(dt_bf16_to_float(h), (float)size);
    dt_comm_req_t *req = NULL;
    uint16_t v[3] = {dt_bf16_from_float(0.5f), dt_bf16_from_float(-2.0f), 0};
    CU_ASSERT_EQUAL_FATAL(dt_comm_iallreduce(comm, v, 3, DT_BF16, DT_COMM_SUM, &req), DT_OK);
    CU_ASSERT_EQUAL(dt_comm_wait(comm, req), DT_OK);
    CU_ASSERT(dt_bf16_to_float(v[0]) == 0.5f * size && dt_bf16_to_float(v[1]) == -2.0f * size &&
              v[2] == 0);
}

/* ---- non-blocking ---------------------------------------------------------- */

static void test_iallreduce_test_loop(void)
{
    size_t n = (size_t)1 << 18;
    float *buf = xcalloc(n, sizeof *buf);
    fill_typed(buf, DT_F32, n);
    dt_comm_req_t *req = NULL;
    int done = 0, ok = 1;
    long polls = 0;
    CU_ASSERT_EQUAL(dt_comm_iallreduce(comm, buf, n, DT_F32, DT_COMM_AVG, &req), DT_OK);
    while (req && !done && ok) {
        ok = dt_comm_test(comm, req, &done) == DT_OK;
        polls++;
    }
    CU_ASSERT(ok && done && polls >= 1);
    CU_ASSERT_EQUAL(count_wrong(buf, DT_F32, DT_COMM_AVG, n), 0);
    /* and with wait */
    fill_typed(buf, DT_F32, n);
    CU_ASSERT_EQUAL(dt_comm_iallreduce(comm, buf, n, DT_F32, DT_COMM_MIN, &req), DT_OK);
    CU_ASSERT_EQUAL(dt_comm_wait(comm, req), DT_OK);
    CU_ASSERT_EQUAL(count_wrong(buf, DT_F32, DT_COMM_MIN, n), 0);
    free(buf);
}

/* Several requests in flight at once, completed out of order. */
static void test_many_in_flight(void)
{
    enum { K = 8 };
    const enum dt_dtype types[K] = {DT_F32, DT_F64, DT_I32, DT_I64,
                                         DT_F32, DT_I32, DT_F64, DT_F32};
    const enum dt_comm_op ops[K] = {DT_COMM_SUM, DT_COMM_MAX, DT_COMM_MIN, DT_COMM_SUM,
                                    DT_COMM_AVG, DT_COMM_SUM, DT_COMM_AVG, DT_COMM_MAX};
    void *bufs[K];
    dt_comm_req_t *reqs[K] = {0};
    size_t n[K];
    for (int k = 0; k < K; k++) {
        n[k] = 1 + (size_t)k * 9973;
        bufs[k] = xcalloc(n[k], dt_dtype_size(types[k]));
        fill_typed(bufs[k], types[k], n[k]);
        CU_ASSERT_EQUAL(dt_comm_iallreduce(comm, bufs[k], n[k], types[k], ops[k], &reqs[k]), DT_OK);
    }
    for (int k = K - 1; k >= 0; k--) {
        int done = 0;
        if (k % 2) /* poll the odd ones, wait for the even ones */
            while (reqs[k] && !done && dt_comm_test(comm, reqs[k], &done) == DT_OK)
                ;
        else if (reqs[k])
            done = dt_comm_wait(comm, reqs[k]) == DT_OK;
        CU_ASSERT(done);
        CU_ASSERT_EQUAL(count_wrong(bufs[k], types[k], ops[k], n[k]), 0);
        free(bufs[k]);
    }
}

/* ---- broadcast, allgather, reduce-scatter, barrier ------------------------ */

static uint8_t byte_at(int r, size_t j)
{
    return (uint8_t)((size_t)r * 37 + j * 5 + 1);
}

static void check_broadcast(int root, size_t bytes)
{
    uint8_t *buf = xcalloc(bytes, 1);
    size_t wrong = 0;
    if (rank == root)
        for (size_t j = 0; j < bytes; j++)
            buf[j] = byte_at(root, j);
    CU_ASSERT_EQUAL(dt_comm_broadcast(comm, buf, bytes, root), DT_OK);
    for (size_t j = 0; j < bytes; j++)
        wrong += buf[j] != byte_at(root, j);
    CU_ASSERT_EQUAL(wrong, 0);
    free(buf);
}

static void test_broadcast(void)
{
    check_broadcast(size - 1, ((size_t)1 << 20) + 13);
    check_broadcast(0, 1);
    check_broadcast(size / 2, 4097);
    char b[16] = {0};
    /* a bad root is refused on every rank before any MPI call */
    CU_ASSERT_EQUAL(dt_comm_broadcast(comm, b, sizeof b, size), DT_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(dt_comm_broadcast(comm, b, sizeof b, -1), DT_ERR_INVALID_ARG);
}

/* An MPI failure comes back as DT_ERR_COMM with MPI's own text: the backend
 * is called directly (past comm.c's root check) with a root MPI rejects
 * locally on every rank. */
static void test_mpi_error_text(void)
{
    char b[16] = {0}, want[64];
    CU_ASSERT_EQUAL(comm->ops->broadcast(comm, b, sizeof b, size + 2), DT_ERR_COMM);
    snprintf(want, sizeof want, "failed on rank %d: MPI_ERR_ROOT", rank);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "MPI_Bcast of 16 bytes"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), want));
    /* the communicator still works afterwards */
    check_broadcast(0, 64);
}

static void check_allgather(size_t bytes, int in_place)
{
    uint8_t *send = xcalloc(bytes, 1), *recv = xcalloc(bytes * (size_t)size, 1);
    size_t wrong = 0;
    uint8_t *src = in_place ? recv + (size_t)rank * bytes : send;
    for (size_t j = 0; j < bytes; j++)
        src[j] = byte_at(rank, j);
    CU_ASSERT_EQUAL(dt_comm_allgather(comm, src, recv, bytes), DT_OK);
    for (int r = 0; r < size; r++)
        for (size_t j = 0; j < bytes; j++)
            wrong += recv[(size_t)r * bytes + j] != byte_at(r, j);
    CU_ASSERT_EQUAL(wrong, 0);
    free(send);
    free(recv);
}

static void test_allgather(void)
{
    check_allgather(37, 0);
    check_allgather((size_t)1 << 16, 0);
    check_allgather(1001, 1);
}

static void check_reduce_scatter(enum dt_dtype t, enum dt_comm_op op, size_t count)
{
    size_t esz = dt_dtype_size(t);
    char *send = xcalloc(count * (size_t)size, esz), *recv = xcalloc(count, esz);
    char *want = xcalloc(count * (size_t)size, esz);
    /* send holds every rank's block; the allreduce of it, cut at my block,
     * is what reduce-scatter must give me */
    fill_typed(send, t, count * (size_t)size);
    CU_ASSERT_EQUAL(dt_comm_reduce_scatter(comm, send, recv, count, t, op), DT_OK);
    size_t before = count * (size_t)rank;
    fill_typed(want, t, count * (size_t)size);
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, want, count * (size_t)size, t, op), DT_OK);
    CU_ASSERT_EQUAL(memcmp(recv, want + before * esz, count * esz), 0);
    free(send);
    free(recv);
    free(want);
}

static void test_reduce_scatter(void)
{
    check_reduce_scatter(DT_F32, DT_COMM_SUM, 1003);
    check_reduce_scatter(DT_I32, DT_COMM_MAX, 17);
    check_reduce_scatter(DT_F64, DT_COMM_AVG, 4099);
    check_reduce_scatter(DT_I64, DT_COMM_MIN, 1);
}

/* Nobody leaves the barrier before the last rank, which sleeps, enters it.
 * Only meaningful when all ranks share one monotonic clock (one host). */
static void test_barrier(void)
{
    double entered = 0;
    if (rank == size - 1) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        entered = dt_now();
    }
    CU_ASSERT_EQUAL(dt_comm_barrier(comm), DT_OK);
    double left = dt_now();
    CU_ASSERT_EQUAL(dt_comm_broadcast(comm, &entered, sizeof entered, size - 1), DT_OK);
    if (dt_comm_local_size(comm) == size) CU_ASSERT(left >= entered);
}

/* Splitting into pieces: with max_count lowered, every call is cut up. */
static void test_pieces(void)
{
    comm->max_count = 1000;
    check_allreduce(DT_F32, DT_COMM_AVG, 10007);
    check_allreduce(DT_I64, DT_COMM_SUM, 2000);
    size_t n = 4321;
    double *d = xcalloc(n, sizeof *d);
    dt_comm_req_t *req = NULL;
    fill_typed(d, DT_F64, n);
    CU_ASSERT_EQUAL(dt_comm_iallreduce(comm, d, n, DT_F64, DT_COMM_AVG, &req), DT_OK);
    CU_ASSERT_EQUAL(dt_comm_wait(comm, req), DT_OK);
    CU_ASSERT_EQUAL(count_wrong(d, DT_F64, DT_COMM_AVG, n), 0);
    check_broadcast(size - 1, 5003);
    check_allgather(2500, 0);
    CU_ASSERT_EQUAL(dt_comm_reduce_scatter(comm, d, d, 1001, DT_F64, DT_COMM_SUM),
                    DT_ERR_UNSUPPORTED);
    comm->max_count = INT32_MAX;
    free(d);
}

/* ---- reducer ----------------------------------------------------------------- */

#define RED_N 1000003
#define RED_BUCKET_MB 0.05 /* 13107 floats */
#define RED_FIRST_MB 0.01  /* 2621 floats */
#define EXACT_SCALE (1.0 / (1 << 20))

/* Random gradients. exact: multiples of 2^-20 below 1 in magnitude, whose
 * sums over ranks are exact in any order; else standard normals. */
static void random_grads(float *g, size_t n, int exact, uint64_t seed)
{
    struct dt_rng_key k = {.seed = seed, .purpose = DT_RNG_TEST, .stream = (uint32_t)rank};
    for (size_t i = 0; i < n; i++)
        g[i] = exact ? (float)(((double)dt_rng_below(&k, i, 1u << 21) - (1 << 20)) * EXACT_SCALE)
                     : dt_rng_normal(&k, i);
}

/* The next prefix after `done`. Random: an uneven, rank-dependent step.
 * Boundaries: one short of the next bucket end, then the end itself, so a
 * bucket started one element early is caught. */
static size_t next_done(size_t done, uint64_t i, const struct dt_rng_key *k, int boundaries)
{
    static size_t off[DT_REDUCER_MAX_BUCKETS + 1];
    if (!boundaries) {
        size_t next = done + 1 + (size_t)dt_rng_below(k, i, 40000);
        return next < RED_N ? next : RED_N;
    }
    size_t n = dt_bucket_plan(RED_N, 2621, 13107, off, DT_REDUCER_MAX_BUCKETS);
    off[n] = RED_N;
    size_t b = 1;
    while (off[b] <= done)
        b++;
    return off[b] - 1 > done ? off[b] - 1 : off[b];
}

/* One step, as backward would run it: the gradients of x become final in
 * a growing prefix, copied into g (poisoned beforehand) just before ready()
 * hears of them (ranks need not agree on timing, only on bucket order);
 * then finish(). A bucket started before its gradients are final would
 * reduce poison or race with the copy. */
static void reduce_step(dt_reducer_t *r, float *g, const float *x, uint64_t salt, int boundaries)
{
    struct dt_rng_key k = {.seed = salt, .purpose = DT_RNG_TEST, .stream = 1000u + (uint32_t)rank};
    double wait_s = -1;
    CU_ASSERT_EQUAL(dt_reducer_begin(r), DT_OK); /* nothing in flight after it */
    for (size_t i = 0; i < RED_N; i++)
        g[i] = NAN;
    size_t done = 0;
    for (uint64_t i = 0; done < RED_N; i++) {
        size_t next = next_done(done, i, &k, boundaries);
        memcpy(g + done, x + done, (next - done) * sizeof *g);
        done = next;
        CU_ASSERT_EQUAL(dt_reducer_ready(r, done), DT_OK);
        CU_ASSERT_EQUAL(dt_reducer_ready(r, done), DT_OK); /* nothing new: cheap no-op */
    }
    CU_ASSERT_EQUAL(dt_reducer_finish(r, &wait_s), DT_OK);
    CU_ASSERT(wait_s >= 0);
}

static dt_reducer_t *make_reducer(float *g, int overlap)
{
    struct dt_reducer_opts o = {
        .bucket_mb = RED_BUCKET_MB, .first_bucket_mb = RED_FIRST_MB, .overlap = overlap};
    dt_reducer_t *r = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_reducer_create(comm, g, RED_N, &o, &r), DT_OK);
    CU_ASSERT_EQUAL(dt_reducer_bucket_count(r), dt_bucket_plan(RED_N, 2621, 13107, NULL, 0));
    CU_ASSERT(dt_reducer_bucket_count(r) > 50);
    return r;
}

/* x reduced by one plain blocking allreduce, into ref. */
static void plain_allreduce(const float *x, float *ref)
{
    memcpy(ref, x, RED_N * sizeof *x);
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, ref, RED_N, DT_F32, DT_COMM_SUM), DT_OK);
}

/* Exact data: the reducer equals one plain allreduce of the whole buffer. */
static void test_reducer_matches_allreduce(void)
{
    float *x = xcalloc(RED_N, sizeof *x), *g = xcalloc(RED_N, sizeof *g);
    float *ref = xcalloc(RED_N, sizeof *ref);
    dt_reducer_t *r = make_reducer(g, 1);
    random_grads(x, RED_N, 1, 42);
    plain_allreduce(x, ref);
    reduce_step(r, g, x, 7, 0);
    CU_ASSERT_EQUAL(memcmp(g, ref, RED_N * sizeof *g), 0);
    reduce_step(r, g, x, 8, 1);
    CU_ASSERT_EQUAL(memcmp(g, ref, RED_N * sizeof *g), 0);
    dt_reducer_destroy(r);
    free(x);
    free(g);
    free(ref);
}

/* Full-precision data: overlap on, overlap off and a second step of the
 * same reducer give the same bits; all are close to a plain allreduce
 * (bit equality with it is not promised: it may sum in another order). */
static void test_reducer_deterministic(void)
{
    float *x = xcalloc(RED_N, sizeof *x), *a = xcalloc(RED_N, sizeof *a);
    float *b = xcalloc(RED_N, sizeof *b), *ref = xcalloc(RED_N, sizeof *ref);
    dt_reducer_t *ra = make_reducer(a, 1), *rb = make_reducer(b, 0);
    random_grads(x, RED_N, 0, 99);
    reduce_step(ra, a, x, 1, 0);
    reduce_step(rb, b, x, 2, 0);
    CU_ASSERT_EQUAL(memcmp(a, b, RED_N * sizeof *a), 0);
    plain_allreduce(x, ref);
    size_t far = 0;
    for (size_t i = 0; i < RED_N; i++)
        far += !(fabsf(a[i] - ref[i]) <= 1e-5f * (float)size);
    CU_ASSERT_EQUAL(far, 0);
    reduce_step(ra, a, x, 3, 1); /* a second step of the same reducer */
    CU_ASSERT_EQUAL(memcmp(a, b, RED_N * sizeof *a), 0);
    dt_reducer_destroy(ra);
    dt_reducer_destroy(rb);
    free(x);
    free(a);
    free(b);
    free(ref);
}

/* Host-memory pack and unpack for a bf16 wire, counting what they move. */
static size_t packed, unpacked;
static dt_status host_pack(void *ctx, uint16_t *wire, const float *g, size_t n)
{
    dt_bf16_pack(wire, g, n);
    packed += n;
    return DT_OK;
}
static dt_status host_unpack(void *ctx, float *g, const uint16_t *wire, size_t n)
{
    dt_bf16_unpack(g, wire, n);
    unpacked += n;
    return DT_OK;
}

/* A bf16 wire: every element is packed and unpacked once per step; data
 * bf16 holds exactly (and whose sums it holds) gives the fp32 result bit
 * for bit; full-precision data comes within bf16 resolution of it, and
 * not bit-equal (the wire really rounds). */
static void test_reducer_bf16_wire(void)
{
    float *x = xcalloc(RED_N, sizeof *x), *g = xcalloc(RED_N, sizeof *g);
    float *ref = xcalloc(RED_N, sizeof *ref);
    uint16_t *wire = xcalloc(RED_N, sizeof *wire);
    struct dt_reducer_wire w = {host_pack, host_unpack, NULL, wire};
    struct dt_reducer_opts o = {.bucket_mb = RED_BUCKET_MB, .first_bucket_mb = RED_FIRST_MB,
                                .overlap = 1, .wire = &w};
    dt_reducer_t *r = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_reducer_create(comm, g, RED_N, &o, &r), DT_OK);
    for (size_t i = 0; i < RED_N; i++)
        x[i] = (float)((int)((i * 7 + (size_t)rank * 3) % 33) - 16) * 0.25f;
    plain_allreduce(x, ref);
    packed = unpacked = 0;
    reduce_step(r, g, x, 11, 0);
    CU_ASSERT(packed == RED_N && unpacked == RED_N);
    CU_ASSERT_EQUAL(memcmp(g, ref, RED_N * sizeof *g), 0);
    random_grads(x, RED_N, 0, 77);
    plain_allreduce(x, ref);
    reduce_step(r, g, x, 12, 1);
    size_t far = 0, differ = 0;
    for (size_t i = 0; i < RED_N; i++) {
        far += !(fabsf(g[i] - ref[i]) <= 0x1p-6f * (fabsf(ref[i]) + (float)size));
        differ += g[i] != ref[i];
    }
    CU_ASSERT_EQUAL(far, 0);
    CU_ASSERT(differ > RED_N / 2);
    struct dt_reducer_wire bad = {host_pack, NULL, NULL, wire};
    o.wire = &bad;
    dt_reducer_t *r2 = NULL;
    CU_ASSERT_EQUAL(dt_reducer_create(comm, g, RED_N, &o, &r2), DT_ERR_INVALID_ARG);
    dt_reducer_destroy(r);
    free(x), free(g), free(ref), free(wire);
}

/* A step abandoned half-way (begin() again with buckets in flight) is
 * drained; the next step then runs normally. */
static void test_reducer_restart(void)
{
    float *x = xcalloc(RED_N, sizeof *x), *g = xcalloc(RED_N, sizeof *g);
    float *ref = xcalloc(RED_N, sizeof *ref);
    dt_reducer_t *r = make_reducer(g, 1);
    CU_ASSERT_EQUAL(dt_reducer_begin(r), DT_OK);
    CU_ASSERT_EQUAL(dt_reducer_ready(r, RED_N / 2), DT_OK);
    CU_ASSERT_EQUAL(dt_reducer_ready(r, RED_N + 1), DT_ERR_INVALID_ARG);
    random_grads(x, RED_N, 1, 5);
    reduce_step(r, g, x, 11, 0); /* its begin() drains the half started above */
    plain_allreduce(x, ref);
    CU_ASSERT_EQUAL(memcmp(g, ref, RED_N * sizeof *g), 0);
    CU_ASSERT_EQUAL(dt_reducer_finish(r, NULL), DT_ERR_INVALID_ARG); /* no step open */
    dt_reducer_destroy(r);
    free(x);
    free(g);
    free(ref);
}

/* ---- benchmark ---------------------------------------------------------------- */

/* Runs the bench into a memory stream on rank 0 and parses its rows. */
static void run_bench(const struct dt_bench_allreduce_opts *o, size_t lo, size_t hi)
{
    char *text = NULL;
    size_t len = 0;
    FILE *mem = rank == 0 ? open_memstream(&text, &len) : NULL;
    CU_ASSERT_EQUAL(dt_bench_allreduce(comm, o, mem), DT_OK);
    if (rank != 0) return;
    fclose(mem);
    char want[64];
    snprintf(want, sizeof want, "backend mpi, %d ranks", size);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, want));
    size_t rows = 0, expect = lo;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        size_t bytes = 0, count = 0;
        char type[16] = "";
        int iters = 0;
        double us = 0, alg = 0, bus = 0;
        long long wrong = -1;
        if (line[0] == '#') continue;
        int got = sscanf(line, "%zu %zu %15s %d %lf %lf %lf %lld", &bytes, &count, type, &iters,
                         &us, &alg, &bus, &wrong);
        CU_ASSERT_EQUAL(got, 8);
        CU_ASSERT_EQUAL(bytes, expect);
        CU_ASSERT_EQUAL(count, bytes / 4);
        CU_ASSERT_STRING_EQUAL(type, "float");
        CU_ASSERT(iters >= 1 && us > 0);
        /* the bandwidths follow from size and time, to print precision
         * (time to 0.005 us, bandwidths to 0.0005 GB/s) */
        double lo_alg = (double)bytes / ((us + 0.005) * 1e3) - 0.0006;
        double hi_alg = (double)bytes / ((us > 0.01 ? us - 0.005 : 0.005) * 1e3) + 0.0006;
        double bus_of = 2.0 * (size - 1) / size;
        CU_ASSERT(alg >= lo_alg && alg <= hi_alg);
        CU_ASSERT(bus >= lo_alg * bus_of - 0.0006 && bus <= hi_alg * bus_of + 0.0006);
        CU_ASSERT_EQUAL(wrong, 0);
        rows++;
        expect *= 2;
    }
    size_t n = 0;
    for (size_t b = lo; b <= hi; b *= 2)
        n++;
    CU_ASSERT_EQUAL(rows, n);
    free(text);
}

static void test_bench(void)
{
    struct dt_bench_allreduce_opts o = {.max_bytes = (size_t)1 << 20, .iters = 5, .warmup = 1};
    run_bench(&o, 8, (size_t)1 << 20);                                      /* 18 rows */
    o = (struct dt_bench_allreduce_opts){.min_bytes = 9, .max_bytes = 100}; /* adaptive iters */
    run_bench(&o, 16, 64);
}

/* ---- the ring all-reduce ------------------------------------------------- */

/* The second suite reruns the non-blocking and reducer tests with every
 * fp32/bf16 sum on the ring (its threshold lowered to 0). */
static int ring_on(void)
{
    dt_comm_set_ring_min_bytes(comm, 0);
    return 0;
}

static int ring_off(void)
{
    dt_comm_set_ring_min_bytes(comm, DT_COMM_RING_MIN_BYTES);
    return 0;
}

static uint64_t fnv1a(const void *p, size_t bytes)
{
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < bytes; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* Sizes around the chunking (fewer elements than ranks, one more, odd),
 * exact data checked against the known sums, then full-precision data:
 * every rank must hold the same bits, close to the library's all-reduce,
 * and the same bits again on a repeat. */
static void test_ring_sizes(void)
{
    const size_t sizes[] = {1, (size_t)size - 1, (size_t)size, (size_t)size + 1, 4099, 1000003};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        if (n == 0)
            continue;
        float *buf = xcalloc(n, sizeof *buf), *ref = xcalloc(n, sizeof *ref);
        float *again = xcalloc(n, sizeof *again);
        uint16_t *h = xcalloc(n, sizeof *h);
        const enum dt_comm_op ops[] = {DT_COMM_SUM, DT_COMM_AVG};
        for (int o = 0; o < 2; o++) {
            fill_typed(buf, DT_F32, n);
            dt_comm_req_t *req = NULL;
            CU_ASSERT_EQUAL_FATAL(dt_comm_iallreduce(comm, buf, n, DT_F32, ops[o], &req), DT_OK);
            CU_ASSERT_EQUAL(dt_comm_wait(comm, req), DT_OK);
            CU_ASSERT_EQUAL(count_wrong(buf, DT_F32, ops[o], n), 0);
        }
        fill_typed(h, DT_BF16, n);
        dt_comm_req_t *req = NULL;
        CU_ASSERT_EQUAL_FATAL(dt_comm_iallreduce(comm, h, n, DT_BF16, DT_COMM_SUM, &req), DT_OK);
        CU_ASSERT_EQUAL(dt_comm_wait(comm, req), DT_OK);
        CU_ASSERT_EQUAL(count_wrong(h, DT_BF16, DT_COMM_SUM, n), 0);

        random_grads(buf, n, 0, 1234 + k);
        memcpy(ref, buf, n * sizeof *buf);
        memcpy(again, buf, n * sizeof *buf);
        CU_ASSERT_EQUAL_FATAL(dt_comm_iallreduce(comm, buf, n, DT_F32, DT_COMM_SUM, &req), DT_OK);
        int done = 0;
        while (req && !done && dt_comm_test(comm, req, &done) == DT_OK)
            ;
        CU_ASSERT(done);
        CU_ASSERT_EQUAL_FATAL(dt_comm_iallreduce(comm, again, n, DT_F32, DT_COMM_SUM, &req), DT_OK);
        CU_ASSERT_EQUAL(dt_comm_wait(comm, req), DT_OK);
        CU_ASSERT_EQUAL(memcmp(buf, again, n * sizeof *buf), 0);
        CU_ASSERT_EQUAL(dt_comm_allreduce(comm, ref, n, DT_F32, DT_COMM_SUM), DT_OK);
        size_t far = 0;
        for (size_t i = 0; i < n; i++)
            far += !(fabsf(buf[i] - ref[i]) <= 1e-5f * (float)size);
        CU_ASSERT_EQUAL(far, 0);
        uint64_t mine = fnv1a(buf, n * sizeof *buf), *all = xcalloc((size_t)size, sizeof *all);
        CU_ASSERT_EQUAL(dt_comm_allgather(comm, &mine, all, sizeof mine), DT_OK);
        for (int r = 0; r < size; r++)
            CU_ASSERT_EQUAL(all[r], mine);
        free(all);
        free(buf);
        free(ref);
        free(again);
        free(h);
    }
}

/* ---- bounded waits ------------------------------------------------------------- */

#define BOUNDED_LIMIT_S 60.0 /* the bounded suite's limit: never reached */
#define SHORT_LIMIT_S 0.2    /* rank 0's limit in the late-peer test */
#define LATE_S 1.0           /* how late the other ranks come */

static int bounded_begin(void)
{
    dt_comm_set_timeout(comm, BOUNDED_LIMIT_S);
    return 0;
}

static int bounded_end(void)
{
    dt_comm_set_timeout(comm, 0);
    return 0;
}

/* The ring with a timeout set: its waits are bounded too. */
static int ring_bounded_begin(void)
{
    ring_on();
    return bounded_begin();
}

static int ring_bounded_end(void)
{
    ring_off();
    return bounded_end();
}

/* Rank 0 waits SHORT_LIMIT_S for an allreduce the others join LATE_S
 * later: its wait gives up with DT_ERR_TIMEOUT naming the collective, the
 * limit and the rank, and its communicator refuses every later call at
 * once. The late ranks still complete the collective (rank 0's MPI goes on
 * progressing it), so the test ends cleanly on every rank. */
static void test_timeout_gives_up(void)
{
    static int32_t early = 1; /* rank 0's buffer outlives the test: MPI still owns it */
    int32_t late = 1;
    dt_comm_t *c = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_comm_create("mpi", &c), DT_OK);
    if (rank == 0) {
        dt_comm_set_timeout(c, SHORT_LIMIT_S);
        CU_ASSERT_EQUAL(dt_comm_allreduce(c, &early, 1, DT_I32, DT_COMM_SUM), DT_ERR_TIMEOUT);
        const char *msg = dt_last_error();
        CU_ASSERT_PTR_NOT_NULL(strstr(msg, "MPI_Allreduce of 1 "));
        CU_ASSERT_PTR_NOT_NULL(strstr(msg, "did not complete within 0.2 s on rank 0"));
        if (!strstr(msg, "did not complete within 0.2 s on rank 0"))
            fprintf(stderr, "rank 0: %s\n", msg);
        dt_comm_req_t *req = NULL;
        CU_ASSERT_EQUAL(dt_comm_barrier(c), DT_ERR_TIMEOUT);
        CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "MPI_Barrier on rank 0: refused"));
        CU_ASSERT_EQUAL(dt_comm_iallreduce(c, &late, 1, DT_I32, DT_COMM_SUM, &req), DT_ERR_TIMEOUT);
    } else {
        struct timespec nap = {(time_t)LATE_S, (long)((LATE_S - (time_t)LATE_S) * 1e9)};
        nanosleep(&nap, NULL);
        dt_comm_set_timeout(c, BOUNDED_LIMIT_S);
        CU_ASSERT_EQUAL(dt_comm_allreduce(c, &late, 1, DT_I32, DT_COMM_SUM), DT_OK);
        CU_ASSERT_EQUAL(late, size);
    }
    MPI_Barrier(MPI_COMM_WORLD); /* rank 0 progresses its pending allreduce meanwhile */
    dt_comm_destroy(c);
}

/* The ring's waits are bounded: rank 0 waits for a ring all-reduce the
 * other ranks never join, gives up with DT_ERR_TIMEOUT naming the ring's
 * step, and its communicator refuses the next one. */
static void test_ring_timeout_gives_up(void)
{
    enum { N = 4096 };
    static float early[N]; /* rank 0's buffer outlives the test: MPI still owns it */
    dt_comm_t *c = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_comm_create("mpi", &c), DT_OK);
    if (rank == 0) {
        dt_comm_set_ring_min_bytes(c, 0);
        dt_comm_set_timeout(c, SHORT_LIMIT_S);
        dt_comm_req_t *req = NULL;
        CU_ASSERT_EQUAL_FATAL(dt_comm_iallreduce(c, early, N, DT_F32, DT_COMM_SUM, &req), DT_OK);
        CU_ASSERT_EQUAL(dt_comm_wait(c, req), DT_ERR_TIMEOUT);
        const char *msg = dt_last_error();
        CU_ASSERT_PTR_NOT_NULL(strstr(msg, "step 1 of "));
        CU_ASSERT_PTR_NOT_NULL(strstr(msg, "ring all-reduce of 4096 floats"));
        CU_ASSERT_PTR_NOT_NULL(strstr(msg, "did not complete within 0.2 s on rank 0"));
        if (!strstr(msg, "ring all-reduce"))
            fprintf(stderr, "rank 0: %s\n", msg);
        CU_ASSERT_EQUAL(dt_comm_iallreduce(c, early, N, DT_F32, DT_COMM_SUM, &req), DT_ERR_TIMEOUT);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    dt_comm_destroy(c);
}

/* ---- main ---------------------------------------------------------------------- */

static void add_suites(void)
{
    CU_pSuite s = CU_add_suite("mpi_comm", NULL, NULL);
    CU_ADD(s, test_identity);
    CU_ADD(s, test_allreduce_types);
    CU_ADD(s, test_allreduce_bf16_rounds);
    CU_ADD(s, test_iallreduce_test_loop);
    CU_ADD(s, test_many_in_flight);
    CU_ADD(s, test_broadcast);
    CU_ADD(s, test_mpi_error_text);
    CU_ADD(s, test_allgather);
    CU_ADD(s, test_reduce_scatter);
    CU_ADD(s, test_barrier);
    CU_ADD(s, test_pieces);
    CU_ADD(s, test_reducer_matches_allreduce);
    CU_ADD(s, test_reducer_deterministic);
    CU_ADD(s, test_reducer_restart);
    CU_ADD(s, test_reducer_bf16_wire);
    CU_ADD(s, test_bench);

    CU_pSuite ring = CU_add_suite("mpi_comm_ring", ring_on, ring_off);
    CU_ADD(ring, test_iallreduce_test_loop);
    CU_ADD(ring, test_many_in_flight);
    CU_ADD(ring, test_pieces);
    CU_ADD(ring, test_ring_sizes);
    CU_ADD(ring, test_reducer_matches_allreduce);
    CU_ADD(ring, test_reducer_deterministic);
    CU_ADD(ring, test_reducer_restart);
    CU_ADD(ring, test_reducer_bf16_wire);

    CU_pSuite b = CU_add_suite("mpi_comm_bounded", bounded_begin, bounded_end);
    CU_ADD(b, test_allreduce_types);
    CU_ADD(b, test_allreduce_bf16_rounds);
    CU_ADD(b, test_iallreduce_test_loop);
    CU_ADD(b, test_many_in_flight);
    CU_ADD(b, test_broadcast);
    CU_ADD(b, test_allgather);
    CU_ADD(b, test_reduce_scatter);
    CU_ADD(b, test_barrier);
    CU_ADD(b, test_pieces);
    CU_ADD(b, test_reducer_matches_allreduce);
    CU_ADD(b, test_reducer_deterministic);
    CU_ADD(b, test_reducer_bf16_wire);
    CU_ADD(b, test_timeout_gives_up);

    CU_pSuite rb = CU_add_suite("mpi_comm_ring_bounded", ring_bounded_begin, ring_bounded_end);
    CU_ADD(rb, test_iallreduce_test_loop);
    CU_ADD(rb, test_many_in_flight);
    CU_ADD(rb, test_ring_sizes);
    CU_ADD(rb, test_reducer_matches_allreduce);
    CU_ADD(rb, test_reducer_deterministic);
    CU_ADD(rb, test_reducer_bf16_wire);
    CU_ADD(rb, test_ring_timeout_gives_up);
}

int main(int argc, char **argv)
{
    return mpi_cu_main(argc, argv, "mpi_comm", &comm, &rank, &size, add_suites);
}
