/*
 * op_args.h - what the CPU and GPU op suites (tests/unit/test_ops.c,
 * tests/gpu/test_gpu_ops.c, the op table) share beside the op table: the
 * element-wise ops of DT_UNARY_LIST called by index, and one list of
 * invalid-argument cases that every backend must refuse.
 *
 * The element-wise ops are numbered in DT_UNARY_LIST order, so a suite
 * that loops over 0..DT_TEST_NACT-1 checks every row of the list, new rows
 * included, with no test written for them.
 */
#ifndef DT_TEST_OP_ARGS_H
#define DT_TEST_OP_ARGS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/ops.h"

#define DT_TEST_ACT_ENUM(a, name, s, forward, gradient, cpu, doc) DT_TEST_ACT_##name,
enum dt_test_act { DT_UNARY_LIST(DT_TEST_ACT_ENUM, _) DT_TEST_NACT };
#undef DT_TEST_ACT_ENUM

/* "relu" for DT_TEST_ACT_relu */
const char *dt_test_act_name(int a);

/* The op id of activation a's forward, and of its backward. */
enum dt_op_id dt_test_act_fwd_op(int a);
enum dt_op_id dt_test_act_bwd_op(int a);

/* 1 when a's backward takes the forward's output, 0 when its input. */
int dt_test_act_takes_output(int a);

/* a's forward and backward through op table o of backend be; the
 * backward gets in or out as dt_test_act_takes_output says. */
dt_status dt_test_act_fwd(const struct dt_ops *o, dt_backend_t *be, int a, float *out,
                          const float *in, size_t n);
dt_status dt_test_act_bwd(const struct dt_ops *o, dt_backend_t *be, int a, float *din,
                          const float *dout, const float *in, const float *out, size_t n);

/* a's forward that keeps its gradient: out = forward(x), x replaced by
 * the gradient at dy = 1 (<unary>_fwd_keep). */
dt_status dt_test_act_keep(const struct dt_ops *o, dt_backend_t *be, int a, float *out, float *x,
                           size_t n);

/* Runs every shared invalid-argument case on backend be: x, y and z are
 * backend buffers of 16 zero floats, lab 2 valid labels for 4 classes
 * (backend memory), key a dropout key. A case passes when the op returns
 * DT_ERR_INVALID_ARG with a message naming it. Returns the number of cases
 * that did not (each printed) and counts the cases run in *ran. */
int dt_test_invalid_args(const struct dt_ops *o, dt_backend_t *be, float *x, float *y, float *z,
                         int32_t *lab, const struct dt_rng_key *key, int *ran);

#endif
