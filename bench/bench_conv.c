/*
 * bench_conv.c - the CPU backend's convolution, pooling and batch norm at
 * the shapes of a small Fashion-MNIST CNN (28x28x1 -> conv 3x3 K1 -> BN ->
 * 2x2 max pool -> conv 3x3 K2 -> BN -> 2x2 max pool), fast table against
 * the reference table in the same run.
 *
 *   bench_conv [BATCH [THREADS [SECONDS [K1 [K2 [GROUPS]]]]]]   (defaults 128 1 1 32 64 1)
 * (GROUPS: of the second convolution; K1 K2 and GROUPS equal make it
 * depthwise)
 * prints one line per op and table: milliseconds per call and, for the
 * convolutions, GFLOP/s (2*N*K*P*Q*C/g*R*S per pass); then the fast
 * table's speed-up over the reference. Each op runs for about SECONDS
 * (at least twice; the reference once where one call takes longer).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "core/clock.h"

#define DEFAULT_BATCH 128
#define DEFAULT_SECONDS 1.0
#define MIN_CALLS 2

struct conv_bufs {
    float *x, *w, *y, *dx, *dw;
    void *ws;
    size_t ws_bytes;
};

enum pass { FWD, BWD_DATA, BWD_FILTER, NPASS };
static const char *const pass_name[NPASS] = {"fwd", "bwd_data", "bwd_filter"};

static dt_status conv_call(dt_backend_t *be, enum pass p, struct conv_bufs *b,
                           const struct dt_conv2d_shape *s)
{
    const struct dt_ops *o = dt_backend_ops(be);
    if (p == FWD)
        return o->conv2d_fwd(be, b->y, b->x, b->w, s, b->ws, b->ws_bytes);
    if (p == BWD_DATA)
        return o->conv2d_bwd_data(be, b->dx, b->y, b->w, s, b->ws, b->ws_bytes);
    return o->conv2d_bwd_filter(be, b->dw, b->y, b->x, s, b->ws, b->ws_bytes);
}

/* Seconds per call of pass p, repeated for about `seconds`. */
static double time_conv(dt_backend_t *be, enum pass p, struct conv_bufs *b,
                        const struct dt_conv2d_shape *s, double seconds)
{
    int calls = 0;
    double t0 = dt_now(), t = t0;
    do {
        if (conv_call(be, p, b, s) != DT_OK) {
            fprintf(stderr, "bench_conv: %s\n", dt_last_error());
            exit(70);
        }
        calls++;
        t = dt_now();
    } while (t - t0 < seconds || (calls < MIN_CALLS && t - t0 < 1.0));
    return (t - t0) / calls;
}

static float *randbuf(size_t n)
{
    float *p = malloc(n * sizeof *p);
    if (!p) {
        fprintf(stderr, "bench_conv: out of memory\n");
        exit(70);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    return p;
}

/* One conv layer, every pass, both tables; returns the fast and reference
 * seconds of a training step's passes (fwd + bwd_filter, + bwd_data when
 * the layer is not the first). */
static void bench_conv_layer(dt_backend_t *fast, dt_backend_t *ref, struct dt_conv2d_shape s,
                             int first, double seconds, double *t_fast, double *t_ref)
{
    s.P = dt_conv_out_dim(s.H, s.pad_h, s.dil_h, s.R, s.stride_h);
    s.Q = dt_conv_out_dim(s.W, s.pad_w, s.dil_w, s.S, s.stride_w);
    size_t nx = (size_t)s.N * s.C * s.H * s.W, ny = (size_t)s.N * s.K * s.P * s.Q;
    size_t nw = (size_t)s.K * (s.C / s.groups) * s.R * s.S;
    struct conv_bufs b = {randbuf(nx), randbuf(nw), randbuf(ny), randbuf(nx), randbuf(nw), NULL, 0};
    if (dt_backend_ops(fast)->conv2d_workspace(fast, &s, &b.ws_bytes) != DT_OK ||
        !(b.ws = malloc(b.ws_bytes ? b.ws_bytes : 1))) {
        fprintf(stderr, "bench_conv: workspace: %s\n", dt_last_error());
        exit(70);
    }
    double flops = 2.0 * s.N * s.K * s.P * s.Q * (s.C / s.groups) * s.R * s.S;
    for (int p = 0; p < NPASS; p++) {
        double tf = time_conv(fast, (enum pass)p, &b, &s, seconds);
        double tr = time_conv(ref, (enum pass)p, &b, &s, seconds);
        printf("conv %dx%dx%dx%d K=%d %dx%d %-10s fast %8.3f ms %6.2f GFLOP/s   reference %9.3f "
               "ms %6.2f GFLOP/s   x%.1f\n",
               s.N, s.C, s.H, s.W, s.K, s.R, s.S, pass_name[p], tf * 1e3, flops / tf * 1e-9,
               tr * 1e3, flops / tr * 1e-9, tr / tf);
        if (p != BWD_DATA || !first) {
            *t_fast += tf;
            *t_ref += tr;
        }
    }
    free(b.x), free(b.w), free(b.y), free(b.dx), free(b.dw), free(b.ws);
}

/* Max pooling 2x2/2 and batch norm (training forward and backward) on
 * x(N, C, H, W), both tables. */
static void bench_pool_bn(dt_backend_t *be[2], int N, int C, int H, int W, double seconds,
                          double *t_fast, double *t_ref)
{
    size_t n = (size_t)N * C * H * W;
    float *x = randbuf(n), *y = randbuf(n), *dx = randbuf(n), *py = randbuf(n / 4 + 1);
    float *pc = randbuf(8 * (size_t)C);
    double *st = malloc(4 * (size_t)C * sizeof *st);
    struct dt_pool2d_shape ps = {N, C, H, W, 2, 2, 2, 2, 0, 0, H / 2, W / 2};
    double tb[2][2] = {{0}};
    for (int k = 0; k < 2; k++) {
        const struct dt_ops *o = dt_backend_ops(be[k]);
        for (int what = 0; what < 2; what++) {
            int calls = 0;
            double t0 = dt_now(), t = t0;
            dt_status s = DT_OK;
            do {
                if (what == 0) { /* max pool fwd + bwd */
                    s = o->maxpool2d_fwd(be[k], py, x, &ps);
                    if (s == DT_OK)
                        s = o->maxpool2d_bwd(be[k], dx, py, x, py, &ps);
                } else { /* batch norm stats, fwd, bwd_reduce, bwd */
                    s = o->batchnorm_stats(be[k], st, x, N, C, H * W);
                    if (s == DT_OK)
                        s = o->batchnorm_fwd(be[k], y, pc, pc + C, pc + 2 * C, pc + 3 * C, x, st,
                                             (double)N * H * W, pc + 4 * C, pc + 5 * C, 1e-5f, 0.1f,
                                             N, C, H * W, 0);
                    if (s == DT_OK)
                        s = o->batchnorm_bwd_reduce(be[k], st + 2 * C, y, x, pc, pc + C, NULL, N,
                                                    C, H * W);
                    if (s == DT_OK)
                        s = o->batchnorm_bwd(be[k], dx, pc + 6 * C, pc + 7 * C, y, x, pc, pc + C,
                                             pc + 4 * C, st + 2 * C, st + 2 * C, (double)N * H * W,
                                             NULL, N, C, H * W);
                }
                if (s != DT_OK) {
                    fprintf(stderr, "bench_conv: %s\n", dt_last_error());
                    exit(70);
                }
                calls++;
                t = dt_now();
            } while (t - t0 < seconds || calls < MIN_CALLS);
            tb[k][what] = (t - t0) / calls;
        }
    }
    printf("maxpool 2x2 %dx%dx%dx%d fwd+bwd    fast %8.3f ms   reference %9.3f ms   x%.1f\n", N, C,
           H, W, tb[0][0] * 1e3, tb[1][0] * 1e3, tb[1][0] / tb[0][0]);
    printf("batchnorm %dx%dx%dx%d fwd+bwd      fast %8.3f ms   reference %9.3f ms   x%.1f\n", N, C,
           H, W, tb[0][1] * 1e3, tb[1][1] * 1e3, tb[1][1] / tb[0][1]);
    *t_fast += tb[0][0] + tb[0][1];
    *t_ref += tb[1][0] + tb[1][1];
    free(x), free(y), free(dx), free(py), free(pc), free(st);
}

int main(int argc, char **argv)
{
    int batch = argc > 1 ? atoi(argv[1]) : DEFAULT_BATCH;
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    double seconds = argc > 3 ? atof(argv[3]) : DEFAULT_SECONDS;
    int k1 = argc > 4 ? atoi(argv[4]) : 32, k2 = argc > 5 ? atoi(argv[5]) : 64;
    int groups = argc > 6 ? atoi(argv[6]) : 1;
    if (argc > 7 || batch < 1 || threads < 1 || !(seconds > 0) || k1 < 1 || k2 < 1 ||
        groups < 1 || k1 % groups || k2 % groups) {
        fprintf(stderr, "usage: bench_conv [BATCH [THREADS [SECONDS [K1 [K2 [GROUPS]]]]]] "
                        "(GROUPS dividing K1 and K2)\n");
        return 64;
    }
    dt_backend_t *be[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        struct dt_backend_opts o = {.threads = threads, .reference_kernels = k == 1};
        if (dt_backend_create("cpu", &o, &be[k]) != DT_OK) {
            fprintf(stderr, "bench_conv: %s\n", dt_last_error());
            return 70;
        }
    }
    printf("batch %d, %d thread(s), fast = im2col + sgemm, reference = plain loops\n", batch,
           threads);
    double tf = 0, tr = 0;
    struct dt_conv2d_shape c1 = {batch, 1, 28, 28, k1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0};
    struct dt_conv2d_shape c2 = {batch, k1, 14, 14, k2, 3, 3, 1, 1, 1, 1, 1, 1, groups, 0, 0};
    bench_conv_layer(be[0], be[1], c1, 1, seconds, &tf, &tr);
    bench_pool_bn(be, batch, k1, 28, 28, seconds, &tf, &tr);
    bench_conv_layer(be[0], be[1], c2, 0, seconds, &tf, &tr);
    bench_pool_bn(be, batch, k2, 14, 14, seconds, &tf, &tr);
    printf("conv+bn+pool part of a training step: fast %.1f ms, reference %.1f ms, x%.1f\n",
           tf * 1e3, tr * 1e3, tr / tf);
    dt_backend_destroy(be[0]);
    dt_backend_destroy(be[1]);
    return 0;
}
