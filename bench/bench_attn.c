/*
 * bench_attn.c - the CPU backend's multi-head attention, forward and
 * backward, fast table (sgemm per head over blocks of query rows) against
 * the reference table (plain loops) in the same run.
 *
 *   bench_attn [B [T [H [DH [CAUSAL [THREADS [SECONDS]]]]]]]
 *              (defaults 8 256 4 32 1 1 1: a small GPT layer's attention)
 * prints one line per pass (fwd, bwd, fwd+bwd): milliseconds per call and
 * GFLOP/s for each table, and the fast table's speed-up. FLOPs are the
 * matrix products' useful work, 2*Dh per (query, allowed key) pair and
 * product: two products forward (Q K^T, P V), four backward (dV, dP, dQ,
 * dK; the recomputed Q K^T is not counted). Causal attention has
 * T*(T+1)/2 allowed pairs per head, otherwise T*T. Each pass runs for
 * about SECONDS (at least twice).
 */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/backend.h"
#include "core/clock.h"

#define MIN_CALLS 2

struct attn_bufs {
    int B, T, H, Dh, causal;
    float *qkv, *out, *lse, *dout, *dqkv;
    void *ws;
    size_t ws_bytes;
};

enum pass { FWD, BWD, NPASS };

static void must(dt_status st)
{
    if (st != DT_OK) {
        fprintf(stderr, "bench_attn: %s\n", dt_last_error());
        exit(70);
    }
}

static void attn_call(dt_backend_t *be, enum pass p, struct attn_bufs *b)
{
    const struct dt_ops *o = dt_backend_ops(be);
    if (p == FWD)
        must(o->attention_fwd(be, b->out, b->lse, b->qkv, b->B, b->T, b->H, b->Dh, b->causal, b->ws,
                              b->ws_bytes));
    else
        must(o->attention_bwd(be, b->dqkv, b->dout, b->qkv, b->out, b->lse, b->B, b->T, b->H, b->Dh,
                              b->causal, b->ws, b->ws_bytes));
}

/* Seconds per call of pass p, repeated for about `seconds`. */
static double time_pass(dt_backend_t *be, enum pass p, struct attn_bufs *b, double seconds)
{
    int calls = 0;
    double t0 = dt_now(), t = t0;
    do {
        attn_call(be, p, b);
        calls++;
        t = dt_now();
    } while (t - t0 < seconds || calls < MIN_CALLS);
    return (t - t0) / calls;
}

static float *randbuf(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) {
        fprintf(stderr, "bench_attn: out of memory\n");
        exit(70);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    return p;
}

int main(int argc, char **argv)
{
    int B = argc > 1 ? atoi(argv[1]) : 8, T = argc > 2 ? atoi(argv[2]) : 256;
    int H = argc > 3 ? atoi(argv[3]) : 4, Dh = argc > 4 ? atoi(argv[4]) : 32;
    int causal = argc > 5 ? atoi(argv[5]) : 1, threads = argc > 6 ? atoi(argv[6]) : 1;
    double seconds = argc > 7 ? atof(argv[7]) : 1.0;
    if (argc > 8 || B < 1 || T < 1 || H < 1 || Dh < 1 || (causal != 0 && causal != 1) ||
        threads < 1 || !(seconds > 0)) {
        fprintf(stderr, "usage: bench_attn [B [T [H [DH [CAUSAL [THREADS [SECONDS]]]]]]]\n");
        return 64;
    }
    dt_backend_t *be[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        struct dt_backend_opts o = {.threads = threads, .reference_kernels = k == 1};
        must(dt_backend_create("cpu", &o, &be[k]));
    }
    size_t n = (size_t)B * T * H * Dh;
    struct attn_bufs b = {B,          T,
                          H,          Dh,
                          causal,     randbuf(3 * n),
                          randbuf(n), randbuf((size_t)B * H * T),
                          randbuf(n), randbuf(3 * n),
                          NULL,       0};
    must(dt_backend_ops(be[0])->attention_workspace(be[0], B, T, H, Dh, causal, &b.ws_bytes));
    b.ws = randbuf(b.ws_bytes / sizeof(float) + 1);
    attn_call(be[0], FWD, &b); /* out and lse as backward expects them */

    double pairs = causal ? (double)T * (T + 1) / 2 : (double)T * T;
    double flops[NPASS] = {4.0 * B * H * pairs * Dh, 8.0 * B * H * pairs * Dh};
    double t[2][NPASS];
    for (int p = 0; p < NPASS; p++)
        for (int k = 0; k < 2; k++)
            t[k][p] = time_pass(be[k], (enum pass)p, &b, seconds);
    printf("attention B=%d T=%d H=%d Dh=%d %s, %d thread(s), fast = sgemm per head over %zu-byte "
           "workspace, reference = plain loops\n",
           B, T, H, Dh, causal ? "causal" : "not causal", threads, b.ws_bytes);
    const char *name[NPASS + 1] = {"fwd", "bwd", "fwd+bwd"};
    for (int p = 0; p <= NPASS; p++) {
        double tf = p < NPASS ? t[0][p] : t[0][FWD] + t[0][BWD];
        double tr = p < NPASS ? t[1][p] : t[1][FWD] + t[1][BWD];
        double fl = p < NPASS ? flops[p] : flops[FWD] + flops[BWD];
        printf("attention %-8s fast %8.3f ms %6.2f GFLOP/s   reference %9.3f ms %6.2f GFLOP/s   "
               "x%.1f\n",
               name[p], tf * 1e3, fl / tf * 1e-9, tr * 1e3, fl / tr * 1e-9, tr / tf);
    }
    free(b.qkv), free(b.out), free(b.lse), free(b.dout), free(b.dqkv), free(b.ws);
    dt_backend_destroy(be[0]);
    dt_backend_destroy(be[1]);
    return 0;
}
