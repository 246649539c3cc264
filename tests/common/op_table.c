/*
 * op_table.c - the op test cases of op_table.h and the generic machinery
 * that runs them on any backend.
 *
 * Each kind of op has a runner: `setup` declares its tensors (inputs with
 * how to fill them, outputs, gradients and which input each belongs to,
 * the output gradients R that seed the backward), `fwd` and `bwd` call the
 * backend's ops on device copies of those tensors. The machinery does the
 * rest the same way for every op: host inputs drawn from a fixed key (so
 * every backend sees the same numbers), upload, forward, backward,
 * download, and then comparison, finite differences or the +=/= checks.
 * The loss for finite differences is L = sum over outputs paired with an
 * R of sum(out * R), so the backward seeded with those R is dL/dinput.
 */
#include "op_table.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "op_args.h"

/* finite differences: step, tolerance (relative, with the gradient size
 * below which it is absolute), elements checked per input at most */
#define FD_H 1e-2
#define FD_TOL 3e-3
#define FD_FLOOR 0.1
#define FD_MAX_ELEMS 24
/* accumulate vs write: relative tolerance of old + new */
#define ACC_TOL 1e-5

#define MAX_BUFS 24

enum kind {
    IN,     /* random input, differentiated */
    CONST,  /* random input, not differentiated (labels, other ranks, R) */
    OUT,    /* forward output (or sum), compared */
    GRAD_W, /* activation gradient: written */
    GRAD_P, /* parameter gradient: accumulated */
};
enum etype { F32, F64, I32 };
enum fill { ZERO, UNIFORM, AWAY, DISTINCT, POSITIVE, LABELS, ONE };

struct buf {
    const char *name;
    enum kind kind;
    enum etype t;
    size_t n;
    enum fill fill;
    int aux;   /* LABELS: the class count */
    int of;    /* GRAD_*: the input it is the gradient of; OUT: its R or -1 */
    int host;  /* lives in host memory only (the ops' host scalars) */
    double wt; /* OUT with an R: its weight in the loss */
    void *h, *d;
};

struct run {
    const struct dt_op_case *c;
    dt_backend_t *be;
    const struct dt_ops *o;
    int nbuf;
    struct buf b[MAX_BUFS];
    void *ws;
    size_t ws_bytes;
    int failed; /* an op returned an error */
    uint64_t draws;
};

struct runner {
    enum dt_op_id op;
    const enum dt_op_id *needs; /* ops the case calls, ending in DT_OP_COUNT */
    void (*setup)(struct run *r);
    void (*fwd)(struct run *r);
    void (*bwd)(struct run *r); /* NULL: no backward */
};

/* ---- buffers ------------------------------------------------------------ */

static size_t esize(enum etype t) { return t == F64 ? sizeof(double) : sizeof(float); }

static int buf(struct run *r, const char *name, enum kind k, enum etype t, size_t n, enum fill f)
{
    if (r->nbuf >= MAX_BUFS) {
        printf("  op table: case %s declares too many tensors\n", r->c->name);
        r->failed = 1;
        return 0;
    }
    int i = r->nbuf++;
    r->b[i] = (struct buf){.name = name, .kind = k, .t = t, .n = n, .fill = f, .of = -1, .wt = 1};
    return i;
}

/* An output paired with R (its gradient seed) for the loss. */
static int out_r(struct run *r, const char *name, size_t n, int R)
{
    int i = buf(r, name, OUT, F32, n, ZERO);
    r->b[i].of = R;
    return i;
}

static int grad(struct run *r, const char *name, enum kind k, int of)
{
    int i = buf(r, name, k, F32, r->b[of].n, ZERO);
    r->b[i].of = of;
    return i;
}

static float *F(struct run *r, int i) { return r->b[i].d; }
static double *D(struct run *r, int i) { return r->b[i].d; }

static void check(struct run *r, dt_status st, const char *what)
{
    if (st != DT_OK && !r->failed) {
        printf("  %s: %s failed on %s: %s\n", r->c->name, what, dt_backend_name(r->be),
               dt_last_error());
        r->failed = 1;
    }
}

#define CALL(r, opname, ...)                                                                       \
    do {                                                                                           \
        if (!(r)->failed)                                                                          \
            check((r), (r)->o->opname((r)->be, __VA_ARGS__), #opname);                             \
    } while (0)

static float draw(struct run *r)
{
    struct dt_rng_key key = {.seed = 20261203, .purpose = DT_RNG_TEST, .stream = 11};
    return dt_rng_uniform(&key, r->draws++);
}

static void fill_host(struct run *r, struct buf *b)
{
    if (b->t == I32) {
        int32_t *v = b->h;
        for (size_t i = 0; i < b->n; i++)
            v[i] = (int32_t)(draw(r) * b->aux) % b->aux;
        return;
    }
    if (b->t == F64) {
        for (size_t i = 0; i < b->n; i++)
            ((double *)b->h)[i] = b->fill == ONE ? 1.0 : 0.0;
        return;
    }
    float *v = b->h;
    for (size_t i = 0; i < b->n; i++) {
        switch (b->fill) {
        case ZERO:
            v[i] = 0.0f;
            break;
        case ONE:
            v[i] = 1.0f;
            break;
        case UNIFORM:
            v[i] = 2.0f * draw(r) - 1.0f;
            break;
        case POSITIVE:
            v[i] = 0.5f + draw(r);
            break;
        case AWAY: {
            float m = 0.1f + 0.9f * draw(r);
            v[i] = draw(r) < 0.5f ? -m : m;
            break;
        }
        case DISTINCT:
            v[i] = (float)i;
            break;
        case LABELS: /* whole numbers in [0, aux) held in floats (token ids) */
            v[i] = (float)((int32_t)(draw(r) * b->aux) % b->aux);
            break;
        }
    }
    if (b->fill == DISTINCT) { /* a random permutation of spaced values */
        for (size_t i = b->n; i > 1; i--) {
            size_t j = (size_t)(draw(r) * i) % i;
            float t = v[i - 1];
            v[i - 1] = v[j];
            v[j] = t;
        }
        for (size_t i = 0; i < b->n; i++)
            v[i] = (v[i] - 0.5f * (float)b->n) * 0.05f;
    }
}

static int alloc_all(struct run *r)
{
    for (int i = 0; i < r->nbuf && !r->failed; i++) {
        struct buf *b = &r->b[i];
        size_t bytes = (b->n ? b->n : 1) * esize(b->t);
        b->h = calloc(1, bytes);
        if (!b->h) {
            r->failed = 1;
            break;
        }
        fill_host(r, b);
        if (!b->host)
            check(r, dt_backend_alloc(r->be, bytes, &b->d), "alloc");
        else
            b->d = b->h;
    }
    return !r->failed;
}

static void upload(struct run *r, int i)
{
    struct buf *b = &r->b[i];
    if (!b->host && !r->failed)
        check(r, dt_backend_copy(r->be, b->d, b->h, b->n * esize(b->t), DT_COPY_H2D), "upload");
}

static void download(struct run *r, int i)
{
    struct buf *b = &r->b[i];
    if (!b->host && !r->failed)
        check(r, dt_backend_copy(r->be, b->h, b->d, b->n * esize(b->t), DT_COPY_D2H), "download");
}

static void copy_d2d(struct run *r, int dst, int src)
{
    if (!r->failed)
        check(r,
              dt_backend_copy(r->be, r->b[dst].d, r->b[src].d, r->b[src].n * esize(r->b[src].t),
                              DT_COPY_D2D),
              "copy");
}

/* The run's workspace grown to at least need bytes. */
static void *grow_workspace(struct run *r, size_t need)
{
    if (!r->failed && need > r->ws_bytes) {
        dt_backend_free(r->be, r->ws);
        r->ws = NULL;
        r->ws_bytes = 0;
        check(r, dt_backend_alloc(r->be, need, &r->ws), "workspace alloc");
        if (!r->failed)
            r->ws_bytes = need;
    }
    return r->ws;
}

static void *workspace(struct run *r, const struct dt_conv2d_shape *s)
{
    size_t need = 0;
    CALL(r, conv2d_workspace, s, &need);
    return grow_workspace(r, need);
}

static void free_all(struct run *r)
{
    for (int i = 0; i < r->nbuf; i++) {
        if (!r->b[i].host)
            dt_backend_free(r->be, r->b[i].d);
        free(r->b[i].h);
    }
    dt_backend_free(r->be, r->ws);
}

/* ---- runners ------------------------------------------------------------ */

#define NEEDS(...) ((const enum dt_op_id[]){__VA_ARGS__, DT_OP_COUNT})

/* slot indices of a run's buffers, in declaration order per runner */
enum { X0, X1, X2, X3, X4, X5, X6, X7, X8, X9, X10, X11, X12, X13, X14, X15, X16, X17 };

/* linear: 0 x, 1 w, 2 dy, 3 y, 4 dx, 5 dw, and with a bias (dims[3] 1) 6 b
 * (its gradient is bias_bwd's, a row of its own) */
static void linear_setup(struct run *r)
{
    const int *d = r->c->dims;
    size_t B = d[0], I = d[1], O = d[2];
    buf(r, "x", IN, F32, B * I, UNIFORM);
    buf(r, "w", IN, F32, O * I, UNIFORM);
    int R = buf(r, "dy", CONST, F32, B * O, UNIFORM);
    out_r(r, "y", B * O, R);
    grad(r, "dx", GRAD_W, X0);
    grad(r, "dw", GRAD_P, X1);
    if (d[3])
        buf(r, "b", CONST, F32, O, UNIFORM);
}
static void linear_fwd(struct run *r)
{
    const int *d = r->c->dims;
    CALL(r, linear_fwd, F(r, X3), F(r, X0), F(r, X1), d[3] ? F(r, X6) : NULL, d[0], d[1], d[2],
         NULL);
}
static void linear_bwd(struct run *r)
{
    const int *d = r->c->dims;
    CALL(r, linear_bwd, F(r, X4), F(r, X5), F(r, X2), F(r, X0), F(r, X1), d[0], d[1], d[2], NULL);
}

/* bias and channel bias (in place, so the forward copies x into y first):
 * 0 x, 1 b, 2 dy, 3 y, 4 db */
static void bias_setup(struct run *r)
{
    const int *d = r->c->dims;
    int chan = r->c->op == DT_OP_channel_bias_fwd;
    size_t n = chan ? (size_t)d[0] * d[1] * d[2] : (size_t)d[0] * d[1];
    buf(r, "x", CONST, F32, n, UNIFORM);
    buf(r, "b", IN, F32, (size_t)d[1], UNIFORM);
    int R = buf(r, "dy", CONST, F32, n, UNIFORM);
    out_r(r, "y", n, R);
    grad(r, "db", GRAD_P, X1);
}
static void bias_fwd(struct run *r)
{
    const int *d = r->c->dims;
    copy_d2d(r, X3, X0);
    if (r->c->op == DT_OP_channel_bias_fwd)
        CALL(r, channel_bias_fwd, F(r, X3), F(r, X1), d[0], d[1], d[2]);
    else
        CALL(r, bias_fwd, F(r, X3), F(r, X1), d[0], d[1]);
}
static void bias_bwd(struct run *r)
{
    const int *d = r->c->dims;
    if (r->c->op == DT_OP_channel_bias_fwd)
        CALL(r, channel_bias_bwd, F(r, X4), F(r, X2), d[0], d[1], d[2]);
    else
        CALL(r, bias_bwd, F(r, X4), F(r, X2), d[0], d[1]);
}

/* activations: 0 x, 1 dy, 2 y, 3 dx */
static void act_setup(struct run *r)
{
    size_t n = r->c->dims[0];
    buf(r, "x", IN, F32, n, AWAY);
    int R = buf(r, "dy", CONST, F32, n, UNIFORM);
    out_r(r, "y", n, R);
    grad(r, "dx", GRAD_W, X0);
}
static int act_of(const struct run *r)
{
    for (int a = 0; a < DT_TEST_NACT; a++)
        if (dt_test_act_fwd_op(a) == r->c->op) return a;
    return -1;
}
static void act_fwd(struct run *r)
{
    size_t n = r->c->dims[0];
    if (!r->failed)
        check(r, dt_test_act_fwd(r->o, r->be, act_of(r), F(r, X2), F(r, X0), n),
              dt_op_name(r->c->op));
}
static void act_bwd(struct run *r)
{
    size_t n = r->c->dims[0];
    int a = act_of(r);
    if (!r->failed)
        check(r, dt_test_act_bwd(r->o, r->be, a, F(r, X3), F(r, X1), F(r, X0), F(r, X2), n),
              dt_op_name(dt_test_act_bwd_op(a)));
}

/* add: 0 a, 1 b, 2 y;  accumulate: 0 src, 1 dst0, 2 dst */
static void sum_setup(struct run *r)
{
    size_t n = r->c->dims[0];
    buf(r, r->c->op == DT_OP_add ? "a" : "src", CONST, F32, n, UNIFORM);
    buf(r, r->c->op == DT_OP_add ? "b" : "dst0", CONST, F32, n, UNIFORM);
    buf(r, r->c->op == DT_OP_add ? "out" : "dst", OUT, F32, n, ZERO);
}
static void sum_fwd(struct run *r)
{
    size_t n = r->c->dims[0];
    if (r->c->op == DT_OP_add) {
        CALL(r, add, F(r, X2), F(r, X0), F(r, X1), n);
    } else {
        copy_d2d(r, X2, X1);
        CALL(r, accumulate, F(r, X2), F(r, X0), n);
    }
}

/* softmax_xent: 0 logits, 1 labels, 2 one (R of the loss), 3 probs,
 * 4 loss (host), 5 correct (host), 6 dlogits */
static void xent_setup(struct run *r)
{
    const int *d = r->c->dims;
    size_t B = d[0], C = d[1];
    buf(r, "logits", IN, F32, B * C, UNIFORM);
    int l = buf(r, "labels", CONST, I32, B, LABELS);
    r->b[l].aux = d[1];
    int one = buf(r, "one", CONST, F64, 1, ONE);
    r->b[one].host = 1;
    buf(r, "probs", OUT, F32, B * C, ZERO);
    int loss = buf(r, "loss_sum", OUT, F64, 1, ZERO);
    r->b[loss].host = 1;
    r->b[loss].of = one;
    int correct = buf(r, "correct", OUT, F64, 1, ZERO);
    r->b[correct].host = 1;
    grad(r, "dlogits", GRAD_W, X0);
}
static void xent_fwd(struct run *r)
{
    const int *d = r->c->dims;
    int64_t correct = 0;
    D(r, X4)[0] = 0.0;
    CALL(r, softmax_xent_fwd, F(r, X3), F(r, X0), r->b[X1].d, d[0], d[1], 1, D(r, X4), &correct);
    /* a device backend adds the totals at its next wait */
    if (!r->failed) check(r, dt_backend_sync(r->be), "softmax_xent_fwd (waiting for the totals)");
    D(r, X5)[0] = (double)correct;
    D(r, X2)[0] = 1.0;
}
static void xent_bwd(struct run *r)
{
    const int *d = r->c->dims;
    CALL(r, softmax_xent_bwd, F(r, X6), F(r, X3), r->b[X1].d, d[0], d[1], 1.0f);
}

/* conv2d: 0 x, 1 w, 2 dy, 3 y, 4 dx, 5 dw */
static struct dt_conv2d_shape conv_shape(const int *d)
{
    struct dt_conv2d_shape s = {d[0], d[1], d[2],  d[3],  d[4],  d[5],  d[6], d[7],
                                d[8], d[9], d[10], d[11], d[12], d[13], 0,    0};
    s.P = dt_conv_out_dim(s.H, s.pad_h, s.dil_h, s.R, s.stride_h);
    s.Q = dt_conv_out_dim(s.W, s.pad_w, s.dil_w, s.S, s.stride_w);
    return s;
}
static void conv_setup(struct run *r)
{
    struct dt_conv2d_shape s = conv_shape(r->c->dims);
    size_t nx = (size_t)s.N * s.C * s.H * s.W, ny = (size_t)s.N * s.K * s.P * s.Q;
    buf(r, "x", IN, F32, nx, UNIFORM);
    buf(r, "w", IN, F32, (size_t)s.K * (s.C / s.groups) * s.R * s.S, UNIFORM);
    int R = buf(r, "dy", CONST, F32, ny, UNIFORM);
    out_r(r, "y", ny, R);
    grad(r, "dx", GRAD_W, X0);
    grad(r, "dw", GRAD_P, X1);
}
static void conv_fwd(struct run *r)
{
    struct dt_conv2d_shape s = conv_shape(r->c->dims);
    void *ws = workspace(r, &s);
    CALL(r, conv2d_fwd, F(r, X3), F(r, X0), F(r, X1), &s, ws, r->ws_bytes);
}
static void conv_bwd(struct run *r)
{
    struct dt_conv2d_shape s = conv_shape(r->c->dims);
    void *ws = workspace(r, &s);
    CALL(r, conv2d_bwd_data, F(r, X4), F(r, X2), F(r, X1), &s, ws, r->ws_bytes);
    CALL(r, conv2d_bwd_filter, F(r, X5), F(r, X2), F(r, X0), &s, ws, r->ws_bytes);
}

/* pooling: 0 x, 1 dy, 2 y, 3 dx */
static struct dt_pool2d_shape pool_shape(const int *d)
{
    struct dt_pool2d_shape s = {d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], 0, 0};
    s.P = dt_conv_out_dim(s.H, s.pad_h, 1, s.R, s.stride_h);
    s.Q = dt_conv_out_dim(s.W, s.pad_w, 1, s.S, s.stride_w);
    return s;
}
static void pool_setup(struct run *r)
{
    struct dt_pool2d_shape s = pool_shape(r->c->dims);
    size_t nx = (size_t)s.N * s.C * s.H * s.W, ny = (size_t)s.N * s.C * s.P * s.Q;
    /* distinct, spaced values: no max changes under a finite-difference step */
    buf(r, "x", IN, F32, nx, r->c->op == DT_OP_maxpool2d_fwd ? DISTINCT : UNIFORM);
    int R = buf(r, "dy", CONST, F32, ny, UNIFORM);
    out_r(r, "y", ny, R);
    grad(r, "dx", GRAD_W, X0);
}
static void pool_fwd(struct run *r)
{
    struct dt_pool2d_shape s = pool_shape(r->c->dims);
    if (r->c->op == DT_OP_maxpool2d_fwd)
        CALL(r, maxpool2d_fwd, F(r, X2), F(r, X0), &s);
    else
        CALL(r, avgpool2d_fwd, F(r, X2), F(r, X0), &s);
}
static void pool_bwd(struct run *r)
{
    struct dt_pool2d_shape s = pool_shape(r->c->dims);
    if (r->c->op == DT_OP_maxpool2d_fwd)
        CALL(r, maxpool2d_bwd, F(r, X3), F(r, X1), F(r, X0), F(r, X2), &s);
    else
        CALL(r, avgpool2d_bwd, F(r, X3), F(r, X1), &s);
}

/* batchnorm (training), this rank and one stand-in for all the others
 * (their data x2, output gradient dy2; their sums are ranks-1 times x2's):
 * 0 x, 1 gamma, 2 beta, 3 x2, 4 dy, 5 dy2, 6 rm0, 7 rv0, 8 stats, 9 stats2,
 * 10 y, 11 mean, 12 invstd, 13 rm, 14 rv, 15 y2, 16 dstats, 17 dstats2,
 * 18 dx, 19 dgamma, 20 dbeta, 21 dx2, 22 dstats_global */
#define BN_MOMENTUM 0.1f
#define BN_EPS 1e-5f
static void bn_setup(struct run *r)
{
    const int *d = r->c->dims;
    size_t n = (size_t)d[0] * d[1] * d[2], C = d[1];
    buf(r, "x", IN, F32, n, UNIFORM);
    buf(r, "gamma", IN, F32, C, POSITIVE);
    buf(r, "beta", IN, F32, C, UNIFORM);
    buf(r, "x2", CONST, F32, n, UNIFORM);
    int R = buf(r, "dy", CONST, F32, n, UNIFORM);
    int R2 = buf(r, "dy2", CONST, F32, n, UNIFORM);
    buf(r, "rm0", CONST, F32, C, UNIFORM);
    buf(r, "rv0", CONST, F32, C, POSITIVE);
    buf(r, "stats", OUT, F64, 2 * C, ZERO);
    buf(r, "stats2", OUT, F64, 2 * C, ZERO);
    out_r(r, "y", n, R);
    buf(r, "mean", OUT, F32, C, ZERO);
    buf(r, "invstd", OUT, F32, C, ZERO);
    buf(r, "running_mean", OUT, F32, C, ZERO);
    buf(r, "running_var", OUT, F32, C, ZERO);
    int y2 = out_r(r, "y2", n, d[3] > 1 ? R2 : -1);
    r->b[y2].wt = d[3] > 1 ? d[3] - 1 : 1; /* every other rank's outputs count */
    buf(r, "dstats", OUT, F64, 2 * C, ZERO);
    buf(r, "dstats2", OUT, F64, 2 * C, ZERO);
    grad(r, "dx", GRAD_W, 0);
    grad(r, "dgamma", GRAD_P, 1);
    grad(r, "dbeta", GRAD_P, 2);
    buf(r, "dx2", OUT, F32, n, ZERO);
    buf(r, "dstats_global", OUT, F64, 2 * C, ZERO);
}

/* Sums of ranks-1 copies of slot `other` added to slot `own`, through the
 * host, as an all-reduce would. */
static void bn_allreduce(struct run *r, int own, int other, int ranks)
{
    download(r, own);
    download(r, other);
    if (r->failed)
        return;
    double *a = r->b[own].h, *b = r->b[other].h;
    for (size_t i = 0; i < r->b[own].n; i++)
        a[i] += (ranks - 1) * b[i];
    upload(r, own);
}

static void bn_fwd(struct run *r)
{
    const int *d = r->c->dims;
    int N = d[0], C = d[1], HW = d[2], ranks = d[3] > 1 ? d[3] : 1, relu = d[4];
    double count = (double)ranks * N * HW;
    CALL(r, batchnorm_stats, D(r, 8), F(r, 0), N, C, HW);
    CALL(r, batchnorm_stats, D(r, 9), F(r, 3), N, C, HW);
    if (ranks > 1)
        bn_allreduce(r, 8, 9, ranks);
    copy_d2d(r, 13, 6);
    copy_d2d(r, 14, 7);
    CALL(r, batchnorm_fwd, F(r, 10), F(r, 11), F(r, 12), F(r, 13), F(r, 14), F(r, 0), D(r, 8),
         count, F(r, 1), F(r, 2), BN_EPS, BN_MOMENTUM, N, C, HW, relu);
    if (ranks > 1) /* the other ranks' outputs, same statistics, no running update */
        CALL(r, batchnorm_fwd, F(r, 15), F(r, 11), F(r, 12), NULL, NULL, F(r, 3), D(r, 8), count,
             F(r, 1), F(r, 2), BN_EPS, BN_MOMENTUM, N, C, HW, relu);
}

/* The loss counts the other ranks' outputs ranks-1 times. */
static void bn_bwd(struct run *r)
{
    const int *d = r->c->dims;
    int N = d[0], C = d[1], HW = d[2], ranks = d[3] > 1 ? d[3] : 1;
    double count = (double)ranks * N * HW;
    /* with the ReLU fused: the outputs, where the output gradients count */
    const float *y = d[4] ? F(r, 10) : NULL, *y2 = d[4] ? F(r, 15) : NULL;
    CALL(r, batchnorm_bwd_reduce, D(r, 16), F(r, 4), F(r, 0), F(r, 11), F(r, 12), y, N, C, HW);
    if (ranks == 1) {
        CALL(r, batchnorm_bwd, F(r, 18), F(r, 19), F(r, 20), F(r, 4), F(r, 0), F(r, 11), F(r, 12),
             F(r, 1), D(r, 16), D(r, 16), count, y, N, C, HW);
        return;
    }
    CALL(r, batchnorm_bwd_reduce, D(r, 17), F(r, 5), F(r, 3), F(r, 11), F(r, 12), y2, N, C, HW);
    /* global = local + (ranks-1) * other */
    download(r, 16);
    download(r, 17);
    if (r->failed)
        return;
    double *g = r->b[22].h, *l = r->b[16].h, *o = r->b[17].h;
    for (int i = 0; i < 2 * C; i++)
        g[i] = l[i] + (ranks - 1) * o[i];
    upload(r, 22);
    CALL(r, batchnorm_bwd, F(r, 18), F(r, 19), F(r, 20), F(r, 4), F(r, 0), F(r, 11), F(r, 12),
         F(r, 1), D(r, 16), D(r, 22), count, y, N, C, HW);
    /* the other ranks' parameter gradients: ranks-1 times their local sums */
    for (int k = 1; k < ranks; k++)
        CALL(r, batchnorm_bwd, F(r, 21), F(r, 19), F(r, 20), F(r, 5), F(r, 3), F(r, 11), F(r, 12),
             F(r, 1), D(r, 17), D(r, 22), count, y2, N, C, HW);
}

/* batchnorm_infer: 0 x, 1 rm, 2 rv, 3 gamma, 4 beta, 5 y */
static void bni_setup(struct run *r)
{
    const int *d = r->c->dims;
    size_t n = (size_t)d[0] * d[1] * d[2], C = d[1];
    buf(r, "x", CONST, F32, n, UNIFORM);
    buf(r, "running_mean", CONST, F32, C, UNIFORM);
    buf(r, "running_var", CONST, F32, C, POSITIVE);
    buf(r, "gamma", CONST, F32, C, POSITIVE);
    buf(r, "beta", CONST, F32, C, UNIFORM);
    buf(r, "y", OUT, F32, n, ZERO);
}
static void bni_fwd(struct run *r)
{
    const int *d = r->c->dims;
    CALL(r, batchnorm_infer, F(r, 5), F(r, 0), F(r, 1), F(r, 2), F(r, 3), F(r, 4), BN_EPS, d[0],
         d[1], d[2], d[3]);
}

/* layernorm: 0 x, 1 gamma, 2 beta, 3 dy, 4 y, 5 mean, 6 rstd, 7 dx,
 * 8 dgamma, 9 dbeta */
static void ln_setup(struct run *r)
{
    const int *d = r->c->dims;
    size_t n = (size_t)d[0] * d[1];
    buf(r, "x", IN, F32, n, UNIFORM);
    buf(r, "gamma", IN, F32, (size_t)d[1], POSITIVE);
    buf(r, "beta", IN, F32, (size_t)d[1], UNIFORM);
    int R = buf(r, "dy", CONST, F32, n, UNIFORM);
    out_r(r, "y", n, R);
    buf(r, "mean", OUT, F32, (size_t)d[0], ZERO);
    buf(r, "rstd", OUT, F32, (size_t)d[0], ZERO);
    grad(r, "dx", GRAD_W, 0);
    grad(r, "dgamma", GRAD_P, 1);
    grad(r, "dbeta", GRAD_P, 2);
}
static void ln_fwd(struct run *r)
{
    const int *d = r->c->dims;
    CALL(r, layernorm_fwd, F(r, 4), F(r, 5), F(r, 6), F(r, 0), F(r, 1), F(r, 2), BN_EPS, d[0],
         d[1]);
}
static void ln_bwd(struct run *r)
{
    const int *d = r->c->dims;
    CALL(r, layernorm_bwd, F(r, 7), F(r, 8), F(r, 9), F(r, 3), F(r, 0), F(r, 5), F(r, 6), F(r, 1),
         d[0], d[1]);
}

/* rmsnorm: 0 x, 1 gamma, 2 dy, 3 y, 4 rstd, 5 dx, 6 dgamma */
static void rms_setup(struct run *r)
{
    const int *d = r->c->dims;
    size_t n = (size_t)d[0] * d[1];
    buf(r, "x", IN, F32, n, UNIFORM);
    buf(r, "gamma", IN, F32, (size_t)d[1], POSITIVE);
    int R = buf(r, "dy", CONST, F32, n, UNIFORM);
    out_r(r, "y", n, R);
    buf(r, "rstd", OUT, F32, (size_t)d[0], ZERO);
    grad(r, "dx", GRAD_W, 0);
    grad(r, "dgamma", GRAD_P, 1);
}
static void rms_fwd(struct run *r)
{
    const int *d = r->c->dims;
    CALL(r, rmsnorm_fwd, F(r, 3), F(r, 4), F(r, 0), F(r, 1), BN_EPS, d[0], d[1]);
}
static void rms_bwd(struct run *r)
{
    const int *d = r->c->dims;
    CALL(r, rmsnorm_bwd, F(r, 5), F(r, 6), F(r, 2), F(r, 0), F(r, 4), F(r, 1), d[0], d[1]);
}

/* embedding: 0 ids, 1 w, 2 dy, 3 y, 4 dw */
static void emb_setup(struct run *r)
{
    const int *d = r->c->dims;
    size_t N = d[0], V = d[1], D = d[2];
    int ids = buf(r, "ids", CONST, F32, N, LABELS);
    r->b[ids].aux = d[1];
    buf(r, "w", IN, F32, V * D, UNIFORM);
    int R = buf(r, "dy", CONST, F32, N * D, UNIFORM);
    out_r(r, "y", N * D, R);
    grad(r, "dw", GRAD_P, X1);
}
static void emb_fwd(struct run *r)
{
    const int *d = r->c->dims;
    CALL(r, embedding_fwd, F(r, X3), F(r, X0), F(r, X1), d[0], d[1], d[2]);
}
static void emb_bwd(struct run *r)
{
    const int *d = r->c->dims;
    CALL(r, embedding_bwd, F(r, X4), F(r, X2), F(r, X0), d[0], d[1], d[2]);
}

/* attention (dims B, T, H, Dh, causal): 0 qkv, 1 dy, 2 y, 3 lse, 4 dqkv */
static void *attn_workspace(struct run *r)
{
    const int *d = r->c->dims;
    size_t need = 0;
    CALL(r, attention_workspace, d[0], d[1], d[2], d[3], d[4], &need);
    return grow_workspace(r, need);
}
static void attn_setup(struct run *r)
{
    const int *d = r->c->dims;
    size_t n = (size_t)d[0] * d[1] * d[2] * d[3];
    buf(r, "qkv", IN, F32, 3 * n, UNIFORM);
    int R = buf(r, "dy", CONST, F32, n, UNIFORM);
    out_r(r, "y", n, R);
    buf(r, "lse", OUT, F32, (size_t)d[0] * d[2] * d[1], ZERO);
    grad(r, "dqkv", GRAD_W, X0);
}
static void attn_fwd(struct run *r)
{
    const int *d = r->c->dims;
    void *ws = attn_workspace(r);
    CALL(r, attention_fwd, F(r, X2), F(r, X3), F(r, X0), d[0], d[1], d[2], d[3], d[4], ws,
         r->ws_bytes);
}
static void attn_bwd(struct run *r)
{
    const int *d = r->c->dims;
    void *ws = attn_workspace(r);
    CALL(r, attention_bwd, F(r, X4), F(r, X1), F(r, X0), F(r, X2), F(r, X3), d[0], d[1], d[2], d[3],
         d[4], ws, r->ws_bytes);
}

/* one runner per row of DT_UNARY_LIST */
#define ACT_RUNNER(a, name, s, forward, gradient, cpu, doc)                                        \
    {DT_OP_##name##_fwd, NEEDS(DT_OP_##name##_fwd, DT_OP_##name##_bwd), act_setup, act_fwd,        \
     act_bwd},

static const struct runner runners[] = {
    {DT_OP_linear_fwd, NEEDS(DT_OP_linear_fwd, DT_OP_linear_bwd), linear_setup, linear_fwd,
     linear_bwd},
    {DT_OP_bias_fwd, NEEDS(DT_OP_bias_fwd, DT_OP_bias_bwd), bias_setup, bias_fwd, bias_bwd},
    {DT_OP_channel_bias_fwd, NEEDS(DT_OP_channel_bias_fwd, DT_OP_channel_bias_bwd), bias_setup,
     bias_fwd, bias_bwd},
    // clang-format off
    DT_UNARY_LIST(ACT_RUNNER, _)
    {DT_OP_add, NEEDS(DT_OP_add), sum_setup, sum_fwd, NULL},
    // clang-format on
    {DT_OP_accumulate, NEEDS(DT_OP_accumulate), sum_setup, sum_fwd, NULL},
    {DT_OP_softmax_xent_fwd, NEEDS(DT_OP_softmax_xent_fwd, DT_OP_softmax_xent_bwd), xent_setup,
     xent_fwd, xent_bwd},
    {DT_OP_conv2d_fwd,
     NEEDS(DT_OP_conv2d_workspace, DT_OP_conv2d_fwd, DT_OP_conv2d_bwd_data,
           DT_OP_conv2d_bwd_filter),
     conv_setup, conv_fwd, conv_bwd},
    {DT_OP_maxpool2d_fwd, NEEDS(DT_OP_maxpool2d_fwd, DT_OP_maxpool2d_bwd), pool_setup, pool_fwd,
     pool_bwd},
    {DT_OP_avgpool2d_fwd, NEEDS(DT_OP_avgpool2d_fwd, DT_OP_avgpool2d_bwd), pool_setup, pool_fwd,
     pool_bwd},
    {DT_OP_batchnorm_fwd,
     NEEDS(DT_OP_batchnorm_stats, DT_OP_batchnorm_fwd, DT_OP_batchnorm_bwd_reduce,
           DT_OP_batchnorm_bwd),
     bn_setup, bn_fwd, bn_bwd},
    {DT_OP_batchnorm_infer, NEEDS(DT_OP_batchnorm_infer), bni_setup, bni_fwd, NULL},
    {DT_OP_layernorm_fwd, NEEDS(DT_OP_layernorm_fwd, DT_OP_layernorm_bwd), ln_setup, ln_fwd,
     ln_bwd},
    {DT_OP_rmsnorm_fwd, NEEDS(DT_OP_rmsnorm_fwd, DT_OP_rmsnorm_bwd), rms_setup, rms_fwd, rms_bwd},
    {DT_OP_embedding_fwd, NEEDS(DT_OP_embedding_fwd, DT_OP_embedding_bwd), emb_setup, emb_fwd,
     emb_bwd},
    {DT_OP_attention_fwd,
     NEEDS(DT_OP_attention_workspace, DT_OP_attention_fwd, DT_OP_attention_bwd), attn_setup,
     attn_fwd, attn_bwd},
};

static const struct runner *runner_of(const struct dt_op_case *c)
{
    for (size_t i = 0; i < sizeof runners / sizeof runners[0]; i++)
        if (runners[i].op == c->op)
            return &runners[i];
    return NULL;
}

/* ---- the cases ------------------------------------------------------- */

#define CONV(N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, g)                                       \
    {                                                                                              \
        N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, g                                             \
    }

const struct dt_op_case dt_op_cases[] = {
    {"linear 5x7->3", DT_OP_linear_fwd, {5, 7, 3}, 1e-5},
    {"linear 17x33->9", DT_OP_linear_fwd, {17, 33, 9}, 1e-5},
    /* the quick-start MLP's last layer: a product OpenBLAS gives to its
     * small-matrix kernels, whose sums change when it is cut into blocks */
    {"linear 128x512->10", DT_OP_linear_fwd, {128, 512, 10}, 1e-5},
    {"linear 5x7->3 with bias", DT_OP_linear_fwd, {5, 7, 3, 1}, 1e-5},
    {"linear 128x512->10 with bias", DT_OP_linear_fwd, {128, 512, 10, 1}, 1e-5},
    /* big enough to be cut across threads, each block starting from the bias */
    {"linear 300x130->260 with bias", DT_OP_linear_fwd, {300, 130, 260, 1}, 1e-5},
    /* from 512 rows on, the own product tiles where the CPU runs them
     * (kernels/cpu/gemm_tiles.c): rows past the last 6, columns past the
     * last 16, K and N each in two blocks; the forward and the input
     * gradient */
    {"linear 515x300->270", DT_OP_linear_fwd, {515, 300, 270}, 1e-5},
    {"linear 515x300->270 with bias", DT_OP_linear_fwd, {515, 300, 270, 1}, 1e-5},
    {"linear 512x16->33 with bias", DT_OP_linear_fwd, {512, 16, 33, 1}, 1e-5},
    /* a short batch against a wide layer: the same tiles with the
     * product transposed (the weights' rows the tall side); the batch's
     * last panel of 16 partial, outputs past the last 6, inputs in two
     * blocks; 8 rows: less than one panel */
    {"linear 40x400->389 with bias", DT_OP_linear_fwd, {40, 400, 389, 1}, 1e-5},
    {"linear 8x390->400", DT_OP_linear_fwd, {8, 390, 400}, 1e-5},
    {"bias 6x19", DT_OP_bias_fwd, {6, 19}, 1e-6},
    {"bias 300x777 (row tiles, the last ones partial)", DT_OP_bias_fwd, {300, 777}, 1e-5},
    {"bias 8200x33 (row tiles wider than 128 rows)", DT_OP_bias_fwd, {8200, 33}, 1e-5},
    {"relu 100", DT_OP_relu_fwd, {100}, 1e-6},
    {"gelu 100", DT_OP_gelu_fwd, {100}, 1e-6},
    {"gelu_tanh 100", DT_OP_gelu_tanh_fwd, {100}, 1e-6},
    {"tanh 100", DT_OP_tanh_fwd, {100}, 1e-6},
    {"silu 100", DT_OP_silu_fwd, {100}, 1e-6},
    {"softmax_xent 7x10", DT_OP_softmax_xent_fwd, {7, 10}, 1e-5},
    {"channel_bias 3x5x7", DT_OP_channel_bias_fwd, {3, 5, 7}, 1e-6},
    {"channel_bias 2x4x50", DT_OP_channel_bias_fwd, {2, 4, 50}, 1e-6},
    {"channel_bias 2x3x300 (planes wider than a block)", DT_OP_channel_bias_fwd, {2, 3, 300}, 1e-6},
    {"channel_bias 5x7x1 (planes narrower than a warp)", DT_OP_channel_bias_fwd, {5, 7, 1}, 1e-6},
    {"channel_bias 64x600x1 (more planes than the grid's threads)",
     DT_OP_channel_bias_fwd,
     {64, 600, 1},
     1e-6},
    {"add 37", DT_OP_add, {37}, 0.0},
    {"accumulate 53", DT_OP_accumulate, {53}, 0.0},
    {"conv 3x3 pad 1", DT_OP_conv2d_fwd, CONV(2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1), 1e-5},
    {"conv 3x2 stride 2x1 pad 0x1", DT_OP_conv2d_fwd,
     CONV(2, 2, 9, 7, 3, 3, 2, 2, 1, 0, 1, 1, 1, 1), 1e-5},
    {"conv 3x3 dilation 2 pad 2", DT_OP_conv2d_fwd, CONV(1, 2, 8, 9, 3, 3, 3, 1, 1, 2, 2, 2, 2, 1),
     1e-5},
    {"conv 5x5 stride 2 pad 2", DT_OP_conv2d_fwd, CONV(2, 2, 11, 10, 3, 5, 5, 2, 2, 2, 2, 1, 1, 1),
     1e-5},
    {"conv groups 2", DT_OP_conv2d_fwd, CONV(2, 4, 6, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2), 1e-5},
    {"conv depthwise", DT_OP_conv2d_fwd, CONV(2, 3, 7, 7, 3, 3, 3, 1, 1, 1, 1, 1, 1, 3), 1e-5},
    /* depthwise at vertical stride 1: by rows, the products by hand */
    {"conv depthwise x2 by taps", DT_OP_conv2d_fwd, CONV(3, 4, 9, 11, 8, 3, 3, 1, 1, 1, 1, 1, 1, 4),
     1e-5},
    {"conv depthwise 5x5 dilation 2 by taps", DT_OP_conv2d_fwd,
     CONV(2, 3, 12, 13, 3, 5, 5, 1, 1, 0, 0, 2, 2, 3), 1e-5},
    {"conv depthwise horizontal stride 2 pad 2 by taps", DT_OP_conv2d_fwd,
     CONV(2, 2, 8, 21, 2, 3, 3, 1, 2, 2, 2, 1, 1, 2), 1e-5},
    {"conv depthwise 11 images by taps", DT_OP_conv2d_fwd,
     CONV(11, 2, 6, 6, 2, 3, 3, 1, 1, 1, 1, 1, 1, 2), 1e-5},
    {"conv depthwise x2 stride 2", DT_OP_conv2d_fwd, CONV(1, 3, 8, 8, 6, 3, 3, 2, 2, 1, 1, 1, 1, 3),
     1e-5},
    /* "same" convolutions with no more output channels than input ones */
    {"conv 3x3 same, 5 -> 4 channels", DT_OP_conv2d_fwd,
     CONV(3, 5, 6, 7, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1), 1e-5},
    {"conv 5x5 same, 4 -> 4 channels", DT_OP_conv2d_fwd,
     CONV(2, 4, 8, 6, 4, 5, 5, 1, 1, 2, 2, 1, 1, 1), 1e-5},
    /* more images than a chunk of the filter gradient (8), the last chunk
     * short */
    {"conv 11 images of 5x5", DT_OP_conv2d_fwd, CONV(11, 3, 5, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1),
     1e-5},
    {"conv 11 images of 10x10 groups 2", DT_OP_conv2d_fwd,
     CONV(11, 4, 10, 10, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2), 1e-5},
    /* direct on the CPU (stride 1, "same" padding): the last tiles of 4
     * filters or channels and of 3 vectors of positions cut short, the
     * filter gradient's tiles of 16 filters too, filters up to 7x7 */
    {"conv 3x3 same direct, 16 -> 20 channels, 14x14", DT_OP_conv2d_fwd,
     CONV(2, 16, 14, 14, 20, 3, 3, 1, 1, 1, 1, 1, 1, 1), 1e-5},
    {"conv 3x3 same direct, 7 -> 9 channels, 5x13", DT_OP_conv2d_fwd,
     CONV(3, 7, 5, 13, 9, 3, 3, 1, 1, 1, 1, 1, 1, 1), 1e-5},
    {"conv 3x3 same direct, 37 -> 24 channels, 7x7", DT_OP_conv2d_fwd,
     CONV(2, 37, 7, 7, 24, 3, 3, 1, 1, 1, 1, 1, 1, 1), 1e-5},
    {"conv 1x3 same direct", DT_OP_conv2d_fwd, CONV(2, 5, 4, 9, 6, 1, 3, 1, 1, 0, 1, 1, 1, 1),
     1e-5},
    {"conv 5x5 same direct, 1 wide", DT_OP_conv2d_fwd,
     CONV(2, 3, 6, 1, 5, 5, 5, 1, 1, 2, 2, 1, 1, 1), 1e-5},
    {"conv 7x7 same direct, groups 2", DT_OP_conv2d_fwd,
     CONV(2, 6, 9, 8, 10, 7, 7, 1, 1, 3, 3, 1, 1, 2), 1e-5},
    /* lowered by rows on the CPU (vertical stride 1, at least 16 channels
     * times filter columns per group) */
    {"conv 3x3 same by rows, 6 -> 5 channels", DT_OP_conv2d_fwd,
     CONV(3, 6, 6, 7, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1), 1e-5},
    {"conv 3x3 by rows, dilation 2 pad 2", DT_OP_conv2d_fwd,
     CONV(2, 8, 8, 9, 3, 3, 3, 1, 1, 2, 2, 2, 2, 1), 1e-5},
    {"conv 3x3 by rows, stride 1x2", DT_OP_conv2d_fwd,
     CONV(2, 6, 7, 9, 4, 3, 3, 1, 2, 1, 1, 1, 1, 1), 1e-5},
    {"conv 3x3 by rows, pad 0x1 (output less tall)", DT_OP_conv2d_fwd,
     CONV(2, 6, 6, 5, 3, 3, 3, 1, 1, 0, 1, 1, 1, 1), 1e-5},
    {"conv 3x3 by rows, pad 2x1 (output taller)", DT_OP_conv2d_fwd,
     CONV(1, 6, 5, 6, 2, 3, 3, 1, 1, 2, 1, 1, 1, 1), 1e-5},
    {"conv 3x3 by rows, 11 images, groups 2", DT_OP_conv2d_fwd,
     CONV(11, 12, 6, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2), 1e-5},
    {"conv 3x3 by rows, stride 1x2, 20 outputs a row", DT_OP_conv2d_fwd,
     CONV(2, 6, 5, 40, 3, 3, 3, 1, 2, 1, 1, 1, 1, 1), 1e-5},
    {"conv 3x3 stride 2, 6 channels", DT_OP_conv2d_fwd,
     CONV(2, 6, 9, 23, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1), 1e-5},
    {"conv 5x5 stride 3x2 pad 2", DT_OP_conv2d_fwd,
     CONV(1, 4, 11, 10, 3, 5, 5, 3, 2, 2, 2, 1, 1, 1), 1e-5},
    {"conv 3x3 stride 2x1, dilation 2x1", DT_OP_conv2d_fwd,
     CONV(2, 8, 10, 9, 3, 3, 3, 2, 1, 2, 1, 2, 1, 1), 1e-5},
    /* stride 2, output half the input each way: im2col through the phases */
    {"conv 3x3 stride 2 pad 1, phases", DT_OP_conv2d_fwd,
     CONV(2, 3, 8, 10, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1), 1e-5},
    {"conv 5x5 stride 2 pad 2, phases", DT_OP_conv2d_fwd,
     CONV(1, 2, 12, 6, 3, 5, 5, 2, 2, 2, 2, 1, 1, 1), 1e-5},
    {"conv 4x4 stride 2 pad 1, phases", DT_OP_conv2d_fwd,
     CONV(2, 2, 8, 8, 3, 4, 4, 2, 2, 1, 1, 1, 1, 1), 1e-5},
    {"conv 3x3 stride 2 pad 1, phases, 28 wide", DT_OP_conv2d_fwd,
     CONV(2, 3, 6, 28, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1), 1e-5},
    {"conv 3x3 stride 2 pad 1, phases, groups 2", DT_OP_conv2d_fwd,
     CONV(2, 4, 8, 8, 4, 3, 3, 2, 2, 1, 1, 1, 1, 2), 1e-5},
    /* stride 2 with output rows of more than one vector */
    {"conv 3x3 stride 2, 12 outputs a row", DT_OP_conv2d_fwd,
     CONV(2, 3, 9, 23, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1), 1e-5},
    {"conv 1x1 stride 2, 28 wide", DT_OP_conv2d_fwd, CONV(2, 4, 6, 28, 5, 1, 1, 2, 2, 0, 0, 1, 1, 1),
     1e-5},
    {"conv 1x1", DT_OP_conv2d_fwd, CONV(2, 5, 4, 6, 3, 1, 1, 1, 1, 0, 0, 1, 1, 1), 1e-5},
    {"conv 1x1 stride 2", DT_OP_conv2d_fwd, CONV(2, 3, 7, 5, 4, 1, 1, 2, 2, 0, 0, 1, 1, 1), 1e-5},
    {"conv stride 3 pad 1 (uneven)", DT_OP_conv2d_fwd,
     CONV(1, 2, 10, 8, 2, 3, 4, 3, 3, 1, 1, 1, 1, 1), 1e-5},
    {"conv 3x3 pad 0x1 (output as wide, less tall)", DT_OP_conv2d_fwd,
     CONV(2, 2, 6, 5, 3, 3, 3, 1, 1, 0, 1, 1, 1, 1), 1e-5},
    {"conv 3x3 pad 2x1 (output as wide, taller)", DT_OP_conv2d_fwd,
     CONV(1, 2, 5, 6, 2, 3, 3, 1, 1, 2, 1, 1, 1, 1), 1e-5},
    {"conv 3x1 pad 1x0", DT_OP_conv2d_fwd, CONV(2, 3, 5, 4, 2, 3, 1, 1, 1, 1, 0, 1, 1, 1), 1e-5},
    {"conv fashion-mnist first layer", DT_OP_conv2d_fwd,
     CONV(1, 1, 28, 28, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1), 1e-5},
    {"maxpool 2x2 stride 2", DT_OP_maxpool2d_fwd, {2, 3, 6, 8, 2, 2, 2, 2, 0, 0}, 0.0},
    {"maxpool 2x2 stride 2, odd edges", DT_OP_maxpool2d_fwd, {2, 2, 7, 9, 2, 2, 2, 2, 0, 0}, 0.0},
    {"maxpool 2x2 stride 2, 14 outputs a row", DT_OP_maxpool2d_fwd, {2, 3, 4, 28, 2, 2, 2, 2, 0, 0},
     0.0},
    {"maxpool 2x2 stride 2, 7 outputs a row", DT_OP_maxpool2d_fwd, {2, 3, 6, 15, 2, 2, 2, 2, 0, 0},
     0.0},
    {"maxpool 3x3 stride 2 pad 1 (overlap)",
     DT_OP_maxpool2d_fwd,
     {2, 2, 7, 9, 3, 3, 2, 2, 1, 1},
     0.0},
    {"maxpool 3x2 stride 1 (overlap)", DT_OP_maxpool2d_fwd, {1, 2, 5, 6, 3, 2, 1, 1, 0, 0}, 0.0},
    {"avgpool 2x2 stride 2", DT_OP_avgpool2d_fwd, {2, 3, 6, 8, 2, 2, 2, 2, 0, 0}, 1e-6},
    {"avgpool 3x3 stride 2 pad 1 (overlap)",
     DT_OP_avgpool2d_fwd,
     {2, 2, 7, 9, 3, 3, 2, 2, 1, 1},
     1e-6},
    {"global avgpool", DT_OP_avgpool2d_fwd, {3, 4, 5, 7, 5, 7, 1, 1, 0, 0}, 1e-5},
    {"global avgpool 8x8", DT_OP_avgpool2d_fwd, {2, 3, 8, 8, 8, 8, 1, 1, 0, 0}, 1e-5},
    {"batchnorm 4x3x5", DT_OP_batchnorm_fwd, {4, 3, 5, 1}, 1e-5},
    {"batchnorm 2x5x20 (HW not a lane multiple)", DT_OP_batchnorm_fwd, {2, 5, 21, 1}, 1e-5},
    {"batchnorm sync over 2 ranks", DT_OP_batchnorm_fwd, {3, 3, 6, 2}, 1e-5},
    {"batchnorm sync over 3 ranks", DT_OP_batchnorm_fwd, {2, 2, 17, 3}, 1e-5},
    {"batchnorm 2x3x300 (planes wider than a block)", DT_OP_batchnorm_fwd, {2, 3, 300, 1}, 1e-5},
    {"batchnorm 6x5x1 (planes narrower than a warp)", DT_OP_batchnorm_fwd, {6, 5, 1, 1}, 1e-5},
    {"batchnorm 64x600x1 (more planes than the grid's threads)",
     DT_OP_batchnorm_fwd,
     {64, 600, 1, 1},
     1e-5},
    {"batchnorm + relu 4x3x5", DT_OP_batchnorm_fwd, {4, 3, 5, 1, 1}, 1e-5},
    {"batchnorm + relu 2x3x300 (planes wider than a block)",
     DT_OP_batchnorm_fwd,
     {2, 3, 300, 1, 1},
     1e-5},
    {"batchnorm + relu sync over 3 ranks", DT_OP_batchnorm_fwd, {2, 2, 17, 3, 1}, 1e-5},
    {"batchnorm_infer 3x4x9", DT_OP_batchnorm_infer, {3, 4, 9}, 1e-6},
    {"batchnorm_infer 2x3x300", DT_OP_batchnorm_infer, {2, 3, 300}, 1e-6},
    {"batchnorm_infer + relu 2x3x300", DT_OP_batchnorm_infer, {2, 3, 300, 1}, 1e-6},
    {"layernorm 5x8", DT_OP_layernorm_fwd, {5, 8}, 1e-5},
    {"layernorm 3x37", DT_OP_layernorm_fwd, {3, 37}, 1e-5},
    {"layernorm 300x777 (row tiles, the last ones partial)", DT_OP_layernorm_fwd, {300, 777}, 1e-5},
    {"rmsnorm 5x8", DT_OP_rmsnorm_fwd, {5, 8}, 1e-5},
    {"rmsnorm 3x37", DT_OP_rmsnorm_fwd, {3, 37}, 1e-5},
    {"rmsnorm 2x300 (rows wider than a block)", DT_OP_rmsnorm_fwd, {2, 300}, 1e-5},
    {"rmsnorm 300x777 (row tiles, the last ones partial)", DT_OP_rmsnorm_fwd, {300, 777}, 1e-5},
    {"embedding 13 ids, 5x8 table (repeated ids)", DT_OP_embedding_fwd, {13, 5, 8}, 0.0},
    {"embedding 6 ids, 40x37 table", DT_OP_embedding_fwd, {6, 40, 37}, 0.0},
    {"attention 2x5 heads 2x8", DT_OP_attention_fwd, {2, 5, 2, 8, 0}, 1e-5},
    {"attention causal 2x5 heads 2x8", DT_OP_attention_fwd, {2, 5, 2, 8, 1}, 1e-5},
    {"attention causal T=1", DT_OP_attention_fwd, {3, 1, 2, 4, 1}, 1e-5},
    {"attention T=1", DT_OP_attention_fwd, {2, 1, 1, 3, 0}, 1e-5},
    {"attention Dh 5, 3 heads", DT_OP_attention_fwd, {1, 7, 3, 5, 0}, 1e-5},
    {"attention causal Dh 7", DT_OP_attention_fwd, {2, 9, 1, 7, 1}, 1e-5},
    {"attention causal T=70 (two query blocks)", DT_OP_attention_fwd, {1, 70, 2, 6, 1}, 1e-5},
    {"attention T=67 (two query blocks)", DT_OP_attention_fwd, {1, 67, 1, 4, 0}, 1e-5},
    /* a GPT's head widths (16 to 40 features), with query blocks and key
     * counts that are not multiples of 8 */
    {"attention causal T=70 heads 2x32", DT_OP_attention_fwd, {1, 70, 2, 32, 1}, 1e-5},
    {"attention T=37 Dh 40", DT_OP_attention_fwd, {2, 37, 1, 40, 0}, 1e-5},
    {"attention causal T=13 heads 3x16", DT_OP_attention_fwd, {2, 13, 3, 16, 1}, 1e-5},
    /* three query blocks of the own tiles (60, 60 and 10 rows), 130 keys
     * (past the last panel of 16 and the last tile of 6) */
    {"attention causal T=130 Dh 16 (three query blocks)", DT_OP_attention_fwd, {1, 130, 1, 16, 1},
     1e-5},
};
const int dt_op_ncases = sizeof dt_op_cases / sizeof dt_op_cases[0];

/* ---- machinery --------------------------------------------------------- */

static int supported(const struct dt_op_case *c, const struct runner *rn, dt_backend_t *be)
{
    for (const enum dt_op_id *op = rn->needs; *op != DT_OP_COUNT; op++)
        if (!dt_backend_supports(be, *op, DT_F32)) {
            printf("  %s: unsupported on %s (no %s)\n", c->name, dt_backend_name(be),
                   dt_op_name(*op));
            return 0;
        }
    return 1;
}

/* Sets up run r of case c on backend be (inputs drawn, uploaded). */
static int start(struct run *r, const struct dt_op_case *c, const struct runner *rn,
                 dt_backend_t *be)
{
    memset(r, 0, sizeof *r);
    r->c = c;
    r->be = be;
    r->o = dt_backend_ops(be);
    rn->setup(r);
    if (!alloc_all(r))
        return 0;
    for (int i = 0; i < r->nbuf; i++)
        if (r->b[i].kind == IN || r->b[i].kind == CONST)
            upload(r, i);
    return !r->failed;
}

/* Forward, then (when there is one) backward into gradient buffers
 * uploaded from their host contents; everything downloaded. */
static void forward_backward(struct run *r, const struct runner *rn)
{
    rn->fwd(r);
    if (rn->bwd) {
        for (int i = 0; i < r->nbuf; i++)
            if (r->b[i].kind == GRAD_W || r->b[i].kind == GRAD_P)
                upload(r, i);
        rn->bwd(r);
    }
    for (int i = 0; i < r->nbuf; i++)
        if (r->b[i].kind != IN && r->b[i].kind != CONST)
            download(r, i);
}

static double value(const struct buf *b, size_t i)
{
    return b->t == F64 ? ((const double *)b->h)[i] : ((const float *)b->h)[i];
}

/* max |a - b| / max |b| over a tensor; NaN counts as infinite */
static double tensor_err(const struct buf *a, const struct buf *b)
{
    double diff = 0.0, mag = 0.0;
    for (size_t i = 0; i < a->n; i++) {
        double x = value(a, i), y = value(b, i), d = fabs(x - y);
        if (isnan(d))
            return INFINITY;
        diff = d > diff ? d : diff;
        mag = fabs(y) > mag ? fabs(y) : mag;
    }
    return diff == 0.0 ? 0.0 : diff / (mag > 1e-30 ? mag : 1e-30);
}

int dt_op_case_kinked(const struct dt_op_case *c)
{
    return c->op == DT_OP_batchnorm_fwd && c->dims[4] != 0;
}

int dt_op_case_has_backward(const struct dt_op_case *c)
{
    const struct runner *rn = runner_of(c);
    return rn && rn->bwd;
}

int dt_op_case_calls(const struct dt_op_case *c, enum dt_op_id op)
{
    const struct runner *rn = runner_of(c);
    for (const enum dt_op_id *o = rn ? rn->needs : NULL; o && *o != DT_OP_COUNT; o++)
        if (*o == op) return 1;
    return 0;
}

int dt_op_case_compare(const struct dt_op_case *c, dt_backend_t *test, dt_backend_t *ref)
{
    const struct runner *rn = runner_of(c);
    if (!rn) {
        printf("  %s: no runner for op %s\n", c->name, dt_op_name(c->op));
        return 1;
    }
    if (!supported(c, rn, test) || !supported(c, rn, ref))
        return -1;
    struct run a, b;
    int bad = 0, ok_a = start(&a, c, rn, test), ok_b = start(&b, c, rn, ref);
    if (ok_a && ok_b) {
        forward_backward(&a, rn);
        forward_backward(&b, rn);
    }
    if (a.failed || b.failed) {
        bad = 1;
    } else {
        for (int i = 0; i < a.nbuf; i++) {
            if (a.b[i].kind == IN || a.b[i].kind == CONST)
                continue;
            double e = tensor_err(&a.b[i], &b.b[i]);
            if (!(e <= c->tol)) {
                printf("  %s: %s differs (%s vs %s): max rel err %.3g > %.3g\n", c->name,
                       a.b[i].name, dt_backend_name(test), dt_backend_name(ref), e, c->tol);
                bad++;
            }
        }
    }
    free_all(&a);
    free_all(&b);
    return bad;
}

/* L = sum over outputs with an R of sum(out * R), in double. */
static double loss(struct run *r, const struct runner *rn)
{
    rn->fwd(r);
    double L = 0.0;
    for (int i = 0; i < r->nbuf; i++) {
        struct buf *b = &r->b[i];
        if (b->kind != OUT || b->of < 0)
            continue;
        download(r, i);
        for (size_t e = 0; e < b->n; e++)
            L += b->wt * value(b, e) * value(&r->b[b->of], e);
    }
    return L;
}

int dt_op_case_gradcheck(const struct dt_op_case *c, dt_backend_t *be)
{
    const struct runner *rn = runner_of(c);
    if (!rn) {
        printf("  %s: no runner for op %s\n", c->name, dt_op_name(c->op));
        return 1;
    }
    if (!rn->bwd || dt_op_case_kinked(c))
        return 0;
    if (!supported(c, rn, be))
        return -1;
    struct run r;
    int bad = 0;
    if (start(&r, c, rn, be))
        forward_backward(&r, rn);
    for (int g = 0; g < r.nbuf && !r.failed; g++) {
        struct buf *gb = &r.b[g];
        if ((gb->kind != GRAD_W && gb->kind != GRAD_P) || gb->of < 0)
            continue;
        struct buf *xb = &r.b[gb->of];
        float *x = xb->h;
        size_t step = (xb->n + FD_MAX_ELEMS - 1) / FD_MAX_ELEMS;
        double worst = 0.0;
        size_t at = 0;
        for (size_t i = 0; i < xb->n && !r.failed; i += step) {
            float x0 = x[i];
            x[i] = (float)(x0 + FD_H);
            double xp = x[i];
            upload(&r, gb->of);
            double lp = loss(&r, rn);
            x[i] = (float)(x0 - FD_H);
            double xm = x[i];
            upload(&r, gb->of);
            double lm = loss(&r, rn);
            x[i] = x0;
            upload(&r, gb->of);
            double num = (lp - lm) / (xp - xm), an = ((float *)gb->h)[i];
            double m = fabs(num) > fabs(an) ? fabs(num) : fabs(an);
            double e = fabs(num - an) / (m > FD_FLOOR ? m : FD_FLOOR);
            if (!(e <= worst)) {
                worst = isnan(e) ? INFINITY : e;
                at = i;
            }
        }
        if (!(worst < FD_TOL)) {
            printf("  %s (%s): d/d%s = %s finite-difference rel err %.3g at element %zu\n", c->name,
                   dt_backend_name(be), xb->name, gb->name, worst, at);
            bad++;
        }
    }
    if (r.failed)
        bad++;
    free_all(&r);
    return bad;
}

int dt_op_case_conventions(const struct dt_op_case *c, dt_backend_t *be)
{
    const struct runner *rn = runner_of(c);
    if (!rn) {
        printf("  %s: no runner for op %s\n", c->name, dt_op_name(c->op));
        return 1;
    }
    if (!rn->bwd)
        return 0;
    if (!supported(c, rn, be))
        return -1;
    struct run a, b;
    int bad = 0, ok_a = start(&a, c, rn, be), ok_b = start(&b, c, rn, be);
    if (ok_a && ok_b) {
        forward_backward(&a, rn); /* gradients into zeros */
        for (int i = 0; i < b.nbuf; i++) {
            struct buf *g = &b.b[i];
            float *v = g->h;
            if (g->kind == GRAD_W)
                for (size_t e = 0; e < g->n; e++)
                    v[e] = e % 2 ? NAN : 1e30f;
            else if (g->kind == GRAD_P)
                for (size_t e = 0; e < g->n; e++)
                    v[e] = 0.25f * (float)(e % 7) - 0.75f;
        }
        forward_backward(&b, rn); /* written over junk, added to old values */
    }
    for (int i = 0; i < a.nbuf && !a.failed && !b.failed; i++) {
        struct buf *ga = &a.b[i], *gb = &b.b[i];
        if (ga->kind != GRAD_W && ga->kind != GRAD_P)
            continue;
        double worst = 0.0;
        for (size_t e = 0; e < ga->n; e++) {
            double want = value(ga, e) + (ga->kind == GRAD_P ? 0.25 * (double)(e % 7) - 0.75 : 0);
            double got = value(gb, e), m = fabs(want) > 1.0 ? fabs(want) : 1.0;
            double err = fabs(got - want) / m;
            if (!(err <= worst))
                worst = isnan(err) ? INFINITY : err;
        }
        if (!(worst <= (ga->kind == GRAD_P ? ACC_TOL : 0.0))) {
            printf("  %s (%s): %s is not %s (err %.3g)\n", c->name, dt_backend_name(be), ga->name,
                   ga->kind == GRAD_P ? "accumulated (+=)" : "written (=)", worst);
            bad++;
        }
    }
    if (a.failed || b.failed)
        bad++;
    free_all(&a);
    free_all(&b);
    return bad;
}
