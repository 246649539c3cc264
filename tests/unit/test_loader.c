/*
 * test_loader.c - CUnit suite for the prefetching loader (io/loader.c):
 * every sample once per epoch, drop_last, determinism, sharding over ranks
 * and with accumulation, prefetch, restarts mid-epoch, held slots, read
 * errors, batch buffers from the caller, and augmentation (crops and flips drawn per (seed, epoch,
 * sample) on any world size).
 *
 * Every file a test needs is made here or by io_common.c, in the
 * suite's private directory.
 */
#define _GNU_SOURCE
#include <hdf5.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io_common.h"
#include "io/dataset.h"
#include "io/loader.h"
#include "core/rng.h"
#include "core/status.h"

/* ---- loader ------------------------------------------------------------------ */

/* (global batch, position in it, sample id) of every row, sorted. */
struct trip {
    int64_t batch, pos;
    uint64_t id;
};

static int trip_cmp(const void *a, const void *b)
{
    const struct trip *x = a, *y = b;
    if (x->batch != y->batch)
        return x->batch < y->batch ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static size_t trips(const struct run *const *runs, int nruns, struct trip *out)
{
    size_t n = 0;
    for (int k = 0; k < nruns; k++)
        for (int i = 0; i < runs[k]->n; i++)
            for (int64_t j = 0; j < runs[k]->r[i].rows; j++)
                out[n++] = (struct trip){runs[k]->r[i].batch, runs[k]->r[i].row0 + j,
                                         runs[k]->r[i].ids[j]};
    qsort(out, n, sizeof *out, trip_cmp);
    return n;
}

static int same_trips(const struct trip *a, size_t na, const struct trip *b, size_t nb)
{
    return na == nb && memcmp(a, b, na * sizeof *a) == 0;
}

static struct run g_ra, g_rb, g_rc, g_rd, g_re; /* big: keep off the stack */

static struct trip g_ta[8192], g_tb[8192];

static void check_visits_once(const struct run *const *runs, int nruns, size_t n, size_t want)
{
    static int seen[1000];
    memset(seen, 0, sizeof seen);
    size_t total = 0;
    for (int k = 0; k < nruns; k++)
        for (int i = 0; i < runs[k]->n; i++)
            for (int64_t j = 0; j < runs[k]->r[i].rows; j++) {
                CU_ASSERT_FATAL(runs[k]->r[i].ids[j] < n);
                seen[runs[k]->r[i].ids[j]]++;
                total++;
            }
    CU_ASSERT_EQUAL(total, want);
    int twice = 0;
    for (size_t i = 0; i < n; i++)
        twice += seen[i] > 1;
    CU_ASSERT_EQUAL(twice, 0);
}

static void test_loader_epoch_all_samples(void)
{
    dt_dataset_t *ds = open_seq("seq103.h5", 103);
    CU_ASSERT_FATAL(ds != NULL);
    struct dt_loader_opts o = seq_opts(ds, 10, 5, 0, 1);
    dt_loader_t *ld = NULL;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_OK);
    CU_ASSERT_EQUAL(dt_loader_batches_per_epoch(ld), 11);
    dt_loader_destroy(ld);
    collect(&o, 0, 0, &g_ra);
    const struct run *one[1] = {&g_ra};
    check_visits_once(one, 1, 103, 103);
    CU_ASSERT_EQUAL(g_ra.n, 10 * 2 + 1); /* short batch of 3: one micro-batch */
    const struct rec *last = &g_ra.r[g_ra.n - 1];
    CU_ASSERT_EQUAL(last->batch, 10);
    CU_ASSERT_EQUAL(last->global_rows, 3);
    CU_ASSERT_EQUAL(last->rows, 3);
    CU_ASSERT_EQUAL(last->micro_count, 1);
    CU_ASSERT_EQUAL(g_ra.bytes, 103 * 2 * sizeof(float));

    /* two ranks, the short batch split 1 + 2 */
    struct dt_loader_opts o0 = seq_opts(ds, 10, 5, 0, 2), o1 = seq_opts(ds, 10, 5, 1, 2);
    collect(&o0, 0, 0, &g_rb);
    collect(&o1, 0, 0, &g_rc);
    const struct run *two[2] = {&g_rb, &g_rc};
    check_visits_once(two, 2, 103, 103);
    CU_ASSERT_EQUAL(g_rb.r[g_rb.n - 1].rows, 1);
    CU_ASSERT_EQUAL(g_rc.r[g_rc.n - 1].rows, 2);
    CU_ASSERT_EQUAL(g_rc.r[g_rc.n - 1].row0, 1);
    dt_dataset_close(ds);
}

static void test_loader_drop_last(void)
{
    dt_dataset_t *ds = open_seq("seq103d.h5", 103);
    CU_ASSERT_FATAL(ds != NULL);
    struct dt_loader_opts o = seq_opts(ds, 10, 5, 0, 1);
    o.drop_last = 1;
    dt_loader_t *ld = NULL;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_OK);
    CU_ASSERT_EQUAL(dt_loader_batches_per_epoch(ld), 10);
    dt_loader_destroy(ld);
    collect(&o, 3, 0, &g_ra);
    const struct run *one[1] = {&g_ra};
    check_visits_once(one, 1, 103, 100);
    int short_ones = 0;
    for (int i = 0; i < g_ra.n; i++)
        short_ones += g_ra.r[i].global_rows != 10 || g_ra.r[i].rows != 5;
    CU_ASSERT_EQUAL(short_ones, 0);
    CU_ASSERT_EQUAL(g_ra.n, 20);
    dt_dataset_close(ds);
}

static void test_loader_deterministic(void)
{
    dt_dataset_t *ds = open_seq("seq64.h5", 64);
    CU_ASSERT_FATAL(ds != NULL);
    struct dt_loader_opts o = seq_opts(ds, 8, 4, 0, 1);
    collect(&o, 5, 0, &g_ra);
    collect(&o, 5, 0, &g_rb);
    collect(&o, 6, 0, &g_rc);
    CU_ASSERT_EQUAL(g_ra.n, 16);
    CU_ASSERT(g_ra.n == g_rb.n && memcmp(g_ra.r, g_rb.r, sizeof g_ra.r[0] * g_ra.n) == 0);
    CU_ASSERT(memcmp(g_ra.r, g_rc.r, sizeof g_ra.r[0] * g_ra.n) != 0);
    /* and the order is the one dt_rng_permutation gives */
    uint64_t perm[64];
    dt_rng_permutation(1234, 5, perm, 64);
    CU_ASSERT(g_ra.r[0].ids[0] == perm[0] && g_ra.r[15].ids[3] == perm[63]);
    /* no shuffle: rows in file order */
    o.shuffle = 0;
    collect(&o, 5, 0, &g_rd);
    int out_of_order = 0;
    for (int i = 0; i < g_rd.n; i++)
        for (int64_t j = 0; j < g_rd.r[i].rows; j++)
            out_of_order += g_rd.r[i].ids[j] != (uint64_t)(i * 4 + j);
    CU_ASSERT_EQUAL(out_of_order, 0);
    dt_dataset_close(ds);
}

static void test_loader_two_ranks(void)
{
    dt_dataset_t *ds = open_seq("seq200.h5", 200);
    CU_ASSERT_FATAL(ds != NULL);
    struct dt_loader_opts o = seq_opts(ds, 16, 8, 0, 1);
    collect(&o, 2, 0, &g_ra); /* world 1, accumulation 2 */
    struct dt_loader_opts o0 = seq_opts(ds, 16, 8, 0, 2), o1 = seq_opts(ds, 16, 8, 1, 2);
    collect(&o0, 2, 0, &g_rb);
    collect(&o1, 2, 0, &g_rc);
    const struct run *one[1] = {&g_ra}, *two[2] = {&g_rb, &g_rc};
    size_t na = trips(one, 1, g_ta), nb = trips(two, 2, g_tb);
    CU_ASSERT_EQUAL(na, 200);
    CU_ASSERT(same_trips(g_ta, na, g_tb, nb));
    /* each rank reads about half */
    CU_ASSERT_EQUAL(g_rb.bytes + g_rc.bytes, g_ra.bytes);
    double share = (double)g_rb.bytes / (double)g_ra.bytes;
    CU_ASSERT(share > 0.45 && share < 0.55);
    dt_dataset_close(ds);
}

static void test_loader_accumulation_matches_ranks(void)
{
    dt_dataset_t *ds = open_seq("seq70.h5", 70);
    CU_ASSERT_FATAL(ds != NULL);
    const int64_t G = 16;
    for (int drop = 1; drop >= 0; drop--) {
        struct dt_loader_opts o = seq_opts(ds, G, G / 4, 0, 1);
        o.drop_last = drop;
        collect(&o, 1, 0, &g_ra);
        struct run *ranks[4] = {&g_rb, &g_rc, &g_rd, &g_re};
        for (int r = 0; r < 4; r++) {
            struct dt_loader_opts orr = seq_opts(ds, G, G / 4, r, 4);
            orr.drop_last = drop;
            collect(&orr, 1, 0, ranks[r]);
        }
        const struct run *one[1] = {&g_ra};
        const struct run *four[4] = {&g_rb, &g_rc, &g_rd, &g_re};
        size_t na = trips(one, 1, g_ta), nb = trips(four, 4, g_tb);
        CU_ASSERT_EQUAL(na, drop ? 64u : 70u);
        CU_ASSERT(same_trips(g_ta, na, g_tb, nb));
        if (!drop)
            continue;
        /* full batches: one rank's micro-batch j is rank j's slice */
        int mismatched = 0;
        for (int i = 0; i < g_ra.n; i++) {
            const struct rec *a = &g_ra.r[i];
            const struct rec *b = &ranks[a->micro]->r[a->batch];
            mismatched += a->micro_count != 4 || b->micro_count != 1 || a->row0 != b->row0 ||
                          a->batch != b->batch ||
                          memcmp(a->ids, b->ids, sizeof(uint64_t) * (size_t)a->rows) != 0;
        }
        CU_ASSERT_EQUAL(g_ra.n, 16);
        CU_ASSERT_EQUAL(mismatched, 0);
    }
    dt_dataset_close(ds);
}

static void test_loader_prefetch_same_sequence(void)
{
    dt_dataset_t *ds = open_seq("seq500.h5", 500);
    CU_ASSERT_FATAL(ds != NULL);
    struct dt_loader_opts o = seq_opts(ds, 24, 4, 1, 2);
    collect(&o, 7, 0, &g_ra);
    o.workers = 4;
    o.prefetch = 8;
    collect(&o, 7, 0, &g_rb);
    CU_ASSERT(g_ra.n > 50);
    CU_ASSERT(g_ra.n == g_rb.n && memcmp(g_ra.r, g_rb.r, sizeof g_ra.r[0] * g_ra.n) == 0);
    CU_ASSERT_EQUAL(g_ra.bytes, g_rb.bytes);
    dt_dataset_close(ds);
}

static void test_loader_restart(void)
{
    dt_dataset_t *ds = open_seq("seq300.h5", 300);
    CU_ASSERT_FATAL(ds != NULL);
    struct dt_loader_opts o = seq_opts(ds, 32, 8, 0, 2);
    o.workers = 3;
    o.prefetch = 5;
    collect(&o, 4, 0, &g_ra);
    const int64_t k = 6;
    int tail = 0;
    while (tail < g_ra.n && g_ra.r[tail].batch < k)
        tail++;
    CU_ASSERT_EQUAL(tail, k * 2);
    collect(&o, 4, k, &g_rb);
    CU_ASSERT(g_rb.n == g_ra.n - tail &&
              memcmp(g_rb.r, g_ra.r + tail, sizeof g_ra.r[0] * (size_t)g_rb.n) == 0);

    /* restart in the middle of an epoch, with batches read ahead and one held */
    dt_loader_t *ld = NULL;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_OK);
    CU_ASSERT_FATAL(ld != NULL);
    ASSERT_STATUS(dt_loader_start_epoch(ld, 9, 0), DT_OK);
    struct dt_batch b, held;
    int end = 0;
    for (int i = 0; i < 3; i++) {
        ASSERT_STATUS(dt_loader_next(ld, &b, &end), DT_OK);
        dt_loader_release(ld, &b);
    }
    ASSERT_STATUS(dt_loader_next(ld, &held, &end), DT_OK);
    ASSERT_STATUS(dt_loader_start_epoch(ld, 4, k), DT_OK);
    dt_loader_release(ld, &held); /* stale: ignored */
    int same = 1;
    for (int i = tail; i < g_ra.n; i++) {
        dt_status st = dt_loader_next(ld, &b, &end);
        if (st != DT_OK || end) {
            same = 0;
            break;
        }
        same &= b.batch == g_ra.r[i].batch && b.micro == g_ra.r[i].micro &&
                memcmp(b.sample_ids, g_ra.r[i].ids, sizeof(uint64_t) * (size_t)b.rows) == 0;
        dt_loader_release(ld, &b);
    }
    CU_ASSERT(same);
    ASSERT_STATUS(dt_loader_next(ld, &b, &end), DT_OK);
    CU_ASSERT_EQUAL(end, 1);
    ASSERT_STATUS(dt_loader_start_epoch(ld, 4, 99), DT_ERR_INVALID_ARG);
    dt_loader_destroy(ld);
    dt_dataset_close(ds);
}

static void test_loader_bad_micro(void)
{
    dt_dataset_t *ds = open_seq("seq50.h5", 50);
    CU_ASSERT_FATAL(ds != NULL);
    dt_loader_t *ld = (dt_loader_t *)1;
    struct dt_loader_opts o = seq_opts(ds, 24, 5, 0, 2); /* 12 rows per rank */
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_USAGE);
    CU_ASSERT(ld == NULL);
    ASSERT_MSG("micro batch 5");
    ASSERT_MSG("1, 2, 3, 4, 6, 12");
    o = seq_opts(ds, 3, 1, 0, 4); /* fewer rows than ranks */
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_USAGE);
    o = seq_opts(ds, 64, 8, 0, 1); /* one batch would be dropped: empty epoch */
    o.drop_last = 1;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_USAGE);
    o = seq_opts(ds, 8, 8, 0, 1);
    o.split = "nope";
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_BAD_DATA);
    dt_dataset_close(ds);
}

static void test_loader_held_slots_and_destroy(void)
{
    dt_dataset_t *ds = open_seq("seq120.h5", 120);
    CU_ASSERT_FATAL(ds != NULL);
    struct dt_loader_opts o = seq_opts(ds, 8, 4, 0, 1);
    o.workers = 3;
    o.prefetch = 2;
    dt_loader_t *ld = NULL;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_OK);
    CU_ASSERT_FATAL(ld != NULL);
    struct dt_batch a, b, c;
    int end = 0;
    ASSERT_STATUS(dt_loader_next(ld, &a, &end), DT_ERR_INVALID_ARG); /* not started */
    ASSERT_STATUS(dt_loader_start_epoch(ld, 0, 0), DT_OK);
    ASSERT_STATUS(dt_loader_next(ld, &a, &end), DT_OK);
    ASSERT_STATUS(dt_loader_next(ld, &b, &end), DT_OK);
    CU_ASSERT(a.x != b.x && a.micro == 0 && b.micro == 1);
    /* both slots held: an error, not a deadlock */
    ASSERT_STATUS(dt_loader_next(ld, &c, &end), DT_ERR_INVALID_ARG);
    dt_loader_release(ld, &a);
    ASSERT_STATUS(dt_loader_next(ld, &c, &end), DT_OK);
    CU_ASSERT_EQUAL(c.batch, 1);
    /* destroy mid-epoch with reads in flight and batches held */
    dt_loader_destroy(ld);
    dt_dataset_close(ds);
}

/* A global batch far larger than the split (the job allows 10^9): one
 * short batch of every row, with buffers sized by the data, not by the
 * batch (10^9 rows of 1000 floats would be 4 TB). */
static void test_loader_batch_beyond_split(void)
{
    char p[4096];
    enum { N = 30, D = 1000 };
    static float x[N * D];
    for (int i = 0; i < N * D; i++)
        x[i] = (float)(i / D);
    tpath(p, sizeof p, "wide.h5");
    int32_t y[N] = {0};
    hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    put_root_attrs(f, 1, 3, 1, 0, 1);
    put_split(f, "train", H5T_IEEE_F32LE, N, D, x, N, y);
    H5Fclose(f);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    struct dt_loader_opts o = seq_opts(ds, 1000000000, 1000000000, 0, 1);
    o.prefetch = 4;
    dt_loader_t *ld = NULL;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_OK);
    CU_ASSERT_FATAL(ld != NULL);
    CU_ASSERT_EQUAL(dt_loader_batches_per_epoch(ld), 1);
    ASSERT_STATUS(dt_loader_start_epoch(ld, 0, 0), DT_OK);
    struct dt_batch b;
    int end = 0;
    ASSERT_STATUS(dt_loader_next(ld, &b, &end), DT_OK);
    CU_ASSERT_FATAL(!end);
    CU_ASSERT_EQUAL(b.rows, N);
    int bad = 0;
    for (int64_t i = 0; i < b.rows; i++)
        bad += b.x[i * D + D - 1] != (float)b.sample_ids[i];
    CU_ASSERT_EQUAL(bad, 0);
    dt_loader_release(ld, &b);
    dt_loader_destroy(ld);
    dt_dataset_close(ds);
}

/* x stored in two external raw files; removing the second makes every read
 * of rows 20.. fail inside HDF5, in a loader worker. */
/* Batch buffers from the caller (a GPU backend's pinned memory): every
 * x and y buffer comes from its alloc and goes back through its free,
 * each refill of a slot first asks idle about both of its buffers, an
 * idle failure is that batch's error, and the batches are those of plain
 * memory. */
struct fake_buffers {
    int allocs, frees, idles, fail_idle_at;
    void *live[64];
};

static dt_status fake_alloc(void *ctx, size_t bytes, void **out)
{
    struct fake_buffers *f = ctx;
    *out = malloc(bytes);
    memset(*out, 0xab, bytes); /* the loader must not count on zeroed memory */
    f->live[f->allocs++ % 64] = *out;
    return DT_OK;
}

static void fake_free(void *ctx, void *p)
{
    struct fake_buffers *f = ctx;
    int mine = 0;
    for (int i = 0; i < 64; i++)
        mine |= f->live[i] == p;
    CU_ASSERT(mine);
    f->frees++;
    free(p);
}

static dt_status fake_idle(void *ctx, const void *p)
{
    struct fake_buffers *f = ctx;
    int mine = 0;
    for (int i = 0; i < 64; i++)
        mine |= f->live[i] == p;
    CU_ASSERT(mine);
    if (++f->idles == f->fail_idle_at)
        return dt_set_error(DT_ERR_CUDA, "upload out of the batch buffer failed (test)");
    return DT_OK;
}

static void test_loader_caller_buffers(void)
{
    dt_dataset_t *ds = open_seq("seq103.h5", 103);
    CU_ASSERT_FATAL(ds != NULL);
    struct dt_loader_opts o = seq_opts(ds, 10, 5, 0, 1);
    collect(&o, 0, 0, &g_ra);
    struct fake_buffers f = {0};
    o.buffers = (struct dt_loader_buffers){fake_alloc, fake_free, fake_idle, &f};
    collect(&o, 0, 0, &g_rb);
    CU_ASSERT_EQUAL_FATAL(g_ra.n, g_rb.n);
    CU_ASSERT_EQUAL(g_rb.bad_rows, 0); /* x and y are the samples' */
    for (int i = 0; i < g_ra.n; i++) {
        const struct rec *a = &g_ra.r[i], *c = &g_rb.r[i];
        CU_ASSERT(a->batch == c->batch && a->row0 == c->row0 && a->rows == c->rows);
        CU_ASSERT_EQUAL(memcmp(a->ids, c->ids, (size_t)a->rows * sizeof *a->ids), 0);
    }
    CU_ASSERT_EQUAL(f.allocs, 2 * o.prefetch);
    CU_ASSERT_EQUAL(f.frees, f.allocs);
    CU_ASSERT(f.idles >= 2 * g_rb.n); /* both buffers, before every fill */
    /* a failing idle is the batch's error, as a read error is */
    struct fake_buffers g = {.fail_idle_at = 3}; /* the second fill's first buffer */
    o.buffers.ctx = &g;
    o.workers = 1; /* fills in order */
    dt_loader_t *ld = NULL;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_OK);
    ASSERT_STATUS(dt_loader_start_epoch(ld, 0, 0), DT_OK);
    struct dt_batch b;
    int end = 0, got = 0;
    dt_status st = DT_OK;
    while ((st = dt_loader_next(ld, &b, &end)) == DT_OK && !end) {
        got++;
        dt_loader_release(ld, &b);
    }
    CU_ASSERT_EQUAL(st, DT_ERR_CUDA);
    CU_ASSERT(strstr(dt_last_error(), "upload out of the batch buffer failed") != NULL);
    CU_ASSERT_EQUAL(got, 1);
    dt_loader_destroy(ld);
    CU_ASSERT_EQUAL(g.frees, g.allocs);
    dt_dataset_close(ds);
}

static void test_loader_read_error(void)
{
    char p[4096], ext_a[4096], ext_b[4096];
    tpath(p, sizeof p, "external.h5");
    tpath(ext_a, sizeof ext_a, "external-a.raw");
    tpath(ext_b, sizeof ext_b, "external-b.raw");
    const hsize_t n = 40;
    float x[40 * 2];
    int32_t y[40];
    for (hsize_t i = 0; i < n; i++) {
        x[2 * i] = (float)i;
        x[2 * i + 1] = -(float)i;
        y[i] = (int32_t)(i % SEQ_K);
    }
    hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    put_root_attrs(f, 1, SEQ_K, 1, 0, 1);
    hid_t g = H5Gcreate2(f, "train", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t dims[2] = {n, 2};
    hid_t sx = H5Screate_simple(2, dims, NULL), sy = H5Screate_simple(1, &n, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_external(dcpl, ext_a, 0, 20 * 2 * sizeof(float));
    H5Pset_external(dcpl, ext_b, 0, 20 * 2 * sizeof(float));
    hid_t dx = H5Dcreate2(g, "x", H5T_NATIVE_FLOAT, sx, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    hid_t dy = H5Dcreate2(g, "y", H5T_STD_I32LE, sy, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT(H5Dwrite(dx, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x) >= 0);
    CU_ASSERT(H5Dwrite(dy, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, y) >= 0);
    H5Dclose(dx);
    H5Dclose(dy);
    H5Pclose(dcpl);
    H5Sclose(sx);
    H5Sclose(sy);
    H5Gclose(g);
    H5Fclose(f);

    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    CU_ASSERT_EQUAL(unlink(ext_b), 0);
    struct dt_loader_opts o = seq_opts(ds, 4, 2, 0, 1);
    o.shuffle = 0;
    o.workers = 2;
    o.prefetch = 4;
    dt_loader_t *ld = NULL;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_OK);
    CU_ASSERT_FATAL(ld != NULL);
    for (int round = 0; round < 2; round++) {
        ASSERT_STATUS(dt_loader_start_epoch(ld, 0, 0), DT_OK);
        int ok = 0, end = 0;
        dt_status st = DT_OK;
        struct dt_batch b;
        while ((st = dt_loader_next(ld, &b, &end)) == DT_OK && !end) {
            ok += b.x[0] == (float)b.sample_ids[0];
            dt_loader_release(ld, &b);
        }
        CU_ASSERT_EQUAL(ok, 10); /* rows 0..19: 5 batches of 2 micro-batches */
        CU_ASSERT_EQUAL(end, 0);
        CU_ASSERT_EQUAL(st, DT_ERR_IO);
        ASSERT_MSG(p);
        ASSERT_MSG("rows 20..21");
        /* the error stays until the next start_epoch */
        ASSERT_STATUS(dt_loader_next(ld, &b, &end), DT_ERR_IO);
        ASSERT_MSG(p);
    }
    dt_loader_destroy(ld);
    dt_dataset_close(ds);
}

/* ---- images, per-channel normalisation, augmentation ---------------------- */

/* What the crop cf of sample i must be, computed here independently. */
static void aug_expect(uint64_t i, const struct dt_crop_flip *cf, int pad, float *out)
{
    for (int c = 0; c < AUG_C; c++)
        for (int y = 0; y < AUG_H; y++)
            for (int x = 0; x < AUG_W; x++) {
                int py = y + cf->top, px = (cf->flip ? AUG_W - 1 - x : x) + cf->left;
                int sy = py - pad, sx = px - pad; /* padded -> stored */
                int inside = sy >= 0 && sy < AUG_H && sx >= 0 && sx < AUG_W;
                out[(c * AUG_H + y) * AUG_W + x] =
                    inside ? aug_value(i, (c * AUG_H + sy) * AUG_W + sx) : 0.0f;
            }
}

/* Runs one rank from global batch `first` to the end of the epoch and
 * checks every row against aug_expect for the draw of (seed, epoch,
 * sample); returns the rows seen. */
static int64_t aug_epoch(const struct dt_loader_opts *o, int64_t epoch, int64_t first, int *bad)
{
    dt_loader_t *ld = NULL;
    int64_t rows = 0;
    ASSERT_STATUS(dt_loader_create(o, &ld), DT_OK);
    if (!ld)
        return 0;
    ASSERT_STATUS(dt_loader_start_epoch(ld, epoch, first), DT_OK);
    for (;;) {
        struct dt_batch b;
        int end = 0;
        dt_status st = dt_loader_next(ld, &b, &end);
        ASSERT_STATUS(st, DT_OK);
        if (st != DT_OK || end)
            break;
        for (int64_t r = 0; r < b.rows; r++) {
            struct dt_crop_flip cf;
            float want[AUG_ELEMS];
            dt_loader_augment_draw(o->seed, epoch, b.sample_ids[r], o->crop_padding, o->hflip, &cf);
            aug_expect(b.sample_ids[r], &cf, o->crop_padding, want);
            *bad += memcmp(want, b.x + r * AUG_ELEMS, sizeof want) != 0;
        }
        rows += b.rows;
        dt_loader_release(ld, &b);
    }
    dt_loader_destroy(ld);
    return rows;
}

/* The same sample in the same epoch gets the same crop and flip whatever
 * the world size, rank, micro-batch or number of workers; each row is
 * the hand-computed crop of its draw. */
static void test_loader_augment_any_world(void)
{
    dt_dataset_t *ds = open_aug();
    if (!ds)
        return;
    struct {
        int world;
        int64_t micro;
        int workers, prefetch;
    } cfgs[] = {{1, 12, 1, 1}, {2, 3, 1, 2}, {3, 4, 2, 3}, {4, 1, 3, 4}};
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++)
        for (int64_t epoch = 0; epoch < 2; epoch++) {
            int64_t rows = 0;
            int bad = 0;
            for (int rank = 0; rank < cfgs[k].world; rank++) {
                struct dt_loader_opts o = {.ds = ds,
                                           .split = "train",
                                           .global_batch = 12,
                                           .micro_batch = cfgs[k].micro,
                                           .rank = rank,
                                           .world = cfgs[k].world,
                                           .seed = AUG_SEED,
                                           .shuffle = 1,
                                           .drop_last = 0,
                                           .workers = cfgs[k].workers,
                                           .prefetch = cfgs[k].prefetch,
                                           .crop_padding = AUG_PAD,
                                           .hflip = 1};
                rows += aug_epoch(&o, epoch, 0, &bad);
            }
            CU_ASSERT_EQUAL(rows, AUG_N);
            CU_ASSERT_EQUAL(bad, 0);
            /* resumed at global batch 2 of 4: the same crops for the rest */
            rows = 0;
            for (int rank = 0; rank < cfgs[k].world; rank++) {
                struct dt_loader_opts o = {.ds = ds,
                                           .split = "train",
                                           .global_batch = 12,
                                           .micro_batch = cfgs[k].micro,
                                           .rank = rank,
                                           .world = cfgs[k].world,
                                           .seed = AUG_SEED,
                                           .shuffle = 1,
                                           .workers = cfgs[k].workers,
                                           .prefetch = cfgs[k].prefetch,
                                           .crop_padding = AUG_PAD,
                                           .hflip = 1};
                rows += aug_epoch(&o, epoch, 2, &bad);
            }
            CU_ASSERT_EQUAL(rows, AUG_N - 24);
            CU_ASSERT_EQUAL(bad, 0);
        }
    dt_dataset_close(ds);
}

/* The draws vary: across samples (every crop offset and both flips
 * occur), and across epochs for the same sample. */
static void test_loader_augment_draws(void)
{
    int tops[2 * AUG_PAD + 1] = {0}, lefts[2 * AUG_PAD + 1] = {0}, flips = 0, changed = 0;
    const int n = 1000;
    for (int i = 0; i < n; i++) {
        struct dt_crop_flip a, b, again;
        dt_loader_augment_draw(AUG_SEED, 0, (uint64_t)i, AUG_PAD, 1, &a);
        dt_loader_augment_draw(AUG_SEED, 1, (uint64_t)i, AUG_PAD, 1, &b);
        dt_loader_augment_draw(AUG_SEED, 0, (uint64_t)i, AUG_PAD, 1, &again);
        CU_ASSERT(a.top >= 0 && a.top <= 2 * AUG_PAD && a.left >= 0 && a.left <= 2 * AUG_PAD);
        CU_ASSERT(a.flip == 0 || a.flip == 1);
        CU_ASSERT(memcmp(&a, &again, sizeof a) == 0);
        tops[a.top]++;
        lefts[a.left]++;
        flips += a.flip;
        changed += memcmp(&a, &b, sizeof a) != 0;
    }
    for (int v = 0; v <= 2 * AUG_PAD; v++) {
        CU_ASSERT(tops[v] > n / 5);
        CU_ASSERT(lefts[v] > n / 5);
    }
    CU_ASSERT(flips > n / 3 && flips < 2 * n / 3);
    CU_ASSERT(changed > n / 2);
    /* off: no crop, no flip */
    struct dt_crop_flip off;
    dt_loader_augment_draw(AUG_SEED, 0, 5, 0, 0, &off);
    CU_ASSERT(off.top == 0 && off.left == 0 && off.flip == 0);
    /* the loader with augmentation off hands out the stored samples */
    dt_dataset_t *ds = open_aug();
    if (!ds)
        return;
    struct dt_loader_opts o = {.ds = ds,
                               .split = "test",
                               .global_batch = 8,
                               .micro_batch = 8,
                               .rank = 0,
                               .world = 1,
                               .seed = AUG_SEED,
                               .shuffle = 0,
                               .workers = 1,
                               .prefetch = 1};
    int bad = 0;
    CU_ASSERT_EQUAL(aug_epoch(&o, 0, 0, &bad), AUG_N / 2);
    CU_ASSERT_EQUAL(bad, 0);
    dt_dataset_close(ds);
}

/* Augmentation of vector samples, or a negative padding, is refused
 * naming the key. */
static void test_loader_augment_refused(void)
{
    dt_dataset_t *ds = open_seq("aug-vec.h5", 16);
    if (!ds)
        return;
    dt_loader_t *ld = NULL;
    struct dt_loader_opts o = seq_opts(ds, 4, 4, 0, 1);
    o.hflip = 1;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_USAGE);
    ASSERT_MSG("data.augment.hflip asks for augmentation of split 'train'");
    ASSERT_MSG("whose samples (2) are not images");
    o.hflip = 0;
    o.crop_padding = 2;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_USAGE);
    ASSERT_MSG("data.augment.crop_padding");
    o.crop_padding = -1;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_USAGE);
    ASSERT_MSG("data.augment.crop_padding=-1");
    CU_ASSERT_PTR_NULL(ld);
    dt_dataset_close(ds);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite("io_loader", io_suite_init, NULL);
    CU_ADD(s, test_loader_augment_any_world);
    CU_ADD(s, test_loader_augment_draws);
    CU_ADD(s, test_loader_augment_refused);
    CU_ADD(s, test_loader_epoch_all_samples);
    CU_ADD(s, test_loader_caller_buffers);
    CU_ADD(s, test_loader_drop_last);
    CU_ADD(s, test_loader_deterministic);
    CU_ADD(s, test_loader_two_ranks);
    CU_ADD(s, test_loader_accumulation_matches_ranks);
    CU_ADD(s, test_loader_prefetch_same_sequence);
    CU_ADD(s, test_loader_restart);
    CU_ADD(s, test_loader_bad_micro);
    CU_ADD(s, test_loader_held_slots_and_destroy);
    CU_ADD(s, test_loader_read_error);
    CU_ADD(s, test_loader_batch_beyond_split);
    return io_run_all();
}
