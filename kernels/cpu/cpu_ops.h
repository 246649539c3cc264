/*
 * cpu_ops.h - internal header of the CPU backend: every op of kernels/ops.h
 * in two versions, and the argument checks they share.
 *
 *   dt_cpu_<op>_ref  plain C that reads like the math; the reference the
 *                    fast path and the CUDA ops are tested against.
 *   dt_cpu_<op>      the fast path (BLAS for linear, blocked loops that the
 *                    compiler vectorises for the rest). Where nothing is
 *                    faster than the reference (libm-bound GELU and tanh,
 *                    softmax-xent backward), only the _ref exists and the
 *                    fast table points at it.
 *
 * backend_cpu.c puts one set or the other into the backend's op table
 * (dt_backend_opts.reference_kernels). Both sets check their arguments the
 * same way and fail with DT_ERR_INVALID_ARG naming the op.
 *
 * Gradients of parameters accumulate (+=); gradients of activations are
 * written (=). Elementwise ops accept out == in (in place); partially
 * overlapping buffers are not supported.
 */
#ifndef DT_CPU_OPS_H
#define DT_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include <string.h>

#include "../../runtime/core/bf16.h"
#include "../ops.h"

/* The fast loops work on blocks of this many floats (one cache line, one
 * AVX-512 register). A loop with a constant trip count that is a multiple
 * of the vector width is one GCC vectorises at -O2 (its "very cheap" cost
 * model), so the blocked loops need no -O3 and no intrinsics. */
#define DT_CPU_LANES 16

/* Returns DT_ERR_INVALID_ARG with "cpu <op>: <why>" when cond is false.
 * op and the format are string literals. */
#define DT_CPU_REQUIRE(cond, op, ...)                                                              \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return dt_set_error(DT_ERR_INVALID_ARG, "cpu " op ": " __VA_ARGS__);                   \
    } while (0)

/* Matmul operands at reduced precision (train.precision bf16/fp16): the
 * CPU rounds them to the nearest bf16/fp16 value (ties to even, overflow
 * to infinity) and multiplies those in fp32. The products of two bf16 or
 * fp16 values are exact in fp32, so this is what a GPU's tensor cores
 * compute, up to the order of the fp32 sums. */
static inline float dt_cpu_round_bf16(float x)
{
    return x != x ? x : dt_bf16_to_float(dt_bf16_from_float(x)); /* NaN stays as it is */
}

static inline float dt_cpu_round_fp16(float x) { return (float)(_Float16)x; }

/* Operand x (n floats) as the backend's precision has the GEMM see it:
 * x itself in fp32, else a rounded copy in the backend's scratch slot
 * `slot` (0..DT_CPU_OPERANDS-1), valid until the slot's next use. */
#define DT_CPU_OPERANDS 3
dt_status dt_cpu_operand(dt_backend_t *be, int slot, const float *x, size_t n, const float **out);

/* linear.c */
dt_status dt_cpu_linear_fwd_ref(dt_backend_t *be, float *out, const float *in, const float *w,
                                int B, int I, int O);
dt_status dt_cpu_linear_fwd(dt_backend_t *be, float *out, const float *in, const float *w, int B,
                            int I, int O);
dt_status dt_cpu_linear_bwd_ref(dt_backend_t *be, float *din, float *dw, const float *dout,
                                const float *in, const float *w, int B, int I, int O);
dt_status dt_cpu_linear_bwd(dt_backend_t *be, float *din, float *dw, const float *dout,
                            const float *in, const float *w, int B, int I, int O);
dt_status dt_cpu_bias_fwd_ref(dt_backend_t *be, float *x, const float *b, int B, int C);
dt_status dt_cpu_bias_fwd(dt_backend_t *be, float *x, const float *b, int B, int C);
dt_status dt_cpu_bias_bwd_ref(dt_backend_t *be, float *db, const float *dout, int B, int C);
dt_status dt_cpu_bias_bwd(dt_backend_t *be, float *db, const float *dout, int B, int C);

/* activation.c */
dt_status dt_cpu_relu_fwd_ref(dt_backend_t *be, float *out, const float *in, size_t n);
dt_status dt_cpu_relu_fwd(dt_backend_t *be, float *out, const float *in, size_t n);
dt_status dt_cpu_relu_bwd_ref(dt_backend_t *be, float *din, const float *dout, const float *in,
                              size_t n);
dt_status dt_cpu_relu_bwd(dt_backend_t *be, float *din, const float *dout, const float *in,
                          size_t n);
dt_status dt_cpu_gelu_fwd_ref(dt_backend_t *be, float *out, const float *in, size_t n);
dt_status dt_cpu_gelu_bwd_ref(dt_backend_t *be, float *din, const float *dout, const float *in,
                              size_t n);
dt_status dt_cpu_tanh_fwd_ref(dt_backend_t *be, float *out, const float *in, size_t n);
dt_status dt_cpu_tanh_bwd_ref(dt_backend_t *be, float *din, const float *dout, const float *out,
                              size_t n);

/* dropout.c */
dt_status dt_cpu_dropout_fwd_ref(dt_backend_t *be, float *out, const float *in, int rows, int cols,
                                 float p, const struct dt_rng_key *key, uint64_t row0);
dt_status dt_cpu_dropout_fwd(dt_backend_t *be, float *out, const float *in, int rows, int cols,
                             float p, const struct dt_rng_key *key, uint64_t row0);
dt_status dt_cpu_dropout_bwd_ref(dt_backend_t *be, float *din, const float *dout, int rows,
                                 int cols, float p, const struct dt_rng_key *key, uint64_t row0);
dt_status dt_cpu_dropout_bwd(dt_backend_t *be, float *din, const float *dout, int rows, int cols,
                             float p, const struct dt_rng_key *key, uint64_t row0);

/* flatten.c */
dt_status dt_cpu_flatten_fwd_ref(dt_backend_t *be, float *out, const float *in, size_t n);
dt_status dt_cpu_flatten_fwd(dt_backend_t *be, float *out, const float *in, size_t n);
dt_status dt_cpu_flatten_bwd_ref(dt_backend_t *be, float *din, const float *dout, size_t n);
dt_status dt_cpu_flatten_bwd(dt_backend_t *be, float *din, const float *dout, size_t n);

/* softmax_xent.c */
dt_status dt_cpu_softmax_xent_fwd_ref(dt_backend_t *be, float *probs, const float *logits,
                                      const int32_t *labels, int B, int C, double *loss_sum,
                                      int64_t *correct);
dt_status dt_cpu_softmax_xent_fwd(dt_backend_t *be, float *probs, const float *logits,
                                  const int32_t *labels, int B, int C, double *loss_sum,
                                  int64_t *correct);
dt_status dt_cpu_softmax_xent_bwd_ref(dt_backend_t *be, float *dlogits, const float *probs,
                                      const int32_t *labels, int B, int C, float scale);

/* optim.c */
dt_status dt_cpu_sgd_update_ref(dt_backend_t *be, float *p, const float *g, float *buf, size_t n,
                                const struct dt_sgd_args *a);
dt_status dt_cpu_sgd_update(dt_backend_t *be, float *p, const float *g, float *buf, size_t n,
                            const struct dt_sgd_args *a);
dt_status dt_cpu_adamw_update_ref(dt_backend_t *be, float *p, const float *g, float *m, float *v,
                                  size_t n, const struct dt_adamw_args *a);
dt_status dt_cpu_adamw_update(dt_backend_t *be, float *p, const float *g, float *m, float *v,
                              size_t n, const struct dt_adamw_args *a);

/* reduce.c */
dt_status dt_cpu_sumsq_ref(dt_backend_t *be, const float *x, size_t n, double *out);
dt_status dt_cpu_sumsq(dt_backend_t *be, const float *x, size_t n, double *out);
dt_status dt_cpu_scale_ref(dt_backend_t *be, float *x, size_t n, float s);
dt_status dt_cpu_scale(dt_backend_t *be, float *x, size_t n, float s);
dt_status dt_cpu_fill_ref(dt_backend_t *be, float *x, size_t n, float v);
dt_status dt_cpu_fill(dt_backend_t *be, float *x, size_t n, float v);
dt_status dt_cpu_all_finite_ref(dt_backend_t *be, const float *x, size_t n, int *out);
dt_status dt_cpu_all_finite(dt_backend_t *be, const float *x, size_t n, int *out);

/* cast.c (one version serves both tables) */
dt_status dt_cpu_to_bf16(dt_backend_t *be, uint16_t *dst, const float *src, size_t n);
dt_status dt_cpu_from_bf16(dt_backend_t *be, float *dst, const uint16_t *src, size_t n);

/* linear.c (channel bias) */
dt_status dt_cpu_channel_bias_fwd_ref(dt_backend_t *be, float *x, const float *b, int N, int C,
                                      int HW);
dt_status dt_cpu_channel_bias_fwd(dt_backend_t *be, float *x, const float *b, int N, int C, int HW);
dt_status dt_cpu_channel_bias_bwd_ref(dt_backend_t *be, float *db, const float *dout, int N, int C,
                                      int HW);
dt_status dt_cpu_channel_bias_bwd(dt_backend_t *be, float *db, const float *dout, int N, int C,
                                  int HW);

/* elementwise.c */
dt_status dt_cpu_add_ref(dt_backend_t *be, float *out, const float *a, const float *b, size_t n);
dt_status dt_cpu_add(dt_backend_t *be, float *out, const float *a, const float *b, size_t n);
dt_status dt_cpu_accumulate_ref(dt_backend_t *be, float *dst, const float *src, size_t n);
dt_status dt_cpu_accumulate(dt_backend_t *be, float *dst, const float *src, size_t n);

/* conv.c */
dt_status dt_cpu_conv2d_workspace_ref(dt_backend_t *be, const struct dt_conv2d_shape *s,
                                      size_t *bytes);
dt_status dt_cpu_conv2d_workspace(dt_backend_t *be, const struct dt_conv2d_shape *s, size_t *bytes);
dt_status dt_cpu_conv2d_fwd_ref(dt_backend_t *be, float *y, const float *x, const float *w,
                                const struct dt_conv2d_shape *s, void *ws, size_t ws_bytes);
dt_status dt_cpu_conv2d_fwd(dt_backend_t *be, float *y, const float *x, const float *w,
                            const struct dt_conv2d_shape *s, void *ws, size_t ws_bytes);
dt_status dt_cpu_conv2d_bwd_data_ref(dt_backend_t *be, float *dx, const float *dy, const float *w,
                                     const struct dt_conv2d_shape *s, void *ws, size_t ws_bytes);
dt_status dt_cpu_conv2d_bwd_data(dt_backend_t *be, float *dx, const float *dy, const float *w,
                                 const struct dt_conv2d_shape *s, void *ws, size_t ws_bytes);
dt_status dt_cpu_conv2d_bwd_filter_ref(dt_backend_t *be, float *dw, const float *dy, const float *x,
                                       const struct dt_conv2d_shape *s, void *ws, size_t ws_bytes);
dt_status dt_cpu_conv2d_bwd_filter(dt_backend_t *be, float *dw, const float *dy, const float *x,
                                   const struct dt_conv2d_shape *s, void *ws, size_t ws_bytes);

/* pool.c */
dt_status dt_cpu_maxpool2d_fwd_ref(dt_backend_t *be, float *y, const float *x,
                                   const struct dt_pool2d_shape *s);
dt_status dt_cpu_maxpool2d_fwd(dt_backend_t *be, float *y, const float *x,
                               const struct dt_pool2d_shape *s);
dt_status dt_cpu_maxpool2d_bwd_ref(dt_backend_t *be, float *dx, const float *dy, const float *x,
                                   const float *y, const struct dt_pool2d_shape *s);
dt_status dt_cpu_maxpool2d_bwd(dt_backend_t *be, float *dx, const float *dy, const float *x,
                               const float *y, const struct dt_pool2d_shape *s);
dt_status dt_cpu_avgpool2d_fwd_ref(dt_backend_t *be, float *y, const float *x,
                                   const struct dt_pool2d_shape *s);
dt_status dt_cpu_avgpool2d_fwd(dt_backend_t *be, float *y, const float *x,
                               const struct dt_pool2d_shape *s);
dt_status dt_cpu_avgpool2d_bwd_ref(dt_backend_t *be, float *dx, const float *dy,
                                   const struct dt_pool2d_shape *s);
dt_status dt_cpu_avgpool2d_bwd(dt_backend_t *be, float *dx, const float *dy,
                               const struct dt_pool2d_shape *s);

/* norm.c */
dt_status dt_cpu_batchnorm_stats_ref(dt_backend_t *be, double *stats, const float *x, int N, int C,
                                     int HW);
dt_status dt_cpu_batchnorm_stats(dt_backend_t *be, double *stats, const float *x, int N, int C,
                                 int HW);
dt_status dt_cpu_batchnorm_fwd_ref(dt_backend_t *be, float *y, float *mean_out, float *invstd_out,
                                   float *running_mean, float *running_var, const float *x,
                                   const double *stats, double count, const float *gamma,
                                   const float *beta, float eps, float momentum, int N, int C,
                                   int HW);
dt_status dt_cpu_batchnorm_fwd(dt_backend_t *be, float *y, float *mean_out, float *invstd_out,
                               float *running_mean, float *running_var, const float *x,
                               const double *stats, double count, const float *gamma,
                               const float *beta, float eps, float momentum, int N, int C, int HW);
dt_status dt_cpu_batchnorm_infer_ref(dt_backend_t *be, float *y, const float *x,
                                     const float *running_mean, const float *running_var,
                                     const float *gamma, const float *beta, float eps, int N, int C,
                                     int HW);
dt_status dt_cpu_batchnorm_infer(dt_backend_t *be, float *y, const float *x,
                                 const float *running_mean, const float *running_var,
                                 const float *gamma, const float *beta, float eps, int N, int C,
                                 int HW);
dt_status dt_cpu_batchnorm_bwd_reduce_ref(dt_backend_t *be, double *dstats, const float *dy,
                                          const float *x, const float *mean, const float *invstd,
                                          int N, int C, int HW);
dt_status dt_cpu_batchnorm_bwd_reduce(dt_backend_t *be, double *dstats, const float *dy,
                                      const float *x, const float *mean, const float *invstd, int N,
                                      int C, int HW);
dt_status dt_cpu_batchnorm_bwd_ref(dt_backend_t *be, float *dx, float *dgamma, float *dbeta,
                                   const float *dy, const float *x, const float *mean,
                                   const float *invstd, const float *gamma, const double *local,
                                   const double *global, double count, int N, int C, int HW);
dt_status dt_cpu_batchnorm_bwd(dt_backend_t *be, float *dx, float *dgamma, float *dbeta,
                               const float *dy, const float *x, const float *mean,
                               const float *invstd, const float *gamma, const double *local,
                               const double *global, double count, int N, int C, int HW);
dt_status dt_cpu_layernorm_fwd_ref(dt_backend_t *be, float *y, float *mean_out, float *rstd_out,
                                   const float *x, const float *gamma, const float *beta, float eps,
                                   int rows, int D);
dt_status dt_cpu_layernorm_fwd(dt_backend_t *be, float *y, float *mean_out, float *rstd_out,
                               const float *x, const float *gamma, const float *beta, float eps,
                               int rows, int D);
dt_status dt_cpu_layernorm_bwd_ref(dt_backend_t *be, float *dx, float *dgamma, float *dbeta,
                                   const float *dy, const float *x, const float *mean,
                                   const float *rstd, const float *gamma, int rows, int D);
dt_status dt_cpu_layernorm_bwd(dt_backend_t *be, float *dx, float *dgamma, float *dbeta,
                               const float *dy, const float *x, const float *mean,
                               const float *rstd, const float *gamma, int rows, int D);

#endif
