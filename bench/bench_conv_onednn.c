/*
 * bench_conv_onednn.c - the CPU backend's convolutions at the shapes of
 * configs/fashion-mnist-resnet.yaml against oneDNN's (the library PyTorch's
 * CPU convolutions call), each pass timed in the same run:
 *   dtrain     the CPU backend as it runs (direct convolutions at stride 1
 *              on a CPU with AVX2 and FMA; rows or im2col, then OpenBLAS)
 *   lowered    the CPU backend with the direct convolution turned off: rows
 *              or im2col, then OpenBLAS, for every shape
 *   plain      oneDNN on NCHW and OIHW as they are
 *   blocked    oneDNN on the layouts it picks itself (channels in
 *              blocks), the operands already in them: what a runtime that
 *              kept its activations blocked would pay
 *   +reorder   blocked, plus the reorders of the operands from NCHW and of
 *              the result back: what PyTorch 1.13 pays for an NCHW tensor
 *
 *   bench_conv_onednn [BATCH [SECONDS]]   (defaults 128 0.3)
 * prints one line per shape and pass with milliseconds per call and
 * GFLOP/s, then the totals over one training step's convolutions (the
 * 16-channel 3x3 twice, the others once; the stem's 1-channel one is left
 * out). Threads: dtrain's backend runs one; oneDNN runs OMP_NUM_THREADS
 * (set it to 1 for the same footing). Built only where libdnnl-dev is
 * installed (bench/CMakeLists.txt); not part of dtrain.
 */
#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/clock.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"

#define MIN_CALLS 3

enum pass { FWD, BWD_DATA, BWD_FILTER, NPASS };
enum way { DTRAIN, LOWERED, PLAIN, BLOCKED, REORDER, NWAYS };
static const char *const pass_name[NPASS] = {"fwd", "bwd_data", "bwd_filter"};
static const char *const way_name[NWAYS] = {"dtrain", "lowered", "plain", "blocked",
                                            "+reorder"};

static dnnl_engine_t engine;
static dnnl_stream_t stream;

static void dnnl_must(dnnl_status_t st, const char *what)
{
    if (st != dnnl_success) {
        fprintf(stderr, "bench_conv_onednn: %s failed (oneDNN status %d)\n", what, (int)st);
        exit(70);
    }
}

static void dt_must(dt_status st)
{
    if (st != DT_OK) {
        fprintf(stderr, "bench_conv_onednn: %s\n", dt_last_error());
        exit(70);
    }
}

static void fill(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
}

static float *randbuf(size_t n)
{
    float *p = malloc(n * sizeof *p);
    if (!p) {
        fprintf(stderr, "bench_conv_onednn: out of memory\n");
        exit(70);
    }
    fill(p, n);
    return p;
}

static dnnl_memory_t new_mem(const dnnl_memory_desc_t *md)
{
    dnnl_memory_t m;
    void *p;
    dnnl_must(dnnl_memory_create(&m, md, engine, DNNL_MEMORY_ALLOCATE), "memory_create");
    dnnl_must(dnnl_memory_get_data_handle(m, &p), "memory_get_data_handle");
    fill(p, dnnl_memory_desc_get_size(md) / sizeof(float));
    return m;
}

/* One primitive's call with its arguments, or one reorder. */
struct step {
    dnnl_primitive_t prim;
    int nargs;
    dnnl_exec_arg_t args[3];
};

static struct step reorder_step(dnnl_memory_t from, dnnl_memory_t to)
{
    const dnnl_memory_desc_t *a, *b;
    dnnl_primitive_desc_t pd;
    struct step s = {.nargs = 2};
    dnnl_must(dnnl_memory_get_memory_desc(from, &a), "memory_get_memory_desc");
    dnnl_must(dnnl_memory_get_memory_desc(to, &b), "memory_get_memory_desc");
    dnnl_must(dnnl_reorder_primitive_desc_create(&pd, a, engine, b, engine, NULL),
              "reorder_primitive_desc_create");
    dnnl_must(dnnl_primitive_create(&s.prim, pd), "primitive_create (reorder)");
    dnnl_primitive_desc_destroy(pd);
    s.args[0] = (dnnl_exec_arg_t){DNNL_ARG_FROM, from};
    s.args[1] = (dnnl_exec_arg_t){DNNL_ARG_TO, to};
    return s;
}

/* Seconds per run of the steps in order, repeated for about `seconds`. */
static double time_steps(struct step *steps, int n, double seconds)
{
    int calls = 0;
    double t0 = dt_now(), t = t0;
    do {
        for (int i = 0; i < n; i++)
            dnnl_must(dnnl_primitive_execute(steps[i].prim, stream, steps[i].nargs, steps[i].args),
                      "primitive_execute");
        dnnl_must(dnnl_stream_wait(stream), "stream_wait");
        calls++;
        t = dt_now();
    } while (t - t0 < seconds || calls < MIN_CALLS);
    return (t - t0) / calls;
}

/* The pass's primitive descriptor on descriptors src, wei, dst (format
 * tags or any); hint: the forward's, for the backward passes. */
static dnnl_primitive_desc_t conv_pd(enum pass p, const dnnl_memory_desc_t *src,
                                     const dnnl_memory_desc_t *wei, const dnnl_memory_desc_t *dst,
                                     const struct dt_conv2d_shape *s, dnnl_primitive_desc_t hint)
{
    dnnl_dims_t strides = {s->stride_h, s->stride_w}, pad = {s->pad_h, s->pad_w};
    dnnl_convolution_desc_t d;
    dnnl_primitive_desc_t pd;
    if (p == FWD)
        dnnl_must(dnnl_convolution_forward_desc_init(&d, dnnl_forward_training,
                                                     dnnl_convolution_direct, src, wei, NULL, dst,
                                                     strides, pad, pad),
                  "convolution_forward_desc_init");
    else if (p == BWD_DATA)
        dnnl_must(dnnl_convolution_backward_data_desc_init(&d, dnnl_convolution_direct, src, wei,
                                                           dst, strides, pad, pad),
                  "convolution_backward_data_desc_init");
    else
        dnnl_must(dnnl_convolution_backward_weights_desc_init(&d, dnnl_convolution_direct, src,
                                                              wei, NULL, dst, strides, pad, pad),
                  "convolution_backward_weights_desc_init");
    dnnl_must(dnnl_primitive_desc_create(&pd, &d, NULL, engine, hint), "primitive_desc_create");
    return pd;
}

/* The argument names of the pass's (source, weights, destination) side. */
static void arg_names(enum pass p, int names[3], dnnl_query_t queries[3])
{
    static const int n[NPASS][3] = {{DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST},
                                    {DNNL_ARG_DIFF_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_DST},
                                    {DNNL_ARG_SRC, DNNL_ARG_DIFF_WEIGHTS, DNNL_ARG_DIFF_DST}};
    static const dnnl_query_t q[NPASS][3] = {
        {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md},
        {dnnl_query_diff_src_md, dnnl_query_weights_md, dnnl_query_diff_dst_md},
        {dnnl_query_src_md, dnnl_query_diff_weights_md, dnnl_query_diff_dst_md}};
    for (int i = 0; i < 3; i++)
        names[i] = n[p][i], queries[i] = q[p][i];
}

/* oneDNN's seconds per call of every pass, for one way (PLAIN, BLOCKED or
 * REORDER). The pass's output is the one operand reordered back. */
static void time_onednn(const struct dt_conv2d_shape *s, enum way w, double seconds,
                        double t[NPASS])
{
    dnnl_dims_t sd = {s->N, s->C, s->H, s->W}, wd = {s->K, s->C, s->R, s->S};
    dnnl_dims_t dd = {s->N, s->K, s->P, s->Q};
    const dnnl_dims_t *dims[3] = {&sd, &wd, &dd};
    const dnnl_format_tag_t plain_tag[3] = {dnnl_nchw, dnnl_oihw, dnnl_nchw};
    dnnl_memory_desc_t plain[3], chosen[3];
    for (int i = 0; i < 3; i++) {
        dnnl_must(dnnl_memory_desc_init_by_tag(&plain[i], 4, *dims[i], dnnl_f32, plain_tag[i]),
                  "memory_desc_init_by_tag");
        dnnl_must(dnnl_memory_desc_init_by_tag(&chosen[i], 4, *dims[i], dnnl_f32,
                                               w == PLAIN ? plain_tag[i] : dnnl_format_tag_any),
                  "memory_desc_init_by_tag");
    }
    dnnl_primitive_desc_t fwd = conv_pd(FWD, &chosen[0], &chosen[1], &chosen[2], s, NULL);
    for (int p = 0; p < NPASS; p++) {
        dnnl_primitive_desc_t pd =
            p == FWD ? fwd : conv_pd((enum pass)p, &chosen[0], &chosen[1], &chosen[2], s, fwd);
        int names[3];
        dnnl_query_t queries[3];
        arg_names((enum pass)p, names, queries);
        struct step steps[7];
        int n = 0, out = p == FWD ? 2 : p == BWD_DATA ? 0 : 1;
        struct step conv = {.nargs = 3};
        dnnl_memory_t mems[6] = {NULL};
        for (int i = 0; i < 3; i++) {
            dnnl_memory_t m = new_mem(dnnl_primitive_desc_query_md(pd, queries[i], 0));
            mems[i] = m;
            conv.args[i] = (dnnl_exec_arg_t){names[i], m};
            if (w == REORDER) {
                mems[3 + i] = new_mem(&plain[i]);
                if (i != out)
                    steps[n++] = reorder_step(mems[3 + i], m);
            }
        }
        dnnl_must(dnnl_primitive_create(&conv.prim, pd), "primitive_create (convolution)");
        steps[n++] = conv;
        if (w == REORDER)
            steps[n++] = reorder_step(mems[out], mems[3 + out]);
        t[p] = time_steps(steps, n, seconds);
        for (int i = 0; i < n; i++)
            dnnl_primitive_destroy(steps[i].prim);
        for (int i = 0; i < 6; i++)
            if (mems[i])
                dnnl_memory_destroy(mems[i]);
        if (p != FWD)
            dnnl_primitive_desc_destroy(pd);
    }
    dnnl_primitive_desc_destroy(fwd);
}

/* dtrain's CPU backend: seconds per call of every pass. */
static void time_dtrain(dt_backend_t *be, const struct dt_conv2d_shape *s, double seconds,
                        double t[NPASS])
{
    const struct dt_ops *o = dt_backend_ops(be);
    size_t nx = (size_t)s->N * s->C * s->H * s->W, ny = (size_t)s->N * s->K * s->P * s->Q;
    size_t nw = (size_t)s->K * s->C * s->R * s->S, wsb = 0;
    dt_must(o->conv2d_workspace(be, s, &wsb));
    float *x = randbuf(nx), *w = randbuf(nw), *y = randbuf(ny), *dx = randbuf(nx);
    float *dw = randbuf(nw), *ws = randbuf(wsb / sizeof(float) + 1);
    for (int p = 0; p < NPASS; p++) {
        int calls = 0;
        double t0 = dt_now(), now = t0;
        do {
            if (p == FWD)
                dt_must(o->conv2d_fwd(be, y, x, w, s, ws, wsb));
            else if (p == BWD_DATA)
                dt_must(o->conv2d_bwd_data(be, dx, y, w, s, ws, wsb));
            else
                dt_must(o->conv2d_bwd_filter(be, dw, y, x, s, ws, wsb));
            calls++;
            now = dt_now();
        } while (now - t0 < seconds || calls < MIN_CALLS);
        t[p] = (now - t0) / calls;
    }
    free(x), free(w), free(y), free(dx), free(dw), free(ws);
}

int main(int argc, char **argv)
{
    int batch = argc > 1 ? atoi(argv[1]) : 128;
    double seconds = argc > 2 ? atof(argv[2]) : 0.3;
    if (argc > 3 || batch < 1 || !(seconds > 0)) {
        fprintf(stderr, "usage: bench_conv_onednn [BATCH [SECONDS]]\n");
        return 64;
    }
    /* the ResNet's convolutions: C, K, H, stride, filter, padding, count */
    static const int layers[][7] = {{16, 16, 28, 1, 3, 1, 2}, {16, 32, 28, 2, 3, 1, 1},
                                    {32, 32, 14, 1, 3, 1, 1}, {32, 64, 14, 2, 3, 1, 1},
                                    {64, 64, 7, 1, 3, 1, 1},  {16, 32, 28, 2, 1, 0, 1},
                                    {32, 64, 14, 2, 1, 0, 1}};
    dt_backend_t *be = NULL;
    struct dt_backend_opts bo = {.threads = 1};
    dt_must(dt_backend_create("cpu", &bo, &be));
    dnnl_must(dnnl_engine_create(&engine, dnnl_cpu, 0), "engine_create");
    dnnl_must(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags), "stream_create");
    double total[NWAYS][NPASS] = {{0}};
    printf("batch %d; dtrain 1 thread, oneDNN %s thread(s)\n", batch,
           getenv("OMP_NUM_THREADS") ? getenv("OMP_NUM_THREADS") : "OMP_NUM_THREADS (unset)");
    for (size_t l = 0; l < sizeof layers / sizeof layers[0]; l++) {
        const int *L = layers[l];
        struct dt_conv2d_shape s = {batch, L[0], L[2], L[2], L[1], L[4], L[4], L[3], L[3],
                                    L[5], L[5], 1, 1, 1, 0, 0};
        s.P = dt_conv_out_dim(s.H, s.pad_h, 1, s.R, s.stride_h);
        s.Q = dt_conv_out_dim(s.W, s.pad_w, 1, s.S, s.stride_w);
        double flops = 2.0 * s.N * s.K * s.P * s.Q * s.C * s.R * s.S, t[NWAYS][NPASS];
        time_dtrain(be, &s, seconds, t[DTRAIN]);
        dt_cpu_conv_direct_pin(0);
        time_dtrain(be, &s, seconds, t[LOWERED]);
        dt_cpu_conv_direct_pin(1);
        for (int w = PLAIN; w < NWAYS; w++)
            time_onednn(&s, (enum way)w, seconds, t[w]);
        for (int p = 0; p < NPASS; p++) {
            printf("%2d -> %2d at %2dx%-2d stride %d %dx%d %-10s", s.C, s.K, s.H, s.W,
                   s.stride_h, s.R, s.S, pass_name[p]);
            for (int w = 0; w < NWAYS; w++) {
                printf("  %s %7.2f ms %5.1f GF", way_name[w], t[w][p] * 1e3,
                       flops / t[w][p] * 1e-9);
                total[w][p] += t[w][p] * L[6];
            }
            printf("\n");
        }
    }
    printf("one step's convolutions, ms (fwd / bwd_data / bwd_filter / all):\n");
    for (int w = 0; w < NWAYS; w++)
        printf("  %-9s %7.1f %7.1f %7.1f %8.1f   dtrain / this %.2f\n", way_name[w],
               total[w][FWD] * 1e3, total[w][BWD_DATA] * 1e3, total[w][BWD_FILTER] * 1e3,
               (total[w][FWD] + total[w][BWD_DATA] + total[w][BWD_FILTER]) * 1e3,
               (total[DTRAIN][FWD] + total[DTRAIN][BWD_DATA] + total[DTRAIN][BWD_FILTER]) /
                   (total[w][FWD] + total[w][BWD_DATA] + total[w][BWD_FILTER]));
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(engine);
    dt_backend_destroy(be);
    return 0;
}
