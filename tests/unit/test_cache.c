/*
 * test_cache.c - CUnit suite for the row cache (data.cache: memory,
 * io/dataset_cache.c): cached batches equal to batches read from the file,
 * a rank's shard, refused requests, a dataset of three files.
 *
 * Every file a test needs is made here or by io_common.c, in the
 * suite's private directory.
 */
#define _GNU_SOURCE
#include <hdf5.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "io_common.h"
#include "io/dataset.h"
#include "io/loader.h"
#include "core/log.h"
#include "core/status.h"

/* ---- data.cache: memory ------------------------------------------------------- */

/* The cache logs what it read at every loader create; the suite keeps the
 * test output to errors. */
static enum dt_log_level cache_saved_level;
static int cache_suite_init(void)
{
    if (io_suite_init() != 0) return -1;
    cache_saved_level = dt_log_get_level();
    dt_log_set_level(DT_LOG_LEVEL_ERROR);
    return 0;
}
static int cache_suite_clean(void)
{
    dt_log_set_level(cache_saved_level);
    return 0;
}

/* Everything a loader hands out over one run, as bytes: each batch's
 * numbers, sample ids, inputs and labels. */
struct stream {
    unsigned char *p;
    size_t n, cap;
};

static void put_bytes(struct stream *s, const void *v, size_t n)
{
    if (s->n + n > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->n + n)
            cap *= 2;
        unsigned char *p = realloc(s->p, cap);
        CU_ASSERT_FATAL(p != NULL);
        s->p = p;
        s->cap = cap;
    }
    memcpy(s->p + s->n, v, n);
    s->n += n;
}

/* Runs o from (epoch, first) to the end of the epoch into s; returns the
 * loader's cache mode. */
static int loader_stream(const struct dt_loader_opts *o, int64_t epoch, int64_t first,
                         struct stream *s)
{
    const struct dt_split_info *si = NULL;
    dt_loader_t *ld = NULL;
    ASSERT_STATUS(dt_dataset_split(o->ds, o->split, &si), DT_OK);
    ASSERT_STATUS(dt_loader_create(o, &ld), DT_OK);
    if (!ld || !si)
        return -1;
    int mode = (int)dt_loader_cache_mode(ld);
    ASSERT_STATUS(dt_loader_start_epoch(ld, epoch, first), DT_OK);
    for (;;) {
        struct dt_batch b;
        int end = 0;
        dt_status st = dt_loader_next(ld, &b, &end);
        ASSERT_STATUS(st, DT_OK);
        if (st != DT_OK || end)
            break;
        int64_t nums[6] = {b.batch, b.row0, b.rows, b.global_rows, b.micro, b.micro_count};
        put_bytes(s, nums, sizeof nums);
        put_bytes(s, b.sample_ids, (size_t)b.rows * sizeof *b.sample_ids);
        put_bytes(s, b.x, (size_t)(b.rows * si->sample_elems) * sizeof *b.x);
        put_bytes(s, b.y, (size_t)b.rows * sizeof *b.y);
        dt_loader_release(ld, &b);
    }
    dt_loader_destroy(ld);
    return mode;
}

/* A uint8 image dataset of AUG_N samples (2 x 3 x 4), norm scale 1/255. */
static dt_dataset_t *open_aug_u8(void)
{
    static float x[AUG_N * AUG_ELEMS];
    for (uint64_t i = 0; i < AUG_N; i++)
        for (int k = 0; k < AUG_ELEMS; k++)
            x[i * AUG_ELEMS + (uint64_t)k] = (float)((i * 7 + (uint64_t)k * 13) % 256);
    hsize_t dims[3] = {AUG_C, AUG_H, AUG_W};
    make_image_ds("aug-u8.h5", H5T_STD_U8LE, AUG_N, 3, dims, x, 1.0 / 255, 0, NULL, 0, NULL);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(open_named("aug-u8.h5", &ds), DT_OK);
    return ds;
}

/* A split that fits is cached whole, and every batch (rows, ids, x, y)
 * is bit-identical to the uncached loader's: float32 and uint8 inputs,
 * 1 and 2 ranks, augmentation off and on, two epochs, from the start and
 * resumed at a later batch, several workers. */
static void test_cache_whole_split_same_batches(void)
{
    dt_dataset_t *dss[2] = {open_aug(), open_aug_u8()};
    for (int d = 0; d < 2; d++) {
        CU_ASSERT_FATAL(dss[d] != NULL);
        for (int world = 1; world <= 2; world++)
            for (int aug = 0; aug < 2; aug++)
                for (int64_t epoch = 0; epoch < 2; epoch++)
                    for (int64_t first = 0; first <= 2; first += 2)
                        for (int rank = 0; rank < world; rank++) {
                            struct dt_loader_opts o = {.ds = dss[d],
                                                       .split = "train",
                                                       .global_batch = 10,
                                                       .micro_batch = 5,
                                                       .rank = rank,
                                                       .world = world,
                                                       .seed = AUG_SEED,
                                                       .shuffle = 1,
                                                       .drop_last = 0,
                                                       .workers = 1,
                                                       .prefetch = 1,
                                                       .crop_padding = aug ? AUG_PAD : 0,
                                                       .hflip = aug,
                                                       .cache_max_mb = 1};
                            struct stream a = {0}, b = {0};
                            CU_ASSERT_EQUAL(loader_stream(&o, epoch, first, &a),
                                            DT_LOADER_CACHED_NONE);
                            o.cache = DT_LOADER_CACHE_MEMORY;
                            o.workers = 3;
                            o.prefetch = 4;
                            CU_ASSERT_EQUAL(loader_stream(&o, epoch, first, &b),
                                            DT_LOADER_CACHED_SPLIT);
                            CU_ASSERT(a.n > 0);
                            CU_ASSERT_EQUAL(a.n, b.n);
                            CU_ASSERT(a.n == b.n && memcmp(a.p, b.p, a.n) == 0);
                            free(a.p);
                            free(b.p);
                        }
        dt_dataset_close(dss[d]);
    }
}

#define SHARD_N 60000 /* rows of 2 floats: 1.14 MiB cached whole, half on each of 2 ranks */

#define SHARD_G 64

/* Does rank r of 2 own dataset row id in the shard layout (its half of
 * every global batch in file order, and of the short last one)? */
static int shard_owns(uint64_t id, int r)
{
    uint64_t full = SHARD_N / SHARD_G * SHARD_G, rest = SHARD_N - full;
    if (id < full)
        return id % SHARD_G / (SHARD_G / 2) == (uint64_t)r;
    return (id - full) / (rest / 2) == (uint64_t)r;
}

/* A split larger than cache_max_mb: each of 2 ranks caches its own shard
 * (reading only its rows), every sample is seen once per epoch across
 * the ranks and only by its owner, each row's x and y match its id, the
 * order changes with the epoch, a resumed run sees the same batches, and
 * without shuffling the batches are those of the uncached loader. */
static void test_cache_shard(void)
{
    dt_dataset_t *ds = open_seq("cache-shard.h5", SHARD_N);
    CU_ASSERT_FATAL(ds != NULL);
    static struct run full[2][2], tail;
    static unsigned char seen[SHARD_N];
    for (int64_t epoch = 0; epoch < 2; epoch++) {
        memset(seen, 0, sizeof seen);
        for (int r = 0; r < 2; r++) {
            struct dt_loader_opts o = seq_opts(ds, SHARD_G, SHARD_G / 2, r, 2);
            o.cache = DT_LOADER_CACHE_MEMORY;
            o.cache_max_mb = 1;
            o.workers = 2;
            o.prefetch = 3;
            dt_loader_t *ld = NULL;
            ASSERT_STATUS(dt_loader_create(&o, &ld), DT_OK);
            CU_ASSERT_EQUAL(dt_loader_cache_mode(ld), DT_LOADER_CACHED_SHARD);
            CU_ASSERT_EQUAL(dt_loader_cache_bytes(ld), (uint64_t)(SHARD_N / 2) * 20);
            dt_loader_destroy(ld);
            struct run *fr = &full[epoch][r];
            collect(&o, epoch, 0, fr);
            /* the fill read this rank's half of x, and the batches nothing more */
            CU_ASSERT_EQUAL(fr->bytes, (uint64_t)(SHARD_N / 2) * 2 * sizeof(float));
            int64_t rows = 0, strangers = 0;
            for (int i = 0; i < fr->n; i++)
                for (int64_t k = 0; k < fr->r[i].rows; k++) {
                    uint64_t id = fr->r[i].ids[k];
                    seen[id]++;
                    strangers += !shard_owns(id, r);
                    rows++;
                }
            CU_ASSERT_EQUAL(rows, SHARD_N / 2);
            CU_ASSERT_EQUAL(strangers, 0);
            /* resumed at global batch 100: the rest of the same epoch */
            collect(&o, epoch, 100, &tail);
            CU_ASSERT_EQUAL(tail.n, fr->n - 100);
            CU_ASSERT(tail.n == fr->n - 100 &&
                      memcmp(tail.r, fr->r + 100, (size_t)tail.n * sizeof *tail.r) == 0);
        }
        int64_t once = 0;
        for (int i = 0; i < SHARD_N; i++)
            once += seen[i] == 1;
        CU_ASSERT_EQUAL(once, SHARD_N);
    }
    CU_ASSERT(memcmp(full[0][0].r[0].ids, full[1][0].r[0].ids, sizeof full[0][0].r[0].ids) != 0);
    int identity = 1; /* the shuffled shard order is not the file order */
    for (int k = 0; k < SHARD_G / 2; k++)
        identity &= full[0][0].r[0].ids[k] == (uint64_t)k;
    CU_ASSERT(!identity);
    /* no shuffling: the shard order is the file order, as without the cache */
    for (int r = 0; r < 2; r++) {
        struct stream a = {0}, b = {0};
        struct dt_loader_opts o = seq_opts(ds, SHARD_G, SHARD_G / 2, r, 2);
        o.shuffle = 0;
        o.cache_max_mb = 1;
        CU_ASSERT_EQUAL(loader_stream(&o, 1, 0, &a), DT_LOADER_CACHED_NONE);
        o.cache = DT_LOADER_CACHE_MEMORY;
        CU_ASSERT_EQUAL(loader_stream(&o, 1, 0, &b), DT_LOADER_CACHED_SHARD);
        CU_ASSERT(a.n > 0 && a.n == b.n && memcmp(a.p, b.p, a.n) == 0);
        free(a.p);
        free(b.p);
    }
    /* drop_last: the full batches only, still no sample twice */
    {
        struct dt_loader_opts o = seq_opts(ds, SHARD_G, SHARD_G / 2, 1, 2);
        o.drop_last = 1;
        o.cache = DT_LOADER_CACHE_MEMORY;
        o.cache_max_mb = 1;
        collect(&o, 3, 0, &tail);
        memset(seen, 0, sizeof seen);
        int64_t rows = 0, twice = 0, strangers = 0;
        for (int i = 0; i < tail.n; i++)
            for (int64_t k = 0; k < tail.r[i].rows; k++) {
                uint64_t id = tail.r[i].ids[k];
                twice += seen[id]++ > 0;
                strangers += !shard_owns(id, 1);
                rows++;
            }
        CU_ASSERT_EQUAL(rows, SHARD_N / SHARD_G * (SHARD_G / 2));
        CU_ASSERT_EQUAL(twice, 0);
        CU_ASSERT_EQUAL(strangers, 0);
    }
    dt_dataset_close(ds);
}

/* Refused with a message naming the key: a shard larger than
 * data.cache_max_mb, a bad data.cache_max_mb, a language-model split. */
static void test_cache_refused(void)
{
    dt_dataset_t *ds = open_seq("cache-big.h5", SHARD_N);
    CU_ASSERT_FATAL(ds != NULL);
    dt_loader_t *ld = NULL;
    struct dt_loader_opts o = seq_opts(ds, SHARD_G, SHARD_G, 0, 1);
    o.cache = DT_LOADER_CACHE_MEMORY;
    o.cache_max_mb = 1;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_USAGE);
    ASSERT_MSG("needs 2 MiB, more than data.cache_max_mb=1");
    CU_ASSERT_PTR_NULL(ld);
    o.cache_max_mb = 0;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_USAGE);
    ASSERT_MSG("data.cache_max_mb=0");
    o.cache_max_mb = 2; /* fits whole again */
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_OK);
    CU_ASSERT_EQUAL(dt_loader_cache_mode(ld), DT_LOADER_CACHED_SPLIT);
    dt_loader_destroy(ld);
    dt_dataset_close(ds);

    char p[4096];
    tpath(p, sizeof p, "cache-lm.h5");
    make_lm(p, H5T_STD_U16LE, 400, 10, 0, LM_V);
    ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    ASSERT_STATUS(dt_dataset_set_seq_len(ds, 4), DT_OK);
    o = seq_opts(ds, 8, 8, 0, 1);
    o.cache = DT_LOADER_CACHE_MEMORY;
    o.cache_max_mb = 64;
    ld = NULL;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_USAGE);
    ASSERT_MSG("data.cache=memory is not implemented for language-model datasets");
    dt_dataset_close(ds);

    /* a NaN stored in x: refused when the cache is read, naming the row;
     * a normalisation that overflows: refused by the batch that meets it */
    float x[8 * 3];
    for (int i = 0; i < 24; i++)
        x[i] = (float)i;
    x[5 * 3 + 1] = NAN;
    tpath(p, sizeof p, "cache-nan.h5");
    make_float_ds(p, H5T_IEEE_F32LE, 8, 3, x, 1, 0, 1);
    ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    o = seq_opts(ds, 4, 4, 0, 1);
    o.cache = DT_LOADER_CACHE_MEMORY;
    o.cache_max_mb = 1;
    ld = NULL;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_BAD_DATA);
    ASSERT_MSG("split 'train', row 5: x holds nan at element 1; inputs must be finite");
    dt_dataset_close(ds);
    x[5 * 3 + 1] = 3e38f;
    make_float_ds(p, H5T_IEEE_F32LE, 8, 3, x, 10, 0, 1);
    ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    dt_row_cache_t *rc = NULL;
    const int64_t from[1] = {0}, all[1] = {8};
    ASSERT_STATUS(dt_row_cache_create(ds, "train", from, all, 1, &rc), DT_OK);
    uint64_t pos[2] = {4, 5};
    float out[2 * 3];
    ASSERT_STATUS(dt_row_cache_read(rc, pos, 1, 0, NULL, out, NULL), DT_OK);
    ASSERT_STATUS(dt_row_cache_read(rc, pos, 2, 0, NULL, out, NULL), DT_ERR_BAD_DATA);
    ASSERT_MSG("row 5: x holds 3e+38 at element 1, which normalisation");
    dt_row_cache_destroy(rc);
    dt_dataset_close(ds);
}

/* A cache over several files: rows that cross file boundaries, the same
 * values and labels as dt_dataset_read. */
static void test_cache_three_files(void)
{
    make_part("c-a.h5", 0, 30, 0.5);
    make_part("c-b.h5", 30, 20, 0.5);
    make_part("c-c.h5", 50, 50, 0.5);
    char a[4096], b[4096], c[4096], spec[3 * 4096 + 4];
    tpath(a, sizeof a, "c-a.h5");
    tpath(b, sizeof b, "c-b.h5");
    tpath(c, sizeof c, "c-c.h5");
    snprintf(spec, sizeof spec, "%s\n%s\n%s", a, b, c);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(spec, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    const int64_t start[2] = {25, 90}, count[2] = {40, 10}; /* 25..64 crosses two boundaries */
    dt_row_cache_t *rc = NULL;
    ASSERT_STATUS(dt_row_cache_create(ds, "train", start, count, 2, &rc), DT_OK);
    CU_ASSERT_FATAL(rc != NULL);
    CU_ASSERT_EQUAL(dt_row_cache_rows(rc), 50);
    CU_ASSERT_EQUAL(dt_row_cache_bytes_read(rc), 50 * 4 * sizeof(float));
    uint64_t pos[50], ids[50];
    for (int i = 0; i < 50; i++) {
        pos[i] = (uint64_t)(49 - i);
        ids[i] = dt_row_cache_row_id(rc, (int64_t)pos[i]);
    }
    CU_ASSERT_EQUAL(ids[0], 99);
    CU_ASSERT_EQUAL(ids[49], 25);
    float x1[50 * 4], x2[50 * 4];
    int32_t y1[50], y2[50];
    ASSERT_STATUS(dt_row_cache_read(rc, pos, 50, 0, NULL, x1, y1), DT_OK);
    ASSERT_STATUS(dt_dataset_read(ds, "train", ids, 50, x2, y2, NULL), DT_OK);
    CU_ASSERT(memcmp(x1, x2, sizeof x1) == 0);
    CU_ASSERT(memcmp(y1, y2, sizeof y1) == 0);
    uint64_t bad = 50;
    ASSERT_STATUS(dt_row_cache_read(rc, &bad, 1, 0, NULL, x1, y1), DT_ERR_INVALID_ARG);
    dt_row_cache_destroy(rc);
    const int64_t past[1] = {95}, n10[1] = {10};
    ASSERT_STATUS(dt_row_cache_create(ds, "train", past, n10, 1, &rc), DT_ERR_INVALID_ARG);
    dt_dataset_close(ds);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite("io_cache", cache_suite_init, cache_suite_clean);
    CU_ADD(s, test_cache_whole_split_same_batches);
    CU_ADD(s, test_cache_shard);
    CU_ADD(s, test_cache_refused);
    CU_ADD(s, test_cache_three_files);
    return io_run_all();
}
