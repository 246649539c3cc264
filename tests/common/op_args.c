/*
 * op_args.c - the element-wise op dispatch and the invalid-argument cases
 * of op_args.h. The dispatch is generated from DT_UNARY_LIST, so it has a
 * case for every row; the invalid-argument list is one table of calls
 * that the CPU and GPU suites both run, each suite keeping beside it only
 * what differs between backends (the CPU checks label ranges on the host).
 */
#include "op_args.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define TAKES_x 0
#define TAKES_y 1
#define TAKES(s) TAKES_##s

#define ACT_INFO(a, name, s, forward, gradient, cpu, doc)                                          \
    {#name, DT_OP_##name##_fwd, DT_OP_##name##_bwd, TAKES(s)},
static const struct {
    const char *name;
    enum dt_op_id fwd, bwd;
    int takes_output;
} acts[] = {DT_UNARY_LIST(ACT_INFO, _)};
#undef ACT_INFO

static int valid(int a)
{
    return a >= 0 && a < DT_TEST_NACT;
}

const char *dt_test_act_name(int a)
{
    return valid(a) ? acts[a].name : "unknown";
}
enum dt_op_id dt_test_act_fwd_op(int a)
{
    return valid(a) ? acts[a].fwd : DT_OP_COUNT;
}
enum dt_op_id dt_test_act_bwd_op(int a)
{
    return valid(a) ? acts[a].bwd : DT_OP_COUNT;
}
int dt_test_act_takes_output(int a)
{
    return valid(a) && acts[a].takes_output;
}

dt_status dt_test_act_fwd(const struct dt_ops *o, dt_backend_t *be, int a, float *out,
                          const float *in, size_t n)
{
    switch (a) {
#define ACT_FWD(u, name, s, forward, gradient, cpu, doc)                                           \
    case DT_TEST_ACT_##name:                                                                       \
        return o->name##_fwd(be, out, in, n);
        DT_UNARY_LIST(ACT_FWD, _)
#undef ACT_FWD
    default:
        return dt_set_error(DT_ERR_INVALID_ARG, "test: no activation %d", a);
    }
}

dt_status dt_test_act_bwd(const struct dt_ops *o, dt_backend_t *be, int a, float *din,
                          const float *dout, const float *in, const float *out, size_t n)
{
    const float *saved = dt_test_act_takes_output(a) ? out : in;
    switch (a) {
#define ACT_BWD(u, name, s, forward, gradient, cpu, doc)                                           \
    case DT_TEST_ACT_##name:                                                                       \
        return o->name##_bwd(be, din, dout, saved, n);
        DT_UNARY_LIST(ACT_BWD, _)
#undef ACT_BWD
    default:
        return dt_set_error(DT_ERR_INVALID_ARG, "test: no activation %d", a);
    }
}

dt_status dt_test_act_keep(const struct dt_ops *o, dt_backend_t *be, int a, float *out, float *x,
                           size_t n)
{
    switch (a) {
#define ACT_KEEP(u, name, s, forward, gradient, cpu, doc)                                          \
    case DT_TEST_ACT_##name:                                                                       \
        return o->name##_fwd_keep(be, out, x, n);
        DT_UNARY_LIST(ACT_KEEP, _)
#undef ACT_KEEP
    default:
        return dt_set_error(DT_ERR_INVALID_ARG, "test: no activation %d", a);
    }
}

/* ---- invalid arguments --------------------------------------------------- */

struct tally {
    int bad, ran;
};

static void expect(struct tally *t, dt_status st, const char *op, const char *what)
{
    t->ran++;
    if (st == DT_ERR_INVALID_ARG && strstr(dt_last_error(), op)) return;
    printf("\n  %s (%s): got %s, \"%s\"; want invalid argument naming %s", op, what,
           dt_status_str(st), dt_last_error(), op);
    t->bad++;
}

/* Runs expr with a clean message and expects op to refuse it. */
#define REFUSED(t, op, expr)                                                                       \
    do {                                                                                           \
        dt_clear_error();                                                                          \
        expect((t), (expr), (op), #expr);                                                          \
    } while (0)

static void unary_cases(struct tally *t, const struct dt_ops *o, dt_backend_t *be, float *x,
                        float *y, float *z)
{
#define ACT_CASES(u, name, s, forward, gradient, cpu, doc)                                         \
    REFUSED(t, #name "_fwd", o->name##_fwd(be, NULL, x, 4));                                       \
    REFUSED(t, #name "_fwd", o->name##_fwd(be, z, NULL, 4));                                       \
    REFUSED(t, #name "_bwd", o->name##_bwd(be, NULL, x, y, 4));                                    \
    REFUSED(t, #name "_bwd", o->name##_bwd(be, z, NULL, y, 4));                                    \
    REFUSED(t, #name "_bwd", o->name##_bwd(be, z, x, NULL, 4));                                    \
    REFUSED(t, #name "_fwd_keep", o->name##_fwd_keep(be, NULL, x, 4));                             \
    REFUSED(t, #name "_fwd_keep", o->name##_fwd_keep(be, z, NULL, 4));                             \
    REFUSED(t, #name "_fwd_keep", o->name##_fwd_keep(be, x, x, 4));
    DT_UNARY_LIST(ACT_CASES, _)
#undef ACT_CASES
}

int dt_test_invalid_args(const struct dt_ops *o, dt_backend_t *be, float *x, float *y, float *z,
                         int32_t *lab, const struct dt_rng_key *key, int *ran)
{
    struct tally t = {0, 0};
    double loss = 0.0;
    int64_t hits = 0;
    int fin = 0;
    REFUSED(&t, "linear_fwd", o->linear_fwd(be, NULL, x, y, NULL, 2, 2, 2, NULL));
    REFUSED(&t, "linear_fwd", o->linear_fwd(be, z, x, y, NULL, -1, 2, 2, NULL));
    REFUSED(&t, "linear_bwd", o->linear_bwd(be, z, NULL, x, x, y, 2, 2, 2, NULL));
    REFUSED(&t, "linear_bwd", o->linear_bwd(be, z, y, x, x, NULL, 2, 2, 2, NULL));
    REFUSED(&t, "linear_bwd", o->linear_bwd(be, z, y, x, x, y, 2, -2, 2, NULL));
    REFUSED(&t, "bias_fwd", o->bias_fwd(be, x, NULL, 2, 2));
    REFUSED(&t, "bias_fwd", o->bias_fwd(be, x, y, 2, -1));
    REFUSED(&t, "bias_bwd", o->bias_bwd(be, NULL, x, 2, 2));
    unary_cases(&t, o, be, x, y, z);
    REFUSED(&t, "mul", o->mul(be, NULL, x, y, 4));
    REFUSED(&t, "mul", o->mul(be, z, NULL, y, 4));
    REFUSED(&t, "mul", o->mul(be, z, x, NULL, 4));
    REFUSED(&t, "dropout_fwd", o->dropout_fwd(be, z, x, 2, 2, 1.0f, key, 0));
    REFUSED(&t, "dropout_fwd", o->dropout_fwd(be, z, x, 2, 2, -0.1f, key, 0));
    REFUSED(&t, "dropout_fwd", o->dropout_fwd(be, z, x, 2, 2, (float)NAN, key, 0));
    REFUSED(&t, "dropout_fwd", o->dropout_fwd(be, z, x, -2, 2, 0.5f, key, 0));
    REFUSED(&t, "dropout_fwd", o->dropout_fwd(be, z, x, 2, 2, 0.5f, NULL, 0));
    REFUSED(&t, "dropout_bwd", o->dropout_bwd(be, NULL, x, 2, 2, 0.5f, key, 0));
    REFUSED(&t, "dropout_bwd", o->dropout_bwd(be, z, x, 2, 2, 1.5f, key, 0));
    REFUSED(&t, "flatten_fwd", o->flatten_fwd(be, NULL, x, 4));
    REFUSED(&t, "flatten_bwd", o->flatten_bwd(be, z, NULL, 4));
    REFUSED(&t, "softmax_xent_fwd", o->softmax_xent_fwd(be, z, x, lab, 1, 0, 1, &loss, &hits));
    REFUSED(&t, "softmax_xent_fwd", o->softmax_xent_fwd(be, z, x, lab, 1, 4, 1, NULL, &hits));
    REFUSED(&t, "softmax_xent_fwd", o->softmax_xent_fwd(be, z, x, NULL, 1, 4, 1, &loss, &hits));
    REFUSED(&t, "softmax_xent_fwd", o->softmax_xent_fwd(be, z, x, lab, 1, 4, 0, &loss, &hits));
    REFUSED(&t, "softmax_xent_bwd", o->softmax_xent_bwd(be, z, x, lab, -1, 4, 1.0f));
    REFUSED(&t, "softmax_xent_bwd", o->softmax_xent_bwd(be, z, NULL, lab, 2, 4, 1.0f));
    REFUSED(&t, "rmsnorm_fwd", o->rmsnorm_fwd(be, z, y, x, NULL, 1e-5f, 2, 3));
    REFUSED(&t, "rmsnorm_fwd", o->rmsnorm_fwd(be, z, y, x, x, -1.0f, 2, 3));
    REFUSED(&t, "rmsnorm_fwd", o->rmsnorm_fwd(be, z, y, x, x, 1e-5f, 2, -3));
    REFUSED(&t, "rmsnorm_bwd", o->rmsnorm_bwd(be, z, NULL, x, x, y, x, 2, 3));
    REFUSED(&t, "rmsnorm_bwd", o->rmsnorm_bwd(be, z, z, x, x, NULL, x, 2, 3));
    REFUSED(&t, "rmsnorm_bwd", o->rmsnorm_bwd(be, z, z, x, x, y, x, -2, 3));
    struct dt_sgd_args sgd = {.lr = 0.1f, .momentum = 0.9f};
    REFUSED(&t, "sgd_update", o->sgd_update(be, x, y, NULL, 4, &sgd));
    REFUSED(&t, "sgd_update", o->sgd_update(be, x, y, z, 4, NULL));
    sgd = (struct dt_sgd_args){.lr = -0.1f};
    REFUSED(&t, "sgd_update", o->sgd_update(be, x, y, z, 4, &sgd));
    sgd = (struct dt_sgd_args){.lr = 0.1f, .nesterov = 1};
    REFUSED(&t, "sgd_update", o->sgd_update(be, x, y, z, 4, &sgd));
    struct dt_adamw_args adam = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .t = 0};
    REFUSED(&t, "adamw_update", o->adamw_update(be, x, y, z, z, 4, &adam));
    adam.t = 1;
    REFUSED(&t, "adamw_update", o->adamw_update(be, x, y, NULL, z, 4, &adam));
    adam.beta2 = 1.0f;
    REFUSED(&t, "adamw_update", o->adamw_update(be, x, y, z, z, 4, &adam));
    adam = (struct dt_adamw_args){.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .t = 1, .clear = z};
    REFUSED(&t, "adamw_update", o->adamw_update(be, x, y, z, z, 4, &adam)); /* clear is not g */
    sgd = (struct dt_sgd_args){.lr = 0.1f, .clear = x};
    REFUSED(&t, "sgd_update", o->sgd_update(be, x, y, NULL, 4, &sgd)); /* clear is not g */
    REFUSED(&t, "sumsq", o->sumsq(be, x, 4, NULL));
    size_t g_lo[1] = {2}, g_hi[1] = {1};
    struct dt_gate gate_out;
    struct dt_gate_args gate = {.lo = g_lo, .hi = g_hi, .count = 1};
    REFUSED(&t, "step_gate", o->step_gate(be, z, &gate, &gate_out)); /* lo > hi */
    REFUSED(&t, "step_gate", o->step_gate(be, z, NULL, &gate_out));
    gate = (struct dt_gate_args){.count = 1};
    REFUSED(&t, "step_gate", o->step_gate(be, z, &gate, &gate_out)); /* no ranges */
    g_lo[0] = 0;
    gate = (struct dt_gate_args){.lo = g_lo, .hi = g_hi, .count = 1, .decide = 1, .unscale = 0.0f};
    REFUSED(&t, "step_gate", o->step_gate(be, z, &gate, &gate_out));
    gate.unscale = 1.0f;
    gate.clip_norm = -1.0;
    REFUSED(&t, "step_gate", o->step_gate(be, z, &gate, &gate_out));
    REFUSED(&t, "scale", o->scale(be, NULL, 4, 2.0f));
    REFUSED(&t, "fill", o->fill(be, NULL, 4, 2.0f));
    REFUSED(&t, "all_finite", o->all_finite(be, NULL, 4, &fin));
    REFUSED(&t, "to_bf16", o->to_bf16(be, NULL, x, 4));
    REFUSED(&t, "to_bf16", o->to_bf16(be, (uint16_t *)y, NULL, 4));
    REFUSED(&t, "from_bf16", o->from_bf16(be, NULL, (const uint16_t *)y, 4));
    REFUSED(&t, "from_bf16", o->from_bf16(be, z, NULL, 4));
    if (loss != 0.0 || hits != 0) {
        printf("\n  softmax_xent_fwd: a refused call accumulated a loss or a hit");
        t.bad++;
    }
    if (ran) *ran = t.ran;
    return t.bad;
}
