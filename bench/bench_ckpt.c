/*
 * bench_ckpt.c - how the number of dimensions of a checkpoint tensor
 * changes the time to save and to verify it.
 *
 * Every rank writes its flat slice of each tensor as a union of hyperslab
 * blocks of the tensor's own N-d dataspace (io/checkpoint.c), at most
 * 2N - 1 of them, and verification reads tensors in flat slices the same
 * way. This program saves one tensor of the same values in four shapes,
 * 1-D (the baseline: one block per rank), 2-D, 4-D and 8-D, all of odd
 * dimensions so every slice boundary falls inside a row at every depth,
 * and prints the median save and verify times of each shape and their
 * ratio to the 1-D times measured in the same run (after one untimed
 * save and verify, so that the first shape does not pay for a cold start).
 *
 *   mpirun -np N bench_ckpt [DIR] [REPEATS]
 *
 * DIR (default /tmp) gets a scratch directory that is removed at the end;
 * REPEATS (default 5) saves and verifies per shape, of which the median
 * counts. A save or a verify that fails stops the program with its
 * message and exit status 1.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "collectives/comm.h"
#include "io/checkpoint.h"
#include "core/log.h"

#define NSHAPES 4
#define MAX_REPEATS 51
#define DEFAULT_REPEATS 5
#define SCRATCH_PATH 4096

/* 5 x 7 x 11 x 13 x 17 x 19 x 23 = 37182145 values (149 MB), in shapes of
 * odd dimensions. */
static const struct dt_shape shapes[NSHAPES] = {
    {1, {37182145}},
    {2, {7429, 5005}},
    {4, {35, 143, 323, 23}},
    {8, {1, 5, 7, 11, 13, 17, 19, 23}},
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, by_value);
    return v[n / 2];
}

static void fail(const char *what)
{
    fprintf(stderr, "bench_ckpt: %s: %s\n", what, dt_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* One save (the slowest rank's time) and one verify by rank 0 of tensor t
 * at the given step; the file is removed afterwards. */
static void measure(dt_comm_t *c, const char *dir, struct dt_ckpt_tensor *t, int64_t step, int rank,
                    double *save_s, double *verify_s)
{
    char path[SCRATCH_PATH + 64];
    struct dt_ckpt_meta m = {.step = step, .world = 1, .loss_scale = 1};
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    if (dt_ckpt_save(c, dir, &m, t, 1, "bench: ckpt\n", path, sizeof path) != DT_OK)
        fail("save");
    double mine = now() - t0;
    MPI_Allreduce(&mine, save_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    *verify_s = 0;
    if (rank == 0) {
        t0 = now();
        if (dt_ckpt_verify(path, NULL) != DT_OK)
            fail("verify");
        *verify_s = now() - t0;
        unlink(path);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

int main(int argc, char **argv)
{
    int rank = 0, size = 1, provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    dt_log_set_rank(rank);
    const char *base = argc > 1 ? argv[1] : "/tmp";
    int repeats = argc > 2 ? atoi(argv[2]) : DEFAULT_REPEATS;
    if (repeats < 1 || repeats > MAX_REPEATS) {
        if (rank == 0)
            fprintf(stderr, "bench_ckpt: REPEATS must be 1 to %d\n", MAX_REPEATS);
        MPI_Finalize();
        return 64;
    }
    char dir[SCRATCH_PATH];
    snprintf(dir, sizeof dir, "%s/bench_ckpt.%d", base, (int)getpid());
    MPI_Bcast(dir, (int)sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank == 0 && mkdir(dir, 0700) != 0) {
        perror(dir);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    dt_comm_t *c = NULL;
    if (dt_comm_create("mpi", &c) != DT_OK)
        fail("communicator");
    size_t n = (size_t)dt_shape_numel(&shapes[0]);
    float *x = malloc(n * sizeof *x);
    if (!x) {
        fprintf(stderr, "bench_ckpt: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(i % 8191) * 0.125f;
    double save[NSHAPES], verify[NSHAPES], untimed_s, untimed_v;
    struct dt_ckpt_tensor warm = {"params/x", shapes[0], x, NULL, 0};
    measure(c, dir, &warm, (int64_t)NSHAPES * MAX_REPEATS, rank, &untimed_s, &untimed_v);
    for (int s = 0; s < NSHAPES; s++) {
        double sv[MAX_REPEATS], vf[MAX_REPEATS];
        struct dt_ckpt_tensor t = {"params/x", shapes[s], x, NULL, 0};
        for (int r = 0; r < repeats; r++)
            measure(c, dir, &t, (int64_t)(s * MAX_REPEATS + r), rank, &sv[r], &vf[r]);
        save[s] = median(sv, repeats);
        verify[s] = median(vf, repeats);
    }
    if (rank == 0) {
        printf("checkpoint of one float32 tensor, %zu values (%.0f MB), %d rank%s, median of %d\n",
               n, (double)n * 4 / 1e6, size, size == 1 ? "" : "s", repeats);
        printf("%-28s %10s %8s %10s %8s\n", "shape", "save s", "vs 1-D", "verify s", "vs 1-D");
        for (int s = 0; s < NSHAPES; s++) {
            char text[DT_MAX_DIMS * 21 + 8];
            printf("%-28s %10.3f %8.2f %10.3f %8.2f\n",
                   dt_shape_format(&shapes[s], text, sizeof text), save[s], save[s] / save[0],
                   verify[s], verify[s] / verify[0]);
        }
        char latest[SCRATCH_PATH + 16];
        snprintf(latest, sizeof latest, "%s/latest", dir);
        unlink(latest);
        rmdir(dir);
    }
    free(x);
    dt_comm_destroy(c);
    MPI_Finalize();
    return 0;
}
