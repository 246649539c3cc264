/*
 * op_dump.c - runs one forward op of the CPU backend on deterministic
 * inputs and writes inputs and outputs as raw float32, for
 * check_ops.py to recompute in NumPy: an oracle written from the
 * definitions (PyTorch's conventions) and independent of dtrain's code.
 *
 *   op_dump ref|fast conv N C H W K R S sh sw ph pw dh dw groups FILE
 *     writes x, w, y
 *   op_dump ref|fast pool N C H W R S sh sw ph pw FILE
 *     writes x, max-pooled y, average-pooled y
 *   op_dump ref|fast bn N C HW FILE
 *     writes x, gamma, beta, running_mean/var before, y, mean, invstd,
 *     running_mean/var after (momentum 0.1, eps 1e-5), batchnorm_infer's y
 *   op_dump ref|fast ln rows D FILE
 *     writes x, gamma, beta, y, mean, rstd (eps 1e-5)
 *   op_dump ref|fast attn B T H Dh causal FILE
 *     writes qkv(B,T,3,H,Dh), out(B,T,H,Dh), lse(B,H,T)
 *   op_dump ref|fast emb N V D FILE
 *     writes ids(N) (whole numbers in floats), w(V,D), out(N,D)
 *   op_dump ref|fast rms rows D FILE
 *     writes x, gamma, y, rstd (RMS norm, eps 1e-5)
 * Exit status 64 on bad usage, 70 when an op fails.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"

#define EPS 1e-5f
#define MOMENTUM 0.1f
#define MAX_ARGS 14

static float *values(size_t n, unsigned salt, float lo, float hi)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (!p)
        exit(70);
    for (size_t i = 0; i < n; i++) /* a fixed scramble, spread over [lo, hi) */
        p[i] =
            lo + (hi - lo) * (float)(((i + 1) * 2654435761u + salt * 40503u) % 10007u) / 10007.0f;
    return p;
}

static void put(FILE *f, const float *p, size_t n)
{
    if (fwrite(p, sizeof *p, n, f) != n)
        exit(74);
}

static void ok(dt_status st)
{
    if (st != DT_OK) {
        fprintf(stderr, "op_dump: %s\n", dt_last_error());
        exit(70);
    }
}

int main(int argc, char **argv)
{
    static const struct {
        const char *op;
        int nargs;
    } ops[] = {{"conv", 14}, {"pool", 10}, {"bn", 3}, {"ln", 2},
               {"attn", 5},  {"emb", 3},   {"rms", 2}};
    int which = -1;
    for (int i = 0; argc > 2 && i < (int)(sizeof ops / sizeof ops[0]); i++)
        if (strcmp(argv[2], ops[i].op) == 0)
            which = i;
    if (argc < 4 || which < 0 || argc != 4 + ops[which].nargs ||
        (strcmp(argv[1], "ref") && strcmp(argv[1], "fast"))) {
        fprintf(stderr, "usage: op_dump ref|fast conv|pool|bn|ln|attn|emb|rms DIMS... FILE\n");
        return 64;
    }
    int d[MAX_ARGS];
    for (int i = 0; i < ops[which].nargs; i++)
        d[i] = atoi(argv[3 + i]);
    dt_backend_t *be = NULL;
    struct dt_backend_opts o = {.threads = 1, .reference_kernels = strcmp(argv[1], "ref") == 0};
    ok(dt_backend_create("cpu", &o, &be));
    const struct dt_ops *op = dt_backend_ops(be);
    FILE *f = fopen(argv[argc - 1], "wb");
    if (!f) {
        perror(argv[argc - 1]);
        return 74;
    }
    if (which == 0) {
        struct dt_conv2d_shape s = {d[0], d[1], d[2],  d[3],  d[4],  d[5],  d[6], d[7],
                                    d[8], d[9], d[10], d[11], d[12], d[13], 0,    0};
        s.P = dt_conv_out_dim(s.H, s.pad_h, s.dil_h, s.R, s.stride_h);
        s.Q = dt_conv_out_dim(s.W, s.pad_w, s.dil_w, s.S, s.stride_w);
        size_t nx = (size_t)s.N * s.C * s.H * s.W, ny = (size_t)s.N * s.K * s.P * s.Q;
        size_t nw = (size_t)s.K * (s.C / (s.groups ? s.groups : 1)) * s.R * s.S, ws = 0;
        float *x = values(nx, 1, -1, 1), *w = values(nw, 2, -1, 1), *y = values(ny, 3, 0, 0);
        ok(op->conv2d_workspace(be, &s, &ws));
        void *buf = malloc(ws ? ws : 1);
        ok(op->conv2d_fwd(be, y, x, w, &s, buf, ws));
        put(f, x, nx), put(f, w, nw), put(f, y, ny);
    } else if (which == 1) {
        struct dt_pool2d_shape s = {d[0], d[1], d[2], d[3], d[4], d[5],
                                    d[6], d[7], d[8], d[9], 0,    0};
        s.P = dt_conv_out_dim(s.H, s.pad_h, 1, s.R, s.stride_h);
        s.Q = dt_conv_out_dim(s.W, s.pad_w, 1, s.S, s.stride_w);
        size_t nx = (size_t)s.N * s.C * s.H * s.W, ny = (size_t)s.N * s.C * s.P * s.Q;
        float *x = values(nx, 4, -1, 1), *ym = values(ny, 0, 0, 0), *ya = values(ny, 0, 0, 0);
        ok(op->maxpool2d_fwd(be, ym, x, &s));
        ok(op->avgpool2d_fwd(be, ya, x, &s));
        put(f, x, nx), put(f, ym, ny), put(f, ya, ny);
    } else if (which == 2) {
        int N = d[0], C = d[1], HW = d[2];
        size_t n = (size_t)N * C * HW;
        float *x = values(n, 5, -2, 3), *g = values(C, 6, 0.5f, 1.5f), *b = values(C, 7, -1, 1);
        float *rm0 = values(C, 8, -1, 1), *rv0 = values(C, 9, 0.5f, 2), *rm = values(C, 8, -1, 1);
        float *rv = values(C, 9, 0.5f, 2), *y = values(n, 0, 0, 0), *yi = values(n, 0, 0, 0);
        float *mean = values(C, 0, 0, 0), *invstd = values(C, 0, 0, 0);
        double *stats = calloc(2 * (size_t)C, sizeof *stats);
        if (!stats)
            return 70;
        ok(op->batchnorm_stats(be, stats, x, N, C, HW));
        ok(op->batchnorm_fwd(be, y, mean, invstd, rm, rv, x, stats, (double)N * HW, g, b, EPS,
                             MOMENTUM, N, C, HW, 0));
        ok(op->batchnorm_infer(be, yi, x, rm, rv, g, b, EPS, N, C, HW, 0));
        put(f, x, n), put(f, g, C), put(f, b, C), put(f, rm0, C), put(f, rv0, C), put(f, y, n);
        put(f, mean, C), put(f, invstd, C), put(f, rm, C), put(f, rv, C), put(f, yi, n);
    } else if (which == 4) {
        int B = d[0], T = d[1], H = d[2], Dh = d[3], causal = d[4];
        size_t n = (size_t)B * T * H * Dh, nl = (size_t)B * H * T, ws = 0;
        float *qkv = values(3 * n, 13, -2, 2), *out = values(n, 0, 0, 0);
        float *lse = values(nl, 0, 0, 0);
        ok(op->attention_workspace(be, B, T, H, Dh, causal, &ws));
        void *buf = malloc(ws ? ws : 1);
        if (!buf)
            return 70;
        ok(op->attention_fwd(be, out, lse, qkv, B, T, H, Dh, causal, buf, ws));
        put(f, qkv, 3 * n), put(f, out, n), put(f, lse, nl);
    } else if (which == 5) {
        int N = d[0], V = d[1], D = d[2];
        float *ids = values(N, 14, 0, (float)V), *w = values((size_t)V * D, 15, -1, 1);
        float *out = values((size_t)N * D, 0, 0, 0);
        for (int i = 0; i < N; i++)
            ids[i] = (float)(int)ids[i];
        ok(op->embedding_fwd(be, out, ids, w, N, V, D));
        put(f, ids, N), put(f, w, (size_t)V * D), put(f, out, (size_t)N * D);
    } else if (which == 6) {
        int rows = d[0], D = d[1];
        size_t n = (size_t)rows * D;
        float *x = values(n, 16, -2, 3), *g = values(D, 17, 0.5f, 1.5f);
        float *y = values(n, 0, 0, 0), *rstd = values(rows, 0, 0, 0);
        ok(op->rmsnorm_fwd(be, y, rstd, x, g, EPS, rows, D));
        put(f, x, n), put(f, g, D), put(f, y, n), put(f, rstd, rows);
    } else {
        int rows = d[0], D = d[1];
        size_t n = (size_t)rows * D;
        float *x = values(n, 10, -2, 3), *g = values(D, 11, 0.5f, 1.5f), *b = values(D, 12, -1, 1);
        float *y = values(n, 0, 0, 0), *mean = values(rows, 0, 0, 0), *rstd = values(rows, 0, 0, 0);
        ok(op->layernorm_fwd(be, y, mean, rstd, x, g, b, EPS, rows, D));
        put(f, x, n), put(f, g, D), put(f, b, D), put(f, y, n), put(f, mean, rows);
        put(f, rstd, rows);
    }
    if (fclose(f) != 0)
        return 74;
    dt_backend_destroy(be);
    return 0;
}
