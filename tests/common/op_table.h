/*
 * op_table.h - the table of op test cases that every backend is checked
 * against: one row per (op, shapes, tolerance). The CPU unit suite runs
 * each row as a finite-difference gradient check on both CPU tables and
 * as fast-vs-reference comparison; the GPU suite runs the same rows as
 * device-vs-CPU-reference comparison. A new op is a new row (and, for a
 * new kind of op, one runner in op_table.c), not new test functions.
 *
 * A row names the op under test by its forward (conv2d_fwd stands for
 * conv2d_workspace, conv2d_fwd, conv2d_bwd_data and conv2d_bwd_filter;
 * batchnorm_fwd for stats, fwd, bwd_reduce and bwd; ...). The meaning of
 * dims depends on that op:
 *   linear_fwd            B, In, Out, bias (1: with one)
 *   bias_fwd              B, C
 *   channel_bias_fwd      N, C, HW
 *   <unary>_fwd (each row of DT_UNARY_LIST), add, accumulate   n
 *   softmax_xent_fwd      B, C
 *   conv2d_fwd            N, C, H, W, K, R, S, stride_h, stride_w, pad_h, pad_w,
 *                         dil_h, dil_w, groups
 *   maxpool2d_fwd, avgpool2d_fwd   N, C, H, W, R, S, stride_h, stride_w, pad_h, pad_w
 *   batchnorm_fwd         N, C, HW, ranks, relu (ranks > 1: the statistics are summed
 *                         with ranks-1 other ranks' data, as model.sync_bn does;
 *                         relu 1: a ReLU fused in)
 *   batchnorm_infer       N, C, HW, relu (1: a ReLU fused in)
 *   layernorm_fwd, rmsnorm_fwd   rows, D
 *   embedding_fwd         N, V, D (ids drawn in [0, V))
 *   attention_fwd         B, T, H, Dh, causal (0 or 1)
 * The functions are not thread safe (they use the thread's backend calls
 * in sequence) and print one line per mismatch to stdout.
 */
#ifndef DT_TEST_OP_TABLE_H
#define DT_TEST_OP_TABLE_H

#include "kernels/backend.h"
#include "kernels/ops.h"

#define DT_OP_CASE_DIMS 14

struct dt_op_case {
    const char *name;
    enum dt_op_id op;
    int dims[DT_OP_CASE_DIMS];
    double tol; /* per tensor: max |test - ref| / max |ref| */
};

extern const struct dt_op_case dt_op_cases[];
extern const int dt_op_ncases;

/* Same random inputs on both backends, forward then backward with the
 * same output gradients, every output and gradient compared. Returns the
 * number of mismatches (each printed with case, tensor and error), or -1
 * when either backend lacks an op the case needs (printed as unsupported). */
int dt_op_case_compare(const struct dt_op_case *c, dt_backend_t *test, dt_backend_t *ref);

/* Central finite differences in double of L = sum(out * R) (the summed
 * loss for softmax_xent) against the op's backward on backend be, for a
 * spread sample of every input's elements. Returns mismatches, 0 for an
 * op without a backward or a kinked row, -1 when unsupported. */
int dt_op_case_gradcheck(const struct dt_op_case *c, dt_backend_t *be);

/* The ops.h conventions on backend be: gradients of activations are
 * written (buffers pre-filled with NaN or huge values give the same
 * result), gradients of parameters accumulate (old + new). Returns
 * mismatches, -1 when unsupported. */
int dt_op_case_conventions(const struct dt_op_case *c, dt_backend_t *be);

/* 1 when a kink of the case's output lies within the finite differences'
 * step of most inputs (a ReLU fused after batch norm: every input and
 * parameter moves every output of its channel), so dt_op_case_gradcheck
 * skips it; test_op_table checks such an op as the composition of its
 * parts instead. */
int dt_op_case_kinked(const struct dt_op_case *c);

/* 1 when the case's op has a backward that dt_op_case_gradcheck checks. */
int dt_op_case_has_backward(const struct dt_op_case *c);

/* 1 when running case c calls op (its forward, backward, workspace query),
 * 0 otherwise or when the case has no runner. */
int dt_op_case_calls(const struct dt_op_case *c, enum dt_op_id op);

#endif
