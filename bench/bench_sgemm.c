/*
 * bench_sgemm.c - OpenBLAS sgemm GFLOP/s at the GEMM shapes of one MLP
 * training step (forward, input gradient, weight gradient per layer), on
 * the thread count given. It is the ceiling dtrain's achieved GFLOP/s is
 * compared with in bench/mlp_vs_torch.sh.
 *
 *   bench_sgemm BATCH THREADS SECONDS DIM0 DIM1 ... DIMn
 * prints one line: "sgemm_gflops <value>" (FLOP-weighted over the step).
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/clock.h"

#define MAX_DIMS 16

struct shape {
    CBLAS_TRANSPOSE ta, tb;
    int m, n, k;
};

static double run_step(const struct shape *s, int ns, float *a, float *b, float *c)
{
    double flops = 0;
    for (int i = 0; i < ns; i++) {
        int lda = s[i].ta == CblasNoTrans ? s[i].k : s[i].m;
        int ldb = s[i].tb == CblasNoTrans ? s[i].n : s[i].k;
        cblas_sgemm(CblasRowMajor, s[i].ta, s[i].tb, s[i].m, s[i].n, s[i].k, 1.0f, a, lda, b, ldb,
                    0.0f, c, s[i].n);
        flops += 2.0 * s[i].m * s[i].n * s[i].k;
    }
    return flops;
}

int main(int argc, char **argv)
{
    if (argc < 6 || argc - 4 > MAX_DIMS) {
        fprintf(stderr, "usage: bench_sgemm BATCH THREADS SECONDS DIM0 DIM1 ...\n");
        return 64;
    }
    int batch = atoi(argv[1]), threads = atoi(argv[2]);
    double seconds = atof(argv[3]);
    int nd = argc - 4, dims[MAX_DIMS];
    for (int i = 0; i < nd; i++)
        dims[i] = atoi(argv[4 + i]);
    openblas_set_num_threads(threads);
    struct shape s[3 * MAX_DIMS];
    int ns = 0, big = 0;
    for (int l = 0; l + 1 < nd; l++) {
        int in = dims[l], out = dims[l + 1];
        s[ns++] = (struct shape){CblasNoTrans, CblasTrans, batch, out, in};   /* forward */
        if (l > 0)
            s[ns++] = (struct shape){CblasNoTrans, CblasNoTrans, batch, in, out}; /* d input */
        s[ns++] = (struct shape){CblasTrans, CblasNoTrans, out, in, batch};   /* d weight */
        if (in * out > big)
            big = in * out;
        if (batch * in > big)
            big = batch * in;
        if (batch * out > big)
            big = batch * out;
    }
    float *a = calloc((size_t)big, 4), *b = calloc((size_t)big, 4), *c = calloc((size_t)big, 4);
    for (int i = 0; i < big; i++)
        a[i] = b[i] = 0.001f * (float)(i % 1000);
    run_step(s, ns, a, b, c); /* warm-up */
    double flops = 0, t0 = dt_now();
    while (dt_now() - t0 < seconds)
        flops += run_step(s, ns, a, b, c);
    printf("sgemm_gflops %.2f\n", flops / (dt_now() - t0) / 1e9);
    free(a);
    free(b);
    free(c);
    return 0;
}
