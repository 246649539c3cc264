/*
 * bench_chan.c - the CPU backend's per-channel sums over x(N, C, HW):
 * batch norm's statistics (batchnorm_stats), its backward's reduction
 * (batchnorm_bwd_reduce, with the fused ReLU's mask) and a convolution's
 * bias gradient (channel_bias_bwd), at the shapes of the Fashion-MNIST
 * ResNet's three stages and one 3x3 map, each call from cold caches (a
 * write over 64 MiB before it) as in a training step, where these arrays
 * were written long before; fast table against the reference table.
 *
 *   bench_chan [BATCH [THREADS [CALLS]]]   (defaults 128 1 15)
 * prints one line per op and shape: the fastest of CALLS calls of each
 * table in microseconds, the fast table's GB/s of input read, and its
 * speed-up (the reference's calls: a third of CALLS, at least one).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "core/clock.h"

#define EVICT_FLOATS ((size_t)16 << 20)

struct chan_bufs {
    float *x, *dy, *y, *mean, *invstd, *db;
    double *stats;
    float *evict;
};

enum chan_op { STATS, REDUCE, BIAS, NOPS };
static const char *const op_name[NOPS] = {"batchnorm_stats", "batchnorm_bwd_reduce",
                                          "channel_bias_bwd"};
static const int op_arrays[NOPS] = {1, 3, 1}; /* arrays of N*C*HW floats read */

static dt_status call(dt_backend_t *be, enum chan_op op, struct chan_bufs *b, int N, int C, int HW)
{
    const struct dt_ops *o = dt_backend_ops(be);
    if (op == STATS)
        return o->batchnorm_stats(be, b->stats, b->x, N, C, HW);
    if (op == REDUCE)
        return o->batchnorm_bwd_reduce(be, b->stats, b->dy, b->x, b->mean, b->invstd, b->y, N, C,
                                       HW);
    return o->channel_bias_bwd(be, b->db, b->dy, N, C, HW);
}

/* The fastest of `calls` calls, each after a write over EVICT_FLOATS. */
static double fastest(dt_backend_t *be, enum chan_op op, struct chan_bufs *b, int N, int C, int HW,
                      int calls)
{
    double best = 0.0;
    for (int r = 0; r < calls; r++) {
        for (size_t i = 0; i < EVICT_FLOATS; i++)
            b->evict[i] += 1.0f;
        double t0 = dt_now();
        if (call(be, op, b, N, C, HW) != DT_OK) {
            fprintf(stderr, "bench_chan: %s: %s\n", op_name[op], dt_last_error());
            exit(70);
        }
        double t = dt_now() - t0;
        if (r == 0 || t < best)
            best = t;
    }
    return best;
}

int main(int argc, char **argv)
{
    int batch = argc > 1 ? atoi(argv[1]) : 128;
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    int calls = argc > 3 ? atoi(argv[3]) : 15;
    if (argc > 4 || batch < 1 || threads < 1 || calls < 1) {
        fprintf(stderr, "usage: bench_chan [BATCH [THREADS [CALLS]]]\n");
        return 64;
    }
    static const int shape[][2] = {{16, 784}, {32, 196}, {64, 49}, {256, 9}}; /* C, HW */
    const int nshape = (int)(sizeof shape / sizeof shape[0]);
    size_t most = 0;
    for (int s = 0; s < nshape; s++)
        if ((size_t)shape[s][0] * shape[s][1] > most)
            most = (size_t)shape[s][0] * shape[s][1];
    size_t n = most * (size_t)batch;
    struct chan_bufs b = {
        .x = malloc(n * sizeof(float)), .dy = malloc(n * sizeof(float)),
        .y = malloc(n * sizeof(float)), .mean = malloc(256 * sizeof(float)),
        .invstd = malloc(256 * sizeof(float)), .db = calloc(256, sizeof(float)),
        .stats = malloc(512 * sizeof(double)), .evict = calloc(EVICT_FLOATS, sizeof(float))};
    if (!b.x || !b.dy || !b.y || !b.mean || !b.invstd || !b.db || !b.stats || !b.evict) {
        fprintf(stderr, "bench_chan: out of memory\n");
        return 71;
    }
    for (size_t i = 0; i < n; i++) {
        b.x[i] = (float)(i % 13) * 0.1f - 0.6f;
        b.dy[i] = (float)(i % 7) * 0.1f - 0.3f;
        b.y[i] = (float)(i % 3) - 1.0f;
    }
    for (int c = 0; c < 256; c++) {
        b.mean[c] = 0.05f;
        b.invstd[c] = 2.0f;
    }

    dt_backend_t *be[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        struct dt_backend_opts o = {.threads = threads, .reference_kernels = k == 1};
        if (dt_backend_create("cpu", &o, &be[k]) != DT_OK) {
            fprintf(stderr, "bench_chan: %s\n", dt_last_error());
            return 70;
        }
    }
    printf("batch %d, %d thread(s), cold caches, fastest of %d calls\n", batch, threads, calls);
    for (int op = 0; op < NOPS; op++)
        for (int s = 0; s < nshape; s++) {
            int C = shape[s][0], HW = shape[s][1];
            double fast = fastest(be[0], op, &b, batch, C, HW, calls);
            double ref = fastest(be[1], op, &b, batch, C, HW, calls / 3 > 0 ? calls / 3 : 1);
            double bytes = (double)op_arrays[op] * batch * C * HW * sizeof(float);
            printf("%-21s %4dx%3dx%3d  fast %9.1f us %6.1f GB/s   reference %9.1f us   x%.1f\n",
                   op_name[op], batch, C, HW, fast * 1e6, bytes / fast * 1e-9, ref * 1e6,
                   ref / fast);
        }
    dt_backend_destroy(be[0]);
    dt_backend_destroy(be[1]);
    free(b.x), free(b.dy), free(b.y), free(b.mean), free(b.invstd), free(b.db), free(b.stats);
    free(b.evict);
    return 0;
}
