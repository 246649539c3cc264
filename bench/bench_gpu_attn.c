/*
 * bench_gpu_attn.c - the cuda backend's attention and embedding ops at the
 * shapes of a GPT-2 small step (heads of 64, width 768, vocabulary 50257,
 * causal), so their share of a training step can be read off against the
 * step time.
 *
 *   bench_gpu_attn [BATCH [T [HEADS [DH [SECONDS]]]]]   (defaults 8 1024 12 64 1)
 * prints one line per op: milliseconds per call and, for attention,
 * GFLOP/s of the matmul work the causal mask leaves (forward: QK^T and PV,
 * 4*B*H*Dh*T(T+1)/2 flops; backward: five such products, 10*B*H*Dh*T(T+1)/2).
 * Each op runs for about SECONDS (at least MIN_CALLS calls) after one
 * untimed call, the stream synchronised after every call (the calls take
 * milliseconds, the synchronisation microseconds). Exits 77 without a
 * usable GPU, 64 on bad arguments, 70 when an op fails.
 */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "core/clock.h"

#define SKIP_CODE 77
#define VOCAB 50257
#define MIN_CALLS 3

enum which { ATT_FWD, ATT_BWD, EMB_FWD, EMB_BWD, NWHICH };
static const char *const names[NWHICH] = {"attention_fwd", "attention_bwd", "embedding_fwd",
                                          "embedding_bwd"};

struct bufs {
    int B, T, H, Dh;
    float *qkv, *out, *lse, *dout, *dqkv, *ids, *wte, *emb, *dwte;
    void *ws;
    size_t ws_bytes;
};

static dt_status call(dt_backend_t *be, enum which w, struct bufs *b)
{
    const struct dt_ops *o = dt_backend_ops(be);
    const int N = b->B * b->T, D = b->H * b->Dh;
    switch (w) {
    case ATT_FWD:
        return o->attention_fwd(be, b->out, b->lse, b->qkv, b->B, b->T, b->H, b->Dh, 1, b->ws,
                                b->ws_bytes);
    case ATT_BWD:
        return o->attention_bwd(be, b->dqkv, b->dout, b->qkv, b->out, b->lse, b->B, b->T, b->H,
                                b->Dh, 1, b->ws, b->ws_bytes);
    case EMB_FWD:
        return o->embedding_fwd(be, b->emb, b->ids, b->wte, N, VOCAB, D);
    default:
        return o->embedding_bwd(be, b->dwte, b->emb, b->ids, N, VOCAB, D);
    }
}

/* Seconds per call, over about `seconds`; -1 on an error (printed). */
static double time_op(dt_backend_t *be, enum which w, struct bufs *b, double seconds)
{
    dt_status st = call(be, w, b);
    if (st == DT_OK)
        st = dt_backend_sync(be);
    int calls = 0;
    double t0 = dt_now(), t = t0;
    while (st == DT_OK && (calls < MIN_CALLS || t - t0 < seconds)) {
        st = call(be, w, b);
        calls++;
        if (st == DT_OK)
            st = dt_backend_sync(be);
        t = dt_now();
    }
    if (st != DT_OK) {
        fprintf(stderr, "bench_gpu_attn: %s: %s\n", names[w], dt_last_error());
        return -1.0;
    }
    return (t - t0) / calls;
}

static dt_status alloc_all(dt_backend_t *be, struct bufs *b)
{
    const size_t N = (size_t)b->B * b->T, D = (size_t)b->H * b->Dh;
    float **f[] = {&b->qkv, &b->out, &b->lse, &b->dout, &b->dqkv,
                   &b->ids, &b->wte, &b->emb, &b->dwte};
    const size_t n[] = {N * 3 * D,         N * D, (size_t)b->B * b->H * b->T, N * D, N * 3 * D, N,
                        (size_t)VOCAB * D, N * D, (size_t)VOCAB * D};
    dt_status st =
        dt_backend_ops(be)->attention_workspace(be, b->B, b->T, b->H, b->Dh, 1, &b->ws_bytes);
    if (st == DT_OK)
        st = dt_backend_alloc(be, b->ws_bytes, &b->ws);
    for (size_t i = 0; st == DT_OK && i < sizeof n / sizeof n[0]; i++)
        st = dt_backend_alloc(be, n[i] * sizeof(float), (void **)f[i]);
    /* ids: token n % VOCAB (allocations start zeroed: every other buffer
     * holds zeros, which the ops take as well as any values) */
    float *h = st == DT_OK ? malloc(N * sizeof *h) : NULL;
    if (st == DT_OK && !h)
        st = dt_set_error(DT_ERR_NOMEM, "bench_gpu_attn: out of host memory");
    for (size_t i = 0; h && i < N; i++)
        h[i] = (float)(i % VOCAB);
    if (st == DT_OK)
        st = dt_backend_copy(be, b->ids, h, N * sizeof *h, DT_COPY_H2D);
    free(h);
    return st;
}

int main(int argc, char **argv)
{
    struct bufs b = {.B = argc > 1 ? atoi(argv[1]) : 8,
                     .T = argc > 2 ? atoi(argv[2]) : 1024,
                     .H = argc > 3 ? atoi(argv[3]) : 12,
                     .Dh = argc > 4 ? atoi(argv[4]) : 64};
    const double seconds = argc > 5 ? atof(argv[5]) : 1.0;
    if (b.B < 1 || b.T < 1 || b.H < 1 || b.Dh < 1 || !(seconds > 0.0)) {
        fprintf(stderr, "usage: bench_gpu_attn [BATCH [T [HEADS [DH [SECONDS]]]]]\n");
        return 64;
    }
    char why[512];
    if (!dt_cuda_usable(why, sizeof why)) {
        printf("bench_gpu_attn: SKIPPED: %s\n", why);
        return SKIP_CODE;
    }
    dt_backend_t *be = NULL;
    struct dt_backend_opts o = {.threads = 1, .device = 0, .precision = DT_F32};
    if (dt_backend_create("cuda", &o, &be) != DT_OK || alloc_all(be, &b) != DT_OK) {
        fprintf(stderr, "bench_gpu_attn: %s\n", dt_last_error());
        if (be)
            dt_backend_destroy(be);
        return 70;
    }
    printf("bench_gpu_attn: %s, B=%d T=%d H=%d Dh=%d causal, embedding %d x %d\n",
           dt_backend_device(be), b.B, b.T, b.H, b.Dh, VOCAB, b.H * b.Dh);
    const double tri = (double)b.B * b.H * b.Dh * b.T * (b.T + 1) / 2.0;
    const double flops[NWHICH] = {4.0 * tri, 10.0 * tri, 0.0, 0.0};
    int rc = 0;
    for (int w = 0; w < NWHICH; w++) {
        double s = time_op(be, (enum which)w, &b, seconds);
        if (s < 0.0) {
            rc = 70;
            continue;
        }
        if (flops[w] > 0.0)
            printf("%-14s %9.3f ms  %8.1f GFLOP/s\n", names[w], 1e3 * s, flops[w] / s / 1e9);
        else
            printf("%-14s %9.3f ms\n", names[w], 1e3 * s);
    }
    dt_backend_destroy(be);
    return rc;
}
