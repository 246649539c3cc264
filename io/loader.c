/*
 * loader.c - the prefetching batch loader (see loader.h).
 *
 * The work of an epoch is a numbered sequence of this rank's micro-batches,
 * starting at the global batch given to dt_loader_start_epoch. Item k
 * always lands in slot k % prefetch of a ring. Worker threads claim items
 * in order under the loader mutex, read them with the mutex released
 * (dt_dataset_read takes the HDF5 lock for the file access only, so
 * workers overlap sorting and normalising), and publish them; the caller
 * takes items strictly in order. Which worker read an item never shows:
 * each item's rows are a pure function of (seed, epoch, batch, rank).
 *
 * Splitting (G = global batch, W = world, m = micro_batch):
 *  - full global batch g: permutation positions [g*G, (g+1)*G); rank r
 *    takes [r*G/W, (r+1)*G/W) of it, in micro-batches of exactly m rows
 *    (m must divide that slice, checked at create).
 *  - the short last batch of R < G rows (kept when drop_last is off): rank
 *    r takes [r*R/W, (r+1)*R/W) (sizes differ by at most one) and splits
 *    it into ceil(rows/m) micro-batches whose sizes differ by at most one.
 *    So micro_count may be smaller there, and may differ between ranks; a
 *    rank whose slice is empty still gets one micro-batch with rows = 0,
 *    so every rank takes part in every global batch. With opts.aligned
 *    (reproducible training) the short batch is cut as a full one is,
 *    [r*G/W, (r+1)*G/W) clipped to R, in micro-batches of m rows, so each
 *    micro-batch starts at a multiple of m in the global batch.
 *
 * Augmentation draws each row's crop and flip from (seed, epoch, row) in
 * the worker, after the rows are known, and hands them to the dataset
 * read, which applies them while it normalises: no pass of its own.
 *
 * Cache (see loader.h): ld->perm then holds cache positions. With the
 * whole split cached they are the dataset rows, permuted as without the
 * cache; with a shard, a permutation of the shard's n_shard positions,
 * where this rank's slice of global batch g starts at g * (its slice of a
 * full batch). Both give an item's rows as one run of ld->perm, so the
 * workers do not care which; the dataset row of a position comes from
 * the cache.
 *
 * A read error is kept in its slot with the worker's message and returned
 * by the dt_loader_next that reaches it; the loader then keeps returning
 * it until the next dt_loader_start_epoch. start_epoch waits for reads in
 * flight to finish and drops everything read ahead; batches the caller
 * still holds become invalid (releasing them afterwards is harmless).
 */
#define _GNU_SOURCE
#include "loader.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fault.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/alloc.h"
#include "core/clock.h"

#define LOADER_MAX_WORKERS 64
#define LOADER_MAX_PREFETCH 1024
#define LOADER_ERRMSG_MAX 1024
#define LOADER_GEN_MOD 65536 /* generations encoded in dt_batch.slot */
#define LOADER_MIB ((uint64_t)1 << 20)

enum slot_state { SLOT_EMPTY = 0, SLOT_READING, SLOT_READY, SLOT_HANDED };

/* One micro-batch: where its rows sit in the permutation. */
struct item {
    int64_t batch, pos0, rows; /* rows at permutation positions pos0.. */
    int64_t row0, global_rows;
    int micro, micro_count;
};

struct slot {
    enum slot_state state;
    int64_t k; /* item number in the current run */
    struct item it;
    float *x;
    int32_t *y;
    uint64_t *ids;
    uint64_t *pos;           /* cache positions of the rows (cached loaders only) */
    struct dt_crop_flip *cf; /* rows crops and flips when augmenting, else NULL */
    dt_status st;
    char err[LOADER_ERRMSG_MAX];
};

struct dt_loader {
    struct dt_loader_opts o;
    int64_t n;            /* samples in the split */
    int64_t sample_elems;
    int lm;                 /* language-model windows: sample_elems labels per row */
    int64_t window_shifts;
    int64_t full_batches; /* global batches of G rows */
    int64_t batches;      /* per epoch, after drop_last */
    int64_t full_micro;   /* micro-batches per full global batch */
    enum dt_loader_cache_mode cache_mode;
    dt_row_cache_t *cache;
    int64_t nperm; /* positions permuted each epoch: n, or the shard's rows */
    int64_t slice; /* this rank's rows of a full global batch */

    pthread_mutex_t mu;
    pthread_cond_t work_cv;  /* workers: an item may be claimable, or quit */
    pthread_cond_t ready_cv; /* caller: a slot became ready */
    pthread_cond_t idle_cv;  /* start_epoch: no read in flight */
    pthread_t *threads;
    int nthreads;
    int quit;

    /* the current run, guarded by mu */
    int started;
    uint64_t gen;
    int64_t epoch, first_batch;
    int64_t total;      /* items in the run */
    int64_t claim_next; /* next item a worker claims */
    int64_t next;       /* next item handed to the caller */
    int busy;           /* reads in flight */
    uint64_t *perm;
    struct slot *slots;

    _Atomic uint64_t bytes;
    int64_t delay_ms; /* DTRAIN_FAULT slowdata: added to every read; 0 normally */
};

/* ---- arithmetic of batches ---------------------------------------------- */

/* Rows of a global batch of R rows that rank r gets: [lo, hi). */
static void rank_slice(const struct dt_loader_opts *o, int64_t R, int64_t *lo, int64_t *hi)
{
    int64_t r = o->rank, w = o->world;
    if (o->aligned) { /* full slices from the start; later ranks may get none */
        int64_t each = o->global_batch / w;
        *lo = r * each < R ? r * each : R;
        *hi = (r + 1) * each < R ? (r + 1) * each : R;
        return;
    }
    *lo = R * r / w;
    *hi = R * (r + 1) / w;
}

static int64_t batch_rows(const struct dt_loader *ld, int64_t g)
{
    return g < ld->full_batches ? ld->o.global_batch : ld->n - g * ld->o.global_batch;
}

static int micro_count_of(const struct dt_loader *ld, int64_t g)
{
    if (g < ld->full_batches)
        return (int)ld->full_micro;
    int64_t lo, hi;
    rank_slice(&ld->o, batch_rows(ld, g), &lo, &hi);
    int64_t c = (hi - lo + ld->o.micro_batch - 1) / ld->o.micro_batch;
    return c > 0 ? (int)c : 1;
}

/* Micro-batches from global batch `first` to the end of the epoch. */
static int64_t items_from(const struct dt_loader *ld, int64_t first)
{
    int64_t total = 0;
    if (first < ld->full_batches)
        total = (ld->full_batches - first) * ld->full_micro;
    if (ld->batches > ld->full_batches && first <= ld->full_batches)
        total += micro_count_of(ld, ld->full_batches);
    return total;
}

/* Describes item k of the run that starts at global batch `first`. */
static struct item item_at(const struct dt_loader *ld, int64_t first, int64_t k)
{
    struct item it;
    int64_t g, j;
    int64_t full_left = first < ld->full_batches ? (ld->full_batches - first) * ld->full_micro : 0;
    if (k < full_left) {
        g = first + k / ld->full_micro;
        j = k % ld->full_micro;
    } else {
        g = ld->full_batches;
        j = k - full_left;
    }
    int64_t R = batch_rows(ld, g), lo, hi;
    rank_slice(&ld->o, R, &lo, &hi);
    int mc = micro_count_of(ld, g);
    /* an even split of [lo, hi) into mc parts; for full batches each is m */
    int64_t mine = hi - lo;
    int64_t a = mine * j / mc, b = mine * (j + 1) / mc;
    if (ld->o.aligned) { /* micro-batches of m rows, the last one shorter */
        a = j * ld->o.micro_batch;
        b = a + ld->o.micro_batch < mine ? a + ld->o.micro_batch : mine;
    }
    it.batch = g;
    it.row0 = lo + a;
    it.rows = b - a;
    it.pos0 = g * ld->o.global_batch + it.row0;
    it.global_rows = R;
    it.micro = (int)j;
    it.micro_count = mc;
    return it;
}

/* Where item it's rows start in ld->perm: its permutation position, or
 * with a cached shard its position in the shard order (see the top). */
static int64_t perm_start(const struct dt_loader *ld, const struct item *it)
{
    if (ld->cache_mode != DT_LOADER_CACHED_SHARD)
        return it->pos0;
    int64_t lo, hi;
    rank_slice(&ld->o, it->global_rows, &lo, &hi);
    return it->batch * ld->slice + (it->row0 - lo);
}

/* ---- workers -------------------------------------------------------------- */

static int claimable(const struct dt_loader *ld)
{
    if (!ld->started || ld->claim_next >= ld->total)
        return 0;
    const struct slot *s = &ld->slots[ld->claim_next % ld->o.prefetch];
    return ld->claim_next < ld->next + ld->o.prefetch && s->state == SLOT_EMPTY;
}

/* Waits (in the worker) until no queued upload reads the slot's buffers. */
static dt_status slot_idle(struct dt_loader *ld, const struct slot *s)
{
    const struct dt_loader_buffers *b = &ld->o.buffers;
    if (!b->idle) return DT_OK;
    dt_status st = b->idle(b->ctx, s->x);
    return st == DT_OK ? b->idle(b->ctx, s->y) : st;
}

static void *worker_main(void *arg)
{
    struct dt_loader *ld = arg;
    pthread_mutex_lock(&ld->mu);
    for (;;) {
        while (!ld->quit && !claimable(ld))
            pthread_cond_wait(&ld->work_cv, &ld->mu);
        if (ld->quit)
            break;
        int64_t k = ld->claim_next++;
        struct slot *s = &ld->slots[k % ld->o.prefetch];
        s->state = SLOT_READING;
        s->k = k;
        s->it = item_at(ld, ld->first_batch, k);
        const uint64_t *from = ld->perm + perm_start(ld, &s->it);
        if (ld->cache) {
            memcpy(s->pos, from, (size_t)s->it.rows * sizeof *s->pos);
            for (int64_t i = 0; i < s->it.rows; i++)
                s->ids[i] = dt_row_cache_row_id(ld->cache, (int64_t)s->pos[i]);
        } else {
            memcpy(s->ids, from, (size_t)s->it.rows * sizeof *s->ids);
        }
        int64_t epoch = ld->epoch;
        ld->busy++;
        pthread_mutex_unlock(&ld->mu);

        if (ld->delay_ms > 0) {
            struct timespec ts = {(time_t)(ld->delay_ms / 1000),
                                  (long)(ld->delay_ms % 1000) * 1000000L};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
                ;
        }
        uint64_t bytes = 0;
        /* an upload from this slot may still be queued */
        dt_status st = slot_idle(ld, s);
        if (s->cf)
            for (int64_t i = 0; i < s->it.rows; i++)
                dt_loader_augment_draw(ld->o.seed, epoch, s->ids[i], ld->o.crop_padding,
                                       ld->o.hflip, &s->cf[i]);
        if (st != DT_OK) {
            /* kept in the slot, as a read error is */
        } else if (ld->cache) {
            st = dt_row_cache_read(ld->cache, s->pos, (size_t)s->it.rows, ld->o.crop_padding, s->cf,
                                   s->x, s->y);
        } else if (s->cf) {
            st = dt_dataset_read_crop_flip(ld->o.ds, ld->o.split, s->ids, (size_t)s->it.rows,
                                           ld->o.crop_padding, s->cf, s->x, s->y, &bytes);
        } else if (ld->lm) {
            int64_t shift = ld->o.shift_windows
                                ? dt_loader_window_shift(ld->o.seed, epoch, ld->window_shifts)
                                : 0;
            st = dt_dataset_read_windows(ld->o.ds, ld->o.split, s->ids, (size_t)s->it.rows, shift,
                                         s->x, s->y, &bytes);
        } else {
            st = dt_dataset_read(ld->o.ds, ld->o.split, s->ids, (size_t)s->it.rows, s->x, s->y,
                                 &bytes);
        }
        atomic_fetch_add(&ld->bytes, bytes);

        pthread_mutex_lock(&ld->mu);
        s->st = st;
        if (st != DT_OK)
            snprintf(s->err, sizeof s->err, "%s", dt_last_error());
        s->state = SLOT_READY;
        ld->busy--;
        pthread_cond_broadcast(&ld->ready_cv);
        if (ld->busy == 0)
            pthread_cond_broadcast(&ld->idle_cv);
        /* another worker may claim now that the lock is free */
    }
    pthread_mutex_unlock(&ld->mu);
    return NULL;
}

/* ---- create / destroy ------------------------------------------------------- */

static dt_status check_opts(const struct dt_loader_opts *o, const struct dt_split_info *si)
{
    if (o->world < 1 || o->rank < 0 || o->rank >= o->world)
        return dt_set_error(DT_ERR_INVALID_ARG, "loader: rank %d is not in a world of %d",
                            o->rank, o->world);
    if (o->workers < 1 || o->workers > LOADER_MAX_WORKERS)
        return dt_set_error(DT_ERR_USAGE, "loader: workers is %d, it must be 1 to %d",
                            o->workers, LOADER_MAX_WORKERS);
    if (o->prefetch < 1 || o->prefetch > LOADER_MAX_PREFETCH)
        return dt_set_error(DT_ERR_USAGE, "loader: prefetch is %d, it must be 1 to %d",
                            o->prefetch, LOADER_MAX_PREFETCH);
    if (o->global_batch < o->world)
        return dt_set_error(DT_ERR_USAGE,
                            "loader: global batch %lld is smaller than the %d ranks; each rank "
                            "needs at least one row",
                            (long long)o->global_batch, o->world);
    if (o->micro_batch < 1)
        return dt_set_error(DT_ERR_USAGE, "loader: micro batch %lld must be at least 1",
                            (long long)o->micro_batch);
    int64_t lo, hi;
    rank_slice(o, o->global_batch, &lo, &hi);
    int64_t mine = hi - lo;
    if (mine % o->micro_batch != 0) {
        char fits[256];
        size_t len = 0;
        for (int64_t d = 1; d <= mine && len < sizeof fits - 16; d++)
            if (mine % d == 0)
                len += (size_t)snprintf(fits + len, sizeof fits - len, "%s%lld", len ? ", " : "",
                                        (long long)d);
        return dt_set_error(DT_ERR_USAGE,
                            "loader: micro batch %lld does not divide the %lld rows rank %d gets "
                            "of global batch %lld over %d rank(s); micro batches that fit: %s",
                            (long long)o->micro_batch, (long long)mine, o->rank,
                            (long long)o->global_batch, o->world, fits);
    }
    if (o->crop_padding < 0 || o->crop_padding > DT_LOADER_MAX_CROP_PADDING)
        return dt_set_error(DT_ERR_USAGE, "data.augment.crop_padding=%d: it must be 0 to %d",
                            o->crop_padding, DT_LOADER_MAX_CROP_PADDING);
    int64_t c, h, w;
    if ((o->crop_padding > 0 || o->hflip) && !dt_split_image_shape(si, &c, &h, &w)) {
        char shape[96] = "";
        size_t k = 0;
        for (int d = 0; d < si->ndim && k < sizeof shape; d++)
            k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%lld", d ? " x " : "",
                                  (long long)si->shape[d]);
        return dt_set_error(DT_ERR_USAGE,
                            "%s asks for augmentation of split '%s', whose samples (%s) are not "
                            "images (H, W) or (C, H, W); set it off for this dataset",
                            o->crop_padding > 0 ? "data.augment.crop_padding"
                                                : "data.augment.hflip",
                            si->name, shape);
    }
    if (o->cache != DT_LOADER_CACHE_NONE && o->cache != DT_LOADER_CACHE_MEMORY)
        return dt_set_error(DT_ERR_INVALID_ARG, "loader: cache mode %d is not none or memory",
                            o->cache);
    if (o->cache == DT_LOADER_CACHE_MEMORY && o->cache_max_mb < 1)
        return dt_set_error(DT_ERR_USAGE, "data.cache_max_mb=%lld: it must be at least 1",
                            (long long)o->cache_max_mb);
    if (o->cache == DT_LOADER_CACHE_MEMORY && dt_dataset_get_info(o->ds)->lm)
        return dt_set_error(DT_ERR_USAGE,
                            "data.cache=memory is not implemented for language-model datasets "
                            "(split '%s' holds token windows) in this version; set data.cache: "
                            "none",
                            si->name);
    if (si->n < 1)
        return dt_set_error(DT_ERR_BAD_DATA, "loader: split '%s' is empty", si->name);
    if (o->drop_last && si->n < o->global_batch)
        return dt_set_error(DT_ERR_USAGE,
                            "loader: split '%s' has %lld samples, fewer than one global batch "
                            "(%lld) and drop_last is on, so an epoch would be empty",
                            si->name, (long long)si->n, (long long)o->global_batch);
    return DT_OK;
}

/* A zero-filled batch buffer of n elements of `size` bytes, from the
 * caller's allocator when it gave one. */
static dt_status batch_buffer(struct dt_loader *ld, size_t n, size_t size, const char *what,
                              void **out)
{
    const struct dt_loader_buffers *b = &ld->o.buffers;
    size_t bytes = 0;
    if (!b->alloc) return dt_calloc(n, size, what, out);
    if (!dt_mul_size(n ? n : 1, size, &bytes))
        return dt_set_error(DT_ERR_NOMEM, "%s: %zu elements of %zu bytes is too large", what, n,
                            size);
    dt_status st = b->alloc(b->ctx, bytes, out);
    if (st != DT_OK) return dt_error_context(st, "%s", what);
    memset(*out, 0, bytes);
    return DT_OK;
}

static void free_batch_buffer(struct dt_loader *ld, void *p)
{
    if (ld->o.buffers.alloc)
        ld->o.buffers.free(ld->o.buffers.ctx, p);
    else
        free(p);
}

/* Slot buffers hold the most rows a micro-batch can have: micro_batch,
 * or the whole split when that is smaller (a batch larger than the data
 * allocates no more than the data). */
static dt_status alloc_slots(struct dt_loader *ld)
{
    dt_status st;
    size_t m = (size_t)(ld->o.micro_batch < ld->n ? ld->o.micro_batch : ld->n), xs = 0;
    if (!dt_mul_size(m, (size_t)ld->sample_elems, &xs))
        return dt_set_error(DT_ERR_USAGE,
                            "loader: a micro batch of %zu rows of %lld values is too large", m,
                            (long long)ld->sample_elems);
    DT_CHECK(dt_calloc((size_t)ld->o.prefetch, sizeof *ld->slots, "loader slots",
                       (void **)&ld->slots));
    for (int i = 0; i < ld->o.prefetch; i++) {
        struct slot *s = &ld->slots[i];
        DT_CHECK(batch_buffer(ld, xs, sizeof(float), "loader batch inputs", (void **)&s->x));
        DT_CHECK(batch_buffer(ld, m * (size_t)(ld->lm ? ld->sample_elems : 1), sizeof *s->y,
                              "loader batch labels", (void **)&s->y));
        DT_CHECK(dt_calloc(m, sizeof *s->ids, "loader batch ids", (void **)&s->ids));
        if (ld->o.cache == DT_LOADER_CACHE_MEMORY)
            DT_CHECK(dt_calloc(m, sizeof *s->pos, "loader batch positions", (void **)&s->pos));
        if (ld->o.crop_padding > 0 || ld->o.hflip)
            DT_CHECK(dt_calloc(m, sizeof *s->cf, "loader batch crops", (void **)&s->cf));
    }
    DT_CHECK(dt_calloc((size_t)ld->n, sizeof *ld->perm, "epoch permutation", (void **)&ld->perm));
out:
    return st;
}

static void free_loader(struct dt_loader *ld)
{
    if (ld->slots)
        for (int i = 0; i < ld->o.prefetch; i++) {
            free_batch_buffer(ld, ld->slots[i].x);
            free_batch_buffer(ld, ld->slots[i].y);
            free(ld->slots[i].ids);
            free(ld->slots[i].pos);
            free(ld->slots[i].cf);
        }
    free(ld->slots);
    free(ld->perm);
    free(ld->threads);
    dt_row_cache_destroy(ld->cache);
    free(ld);
}

uint64_t dt_loader_split_cache_bytes(const struct dt_split_info *si)
{
    uint64_t b;
    return __builtin_mul_overflow((uint64_t)si->n, dt_row_cache_row_bytes(si), &b) ? UINT64_MAX : b;
}

static uint64_t mib_up(uint64_t bytes) { return bytes / LOADER_MIB + (bytes % LOADER_MIB != 0); }

/* Appends rows [from, from + n) to the ranges, extending the last one
 * when they follow it (one rank: the shard is one range). */
static void add_range(int64_t *start, int64_t *count, int *nranges, int64_t from, int64_t n)
{
    if (n <= 0)
        return;
    if (*nranges > 0 && start[*nranges - 1] + count[*nranges - 1] == from) {
        count[*nranges - 1] += n;
        return;
    }
    start[*nranges] = from;
    count[(*nranges)++] = n;
}

/* Reads this rank's cache: the whole split when it fits cache_max_mb,
 * else this rank's shard (the ranges of its slices of the global batches
 * in identity order), else refuses. Logs what it read and how long it
 * took. */
static dt_status make_cache(struct dt_loader *ld, const struct dt_split_info *si)
{
    dt_status st = DT_OK;
    int64_t *start = NULL, *count = NULL;
    int64_t G = ld->o.global_batch, full = ld->full_batches, rest = ld->n - full * G;
    int64_t lo, hi, rest_lo, rest_hi;
    uint64_t max = (uint64_t)ld->o.cache_max_mb, whole = dt_loader_split_cache_bytes(si);
    int nranges = 0;
    rank_slice(&ld->o, G, &lo, &hi);
    rank_slice(&ld->o, rest, &rest_lo, &rest_hi);
    int shard = mib_up(whole) > max;
    int64_t rows = shard ? full * ld->slice + (rest_hi - rest_lo) : ld->n;
    uint64_t need = (uint64_t)rows * dt_row_cache_row_bytes(si);
    if (mib_up(need) > max)
        return dt_set_error(DT_ERR_USAGE,
                            "data.cache=memory: rank %d's shard of split '%s' (%lld of %lld "
                            "rows) needs %llu MiB, more than data.cache_max_mb=%llu (the whole "
                            "split needs %llu MiB); raise data.cache_max_mb, run on more ranks, "
                            "or set data.cache: none",
                            ld->o.rank, si->name, (long long)rows, (long long)ld->n,
                            (unsigned long long)mib_up(need), (unsigned long long)max,
                            (unsigned long long)mib_up(whole));
    /* ranges: one per global batch at most, merged where they touch */
    int64_t most = shard && ld->o.world > 1 ? full + 1 : 1;
    if (most > INT_MAX)
        return dt_set_error(DT_ERR_USAGE,
                            "data.cache=memory: split '%s' has %lld global batches, too many "
                            "shard pieces to cache; use a larger train.global_batch or "
                            "data.cache: none",
                            si->name, (long long)full);
    DT_CHECK(dt_calloc((size_t)most, sizeof *start, "cache ranges", (void **)&start));
    DT_CHECK(dt_calloc((size_t)most, sizeof *count, "cache ranges", (void **)&count));
    if (!shard) {
        add_range(start, count, &nranges, 0, ld->n);
    } else {
        for (int64_t g = 0; g < full; g++)
            add_range(start, count, &nranges, g * G + lo, hi - lo);
        add_range(start, count, &nranges, full * G + rest_lo, rest_hi - rest_lo);
    }
    ld->cache_mode = shard ? DT_LOADER_CACHED_SHARD : DT_LOADER_CACHED_SPLIT;
    ld->nperm = rows;
    double t0 = dt_now();
    DT_CHECK(dt_row_cache_create(ld->o.ds, ld->o.split, start, count, nranges, &ld->cache));
    uint64_t read = dt_row_cache_bytes_read(ld->cache);
    atomic_fetch_add(&ld->bytes, read);
    if (ld->cache_mode == DT_LOADER_CACHED_SPLIT)
        DT_LOG_INFO("data",
                    "cached split '%s' in memory: %lld rows, %.1f MiB held, %.1f MiB read in "
                    "%.2f s",
                    si->name, (long long)ld->n, (double)dt_row_cache_bytes(ld->cache) / LOADER_MIB,
                    (double)read / LOADER_MIB, dt_now() - t0);
    else
        DT_LOG_WARN("data",
                    "split '%s' needs %llu MiB, more than data.cache_max_mb=%llu: each rank caches "
                    "its own shard (%lld rows here, %.1f MiB held, %.1f MiB read in %.2f s) and "
                    "shuffles within it, so batches differ from data.cache: none",
                    si->name, (unsigned long long)mib_up(whole), (unsigned long long)max,
                    (long long)ld->nperm, (double)dt_row_cache_bytes(ld->cache) / LOADER_MIB,
                    (double)read / LOADER_MIB, dt_now() - t0);
out:
    free(start);
    free(count);
    return st;
}

dt_status dt_loader_create(const struct dt_loader_opts *opts, dt_loader_t **out)
{
    dt_status st = DT_OK;
    struct dt_loader *ld = NULL;
    const struct dt_split_info *si = NULL;
    *out = NULL;
    if (!opts || !opts->ds || !opts->split)
        return dt_set_error(DT_ERR_INVALID_ARG, "loader: no dataset or split given");
    DT_CHECK(dt_dataset_split(opts->ds, opts->split, &si));
    DT_CHECK(check_opts(opts, si));
    DT_CHECK(dt_calloc(1, sizeof *ld, "loader", (void **)&ld));
    ld->o = *opts;
    ld->n = si->n;
    ld->sample_elems = si->sample_elems;
    ld->lm = dt_dataset_get_info(opts->ds)->lm;
    ld->window_shifts = si->window_shifts;
    ld->full_batches = si->n / opts->global_batch;
    ld->batches = ld->full_batches + (!opts->drop_last && si->n % opts->global_batch ? 1 : 0);
    int64_t lo, hi;
    rank_slice(opts, opts->global_batch, &lo, &hi);
    ld->full_micro = (hi - lo) / opts->micro_batch;
    ld->slice = hi - lo;
    ld->nperm = si->n;
    atomic_init(&ld->bytes, 0);
    if (!dt_fault_value("slowdata", opts->rank, &ld->delay_ms))
        ld->delay_ms = 0;
    if (opts->cache == DT_LOADER_CACHE_MEMORY)
        DT_CHECK(make_cache(ld, si));
    DT_CHECK(alloc_slots(ld));
    DT_CHECK(dt_calloc((size_t)opts->workers, sizeof *ld->threads, "loader threads",
                       (void **)&ld->threads));
    pthread_mutex_init(&ld->mu, NULL);
    pthread_cond_init(&ld->work_cv, NULL);
    pthread_cond_init(&ld->ready_cv, NULL);
    pthread_cond_init(&ld->idle_cv, NULL);
    for (int i = 0; i < opts->workers; i++) {
        if (pthread_create(&ld->threads[i], NULL, worker_main, ld) != 0) {
            st = dt_set_error(DT_ERR_NOMEM, "loader: cannot start reader thread %d of %d", i + 1,
                              opts->workers);
            dt_loader_destroy(ld);
            return st;
        }
        ld->nthreads++;
    }
    *out = ld;
    return DT_OK;
out:
    if (ld)
        free_loader(ld);
    return st;
}

void dt_loader_destroy(dt_loader_t *ld)
{
    if (!ld)
        return;
    pthread_mutex_lock(&ld->mu);
    ld->quit = 1;
    pthread_cond_broadcast(&ld->work_cv);
    pthread_mutex_unlock(&ld->mu);
    for (int i = 0; i < ld->nthreads; i++)
        pthread_join(ld->threads[i], NULL); /* a read in flight finishes first */
    pthread_cond_destroy(&ld->idle_cv);
    pthread_cond_destroy(&ld->ready_cv);
    pthread_cond_destroy(&ld->work_cv);
    pthread_mutex_destroy(&ld->mu);
    free_loader(ld);
}

int64_t dt_loader_batches_per_epoch(const dt_loader_t *ld) { return ld->batches; }

/* Uniform in [0, n) from word `word` of the sample's block, without
 * modulo bias: a word in the last partial range of n (probability below
 * n / 2^32) is replaced by the same word of the next sub-counter's block. */
static uint32_t draw_below(const struct dt_rng_key *key, uint64_t sample, const uint32_t first[4],
                           int word, uint32_t n)
{
    uint64_t accept = (UINT64_C(1) << 32) - (UINT64_C(1) << 32) % n;
    uint32_t w = first[word];
    for (uint32_t sub = 1; w >= accept; sub++) {
        uint32_t r[4];
        dt_rng_block(key, sample, sub, r);
        w = r[word];
    }
    return w % n;
}

int64_t dt_loader_window_shift(uint64_t seed, int64_t epoch, int64_t shifts)
{
    struct dt_rng_key key = {
        .seed = seed, .purpose = DT_RNG_AUGMENT, .stream = 1, .step = (uint64_t)epoch};
    return shifts > 1 ? (int64_t)dt_rng_below(&key, 0, (uint64_t)shifts) : 0;
}

void dt_loader_augment_draw(uint64_t seed, int64_t epoch, uint64_t sample, int pad, int hflip,
                            struct dt_crop_flip *out)
{
    struct dt_rng_key key = {.seed = seed, .purpose = DT_RNG_AUGMENT, .step = (uint64_t)epoch};
    uint32_t r[4];
    *out = (struct dt_crop_flip){0, 0, 0};
    if (pad <= 0 && !hflip)
        return;
    dt_rng_block(&key, sample, 0, r);
    if (pad > 0) {
        out->top = (int32_t)draw_below(&key, sample, r, 0, 2 * (uint32_t)pad + 1);
        out->left = (int32_t)draw_below(&key, sample, r, 1, 2 * (uint32_t)pad + 1);
    }
    if (hflip)
        out->flip = (int32_t)(r[2] >> 31);
}

uint64_t dt_loader_bytes_read(const dt_loader_t *ld)
{
    return atomic_load(&((struct dt_loader *)ld)->bytes);
}

enum dt_loader_cache_mode dt_loader_cache_mode(const dt_loader_t *ld) { return ld->cache_mode; }

uint64_t dt_loader_cache_bytes(const dt_loader_t *ld)
{
    return ld->cache ? dt_row_cache_bytes(ld->cache) : 0;
}

/* ---- the caller's side --------------------------------------------------------- */

dt_status dt_loader_start_epoch(dt_loader_t *ld, int64_t epoch, int64_t first_batch)
{
    if (epoch < 0 || first_batch < 0 || first_batch > ld->batches)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "loader: cannot start epoch %lld at batch %lld (an epoch has %lld "
                            "batches)",
                            (long long)epoch, (long long)first_batch, (long long)ld->batches);
    pthread_mutex_lock(&ld->mu);
    ld->started = 0; /* no new claims */
    while (ld->busy > 0)
        pthread_cond_wait(&ld->idle_cv, &ld->mu);
    if (ld->o.shuffle) {
        /* a cached shard shuffles its own positions, from stream 1 + rank
         * (stream 0 is the global permutation's) */
        uint32_t stream = ld->cache_mode == DT_LOADER_CACHED_SHARD ? 1u + (uint32_t)ld->o.rank : 0;
        dt_rng_permutation_stream(ld->o.seed, (uint64_t)epoch, stream, ld->perm,
                                  (uint64_t)ld->nperm);
    } else {
        for (int64_t i = 0; i < ld->nperm; i++)
            ld->perm[i] = (uint64_t)i;
    }
    for (int i = 0; i < ld->o.prefetch; i++)
        ld->slots[i].state = SLOT_EMPTY;
    ld->gen++;
    ld->epoch = epoch;
    ld->first_batch = first_batch;
    ld->total = items_from(ld, first_batch);
    ld->claim_next = 0;
    ld->next = 0;
    ld->started = 1;
    pthread_cond_broadcast(&ld->work_cv);
    pthread_mutex_unlock(&ld->mu);
    return DT_OK;
}

dt_status dt_loader_next(dt_loader_t *ld, struct dt_batch *b, int *end)
{
    dt_status st = DT_OK;
    *end = 0;
    pthread_mutex_lock(&ld->mu);
    if (!ld->started) {
        st = dt_set_error(DT_ERR_INVALID_ARG, "loader: dt_loader_next before "
                                              "dt_loader_start_epoch");
        goto out;
    }
    if (ld->next >= ld->total) {
        *end = 1;
        goto out;
    }
    int idx = (int)(ld->next % ld->o.prefetch);
    struct slot *s = &ld->slots[idx];
    if (s->state == SLOT_HANDED) {
        st = dt_set_error(DT_ERR_INVALID_ARG,
                          "loader: all %d prefetch slots are held; release a batch before "
                          "asking for the next",
                          ld->o.prefetch);
        goto out;
    }
    while (!(s->state == SLOT_READY && s->k == ld->next))
        pthread_cond_wait(&ld->ready_cv, &ld->mu);
    if (s->st != DT_OK) {
        /* keep the slot: every later call returns the same error */
        st = dt_set_error(s->st, "%s", s->err);
        goto out;
    }
    s->state = SLOT_HANDED;
    ld->next++;
    *b = (struct dt_batch){
        .x = s->x,
        .y = s->y,
        .rows = s->it.rows,
        .row0 = s->it.row0,
        .global_rows = s->it.global_rows,
        .epoch = ld->epoch,
        .batch = s->it.batch,
        .micro = s->it.micro,
        .micro_count = s->it.micro_count,
        .sample_ids = s->ids,
        .slot = (int)(ld->gen % LOADER_GEN_MOD) * ld->o.prefetch + idx,
    };
out:
    pthread_mutex_unlock(&ld->mu);
    return st;
}

void dt_loader_release(dt_loader_t *ld, struct dt_batch *b)
{
    if (!b || b->slot < 0)
        return;
    pthread_mutex_lock(&ld->mu);
    int idx = b->slot % ld->o.prefetch;
    uint64_t gen = (uint64_t)(b->slot / ld->o.prefetch);
    /* a batch from before the last start_epoch is already gone */
    if (gen == ld->gen % LOADER_GEN_MOD && ld->slots[idx].state == SLOT_HANDED) {
        ld->slots[idx].state = SLOT_EMPTY;
        pthread_cond_broadcast(&ld->work_cv);
    }
    b->slot = -1;
    pthread_mutex_unlock(&ld->mu);
}
