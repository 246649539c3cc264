/*
 * bench_loader.c - batches per second of the prefetching loader with and
 * without augmentation, on one rank, nothing done with the batches: the
 * loader's own ceiling. Each setting reads whole epochs of the split; the
 * settings alternate (off, crop, flip, crop + flip) for ROUNDS rounds so
 * that a busy machine slows them alike, and each is reported as its best
 * epoch and as a ratio to "off" measured in the same run. Wall-clock
 * rates swing on a shared machine, so the process's CPU time per batch
 * (all threads; the consumer only waits) is reported too: it is the
 * loader's work, and what augmentation adds to it. A second table times
 * the reads alone on this thread (the same random rows read plainly and
 * through the draws and crop-and-flip), the steadiest measure of the
 * augmentation's own cost.
 *
 *   bench_loader DATASET SPLIT BATCH WORKERS PAD ROUNDS
 * prints one line per setting: batches/s, ratio to off, CPU us per batch,
 * ratio to off.
 *
 *   bench_loader DATASET SPLIT cache ROUNDS
 * compares data.cache none and memory instead: micro-batches of 128 and
 * 4096 rows, 1 and 2 reader threads, one rank, shuffled. Each setting's
 * loader is created once (the cache is read then, outside the timing) and
 * kept; every round runs CACHE_EPOCHS epochs of each setting in turn, and
 * the best round counts. It prints batches/s, samples/s and CPU us per
 * batch of each, the ratio memory / none at the same batch and threads,
 * and the samples/s a GPU would consume training the quick-start MLP
 * (784-512-512-10 on this data's sample size) at GPU_TFLOPS x GPU_MFU,
 * counting 3 x its forward FLOPs per sample.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "io/loader.h"
#include "core/clock.h"

#define READ_ITERS 200
#define CACHE_EPOCHS 2   /* epochs per timed run of a cache setting */
#define GPU_TFLOPS 400.0 /* a round bf16 dense figure for an H100/H200-class GPU */
#define GPU_MFU 0.5      /* the fraction of it a training step reaches */
#define MLP_HIDDEN 512   /* the quick-start MLP: two hidden layers this wide */

struct setting {
    const char *name;
    int pad, hflip;
};

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

/* One epoch; returns batches per second, or -1 on an error (printed), and
 * the CPU seconds per batch in *cpu. */
static double one_epoch(const struct dt_loader_opts *o, int64_t epoch, double *cpu)
{
    dt_loader_t *ld = NULL;
    int64_t batches = 0;
    double rate = -1;
    if (dt_loader_create(o, &ld) != DT_OK || dt_loader_start_epoch(ld, epoch, 0) != DT_OK)
        goto out;
    double t0 = dt_now(), c0 = cpu_seconds();
    for (;;) {
        struct dt_batch b;
        int end = 0;
        if (dt_loader_next(ld, &b, &end) != DT_OK)
            goto out;
        if (end)
            break;
        batches++;
        dt_loader_release(ld, &b);
    }
    rate = (double)batches / (dt_now() - t0);
    *cpu = (cpu_seconds() - c0) / (double)batches;
out:
    if (rate < 0)
        fprintf(stderr, "bench_loader: %s\n", dt_last_error());
    dt_loader_destroy(ld);
    return rate;
}

/* CPU seconds per read of `batch` random rows (the same rows for each
 * setting), over `iters` reads; -1 on an error (printed). */
static double read_cost(dt_dataset_t *ds, const char *split, int64_t batch, int iters,
                        const struct setting *set)
{
    const struct dt_split_info *si = NULL;
    uint64_t *idx = calloc((size_t)batch, sizeof *idx);
    struct dt_crop_flip *cf = calloc((size_t)batch, sizeof *cf);
    float *x = NULL;
    double cost = -1;
    if (!idx || !cf || dt_dataset_split(ds, split, &si) != DT_OK)
        goto out;
    x = calloc((size_t)(batch * si->sample_elems), sizeof *x);
    if (!x)
        goto out;
    double c0 = cpu_seconds();
    for (int it = 0; it < iters; it++) {
        for (int64_t i = 0; i < batch; i++)
            idx[i] = ((uint64_t)it * 7919u + (uint64_t)i * 104729u) % (uint64_t)si->n;
        dt_status st;
        if (set->pad == 0 && !set->hflip) {
            st = dt_dataset_read(ds, split, idx, (size_t)batch, x, NULL, NULL);
        } else {
            for (int64_t i = 0; i < batch; i++)
                dt_loader_augment_draw(1, it, idx[i], set->pad, set->hflip, &cf[i]);
            st = dt_dataset_read_crop_flip(ds, split, idx, (size_t)batch, set->pad, cf, x, NULL,
                                           NULL);
        }
        if (st != DT_OK)
            goto out;
    }
    cost = (cpu_seconds() - c0) / iters;
out:
    if (cost < 0)
        fprintf(stderr, "bench_loader: %s\n", dt_last_error());
    free(x);
    free(cf);
    free(idx);
    return cost;
}

struct cache_setting {
    int64_t batch;
    int workers;
    int cache;
    dt_loader_t *ld;
    double best, cpu; /* batches/s of the best round, CPU s per batch */
};

/* CACHE_EPOCHS epochs of a kept loader from epoch `first`; batches/s, or
 * -1 on an error (printed), and CPU seconds per batch in *cpu. */
static double kept_epochs(dt_loader_t *ld, int64_t first, double *cpu)
{
    int64_t batches = 0;
    double t0 = dt_now(), c0 = cpu_seconds();
    for (int64_t e = first; e < first + CACHE_EPOCHS; e++) {
        if (dt_loader_start_epoch(ld, e, 0) != DT_OK)
            goto fail;
        for (;;) {
            struct dt_batch b;
            int end = 0;
            if (dt_loader_next(ld, &b, &end) != DT_OK)
                goto fail;
            if (end)
                break;
            batches++;
            dt_loader_release(ld, &b);
        }
    }
    *cpu = (cpu_seconds() - c0) / (double)batches;
    return (double)batches / (dt_now() - t0);
fail:
    fprintf(stderr, "bench_loader: %s\n", dt_last_error());
    return -1;
}

static int cache_main(dt_dataset_t *ds, const char *split, int rounds)
{
    struct cache_setting set[8];
    const int64_t batches[2] = {128, 4096};
    const struct dt_split_info *si = NULL;
    int nset = 0, rc = 0;
    if (dt_dataset_split(ds, split, &si) != DT_OK) {
        fprintf(stderr, "bench_loader: %s\n", dt_last_error());
        return 66;
    }
    for (int b = 0; b < 2; b++)
        for (int w = 1; w <= 2; w++)
            for (int c = 0; c < 2; c++) {
                struct cache_setting *cs = &set[nset++];
                *cs = (struct cache_setting){.batch = batches[b], .workers = w, .cache = c};
                struct dt_loader_opts o = {.ds = ds,
                                           .split = split,
                                           .global_batch = cs->batch,
                                           .micro_batch = cs->batch,
                                           .world = 1,
                                           .seed = 1,
                                           .shuffle = 1,
                                           .drop_last = 1,
                                           .workers = w,
                                           .prefetch = 2 * w,
                                           .cache =
                                               c ? DT_LOADER_CACHE_MEMORY : DT_LOADER_CACHE_NONE,
                                           .cache_max_mb = 1 << 20};
                if (dt_loader_create(&o, &cs->ld) != DT_OK) {
                    fprintf(stderr, "bench_loader: %s\n", dt_last_error());
                    rc = 70;
                    goto out;
                }
            }
    for (int r = 0; r < rounds; r++)
        for (int s = 0; s < nset; s++) {
            double cpu = 0, rate = kept_epochs(set[s].ld, (int64_t)r * CACHE_EPOCHS, &cpu);
            if (rate < 0) {
                rc = 70;
                goto out;
            }
            if (rate > set[s].best)
                set[s].best = rate;
            if (r == 0 || cpu < set[s].cpu)
                set[s].cpu = cpu;
        }
    printf("loader on split '%s' (%lld rows of %lld values), one rank, shuffled, best of %d x %d "
           "epochs:\n",
           split, (long long)si->n, (long long)si->sample_elems, rounds, CACHE_EPOCHS);
    printf("%6s %7s %-6s %10s %12s %12s %10s %10s\n", "batch", "threads", "cache", "batches/s",
           "samples/s", "us CPU/batch", "memory/none", "CPU ratio");
    double top = 0;
    for (int s = 0; s < nset; s++) {
        const struct cache_setting *cs = &set[s], *none = cs->cache ? cs - 1 : cs;
        double samples = cs->best * (double)cs->batch;
        top = samples > top ? samples : top;
        printf("%6lld %7d %-6s %10.1f %12.0f %12.1f %10.2fx %9.2fx\n", (long long)cs->batch,
               cs->workers, cs->cache ? "memory" : "none", cs->best, samples, 1e6 * cs->cpu,
               cs->best / none->best, cs->cpu / none->cpu);
    }
    double classes = dt_dataset_get_info(ds)->num_classes;
    double h = MLP_HIDDEN, d = (double)si->sample_elems;
    double fwd = 2 * (d * h + h * h + h * classes), need = GPU_TFLOPS * 1e12 * GPU_MFU / (3 * fwd);
    printf("a GPU step would consume: the quick-start MLP (%lld-%d-%d-%d) costs %.2f MFLOP a "
           "sample forward, %.2f with backward (3x); at %.0f TFLOP/s x %.2f MFU that is %.3g "
           "samples/s, %.0fx the best loader rate here (%.0f samples/s)\n",
           (long long)si->sample_elems, MLP_HIDDEN, MLP_HIDDEN, (int)classes, fwd / 1e6,
           3 * fwd / 1e6, GPU_TFLOPS, GPU_MFU, need, need / top, top);
out:
    for (int s = 0; s < nset; s++)
        dt_loader_destroy(set[s].ld);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[3], "cache") == 0) {
        dt_dataset_t *ds = NULL;
        if (dt_dataset_open(argv[1], &ds) != DT_OK) {
            fprintf(stderr, "bench_loader: %s\n", dt_last_error());
            return 66;
        }
        int rc = cache_main(ds, argv[2], atoi(argv[4]) > 0 ? atoi(argv[4]) : 1);
        dt_dataset_close(ds);
        return rc;
    }
    if (argc != 7) {
        fprintf(stderr, "usage: bench_loader DATASET SPLIT BATCH WORKERS PAD ROUNDS\n"
                        "       bench_loader DATASET SPLIT cache ROUNDS\n");
        return 64;
    }
    dt_dataset_t *ds = NULL;
    if (dt_dataset_open(argv[1], &ds) != DT_OK) {
        fprintf(stderr, "bench_loader: %s\n", dt_last_error());
        return 66;
    }
    int64_t batch = atoll(argv[3]);
    int workers = atoi(argv[4]), pad = atoi(argv[5]), rounds = atoi(argv[6]);
    struct setting set[] = {{"off", 0, 0}, {"crop", pad, 0}, {"flip", 0, 1}, {"crop+flip", pad, 1}};
    enum { NSET = sizeof set / sizeof set[0] };
    double best[NSET] = {0}, cpu[NSET] = {0};
    for (int r = 0; r < rounds; r++)
        for (int s = 0; s < NSET; s++) {
            struct dt_loader_opts o = {.ds = ds,
                                       .split = argv[2],
                                       .global_batch = batch,
                                       .micro_batch = batch,
                                       .rank = 0,
                                       .world = 1,
                                       .seed = 1,
                                       .shuffle = 1,
                                       .drop_last = 1,
                                       .workers = workers,
                                       .prefetch = 2 * workers,
                                       .crop_padding = set[s].pad,
                                       .hflip = set[s].hflip};
            double c = 0, rate = one_epoch(&o, r, &c);
            if (rate < 0) {
                dt_dataset_close(ds);
                return 70;
            }
            if (rate > best[s])
                best[s] = rate;
            if (r == 0 || c < cpu[s])
                cpu[s] = c;
        }
    printf("loader, %d worker(s), batch %lld, best of %d epochs:\n", workers, (long long)batch,
           rounds);
    for (int s = 0; s < NSET; s++)
        printf("%-10s %9.1f batches/s  %.3f x off  %7.1f us CPU/batch  %.3f x off\n", set[s].name,
               best[s], best[s] / best[0], 1e6 * cpu[s], cpu[s] / cpu[0]);
    double rc[NSET] = {0};
    for (int r = 0; r < rounds; r++)
        for (int s = 0; s < NSET; s++) {
            double c = read_cost(ds, argv[2], batch, READ_ITERS, &set[s]);
            if (c < 0) {
                dt_dataset_close(ds);
                return 70;
            }
            if (r == 0 || c < rc[s])
                rc[s] = c;
        }
    printf("reads alone on one thread, batch %lld, best of %d x %d reads:\n", (long long)batch,
           rounds, READ_ITERS);
    for (int s = 0; s < NSET; s++)
        printf("%-10s %7.1f us CPU/batch  %.3f x off\n", set[s].name, 1e6 * rc[s], rc[s] / rc[0]);
    dt_dataset_close(ds);
    return 0;
}
