/*
 * ops.h - the op table every compute backend fills.
 *
 * Each op has the same signature on every backend: pointers are device
 * pointers of the backend that is passed first (host memory for cpu),
 * shapes are given in elements. All tensors are fp32, row-major, dense.
 * Host-side scalar results (loss sums, norms) come back through host
 * pointers; a device backend synchronises for them.
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

#include "../runtime/core/rng.h"
#include "../runtime/core/status.h"

typedef struct dt_backend dt_backend_t;

/* SGD with momentum, as torch.optim.SGD (dampening 0):
 *   g' = g + wd*p;  buf = first ? g' : momentum*buf + g';
 *   d = nesterov ? g' + momentum*buf : buf  (d = g' when momentum == 0);
 *   p -= lr * d */
struct dt_sgd_args {
    float lr, momentum, weight_decay;
    int nesterov;
    int first_step; /* buf holds nothing yet */
};

/* AdamW, as torch.optim.AdamW (decoupled weight decay):
 *   p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
 *   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps) */
struct dt_adamw_args {
    float lr, beta1, beta2, eps, weight_decay;
    int64_t t; /* 1-based step count */
};

struct dt_ops {
    /* out(B,Out) = in(B,In) @ w(Out,In)^T */
    dt_status (*linear_fwd)(dt_backend_t *be, float *out, const float *in, const float *w, int B,
                            int In, int Out);
    /* din(B,In) = dout(B,Out) @ w(Out,In)  (written; skipped when din is NULL)
     * dw(Out,In) += dout(B,Out)^T @ in(B,In) */
    dt_status (*linear_bwd)(dt_backend_t *be, float *din, float *dw, const float *dout,
                            const float *in, const float *w, int B, int In, int Out);
    /* x(B,C) += b(C), in place */
    dt_status (*bias_fwd)(dt_backend_t *be, float *x, const float *b, int B, int C);
    /* db(C) += sum over B of dout(B,C) */
    dt_status (*bias_bwd)(dt_backend_t *be, float *db, const float *dout, int B, int C);

    /* out = max(in, 0); din = dout * (in > 0) */
    dt_status (*relu_fwd)(dt_backend_t *be, float *out, const float *in, size_t n);
    dt_status (*relu_bwd)(dt_backend_t *be, float *din, const float *dout, const float *in,
                          size_t n);
    /* exact GELU: out = 0.5 x (1 + erf(x / sqrt 2)); backward takes the input */
    dt_status (*gelu_fwd)(dt_backend_t *be, float *out, const float *in, size_t n);
    dt_status (*gelu_bwd)(dt_backend_t *be, float *din, const float *dout, const float *in,
                          size_t n);
    /* out = tanh(in); backward takes the OUTPUT: din = dout * (1 - out^2) */
    dt_status (*tanh_fwd)(dt_backend_t *be, float *out, const float *in, size_t n);
    dt_status (*tanh_bwd)(dt_backend_t *be, float *din, const float *dout, const float *out,
                          size_t n);

    /* Inverted dropout on a (rows, cols) block whose first row is row `row0`
     * of the global batch. Element e = (row0 + r) * cols + c is kept when
     * u >= p, u = dt_rng_u32_to_unit(word e % 4 of dt_rng_block(key, e / 4, 0));
     * kept values are scaled by 1/(1-p). Backward recomputes the same mask.
     * p == 0 is a copy. 0 <= p < 1. */
    dt_status (*dropout_fwd)(dt_backend_t *be, float *out, const float *in, int rows, int cols,
                             float p, const struct dt_rng_key *key, uint64_t row0);
    dt_status (*dropout_bwd)(dt_backend_t *be, float *din, const float *dout, int rows, int cols,
                             float p, const struct dt_rng_key *key, uint64_t row0);

    /* (B, d1, d2, ...) -> (B, d1*d2*...): a copy forward and backward */
    dt_status (*flatten_fwd)(dt_backend_t *be, float *out, const float *in, size_t n);
    dt_status (*flatten_bwd)(dt_backend_t *be, float *din, const float *dout, size_t n);

    /* Fused, numerically stable softmax + cross-entropy.
     * probs(B,C) = softmax(logits(B,C)) row-wise (max subtracted);
     * *loss_sum += sum_b -log probs[b, labels[b]] computed as
     *              logsumexp(logits[b]) - logits[b, labels[b]];
     * *correct += count of b with argmax(logits[b]) == labels[b]
     *             (ties: lowest index). labels in [0, C). */
    dt_status (*softmax_xent_fwd)(dt_backend_t *be, float *probs, const float *logits,
                                  const int32_t *labels, int B, int C, double *loss_sum,
                                  int64_t *correct);
    /* dlogits(B,C) = (probs - onehot(labels)) * scale   (written) */
    dt_status (*softmax_xent_bwd)(dt_backend_t *be, float *dlogits, const float *probs,
                                  const int32_t *labels, int B, int C, float scale);

    /* Fused optimizer updates over n elements (see the arg structs). */
    dt_status (*sgd_update)(dt_backend_t *be, float *p, const float *g, float *buf, size_t n,
                            const struct dt_sgd_args *a);
    dt_status (*adamw_update)(dt_backend_t *be, float *p, const float *g, float *m, float *v,
                              size_t n, const struct dt_adamw_args *a);

    /* *out = sum of x^2, accumulated in double */
    dt_status (*sumsq)(dt_backend_t *be, const float *x, size_t n, double *out);
    /* x *= s */
    dt_status (*scale)(dt_backend_t *be, float *x, size_t n, float s);
    /* x = v */
    dt_status (*fill)(dt_backend_t *be, float *x, size_t n, float v);
    /* *out = 1 if every x is finite, else 0 */
    dt_status (*all_finite)(dt_backend_t *be, const float *x, size_t n, int *out);

    /* Gradients on the wire in bf16 (comm.grad_dtype): dst(n) = the raw
     * bits of src rounded to the nearest bf16 (ties to even, overflow to
     * infinity, NaN stays a quiet NaN); from_bf16 widens them back, exactly. */
    dt_status (*to_bf16)(dt_backend_t *be, uint16_t *dst, const float *src, size_t n);
    dt_status (*from_bf16)(dt_backend_t *be, float *dst, const uint16_t *src, size_t n);
};

#endif
