/*
 * bench_act.c - the CPU backend's element-wise activations (every row of
 * DT_UNARY_LIST), forward and backward, then dropout (p = 0.1, forward and
 * the backward that applies the mask forward kept) and the sum of squares
 * of the gradient norm, fast table against the reference table in the
 * same run.
 *
 *   bench_act [N [THREADS [SECONDS]]]   (defaults 1048576 1 0.5: one GPT
 *                                        layer's MLP activation, 16 x 128
 *                                        tokens x 512)
 * prints one line per op and pass: nanoseconds per element for each table
 * and the fast table's speed-up (dropout's N elements as rows of 512).
 * Inputs are spread over [-6, 6), where GELU's tails and the
 * exponentials' ranges are all met. Each pass runs for about SECONDS (at
 * least twice).
 */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/backend.h"
#include "core/clock.h"

#define MIN_CALLS 2

static void must(dt_status st)
{
    if (st != DT_OK) {
        fprintf(stderr, "bench_act: %s\n", dt_last_error());
        exit(70);
    }
}

typedef dt_status (*fwd_fn)(dt_backend_t *, float *, const float *, size_t);
typedef dt_status (*bwd_fn)(dt_backend_t *, float *, const float *, const float *, size_t);

struct act {
    const char *name;
    fwd_fn fwd[2];
    bwd_fn bwd[2];
};

/* Seconds per call of one pass (bwd when b is not NULL). */
static double time_pass(dt_backend_t *be, fwd_fn f, bwd_fn b, float *out, const float *in,
                        const float *dout, size_t n, double seconds)
{
    int calls = 0;
    double t0 = dt_now(), t = t0;
    do {
        must(b ? b(be, out, dout, in, n) : f(be, out, in, n));
        calls++;
        t = dt_now();
    } while (t - t0 < seconds || calls < MIN_CALLS);
    return (t - t0) / calls;
}

/* Seconds per dropout call (backward: after a forward with the same key,
 * so it applies the kept mask, as in training); each call a new step. */
static double time_dropout(dt_backend_t *be, const struct dt_ops *o, int backward, float *out,
                           const float *in, const float *dout, int rows, int cols,
                           double seconds)
{
    struct dt_rng_key key = {.seed = 1, .purpose = DT_RNG_DROPOUT, .stream = 1, .step = 0};
    int calls = 0;
    double spent = 0, t0 = dt_now();
    do {
        key.step++;
        if (backward) /* untimed: keeps the mask the timed backward applies */
            must(o->dropout_fwd(be, out, in, rows, cols, 0.1f, &key, 0));
        double a = dt_now();
        must(backward ? o->dropout_bwd(be, out, dout, rows, cols, 0.1f, &key, 0)
                      : o->dropout_fwd(be, out, in, rows, cols, 0.1f, &key, 0));
        spent += dt_now() - a;
        calls++;
    } while (dt_now() - t0 < seconds || calls < MIN_CALLS);
    return spent / calls;
}

static double time_sumsq(dt_backend_t *be, const struct dt_ops *o, const float *x, size_t n,
                         double seconds)
{
    int calls = 0;
    double t0 = dt_now(), t = t0, s = 0;
    do {
        must(o->sumsq(be, x, n, &s));
        calls++;
        t = dt_now();
    } while (t - t0 < seconds || calls < MIN_CALLS);
    return (t - t0) / calls;
}

static float *buf(size_t n, float lo, float span)
{
    float *p = malloc(n * sizeof *p);
    if (!p) {
        fprintf(stderr, "bench_act: out of memory\n");
        exit(70);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = lo + span * (float)((i * 2654435761u) % 100003) / 100003.0f;
    return p;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1048576;
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    double seconds = argc > 3 ? atof(argv[3]) : 0.5;
    if (argc > 4 || n < 1 || threads < 1 || !(seconds > 0)) {
        fprintf(stderr, "usage: bench_act [N [THREADS [SECONDS]]]\n");
        return 64;
    }
    dt_backend_t *be[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        struct dt_backend_opts o = {.threads = threads, .reference_kernels = k == 1};
        must(dt_backend_create("cpu", &o, &be[k]));
    }
    const struct dt_ops *o[2] = {dt_backend_ops(be[0]), dt_backend_ops(be[1])};
#define ACT_ROW(a, nm, s, forward, gradient, cpu, doc)                                             \
    {#nm, {o[0]->nm##_fwd, o[1]->nm##_fwd}, {o[0]->nm##_bwd, o[1]->nm##_bwd}},
    const struct act acts[] = {DT_UNARY_LIST(ACT_ROW, _)};
#undef ACT_ROW
    float *in = buf((size_t)n, -6.0f, 12.0f), *dout = buf((size_t)n, -1.0f, 2.0f);
    float *out = buf((size_t)n, 0.0f, 0.0f);
    printf("activations, %ld elements, %d thread(s): ns per element, fast and reference\n", n,
           threads);
    for (size_t a = 0; a < sizeof acts / sizeof acts[0]; a++)
        for (int p = 0; p < 2; p++) {
            double t[2];
            for (int k = 0; k < 2; k++)
                t[k] = time_pass(be[k], acts[a].fwd[k], p ? acts[a].bwd[k] : NULL, out, in, dout,
                                 (size_t)n, seconds);
            printf("%-10s %s  fast %7.3f ns  reference %7.3f ns  x%.1f\n", acts[a].name,
                   p ? "bwd" : "fwd", t[0] / (double)n * 1e9, t[1] / (double)n * 1e9, t[1] / t[0]);
        }
    const int dcols = n < 512 ? (int)n : 512, rows = (int)(n / dcols);
    const size_t nd = (size_t)rows * dcols;
    for (int p = 0; p < 2; p++) {
        double t[2];
        for (int k = 0; k < 2; k++)
            t[k] = time_dropout(be[k], o[k], p, out, in, dout, rows, dcols, seconds);
        printf("%-10s %s  fast %7.3f ns  reference %7.3f ns  x%.1f\n", "dropout",
               p ? "bwd" : "fwd", t[0] / (double)nd * 1e9, t[1] / (double)nd * 1e9, t[1] / t[0]);
    }
    {
        double t[2];
        for (int k = 0; k < 2; k++)
            t[k] = time_sumsq(be[k], o[k], in, (size_t)n, seconds);
        printf("%-10s %s  fast %7.3f ns  reference %7.3f ns  x%.1f\n", "sumsq", "   ",
               t[0] / (double)n * 1e9, t[1] / (double)n * 1e9, t[1] / t[0]);
    }
    free(in), free(dout), free(out);
    dt_backend_destroy(be[0]);
    dt_backend_destroy(be[1]);
    return 0;
}
