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
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "../io/loader.h"
#include "../runtime/core/util.h"

#define READ_ITERS 200

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

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: bench_loader DATASET SPLIT BATCH WORKERS PAD ROUNDS\n");
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
