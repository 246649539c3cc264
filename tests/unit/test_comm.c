/*
 * test_comm.c - the collectives module in one process: the bucket plan
 * (a pure function), argument checks and the backend registry, and a
 * one-rank mpi communicator and reducer (MPI started as a singleton), and
 * what the nccl backend says where it cannot run (every GPU is hidden from
 * this process, so that holds on GPU machines too). Multi-rank behaviour is
 * tested under mpirun by tests/mpi/mpi_comm.c, NCCL on a GPU by
 * tests/gpu/test_gpu_comm.c.
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/allreduce_perf.h"
#include "collectives/comm.h"
#include "collectives/comm_impl.h"
#include "collectives/reducer.h"
#include "collectives/tree.h"
#include "cu_util.h"

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

#define SENTINEL ((size_t)0xdeadbeef)

static dt_comm_t *comm;

/* A stand-in device for the bench's device path: host memory, counted. */
static int fake_live, fake_copies;

static dt_status fake_alloc(dt_backend_t *be, size_t bytes, void **out)
{
    (void)be;
    *out = calloc(1, bytes);
    fake_live += *out != NULL;
    return *out ? DT_OK : DT_ERR_NOMEM;
}

static void fake_free(dt_backend_t *be, void *ptr)
{
    (void)be;
    fake_live--;
    free(ptr);
}

static dt_status fake_copy(dt_backend_t *be, void *dst, const void *src, size_t bytes,
                           enum dt_copy_kind kind)
{
    (void)be;
    (void)kind;
    fake_copies++;
    memcpy(dst, src, bytes);
    return DT_OK;
}

static dt_status fake_sync(dt_backend_t *be)
{
    (void)be;
    return DT_OK;
}

static const struct dt_bench_device fake_device = {.be = (dt_backend_t *)1,
                                                   .alloc = fake_alloc,
                                                   .free = fake_free,
                                                   .copy = fake_copy,
                                                   .sync = fake_sync};

/* White box: the mpi communicator's table, marked as taking device
 * buffers, goes into `ops` and takes its place; returns the real one. */
static const struct dt_comm_ops *mark_device(struct dt_comm_ops *ops)
{
    static struct dt_comm_caps device_caps;
    const struct dt_comm_ops *real = comm->ops;
    *ops = *real;
    device_caps = *real->caps;
    device_caps.device_buffers = 1;
    ops->caps = &device_caps;
    comm->ops = ops;
    return real;
}

/* ---- dt_tree: sums in a tree fixed by leaf index ------------------------ */

#define TREE_N 5 /* floats per leaf */

/* The padded tree over leaves [lo, lo + span) of which the first n exist,
 * written out recursively: the definition dt_tree must meet. */
static int tree_ref(float (*leaf)[TREE_N], int lo, int span, int n, float *out)
{
    if (lo >= n) return 0;
    if (span == 1) {
        memcpy(out, leaf[lo], sizeof(float) * TREE_N);
        return 1;
    }
    float l[TREE_N], r[TREE_N];
    int hl = tree_ref(leaf, lo, span / 2, n, l), hr = tree_ref(leaf, lo + span / 2, span / 2, n, r);
    for (int i = 0; i < TREE_N; i++)
        out[i] = hl && hr ? l[i] + r[i] : hl ? l[i] : r[i];
    return hl || hr;
}

static void tree_leaves(float (*leaf)[TREE_N], int n, unsigned seed)
{
    for (int j = 0; j < n; j++)
        for (int i = 0; i < TREE_N; i++) {
            seed = seed * 1103515245u + 12345u;
            /* magnitudes 2^-12 .. 2^12, both signs: orders of summing differ */
            leaf[j][i] = ldexpf((float)((seed >> 8) & 0xffff) / 65536.0f + 0.5f,
                                (int)((seed >> 24) % 25) - 12) * ((seed & 1) ? -1.0f : 1.0f);
        }
}

/* One stream of n leaves, with dt_tree_push and with next/commit, gives
 * the padded tree's bits; the tree is not a left fold (the data make the
 * two differ for most n, so the check could fail). */
static void test_tree_matches_definition(void)
{
    float leaf[13][TREE_N], want[TREE_N], got[TREE_N], got2[TREE_N];
    int folds_differ = 0;
    for (int n = 1; n <= 13; n++) {
        dt_tree_t *t = NULL, *t2 = NULL;
        tree_leaves(leaf, n, 7u + (unsigned)n);
        int span = 1;
        while (span < n) span *= 2;
        CU_ASSERT_FATAL(tree_ref(leaf, 0, span, n, want));
        CU_ASSERT_FATAL(dt_tree_create(TREE_N, &t) == DT_OK);
        CU_ASSERT_FATAL(dt_tree_create(TREE_N, &t2) == DT_OK);
        for (int j = 0; j < n; j++) {
            float *p;
            CU_ASSERT_FATAL(dt_tree_push(t, leaf[j]) == DT_OK);
            CU_ASSERT_FATAL(dt_tree_next(t2, &p) == DT_OK);
            memcpy(p, leaf[j], sizeof leaf[j]);
            CU_ASSERT_FATAL(dt_tree_commit(t2) == DT_OK);
        }
        CU_ASSERT_EQUAL(dt_tree_count(t), (size_t)n);
        dt_tree_finish(t, got);
        dt_tree_finish(t2, got2);
        CU_ASSERT_EQUAL(dt_tree_count(t), 0);
        CU_ASSERT(memcmp(got, want, sizeof want) == 0);
        CU_ASSERT(memcmp(got2, want, sizeof want) == 0);
        float fold[TREE_N];
        memcpy(fold, leaf[0], sizeof fold);
        for (int j = 1; j < n; j++)
            for (int i = 0; i < TREE_N; i++)
                fold[i] += leaf[j][i];
        folds_differ += memcmp(fold, want, sizeof want) != 0;
        dt_tree_destroy(t);
        dt_tree_destroy(t2);
    }
    CU_ASSERT(folds_differ > 0);
}

/* Aligned blocks of k = 2^j leaves (the last one short), each summed on
 * its own, then the blocks' sums as leaves of a second tree: the bits of
 * one stream, for every k (how ranks split the shards). */
static void test_tree_blocks(void)
{
    float leaf[12][TREE_N], whole[TREE_N], part[TREE_N];
    const int n = 12;
    dt_tree_t *t = NULL, *upper = NULL;
    tree_leaves(leaf, n, 99u);
    CU_ASSERT_FATAL(dt_tree_create(TREE_N, &t) == DT_OK);
    CU_ASSERT_FATAL(dt_tree_create(TREE_N, &upper) == DT_OK);
    for (int j = 0; j < n; j++)
        CU_ASSERT_FATAL(dt_tree_push(t, leaf[j]) == DT_OK);
    dt_tree_finish(t, whole);
    for (int k = 1; k <= 16; k *= 2) {
        for (int lo = 0; lo < n; lo += k) {
            for (int j = lo; j < lo + k && j < n; j++)
                CU_ASSERT_FATAL(dt_tree_push(t, leaf[j]) == DT_OK);
            dt_tree_finish(t, part);
            CU_ASSERT_FATAL(dt_tree_push(upper, part) == DT_OK);
        }
        float got[TREE_N];
        dt_tree_finish(upper, got);
        CU_ASSERT(memcmp(got, whole, sizeof whole) == 0);
    }
    dt_tree_destroy(t);
    dt_tree_destroy(upper);
}

/* One rank: the sum over ranks leaves the buffer as it is. */
static void test_tree_allreduce_one_rank(void)
{
    float v[3] = {1.5f, -2.0f, 3.25f}, w[3];
    dt_tree_t *t = NULL;
    memcpy(w, v, sizeof v);
    CU_ASSERT_FATAL(dt_tree_create(3, &t) == DT_OK);
    CU_ASSERT_EQUAL(dt_comm_allreduce_tree(comm, t, v, 3, 1), DT_OK);
    CU_ASSERT(memcmp(v, w, sizeof v) == 0);
    dt_tree_destroy(t);
}

/* ---- dt_bucket_plan ------------------------------------------------------ */

static void test_plan_empty(void)
{
    size_t off[4] = {SENTINEL, SENTINEL, SENTINEL, SENTINEL};
    CU_ASSERT_EQUAL(dt_bucket_plan(0, 10, 100, off, 4), 0);
    CU_ASSERT_EQUAL(off[0], SENTINEL);
}

static void test_plan_smaller_than_first(void)
{
    size_t off[4] = {SENTINEL, SENTINEL, SENTINEL, SENTINEL};
    CU_ASSERT_EQUAL(dt_bucket_plan(7, 10, 100, off, 4), 1);
    CU_ASSERT_EQUAL(off[0], 0);
    CU_ASSERT_EQUAL(off[1], SENTINEL);
    CU_ASSERT_EQUAL(dt_bucket_plan(10, 10, 100, off, 4), 1); /* exactly the first */
    CU_ASSERT_EQUAL(dt_bucket_plan(1, 1, 1, off, 4), 1);
}

static void test_plan_exact_multiple(void)
{
    size_t off[8];
    /* first 10, then 3 full buckets of 100 */
    CU_ASSERT_EQUAL_FATAL(dt_bucket_plan(310, 10, 100, off, 8), 4);
    CU_ASSERT_EQUAL(off[0], 0);
    CU_ASSERT_EQUAL(off[1], 10);
    CU_ASSERT_EQUAL(off[2], 110);
    CU_ASSERT_EQUAL(off[3], 210);
}

static void test_plan_remainder(void)
{
    size_t off[8];
    /* 10 + 100 + 100 + a last bucket of 1 */
    CU_ASSERT_EQUAL_FATAL(dt_bucket_plan(211, 10, 100, off, 8), 4);
    CU_ASSERT_EQUAL(off[3], 210);
    /* 10 + a partial second bucket */
    CU_ASSERT_EQUAL_FATAL(dt_bucket_plan(11, 10, 100, off, 8), 2);
    CU_ASSERT_EQUAL(off[1], 10);
}

static void test_plan_first_equals_bucket(void)
{
    size_t off[8];
    CU_ASSERT_EQUAL_FATAL(dt_bucket_plan(250, 50, 50, off, 8), 5);
    for (size_t k = 0; k < 5; k++)
        CU_ASSERT_EQUAL(off[k], 50 * k);
    CU_ASSERT_EQUAL(dt_bucket_plan(251, 50, 50, off, 8), 6);
}

static void test_plan_max_too_small(void)
{
    size_t off[4] = {SENTINEL, SENTINEL, SENTINEL, SENTINEL};
    /* returns the full count, writes only max offsets */
    CU_ASSERT_EQUAL(dt_bucket_plan(1000, 10, 100, off, 2), 11);
    CU_ASSERT_EQUAL(off[0], 0);
    CU_ASSERT_EQUAL(off[1], 10);
    CU_ASSERT_EQUAL(off[2], SENTINEL);
    CU_ASSERT_EQUAL(dt_bucket_plan(1000, 10, 100, NULL, 0), 11); /* count only */
}

static void test_plan_zero_sizes(void)
{
    size_t off[4];
    /* a zero size is taken as 1 rather than looping forever */
    CU_ASSERT_EQUAL(dt_bucket_plan(3, 0, 0, off, 4), 3);
    CU_ASSERT_EQUAL(off[2], 2);
}

/* Property: buckets tile [0, total) in order, the first of `first`, the
 * middle ones of `bucket`, the last of at most `bucket`. */
static void test_plan_tiles(void)
{
    size_t off[512];
    for (size_t total = 1; total < 400; total += 7)
        for (size_t first = 1; first < 60; first += 11)
            for (size_t bucket = first; bucket < 90; bucket += 13) {
                size_t n = dt_bucket_plan(total, first, bucket, off, 512);
                CU_ASSERT_FATAL(n >= 1 && n <= 512);
                CU_ASSERT_EQUAL(off[0], 0);
                for (size_t k = 1; k < n; k++)
                    CU_ASSERT_EQUAL(off[k] - off[k - 1], k == 1 ? first : bucket);
                size_t last = total - off[n - 1];
                CU_ASSERT(last >= 1);
                CU_ASSERT(n == 1 ? total <= first : last <= bucket);
            }
}

/* ---- registry and argument checks ----------------------------------------- */

static void test_registry(void)
{
    dt_comm_t *c = (dt_comm_t *)1;
    CU_ASSERT_EQUAL(dt_comm_create("gloo", &c), DT_ERR_UNSUPPORTED);
    CU_ASSERT_PTR_NULL(c);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "'gloo'"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "mpi"));
    CU_ASSERT_EQUAL(dt_dtype_size(DT_F32), 4);
    CU_ASSERT_EQUAL(dt_dtype_size(DT_F64), 8);
    CU_ASSERT_EQUAL(dt_dtype_size(DT_I32), 4);
    CU_ASSERT_EQUAL(dt_dtype_size(DT_I64), 8);
    CU_ASSERT_EQUAL(dt_dtype_size(DT_U8), 1);
}

/* nccl without a usable GPU (main hides them all) or without NCCL in the
 * build: unsupported, and the message says which. */
static void test_nccl_unavailable(void)
{
    dt_comm_t *c = (dt_comm_t *)1;
    CU_ASSERT_EQUAL(dt_comm_create("nccl", &c), DT_ERR_UNSUPPORTED);
    CU_ASSERT_PTR_NULL(c);
#ifdef DT_HAVE_NCCL
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "needs a CUDA GPU on every rank"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "rank 0 has no usable GPU"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "use the mpi backend"));
#else
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "built without NCCL"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "(built: mpi)"));
#endif
    /* the failed attempt left MPI and the mpi communicator working */
    int32_t one = 1;
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, &one, 1, DT_I32, DT_COMM_SUM), DT_OK);
    CU_ASSERT_EQUAL(one, 1);
}

/* What the communicators say they are: mpi by instance and by name (and
 * its table agrees), nccl by name in every build. */
static void test_caps(void)
{
    const struct dt_comm_caps *mpi = dt_comm_caps_named("mpi");
    CU_ASSERT_PTR_NOT_NULL_FATAL(mpi);
    CU_ASSERT_PTR_EQUAL(dt_comm_caps(comm), mpi);
    CU_ASSERT_EQUAL(mpi->built, 1);
    CU_ASSERT_EQUAL(mpi->device_buffers, 0);
    CU_ASSERT_EQUAL(dt_comm_device_buffers(comm), 0);
    CU_ASSERT_PTR_NULL(mpi->device_backend);
    CU_ASSERT_EQUAL(mpi->nonblocking, 1);
    CU_ASSERT(mpi->collectives & DT_COMM_HAS_REDUCE_SCATTER);
    CU_ASSERT(mpi->collectives & DT_COMM_HAS_ALLGATHER);
    CU_ASSERT(mpi->collectives & DT_COMM_HAS_IALLREDUCE);
    CU_ASSERT(mpi->collectives & DT_COMM_HAS_RING);
    /* the bits say what the table has */
    const struct dt_comm_ops *o = comm->ops;
    CU_ASSERT_EQUAL(!!(mpi->collectives & DT_COMM_HAS_ALLREDUCE), o->allreduce != NULL);
    CU_ASSERT_EQUAL(!!(mpi->collectives & DT_COMM_HAS_IALLREDUCE), o->iallreduce != NULL);
    CU_ASSERT_EQUAL(!!(mpi->collectives & DT_COMM_HAS_BROADCAST), o->broadcast != NULL);
    CU_ASSERT_EQUAL(!!(mpi->collectives & DT_COMM_HAS_ALLGATHER), o->allgather != NULL);
    CU_ASSERT_EQUAL(!!(mpi->collectives & DT_COMM_HAS_REDUCE_SCATTER), o->reduce_scatter != NULL);
    CU_ASSERT_EQUAL(!!(mpi->collectives & DT_COMM_HAS_BARRIER), o->barrier != NULL);
    CU_ASSERT_EQUAL(!!(mpi->collectives & DT_COMM_HAS_RING), dt_comm_has_ring(comm));

    const struct dt_comm_caps *nccl = dt_comm_caps_named("nccl");
    CU_ASSERT_PTR_NOT_NULL_FATAL(nccl);
#ifdef DT_HAVE_NCCL
    CU_ASSERT_EQUAL(nccl->built, 1);
#else
    CU_ASSERT_EQUAL(nccl->built, 0);
#endif
    CU_ASSERT_EQUAL(nccl->device_buffers, 1);
    CU_ASSERT_STRING_EQUAL(nccl->device_backend, "cuda");
    CU_ASSERT_EQUAL(nccl->shares_device, 0);
    CU_ASSERT(nccl->collectives & DT_COMM_HAS_REDUCE_SCATTER);
    CU_ASSERT_FALSE(nccl->collectives & DT_COMM_HAS_RING);
    CU_ASSERT_PTR_NULL(dt_comm_caps_named("gloo"));
    CU_ASSERT_PTR_NULL(dt_comm_caps_named(NULL));

    /* comm.backend: auto */
    CU_ASSERT_STRING_EQUAL(dt_comm_auto(0, 0), "mpi");
    CU_ASSERT_STRING_EQUAL(dt_comm_auto(0, 1), "mpi");
    CU_ASSERT_STRING_EQUAL(dt_comm_auto(1, 0), "nccl");
    CU_ASSERT_STRING_EQUAL(dt_comm_auto(1, 1), "mpi"); /* NCCL refuses a shared GPU */

    CU_ASSERT_EQUAL(dt_comm_is(comm, "mpi"), 1);
    CU_ASSERT_EQUAL(dt_comm_is(comm, "nccl"), 0);
    CU_ASSERT_EQUAL(dt_comm_is(comm, NULL), 0);
}

/* Host buffers: no stream to bind, buffers are not device memory. */
static void test_mpi_streams_and_timeout(void)
{
    CU_ASSERT_EQUAL(dt_comm_device_buffers(comm), 0);
    CU_ASSERT_EQUAL(dt_comm_bind_stream(comm, NULL), DT_OK);
    CU_ASSERT_EQUAL(dt_comm_bind_stream(comm, (void *)&comm), DT_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "mpi communicator works on host buffers"));
    dt_comm_set_timeout(comm, 2.5);
    CU_ASSERT_EQUAL(comm->timeout_s, 2.5);
    dt_comm_set_timeout(comm, -1);
    CU_ASSERT_EQUAL(comm->timeout_s, 0.0);
    dt_comm_set_timeout(comm, 7);
    dt_comm_set_timeout(comm, NAN);
    CU_ASSERT_EQUAL(comm->timeout_s, 0.0);
    dt_comm_set_timeout(comm, INFINITY); /* no limit */
    CU_ASSERT_EQUAL(comm->timeout_s, 0.0);
    /* with a limit, every collective runs as a bounded non-blocking one */
    dt_comm_set_timeout(comm, 60);
    float f[3] = {1, 2, 3}, g[3] = {0};
    unsigned char b[4] = {1, 2, 3, 4};
    dt_comm_req_t *req = NULL;
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, f, 3, DT_F32, DT_COMM_SUM), DT_OK);
    CU_ASSERT_EQUAL(f[2], 3.0f);
    CU_ASSERT_EQUAL(dt_comm_broadcast(comm, b, sizeof b, 0), DT_OK);
    CU_ASSERT_EQUAL(b[3], 4);
    CU_ASSERT_EQUAL(dt_comm_allgather(comm, f, g, sizeof f), DT_OK);
    CU_ASSERT_EQUAL(g[1], 2.0f);
    CU_ASSERT_EQUAL(dt_comm_reduce_scatter(comm, f, g, 3, DT_F32, DT_COMM_SUM), DT_OK);
    CU_ASSERT_EQUAL(g[2], 3.0f);
    CU_ASSERT_EQUAL(dt_comm_barrier(comm), DT_OK);
    CU_ASSERT_EQUAL(dt_comm_iallreduce(comm, f, 3, DT_F32, DT_COMM_AVG, &req), DT_OK);
    CU_ASSERT_EQUAL(dt_comm_wait(comm, req), DT_OK);
    CU_ASSERT_EQUAL(f[0], 1.0f);
    dt_comm_set_timeout(comm, 0);
}

static void test_bad_args(void)
{
    int32_t i[4] = {1, 2, 3, 4};
    float f[4] = {0};
    dt_comm_req_t *req = (dt_comm_req_t *)1;
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, i, 4, DT_I32, DT_COMM_AVG), DT_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "AVG"));
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, NULL, 4, DT_F32, DT_COMM_SUM), DT_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, f, 4, (enum dt_dtype)42, DT_COMM_SUM),
                    DT_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, f, 4, DT_F32, (enum dt_comm_op)9),
                    DT_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(dt_comm_iallreduce(comm, i, 4, DT_I64, DT_COMM_AVG, &req),
                    DT_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NULL(req);
    CU_ASSERT_EQUAL(dt_comm_broadcast(comm, f, 16, 1), DT_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(dt_comm_broadcast(comm, f, 16, -1), DT_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "root -1"));
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, NULL, 0, DT_F32, DT_COMM_SUM), DT_OK);
}

/* ---- one-rank communicator ------------------------------------------------- */

static void test_one_rank_identity(void)
{
    char name[MPI_MAX_PROCESSOR_NAME];
    int len = 0;
    MPI_Get_processor_name(name, &len);
    CU_ASSERT_STRING_EQUAL(dt_comm_backend(comm), "mpi");
    CU_ASSERT_EQUAL(dt_comm_rank(comm), 0);
    CU_ASSERT_EQUAL(dt_comm_size(comm), 1);
    CU_ASSERT_EQUAL(dt_comm_local_rank(comm), 0);
    CU_ASSERT_EQUAL(dt_comm_local_size(comm), 1);
    CU_ASSERT_STRING_EQUAL(dt_comm_host(comm), name);
}

static void test_one_rank_collectives(void)
{
    float f[5] = {1.5f, -2, 3, 4, 5}, g[5];
    double d[3] = {0.25, -1, 7};
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, f, 5, DT_F32, DT_COMM_AVG), DT_OK);
    CU_ASSERT_EQUAL(f[0], 1.5f);
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, d, 3, DT_F64, DT_COMM_MIN), DT_OK);
    CU_ASSERT_EQUAL(d[1], -1.0);
    dt_comm_req_t *req = NULL;
    int done = 0;
    CU_ASSERT_EQUAL_FATAL(dt_comm_iallreduce(comm, f, 5, DT_F32, DT_COMM_SUM, &req), DT_OK);
    while (!done)
        CU_ASSERT_EQUAL_FATAL(dt_comm_test(comm, req, &done), DT_OK);
    CU_ASSERT_EQUAL(f[1], -2.0f);
    CU_ASSERT_EQUAL(dt_comm_broadcast(comm, f, sizeof f, 0), DT_OK);
    CU_ASSERT_EQUAL(dt_comm_allgather(comm, f, g, sizeof f), DT_OK);
    CU_ASSERT_EQUAL(memcmp(f, g, sizeof f), 0);
    CU_ASSERT_EQUAL(dt_comm_reduce_scatter(comm, f, g, 5, DT_F32, DT_COMM_MAX), DT_OK);
    CU_ASSERT_EQUAL(memcmp(f, g, sizeof f), 0);
    CU_ASSERT_EQUAL(dt_comm_barrier(comm), DT_OK);
}

/* Pieces: with max_count lowered, big calls are split and still correct. */
static void test_one_rank_pieces(void)
{
    enum { N = 1003 };
    static float f[N], g[N];
    for (int i = 0; i < N; i++)
        f[i] = (float)i;
    comm->max_count = 100;
    CU_ASSERT_EQUAL(dt_comm_allreduce(comm, f, N, DT_F32, DT_COMM_AVG), DT_OK);
    dt_comm_req_t *req = NULL;
    CU_ASSERT_EQUAL(dt_comm_iallreduce(comm, f, N, DT_F32, DT_COMM_SUM, &req), DT_OK);
    CU_ASSERT_EQUAL(dt_comm_wait(comm, req), DT_OK);
    CU_ASSERT_EQUAL(dt_comm_broadcast(comm, f, sizeof f, 0), DT_OK);
    CU_ASSERT_EQUAL(dt_comm_allgather(comm, f, g, sizeof f), DT_OK);
    CU_ASSERT_EQUAL(memcmp(f, g, sizeof f), 0);
    CU_ASSERT_EQUAL(f[N - 1], (float)(N - 1));
    CU_ASSERT_EQUAL(dt_comm_reduce_scatter(comm, f, g, N, DT_F32, DT_COMM_SUM),
                    DT_ERR_UNSUPPORTED);
    comm->max_count = INT32_MAX;
}

/* A failing MPI call (bypassing comm.c's root check) comes back as
 * DT_ERR_COMM with MPI's own text. */
static void test_mpi_error_text(void)
{
    char buf[8] = {0};
    CU_ASSERT_EQUAL(comm->ops->broadcast(comm, buf, sizeof buf, 3), DT_ERR_COMM);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "MPI_Bcast of 8 bytes from root 3"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "on rank 0: MPI_ERR_ROOT"));
}

/* ---- one-rank reducer ------------------------------------------------------ */

static void test_reducer_one_rank(void)
{
    enum { N = 100000 };
    static float g[N];
    for (int i = 0; i < N; i++)
        g[i] = (float)i * 0.5f;
    struct dt_reducer_opts o = {.bucket_mb = 0.05, .first_bucket_mb = 0.01, .overlap = 1};
    dt_reducer_t *r = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_reducer_create(comm, g, N, &o, &r), DT_OK);
    /* 0.01 MiB = 2621 floats, then 13107 */
    CU_ASSERT_EQUAL(dt_reducer_bucket_count(r), dt_bucket_plan(N, 2621, 13107, NULL, 0));
    double wait_s = -1;
    CU_ASSERT_EQUAL(dt_reducer_ready(r, 10), DT_ERR_INVALID_ARG); /* before begin */
    CU_ASSERT_EQUAL(dt_reducer_begin(r), DT_OK);
    for (size_t done = 0; done <= N; done += 7919)
        CU_ASSERT_EQUAL(dt_reducer_ready(r, done), DT_OK);
    CU_ASSERT_EQUAL(dt_reducer_ready(r, N + 1), DT_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(dt_reducer_finish(r, &wait_s), DT_OK);
    CU_ASSERT(wait_s >= 0);
    CU_ASSERT_EQUAL(g[N - 1], (float)(N - 1) * 0.5f);
    CU_ASSERT_EQUAL(dt_reducer_finish(r, NULL), DT_ERR_INVALID_ARG); /* no step open */
    dt_reducer_destroy(r);
}

/* ---- sharded gradients: dt_bucket_plan_cuts and the staging area ------- */

static void test_plan_cuts(void)
{
    size_t off[8] = {SENTINEL, SENTINEL, SENTINEL, SENTINEL};
    const size_t cuts[] = {0, 10, 30, 200, 210};
    /* first 20: the first cut at least 20 in is 30; then 50: 200; then the end */
    CU_ASSERT_EQUAL_FATAL(dt_bucket_plan_cuts(260, cuts, 5, 20, 50, off, 8), 3);
    CU_ASSERT_EQUAL(off[0], 0);
    CU_ASSERT_EQUAL(off[1], 30);
    CU_ASSERT_EQUAL(off[2], 200);
    CU_ASSERT_EQUAL(off[3], SENTINEL);
    /* one large parameter is one bucket, however small the buckets */
    const size_t one[] = {0};
    CU_ASSERT_EQUAL(dt_bucket_plan_cuts(1000, one, 1, 1, 1, off, 8), 1);
    CU_ASSERT_EQUAL(dt_bucket_plan_cuts(0, one, 1, 1, 1, off, 8), 0);
    /* every cut a bucket when buckets are tiny; counted past max */
    CU_ASSERT_EQUAL(dt_bucket_plan_cuts(260, cuts, 5, 1, 1, off, 2), 5);
    CU_ASSERT_EQUAL(off[1], 10);
}

/* One rank (the reduce-scatter keeps everything): the gradients placed,
 * written and reduced arrive in the packed shard, a second micro-batch
 * adds to them, and the staging area holds less than the whole buffer. */
static void test_reducer_staging(void)
{
    /* parameters at 0 (100), 128 (3000), 3200 (50), 3264 (5000), 8320 (10) */
    enum { N = 8330, B = 1000 };
    const size_t poff[] = {8320, 0, 3264, 128, 3200}, plen[] = {10, 100, 5000, 3000, 50};
    const size_t order[] = {0, 1, 3, 4, 2, 0}; /* backward: a tied last one first and last */
    const size_t ready_after[] = {0, 0, 3200, 0, 8320, N};
    struct dt_reducer_opts o = {.bucket_mb = B * 4.0 / 1048576.0,
                                .first_bucket_mb = B * 4.0 / 1048576.0,
                                .overlap = 1,
                                .shard = 1,
                                .shard_grads = 1,
                                .param_off = poff,
                                .nparams = 5};
    dt_reducer_t *r = NULL;
    if (!dt_comm_has_ring(comm)) {
        CU_PASS("no ring");
        return;
    }
    CU_ASSERT_EQUAL_FATAL(dt_reducer_create(comm, NULL, N, &o, &r), DT_OK);
    CU_ASSERT_EQUAL(dt_reducer_bucket_count(r), 3); /* [0,3200) [3200,8320) [8320,8330) */
    dt_reducer_clear(r);
    for (int micro = 0; micro < 2; micro++) {
        CU_ASSERT_EQUAL_FATAL(dt_reducer_begin(r), DT_OK);
        for (size_t s = 0; s < sizeof order / sizeof *order; s++) {
            size_t i = order[s];
            float *g = NULL;
            CU_ASSERT_EQUAL_FATAL(dt_reducer_place(r, poff[i], plen[i], &g), DT_OK);
            for (size_t e = 0; e < plen[i]; e++)
                g[e] += (float)(poff[i] + e) + 0.25f;
            if (ready_after[s]) CU_ASSERT_EQUAL_FATAL(dt_reducer_ready(r, ready_after[s]), DT_OK);
        }
        CU_ASSERT_EQUAL_FATAL(dt_reducer_finish(r, NULL), DT_OK);
    }
    size_t n = 0;
    const float *sh = dt_reducer_shard_grads(r, &n);
    CU_ASSERT_EQUAL_FATAL(n, N);
    int bad = 0;
    for (size_t i = 0; i < 5; i++)
        for (size_t e = 0; e < plen[i]; e++) {
            float once = (float)(poff[i] + e) + 0.25f, want = 2 * (i == 0 ? 2 * once : once);
            bad += sh[poff[i] + e] != want;
        }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(sh[110], 0.0f); /* padding between parameters */
    CU_ASSERT(dt_reducer_staging_bytes(r) > 0);
    CU_ASSERT(dt_reducer_staging_bytes(r) < (N + B) * sizeof(float));
    /* a parameter across two buckets, and one placed after its bucket went out */
    float *g = NULL;
    CU_ASSERT_EQUAL(dt_reducer_begin(r), DT_OK);
    CU_ASSERT_EQUAL(dt_reducer_place(r, 3190, 20, &g), DT_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(dt_reducer_place(r, 0, 100, &g), DT_OK);
    CU_ASSERT_EQUAL(dt_reducer_ready(r, 3200), DT_OK);
    CU_ASSERT_EQUAL(dt_reducer_place(r, 128, 3000, &g), DT_ERR_INTERNAL);
    CU_ASSERT_EQUAL(dt_reducer_finish(r, NULL), DT_OK);
    dt_reducer_destroy(r);
}

static void test_reducer_bad_opts(void)
{
    float g[4];
    dt_reducer_t *r = (dt_reducer_t *)1;
    struct dt_reducer_opts o = {.bucket_mb = 1, .first_bucket_mb = 2};
    CU_ASSERT_EQUAL(dt_reducer_create(comm, g, 4, &o, &r), DT_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NULL(r);
    o = (struct dt_reducer_opts){.bucket_mb = 0, .first_bucket_mb = 0};
    CU_ASSERT_EQUAL(dt_reducer_create(comm, g, 4, &o, &r), DT_ERR_INVALID_ARG);
    o = (struct dt_reducer_opts){.bucket_mb = 1, .first_bucket_mb = 1};
    CU_ASSERT_EQUAL(dt_reducer_create(comm, NULL, 4, &o, &r), DT_ERR_INVALID_ARG);
    /* 1e-6 MiB rounds to 1 float per bucket: too many buckets */
    o = (struct dt_reducer_opts){.bucket_mb = 1e-6, .first_bucket_mb = 1e-6};
    CU_ASSERT_EQUAL(dt_reducer_create(comm, g, DT_REDUCER_MAX_BUCKETS + 1, &o, &r),
                    DT_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "bucket_mb"));
    CU_ASSERT_EQUAL(dt_reducer_create(comm, g, 0, &o, &r), DT_OK); /* empty: no buckets */
    CU_ASSERT_EQUAL(dt_reducer_bucket_count(r), 0);
    CU_ASSERT_EQUAL(dt_reducer_begin(r), DT_OK);
    CU_ASSERT_EQUAL(dt_reducer_finish(r, NULL), DT_OK);
    dt_reducer_destroy(r);
}

static void test_bench_bad_opts(void)
{
    struct dt_bench_allreduce_opts o = {.min_bytes = 64, .max_bytes = 32};
    CU_ASSERT_EQUAL(dt_bench_allreduce(comm, &o, NULL), DT_ERR_INVALID_ARG);
    o = (struct dt_bench_allreduce_opts){.max_bytes = 4};
    CU_ASSERT_EQUAL(dt_bench_allreduce(comm, &o, NULL), DT_ERR_INVALID_ARG);
    o = (struct dt_bench_allreduce_opts){.max_bytes = 64, .iters = -1};
    CU_ASSERT_EQUAL(dt_bench_allreduce(comm, &o, NULL), DT_ERR_INVALID_ARG);
    /* a device for a host-buffer communicator */
    struct dt_bench_device dev = {0};
    o = (struct dt_bench_allreduce_opts){.max_bytes = 64, .device = &dev};
    CU_ASSERT_EQUAL(dt_bench_allreduce(comm, &o, NULL), DT_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "takes host buffers"));
    /* a device-buffer communicator without a device, then without a
     * host-buffer control communicator */
    struct dt_comm_ops ops;
    const struct dt_comm_ops *saved = mark_device(&ops);
    o = (struct dt_bench_allreduce_opts){.max_bytes = 64};
    CU_ASSERT_EQUAL(dt_bench_allreduce(comm, &o, NULL), DT_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "all-reduces device memory"));
    dev = fake_device;
    o = (struct dt_bench_allreduce_opts){.max_bytes = 64, .device = &dev};
    CU_ASSERT_EQUAL(dt_bench_allreduce(comm, &o, NULL), DT_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "control communicator"));
    o.control = comm; /* itself takes device buffers */
    CU_ASSERT_EQUAL(dt_bench_allreduce(comm, &o, NULL), DT_ERR_INVALID_ARG);
    comm->ops = saved;
}

/* The bench through a "device" that is host memory behind the device
 * entry points: uploads, downloads and the control path are exercised. */
static void test_bench_device_path(void)
{
    dt_comm_t *ctl = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_comm_create("mpi", &ctl), DT_OK);
    struct dt_comm_ops ops;
    const struct dt_comm_ops *saved = mark_device(&ops);
    struct dt_bench_allreduce_opts o = {
        .max_bytes = 4096, .iters = 2, .warmup = 1, .device = &fake_device, .control = ctl};
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(mem);
    fake_copies = 0;
    CU_ASSERT_EQUAL(dt_bench_allreduce(comm, &o, mem), DT_OK);
    comm->ops = saved;
    dt_comm_destroy(ctl);
    fclose(mem);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "# wrong values: 0"));
    /* 10 sizes (8..4096 B): upload before warm-up, upload and download for the check */
    CU_ASSERT_EQUAL(fake_copies, 30);
    CU_ASSERT_EQUAL(fake_live, 0);
    free(text);
}

int main(int argc, char **argv)
{
    int provided = 0;
    /* Before anything starts CUDA: no GPU is visible to this process. */
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    if (dt_comm_create("mpi", &comm) != DT_OK) {
        fprintf(stderr, "test_comm: %s\n", dt_last_error());
        MPI_Finalize();
        return 1;
    }
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite plan = CU_add_suite("bucket_plan", NULL, NULL);
    CU_ADD(plan, test_plan_empty);
    CU_ADD(plan, test_plan_smaller_than_first);
    CU_ADD(plan, test_plan_exact_multiple);
    CU_ADD(plan, test_plan_remainder);
    CU_ADD(plan, test_plan_first_equals_bucket);
    CU_ADD(plan, test_plan_max_too_small);
    CU_ADD(plan, test_plan_zero_sizes);
    CU_ADD(plan, test_plan_tiles);
    CU_ADD(plan, test_plan_cuts);
    CU_pSuite tree = CU_add_suite("sum_tree", NULL, NULL);
    CU_ADD(tree, test_tree_matches_definition);
    CU_ADD(tree, test_tree_blocks);
    CU_pSuite one = CU_add_suite("comm_one_rank", NULL, NULL);
    CU_ADD(one, test_tree_allreduce_one_rank);
    CU_ADD(one, test_registry);
    CU_ADD(one, test_nccl_unavailable);
    CU_ADD(one, test_caps);
    CU_ADD(one, test_mpi_streams_and_timeout);
    CU_ADD(one, test_bad_args);
    CU_ADD(one, test_one_rank_identity);
    CU_ADD(one, test_one_rank_collectives);
    CU_ADD(one, test_one_rank_pieces);
    CU_ADD(one, test_mpi_error_text);
    CU_ADD(one, test_reducer_one_rank);
    CU_ADD(one, test_reducer_bad_opts);
    CU_ADD(one, test_reducer_staging);
    CU_ADD(one, test_bench_bad_opts);
    CU_ADD(one, test_bench_device_path);
    int rc = cu_run_all();
    dt_comm_destroy(comm);
    MPI_Finalize();
    return rc;
}
