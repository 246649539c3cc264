/*
 * loader.h - the prefetching batch loader.
 *
 * An epoch is a sequence of global batches taken from the permutation of
 * the split for (seed, epoch) (dt_rng_permutation; identity when shuffle is
 * off). Global batch g holds permutation positions [g*G, (g+1)*G). This rank
 * reads rows [rank*G/world, (rank+1)*G/world) of each global batch, in
 * micro-batches of `micro_batch` rows, so 1 rank with accumulation k and k
 * ranks without see the same samples. With drop_last the short last global
 * batch of an epoch is skipped; otherwise it is split evenly over ranks and
 * micro-batches (never a sample twice in one epoch).
 *
 * Worker threads read ahead up to `prefetch` micro-batches; batches are
 * handed out strictly in order, so results never depend on thread timing.
 * One thread (the training loop) calls next/release.
 *
 * The short last batch (R < G rows, drop_last off): rank r takes rows
 * [r*R/world, (r+1)*R/world), split into ceil(rows/micro_batch)
 * micro-batches whose sizes differ by at most one. So micro_count there
 * can be smaller than in full batches and can differ between ranks; a
 * rank whose slice is empty gets one micro-batch with rows = 0, so every
 * rank takes part in every global batch. Use global_rows, not G, to
 * average.
 *
 * Augmentation (crop_padding > 0 or hflip; for image samples only): every
 * sample is read through a random crop and/or left-right flip
 * (dt_dataset_read_crop_flip) drawn by dt_loader_augment_draw from (seed,
 * epoch, dataset row), so a sample gets the same crop and flip in the same
 * epoch whichever rank, micro-batch or worker reads it, and on resume.
 *
 * Cache (cache = DT_LOADER_CACHE_MEMORY, data.cache: memory): the rows
 * are read once, at create, into memory as stored (dt_row_cache_create:
 * contiguous reads under the HDF5 lock), and every batch is gathered and
 * normalised from there, with no HDF5 call. Normalisation, augmentation
 * and labels are applied per batch exactly as without the cache.
 *  - When the whole split fits in cache_max_mb MiB, each rank caches the
 *    whole split and the epoch permutation is unchanged: the batches
 *    (rows, x, y, sample ids) are bit-identical to cache none.
 *  - Otherwise rank r caches only its shard: the rows it would read in
 *    epoch order without shuffling, i.e. its slice [r*G/W, (r+1)*G/W) of
 *    every global batch of the identity order (and its slice of the short
 *    last one), so it reads about 1/W of the split from disk, and its
 *    rows come from every part of the file (a file sorted by class still
 *    gives each rank every class, as contiguous blocks would not). Each epoch
 *    it permutes its shard (a Fisher-Yates shuffle keyed by (seed,
 *    DT_RNG_SHUFFLE, stream 1 + rank, step epoch)) and fills its slice of
 *    each global batch from that order. Batch counts, sizes and micro
 *    splits are those of cache none; a sample stays on its rank for the
 *    whole run, so which samples meet in one global batch depends on the
 *    world size, and a run resumed on another world size sees other
 *    batches. With drop_last, the rows past the full batches of the shard
 *    order are the ones dropped that epoch. Without shuffling, the shard
 *    order is the identity and the batches again equal cache none's.
 *    Positions stay a pure function of (seed, epoch, batch, rank, world).
 *  - A shard that does not fit either is DT_ERR_USAGE naming
 *    data.cache_max_mb and the MiB needed. A language-model split is
 *    DT_ERR_USAGE: caching token windows is not implemented.
 *
 * Errors: a read error is returned by the dt_loader_next that reaches the
 * failed micro-batch, with the reader's message, and again by every later
 * call until dt_loader_start_epoch. start_epoch drops what was read ahead
 * and invalidates batches still held (releasing them afterwards is
 * harmless). next before any start_epoch, or with all `prefetch` slots
 * held and unreleased, is DT_ERR_INVALID_ARG rather than a deadlock.
 */
#ifndef DT_LOADER_H
#define DT_LOADER_H

#include <stdint.h>

#include "core/status.h"
#include "dataset.h"

typedef struct dt_loader dt_loader_t;

/* Where the batch buffers (inputs and labels) live: host memory the loader
 * allocates itself when alloc is NULL; else these (a GPU backend's pinned
 * memory, which uploads read without a host copy). idle(ctx, p) returns
 * once nothing queued still reads buffer p (an upload in flight); a worker
 * calls it before it refills a slot, so the caller never waits for it. */
struct dt_loader_buffers {
    dt_status (*alloc)(void *ctx, size_t bytes, void **out);
    void (*free)(void *ctx, void *p);
    dt_status (*idle)(void *ctx, const void *p);
    void *ctx;
};

struct dt_loader_opts {
    dt_dataset_t *ds;
    const char *split;
    int64_t global_batch; /* G */
    int64_t micro_batch;  /* rows per micro-batch on this rank */
    int rank, world;
    uint64_t seed;
    int shuffle;
    int drop_last;
    int workers;  /* reader threads, >= 1 */
    int prefetch; /* micro-batches read ahead, >= 1 */
    int crop_padding; /* data.augment.crop_padding: random crop from the image zero-padded by
                         this many pixels (0 after normalisation); 0 = off */
    int hflip;        /* data.augment.hflip: flip left-right with probability 0.5 */
    int shift_windows; /* language-model data: move the window boundaries every epoch
                          (dt_loader_window_shift); else windows start at offset 0 */
    int cache;         /* data.cache: DT_LOADER_CACHE_NONE or DT_LOADER_CACHE_MEMORY */
    int64_t cache_max_mb; /* data.cache_max_mb: the most MiB the cache of this rank may hold */
    struct dt_loader_buffers buffers; /* all NULL: plain host memory */
    /* 1: a batch of R rows is split as full ones are: rank r takes
     * [r*G/W, (r+1)*G/W) of it cut at R (so later ranks of a short batch
     * may get none), in micro-batches of exactly micro_batch rows, the
     * last one shorter; every micro-batch then starts at a multiple of
     * micro_batch within the global batch (train.reproducible's shards) */
    int aligned;
};

enum { DT_LOADER_CACHE_NONE = 0, DT_LOADER_CACHE_MEMORY = 1 };

/* What dt_loader_create did about the cache. */
enum dt_loader_cache_mode {
    DT_LOADER_CACHED_NONE = 0,  /* data.cache: none; every batch is read from the file */
    DT_LOADER_CACHED_SPLIT = 1, /* the whole split in memory; the same batches as none */
    DT_LOADER_CACHED_SHARD = 2, /* this rank's shard in memory, shuffled within the shard */
};

#define DT_LOADER_MAX_CROP_PADDING 1024

struct dt_batch {
    const float *x;     /* rows * sample_elems normalised inputs */
    const int32_t *y;   /* rows labels (rows * seq_len next tokens for language-model data) */
    int64_t rows;       /* rows in this micro-batch */
    int64_t row0;       /* index of the first row within its global batch */
    int64_t global_rows;/* rows of the whole global batch (all ranks) */
    int64_t epoch;
    int64_t batch;      /* global batch index within the epoch */
    int micro;          /* micro-batch index within this rank's slice */
    int micro_count;    /* micro-batches of this rank in this global batch */
    const uint64_t *sample_ids; /* dataset row of each of the rows */
    int slot;           /* internal */
};

dt_status dt_loader_create(const struct dt_loader_opts *opts, dt_loader_t **out);
void dt_loader_destroy(dt_loader_t *ld);

/* Global batches per epoch (after drop_last). */
int64_t dt_loader_batches_per_epoch(const dt_loader_t *ld);

/* Starts (or restarts) reading epoch `epoch` at global batch `first_batch`. */
dt_status dt_loader_start_epoch(dt_loader_t *ld, int64_t epoch, int64_t first_batch);

/* Next micro-batch of the epoch, waiting for it if needed. Sets *end = 1
 * (and leaves b untouched) when the epoch is done. The batch stays valid
 * until dt_loader_release. */
dt_status dt_loader_next(dt_loader_t *ld, struct dt_batch *b, int *end);
void dt_loader_release(dt_loader_t *ld, struct dt_batch *b);

/* The offset of the token windows of a language-model split in `epoch`:
 * uniform in [0, shifts) from one block of (seed, DT_RNG_AUGMENT, stream
 * 1, step epoch) at index 0 (0 when shifts <= 1). */
int64_t dt_loader_window_shift(uint64_t seed, int64_t epoch, int64_t shifts);

/* The crop and flip of dataset row `sample` in `epoch`: top and left
 * uniform in [0, 2 * pad] (0 when pad is 0), flip with probability 1/2
 * when hflip (else 0). One block of (seed, DT_RNG_AUGMENT, stream 0, step
 * epoch) at index sample: word 0 gives top, word 1 left (without modulo
 * bias), the top bit of word 2 the flip. */
void dt_loader_augment_draw(uint64_t seed, int64_t epoch, uint64_t sample, int pad, int hflip,
                            struct dt_crop_flip *out);

/* Bytes this loader has read from the dataset file so far (the cache fill
 * included). */
uint64_t dt_loader_bytes_read(const dt_loader_t *ld);

/* The cache this loader holds: its mode, and the memory it takes (0 with
 * none). */
enum dt_loader_cache_mode dt_loader_cache_mode(const dt_loader_t *ld);
uint64_t dt_loader_cache_bytes(const dt_loader_t *ld);

/* Bytes the cache of the whole split si would hold (cache_max_mb is
 * compared with this, in MiB rounded up). */
uint64_t dt_loader_split_cache_bytes(const struct dt_split_info *si);

#endif
