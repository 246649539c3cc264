/*
 * ops.h - the op table every compute backend fills.
 *
 * Each op has the same signature on every backend: pointers are device
 * pointers of the backend that is passed first (host memory for cpu),
 * shapes are given in elements. All tensors are fp32, row-major, dense;
 * images are NCHW.
 *
 * The ops are listed once, in DT_OP_LIST below (the element-wise ones as
 * the rows of DT_UNARY_LIST): the op table (struct dt_ops), the op ids
 * (enum dt_op_id), their names and the backend query dt_backend_supports()
 * all come from that list. A backend leaves an op it
 * does not have NULL; callers ask dt_backend_supports() before building a
 * model that needs it, so a job learns at start-up, in words, what its
 * backend lacks.
 * Host-side scalar results (loss sums, norms) come back through host
 * pointers; a device backend waits for them (sumsq, all_finite) or, for
 * the loss and the step gate, fills them at its next wait.
 *
 * Convention: gradients of parameters ACCUMULATE (+=), so micro-batches
 * can add into one gradient buffer; gradients of activations are WRITTEN (=).
 *
 * Also part of the contract, on every backend: element-wise ops may run in
 * place (out == in) but not on partly overlapping buffers; ReLU passes NaN
 * through; dropout's key may be NULL when p == 0; the SGD buffer may be
 * NULL when momentum == 0; loss_sum and correct are never NULL; labels
 * outside [0, C) are DT_ERR_INVALID_ARG (the loader rejects such data
 * earlier as bad data).
 */
#ifndef DT_OPS_H
#define DT_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "core/rng.h"
#include "core/status.h"

typedef struct dt_backend dt_backend_t;

/* SGD with momentum, as torch.optim.SGD (dampening 0):
 *   g' = g + wd*p;  buf = first ? g' : momentum*buf + g';
 *   d = nesterov ? g' + momentum*buf : buf  (d = g' when momentum == 0);
 *   p -= lr * d */
struct dt_sgd_args {
    float lr, momentum, weight_decay;
    int nesterov;
    int first_step; /* buf holds nothing yet */
    int gated;      /* 1: nothing changes when the backend's step gate skips (step_gate) */
    float *clear;   /* NULL, or g itself: each gradient is zeroed once read, and all n are
                       zero on return, also when the gate skipped (the next step's backward
                       accumulates into them with no fill first) */
};

/* AdamW, as torch.optim.AdamW (decoupled weight decay):
 *   p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
 *   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps) */
struct dt_adamw_args {
    float lr, beta1, beta2, eps, weight_decay;
    int64_t t;    /* 1-based step count */
    int gated;    /* 1: nothing changes when the backend's step gate skips (step_gate) */
    float *clear; /* NULL, or g itself: zeroed as dt_sgd_args' clear is */
};

/* The step's gradient check (step_gate): the sum of squares of g over
 * ranges [lo[k], hi[k]) taken in order, and with decide, the gate the
 * gated updates follow. */
struct dt_gate_args {
    const size_t *lo, *hi;
    size_t count;
    int decide;       /* 1: set the backend's step gate and apply its factor to g */
    float unscale;    /* decide: the first multiplier (fp16's 1/scale; 1 without scaling) */
    double clip_norm; /* decide: > 0 clips the unscaled gradients to this global norm */
};

/* What step_gate found. */
struct dt_gate {
    double sumsq; /* of g over the ranges, before any multiplier */
    int skip;     /* decide: sumsq was not finite, so the gated updates change nothing */
    float factor; /* decide: the clip factor applied after unscale (1: none) */
};

/* Convolution of x(N,C,H,W) with w(K, C/groups, R, S) into y(N,K,P,Q):
 *   P = (H + 2*pad_h - dil_h*(R-1) - 1) / stride_h + 1  (Q likewise), as
 * dt_conv2d_out computes; cross-correlation, as every framework's conv. */
struct dt_conv2d_shape {
    int N, C, H, W;
    int K, R, S;
    int stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups;
    int P, Q;
};

/* Max or average pooling of x(N,C,H,W) over R x S windows into y(N,C,P,Q);
 * padded positions never win a max and count in an average (PyTorch's
 * count_include_pad=True). P and Q as for a convolution with dilation 1. */
struct dt_pool2d_shape {
    int N, C, H, W;
    int R, S, stride_h, stride_w, pad_h, pad_w;
    int P, Q;
};

/*
 * The element-wise ops (the activations), one row each:
 *
 *   U(a, name, s, forward, gradient, cpu, doc)
 *
 * name_fwd(out, in, n):      out[i] = forward, with x = in[i]
 * name_bwd(din, dout, s, n): din[i] = gradient, with dy = dout[i] and s[i]
 *                            the forward's input (s is x) or its output
 *                            (s is y); din is written
 * cpu:  BLOCKED - the CPU's fast version is the same expression over fixed
 *       blocks the compiler vectorises (the same bits as the reference);
 *       OWN - kernels/cpu/activation.c writes its fast version itself.
 * doc:  what the layer of that name computes, for the layer reference.
 *
 * forward and gradient are float expressions that compile as C on the
 * host and as CUDA device code (the float functions of <math.h>), so both
 * backends expand the same rows (kernels/cpu/activation.c,
 * kernels/cuda/activation.cu); DT_OP_LIST, the layer kinds, the values of
 * model.activation and the tests come from this list too: a new
 * activation is one row here and one case in tests/common/op_table.c.
 * `a` is passed through to U; an expression has no comma outside
 * parentheses (it is one macro argument). ReLU lets NaN through (as torch
 * does), so a non-finite activation still reaches the loss and the finite
 * check.
 */
#define DT_INV_SQRT2 0.70710678118654752440f
#define DT_INV_SQRT_2PI 0.39894228040143267794f
#define DT_SQRT_2_OVER_PI 0.79788456080286535588f
#define DT_UNARY_LIST(U, a)                                                                        \
    U(a, relu, x, x < 0.0f ? 0.0f : x, x > 0.0f ? dy : 0.0f, BLOCKED, "max(x, 0)")                 \
    U(a, gelu, x, 0.5f * x * erfcf(-x * DT_INV_SQRT2),                                             \
      dy * (0.5f * erfcf(-x * DT_INV_SQRT2) + x * (DT_INV_SQRT_2PI * expf(-0.5f * x * x))), OWN,   \
      "exact GELU, x * Phi(x)")                                                                    \
    U(a, gelu_tanh, x, 0.5f * x * (1.0f + tanhf(DT_SQRT_2_OVER_PI * (x + 0.044715f * x * x * x))),  \
      dy * (0.5f * (1.0f + tanhf(DT_SQRT_2_OVER_PI * (x + 0.044715f * x * x * x))) +              \
            0.5f * x *                                                                             \
                (1.0f - tanhf(DT_SQRT_2_OVER_PI * (x + 0.044715f * x * x * x)) *                   \
                            tanhf(DT_SQRT_2_OVER_PI * (x + 0.044715f * x * x * x))) *              \
                DT_SQRT_2_OVER_PI * (1.0f + 3.0f * 0.044715f * x * x)),                            \
      OWN, "GELU's tanh approximation (GPT-2's gelu_new, torch's approximate='tanh')")             \
    U(a, tanh, y, tanhf(x), dy * (1.0f - y * y), OWN, "hyperbolic tangent")                       \
    U(a, silu, x, x / (1.0f + expf(-x)),                                                           \
      dy * (1.0f / (1.0f + expf(-x))) * (1.0f + x * (1.0f - 1.0f / (1.0f + expf(-x)))), OWN,       \
      "x * sigmoid(x) (SiLU)")

/* The three ops of a row of DT_UNARY_LIST, as rows of DT_OP_LIST. */
#define DT_OP_UNARY_PAIR(X, name, s, forward, gradient, cpu, doc)                                  \
    X(name##_fwd, (dt_backend_t * be, float *out, const float *in, size_t n))                      \
    X(name##_bwd, (dt_backend_t * be, float *din, const float *dout, const float *s, size_t n))    \
    X(name##_fwd_keep, (dt_backend_t * be, float *out, float *x, size_t n))

/*
 * The op list: X(name, (parameters)). Per op:
 *
 * linear_fwd     out(B,Out) = in(B,In) @ w(Out,In)^T (+ bias(Out) on every row when
 *                bias is not NULL); when in_kept is not NULL it
 *                also gets in as the GEMM reads it, rounded to the backend's
 *                operand type (dt_backend_kept_operand_bytes per element; only
 *                on backends where that is not 0), for linear_bwd
 * linear_bwd     din(B,In) = dout(B,Out) @ w(Out,In)  (written; skipped when din is NULL)
 *                dw(Out,In) += dout(B,Out)^T @ in(B,In); in_kept (NULL: none) is
 *                linear_fwd's copy of the same in, read instead of rounding in again
 * bias_fwd       x(B,C) += b(C), in place
 * bias_bwd       db(C) += sum over B of dout(B,C)
 * channel_bias_fwd  x(N,C,HW) += b(C), in place
 * channel_bias_bwd  db(C) += sum over N and HW of dout(N,C,HW)
 * <unary>_fwd, <unary>_bwd   the element-wise ops, one pair per row of DT_UNARY_LIST above
 * <unary>_fwd_keep  out = <unary>_fwd's output, and x (the input, read first) is
 *                replaced by the row's gradient at dy = 1, element by element
 *                (out and x distinct), so that mul(din, dout, x) is the backward
 *                where the input is needed by nothing else: for a row whose
 *                gradient is dy * (an expression without dy), the same bits as
 *                <unary>_bwd (the model uses it only for those: gelu, gelu_tanh)
 * dropout_*      inverted dropout on a (rows, cols) block whose first row is row
 *                `row0` of the global batch. Element e = (row0 + r) * cols + c is
 *                kept when u >= p, u = dt_rng_u32_to_unit(word e % 4 of
 *                dt_rng_block(key, e / 4, 0)); kept values are scaled by 1/(1-p).
 *                Backward applies the same mask (drawn again, or kept from the
 *                forward with the same arguments where a backend keeps it: the
 *                same bits). p == 0 is a copy. 0 <= p < 1.
 * flatten_*      (B, d1, d2, ...) -> (B, d1*d2*...): a copy forward and backward
 * add            out(n) = a + b (out may be a or b)
 * accumulate     dst(n) += src
 * mul            out(n) = a * b (out may be a or b)
 * softmax_xent_fwd  fused, numerically stable softmax + cross-entropy:
 *                probs(B,C) = softmax(logits(B,C)) row-wise (max subtracted);
 *                *loss_sum += (sum_b logsumexp(logits[b]) - logits[b, labels[b]]) / per
 *                (per >= 1: the labels each sample's loss is the mean of, 1 or a
 *                sequence's positions);
 *                *correct += count of b with argmax(logits[b]) == labels[b]
 *                (ties: lowest index). labels in [0, C). A backend with a stream
 *                (cuda) adds to *loss_sum and *correct, or reports a label outside
 *                [0, C), at the next call that waits for the device (sync, a
 *                download, sumsq), so both must stay valid until then.
 * softmax_xent_bwd  dlogits(B,C) = (probs - onehot(labels)) * scale  (written)
 * conv2d_workspace  *bytes = scratch conv2d_* needs for shape s (the caller
 *                gives at least that much as ws; 0 is allowed)
 * conv2d_fwd     y = conv(x, w) as struct dt_conv2d_shape says (written)
 * conv2d_bwd_data    dx(N,C,H,W) = the input gradient for dy(N,K,P,Q) (written)
 * conv2d_bwd_filter  dw(K,C/groups,R,S) += the filter gradient
 * maxpool2d_fwd  y(N,C,P,Q) = window maxima of x
 * maxpool2d_bwd  dx (written) = dy routed to the first maximum of each
 *                window (row-major order within the window), summed where
 *                windows overlap; takes x and y
 * avgpool2d_fwd  y = window sums / (R*S)
 * avgpool2d_bwd  dx (written) = dy / (R*S) spread over each window, summed
 * batchnorm_stats    stats[c] = sum of x(N,c,HW), stats[C+c] = sum of x^2,
 *                in double (written); the model may sum them over ranks
 *                (model.sync_bn) before batchnorm_fwd
 * batchnorm_fwd  with count the number of values the stats summed:
 *                mean = stats[c]/count, var = stats[C+c]/count - mean^2 (biased),
 *                invstd = 1/sqrt(var + eps); y = (x - mean)*invstd*gamma + beta,
 *                then max(y, 0) when relu is not 0 (a ReLU fused in);
 *                mean_out, invstd_out (C floats each) saved for backward; when
 *                running_mean is not NULL: running = (1-momentum)*running +
 *                momentum*batch, with the unbiased var (count/(count-1)) for running_var
 * batchnorm_infer    y = (x - running_mean)/sqrt(running_var + eps)*gamma + beta,
 *                then max(y, 0) when relu is not 0
 * batchnorm_bwd_reduce  dstats[c] = sum of dy(N,c,HW), dstats[C+c] = sum of
 *                dy * xhat, xhat = (x - mean)*invstd, in double (written).
 *                y: NULL, or the output of a batchnorm_fwd with relu (dy is
 *                then the gradient of the ReLU's output: it counts only
 *                where y > 0, the ReLU's own backward folded in)
 * batchnorm_bwd  dgamma[c] += local[C+c], dbeta[c] += local[c] (this rank's
 *                sums); dx (written) = gamma*invstd*(dy - global[c]/count -
 *                xhat*global[C+c]/count) with the sums over every rank that
 *                shared the statistics (global == local without sync_bn);
 *                y as for batchnorm_bwd_reduce (dy is 0 where y is not > 0)
 * layernorm_fwd  per row of x(rows, D): mean, rstd = 1/sqrt(biased var + eps);
 *                y = (x - mean)*rstd*gamma + beta; mean_out, rstd_out (rows) saved
 * layernorm_bwd  dx (written), dgamma += , dbeta += ; takes x, mean, rstd, gamma
 * rmsnorm_fwd    per row of x(rows, D): rstd = 1/sqrt(mean of x^2 + eps); y = x*rstd*gamma;
 *                rstd_out (rows) saved. No mean is taken out and there is no shift.
 * rmsnorm_bwd    dx (written), dgamma += ; takes x, rstd, gamma
 * embedding_fwd  out(N,D) = w(V,D)[ids[n]]: ids are N floats holding whole numbers in
 *                [0, V) (token ids, exact below 2^24); anything else is DT_ERR_INVALID_ARG,
 *                which a backend with a stream (cuda) returns from the next call that
 *                waits for the device (the loss, a download, sync) instead
 * embedding_bwd  dw(V,D)[ids[n]] += dout(n) for n = 0..N-1 in that order per row of dw
 *                (deterministic: the same bits on every run)
 * attention_workspace  *bytes = scratch attention_fwd/bwd need for these shapes
 * attention_fwd  multi-head scaled dot-product attention over qkv(B,T,3,H,Dh): for
 *                batch b, head h, q = qkv[b,:,0,h,:], k = qkv[b,:,1,h,:], v = qkv[b,:,2,h,:]
 *                (each T x Dh with row stride 3*H*Dh); s = q k^T / sqrt(Dh), with
 *                causal: s[i,j] = -inf for j > i; out[b,i,h,:] = softmax(s[i]) v
 *                (out is (B,T,H,Dh), written); lse[b,h,i] = logsumexp(s[i]) (written,
 *                kept for backward). No T x T matrix is kept: the scratch is bounded by
 *                the workspace, so memory grows linearly with T.
 * attention_bwd  dqkv(B,T,3,H,Dh) (written) = the gradient through attention_fwd for
 *                dout; takes the forward's qkv, out and lse
 * attention_decode  causal attention of one sequence, n new positions at a time
 *                (generation with a key/value cache): qkv(n,3,H,Dh) holds positions
 *                pos..pos+n-1; their keys and values are written into kcache and vcache
 *                (T,H,Dh) at rows pos..pos+n-1, then out[i,h,:] (n,H,Dh, written) =
 *                softmax(q_i k^T / sqrt(Dh)) v over the cached rows 0..pos+i. The same
 *                function of the same rows as attention_fwd's, to rounding.
 * sgd_update     SGD with momentum, as torch.optim.SGD (dampening 0):
 *                g' = g + wd*p;  buf = first ? g' : momentum*buf + g';
 *                d = nesterov ? g' + momentum*buf : buf  (d = g' when momentum == 0);
 *                p -= lr * d.  buf may be NULL when momentum == 0.
 * adamw_update   AdamW, as torch.optim.AdamW (decoupled weight decay):
 *                p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
 *                p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 * sumsq          *out = sum of x^2, accumulated in double
 * step_gate      out->sumsq = sum of g^2 over a's ranges (each range summed as sumsq
 *                sums, the range totals added in order). With a->decide it also sets
 *                the backend's step gate: skip when sumsq is not finite; otherwise
 *                g *= unscale, then g *= factor over the ranges, where factor is
 *                (float)(clip_norm / (norm + 1e-6)) when clip_norm > 0 and the
 *                unscaled norm = sqrt(sumsq * unscale^2) (double) exceeds it, else 1. The decision
 * is taken where the gradients are (on the device for cuda), so the gated sgd_update and
 * adamw_update that follow can be queued before the host knows it; cuda fills *out at the next call
 * that waits (dt_backend_settle, sync, a download), so out must stay valid. scale          x *= s
 * fill           x = v
 * all_finite     *out = 1 if every x is finite, else 0
 * to_bf16        dst(n) = the raw bits of src rounded to the nearest bf16 (ties to
 *                even, overflow to infinity, NaN stays a quiet NaN)
 * from_bf16      dst = src widened back, exactly
 */
#define DT_OP_LIST(X)                                                                              \
    X(linear_fwd, (dt_backend_t * be, float *out, const float *in, const float *w,                \
                   const float *bias, int B, int In, int Out, void *in_kept))                      \
    X(linear_bwd, (dt_backend_t * be, float *din, float *dw, const float *dout, const float *in,   \
                   const float *w, int B, int In, int Out, const void *in_kept))                   \
    X(bias_fwd, (dt_backend_t * be, float *x, const float *b, int B, int C))                       \
    X(bias_bwd, (dt_backend_t * be, float *db, const float *dout, int B, int C))                   \
    X(channel_bias_fwd, (dt_backend_t * be, float *x, const float *b, int N, int C, int HW))       \
    X(channel_bias_bwd, (dt_backend_t * be, float *db, const float *dout, int N, int C, int HW))   \
    DT_UNARY_LIST(DT_OP_UNARY_PAIR, X)                                                             \
    X(dropout_fwd, (dt_backend_t * be, float *out, const float *in, int rows, int cols, float p,   \
                    const struct dt_rng_key *key, uint64_t row0))                                  \
    X(dropout_bwd, (dt_backend_t * be, float *din, const float *dout, int rows, int cols, float p, \
                    const struct dt_rng_key *key, uint64_t row0))                                  \
    X(flatten_fwd, (dt_backend_t * be, float *out, const float *in, size_t n))                     \
    X(flatten_bwd, (dt_backend_t * be, float *din, const float *dout, size_t n))                   \
    X(add, (dt_backend_t * be, float *out, const float *a, const float *b, size_t n))              \
    X(accumulate, (dt_backend_t * be, float *dst, const float *src, size_t n))                     \
    X(mul, (dt_backend_t * be, float *out, const float *a, const float *b, size_t n))              \
    X(softmax_xent_fwd,                                                                            \
      (dt_backend_t * be, float *probs, const float *logits, const int32_t *labels, int B, int C,  \
       int per, double *loss_sum, int64_t *correct))                                               \
    X(softmax_xent_bwd, (dt_backend_t * be, float *dlogits, const float *probs,                    \
                         const int32_t *labels, int B, int C, float scale))                        \
    X(conv2d_workspace, (dt_backend_t * be, const struct dt_conv2d_shape *s, size_t *bytes))       \
    X(conv2d_fwd, (dt_backend_t * be, float *y, const float *x, const float *w,                    \
                   const struct dt_conv2d_shape *s, void *ws, size_t ws_bytes))                    \
    X(conv2d_bwd_data, (dt_backend_t * be, float *dx, const float *dy, const float *w,             \
                        const struct dt_conv2d_shape *s, void *ws, size_t ws_bytes))               \
    X(conv2d_bwd_filter, (dt_backend_t * be, float *dw, const float *dy, const float *x,           \
                          const struct dt_conv2d_shape *s, void *ws, size_t ws_bytes))             \
    X(maxpool2d_fwd,                                                                               \
      (dt_backend_t * be, float *y, const float *x, const struct dt_pool2d_shape *s))              \
    X(maxpool2d_bwd, (dt_backend_t * be, float *dx, const float *dy, const float *x,               \
                      const float *y, const struct dt_pool2d_shape *s))                            \
    X(avgpool2d_fwd,                                                                               \
      (dt_backend_t * be, float *y, const float *x, const struct dt_pool2d_shape *s))              \
    X(avgpool2d_bwd,                                                                               \
      (dt_backend_t * be, float *dx, const float *dy, const struct dt_pool2d_shape *s))            \
    X(batchnorm_stats, (dt_backend_t * be, double *stats, const float *x, int N, int C, int HW))   \
    X(batchnorm_fwd,                                                                               \
      (dt_backend_t * be, float *y, float *mean_out, float *invstd_out, float *running_mean,       \
       float *running_var, const float *x, const double *stats, double count, const float *gamma,  \
       const float *beta, float eps, float momentum, int N, int C, int HW, int relu))              \
    X(batchnorm_infer, (dt_backend_t * be, float *y, const float *x, const float *running_mean,    \
                        const float *running_var, const float *gamma, const float *beta,           \
                        float eps, int N, int C, int HW, int relu))                                \
    X(batchnorm_bwd_reduce,                                                                        \
      (dt_backend_t * be, double *dstats, const float *dy, const float *x, const float *mean,      \
       const float *invstd, const float *y, int N, int C, int HW))                                 \
    X(batchnorm_bwd,                                                                               \
      (dt_backend_t * be, float *dx, float *dgamma, float *dbeta, const float *dy, const float *x, \
       const float *mean, const float *invstd, const float *gamma, const double *local,            \
       const double *global, double count, const float *y, int N, int C, int HW))                  \
    X(layernorm_fwd,                                                                               \
      (dt_backend_t * be, float *y, float *mean_out, float *rstd_out, const float *x,              \
       const float *gamma, const float *beta, float eps, int rows, int D))                         \
    X(layernorm_bwd,                                                                               \
      (dt_backend_t * be, float *dx, float *dgamma, float *dbeta, const float *dy, const float *x, \
       const float *mean, const float *rstd, const float *gamma, int rows, int D))                 \
    X(rmsnorm_fwd, (dt_backend_t * be, float *y, float *rstd_out, const float *x,                  \
                    const float *gamma, float eps, int rows, int D))                               \
    X(rmsnorm_bwd, (dt_backend_t * be, float *dx, float *dgamma, const float *dy, const float *x,  \
                    const float *rstd, const float *gamma, int rows, int D))                       \
    X(embedding_fwd,                                                                               \
      (dt_backend_t * be, float *out, const float *ids, const float *w, int N, int V, int D))      \
    X(embedding_bwd,                                                                               \
      (dt_backend_t * be, float *dw, const float *dout, const float *ids, int N, int V, int D))    \
    X(attention_workspace,                                                                         \
      (dt_backend_t * be, int B, int T, int H, int Dh, int causal, size_t *bytes))                 \
    X(attention_fwd, (dt_backend_t * be, float *out, float *lse, const float *qkv, int B, int T,   \
                      int H, int Dh, int causal, void *ws, size_t ws_bytes))                       \
    X(attention_bwd,                                                                               \
      (dt_backend_t * be, float *dqkv, const float *dout, const float *qkv, const float *out,      \
       const float *lse, int B, int T, int H, int Dh, int causal, void *ws, size_t ws_bytes))      \
    X(attention_decode, (dt_backend_t * be, float *out, float *kcache, float *vcache,              \
                         const float *qkv, int pos, int n, int T, int H, int Dh))                  \
    X(sgd_update, (dt_backend_t * be, float *p, const float *g, float *buf, size_t n,              \
                   const struct dt_sgd_args *a))                                                   \
    X(adamw_update, (dt_backend_t * be, float *p, const float *g, float *m, float *v, size_t n,    \
                     const struct dt_adamw_args *a))                                               \
    X(sumsq, (dt_backend_t * be, const float *x, size_t n, double *out))                           \
    X(step_gate, (dt_backend_t * be, float *g, const struct dt_gate_args *a, struct dt_gate *out)) \
    X(scale, (dt_backend_t * be, float *x, size_t n, float s))                                     \
    X(fill, (dt_backend_t * be, float *x, size_t n, float v))                                      \
    X(all_finite, (dt_backend_t * be, const float *x, size_t n, int *out))                         \
    X(to_bf16, (dt_backend_t * be, uint16_t * dst, const float *src, size_t n))                    \
    X(from_bf16, (dt_backend_t * be, float *dst, const uint16_t *src, size_t n))

/* The op table: one function pointer per op, NULL where the backend does
 * not have it. */
struct dt_ops {
#define DT_OP_MEMBER(name, params) dt_status(*name) params;
    DT_OP_LIST(DT_OP_MEMBER)
#undef DT_OP_MEMBER
};

enum dt_op_id {
#define DT_OP_ENUM(name, params) DT_OP_##name,
    DT_OP_LIST(DT_OP_ENUM)
#undef DT_OP_ENUM
    DT_OP_COUNT
};

/* "conv2d_fwd" for DT_OP_conv2d_fwd; "unknown" outside the list. */
const char *dt_op_name(enum dt_op_id op);

/* Output size of a convolution or pooling along one axis; 0 or less when
 * the window does not fit the padded input. */
static inline int dt_conv_out_dim(int in, int pad, int dil, int k, int stride)
{
    int span = in + 2 * pad - dil * (k - 1) - 1;
    return stride > 0 && span >= 0 ? span / stride + 1 : 0;
}

#endif
