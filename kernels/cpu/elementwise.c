/*
 * elementwise.c - sums and products of whole buffers on the CPU: add (the
 * forward of a residual connection), accumulate (gradients flowing into a
 * tensor that several nodes read) and mul (the backward of an activation
 * that kept its gradient, <unary>_fwd_keep).
 *
 * The fast versions work on fixed blocks of DT_CPU_LANES elements so GCC
 * vectorises them at -O2; each element is one fp32 addition or
 * multiplication, so they give the reference's bits. add and mul allow
 * out == a or out == b (in place), not partly overlapping buffers;
 * accumulate adds into dst (+=).
 */
#include "cpu_ops.h"

static dt_status check_add(const float *out, const float *a, const float *b)
{
    DT_CPU_REQUIRE(out && a && b, "add", "out, a and b must not be NULL");
    return DT_OK;
}

static dt_status check_accumulate(const float *dst, const float *src)
{
    DT_CPU_REQUIRE(dst && src, "accumulate", "dst and src must not be NULL");
    return DT_OK;
}

static dt_status check_mul(const float *out, const float *a, const float *b)
{
    DT_CPU_REQUIRE(out && a && b, "mul", "out, a and b must not be NULL");
    return DT_OK;
}

/* ---- reference ------------------------------------------------------- */

/* out(n) = a * b */
dt_status dt_cpu_mul_ref(dt_backend_t *be, float *out, const float *a, const float *b, size_t n)
{
    dt_status st = check_mul(out, a, b);
    if (st != DT_OK)
        return st;
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] * b[i];
    return DT_OK;
}

/* out(n) = a + b */
dt_status dt_cpu_add_ref(dt_backend_t *be, float *out, const float *a, const float *b, size_t n)
{
    dt_status st = check_add(out, a, b);
    if (st != DT_OK)
        return st;
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
    return DT_OK;
}

/* dst(n) += src */
dt_status dt_cpu_accumulate_ref(dt_backend_t *be, float *dst, const float *src, size_t n)
{
    dt_status st = check_accumulate(dst, src);
    if (st != DT_OK)
        return st;
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
    return DT_OK;
}

/* ---- fast ------------------------------------------------------------ */

struct ew_job {
    float *out;
    const float *a, *b;
};

DT_CPU_CLONES static void add_range(void *arg, size_t lo, size_t n)
{
    const struct ew_job *j = arg;
    float *out = j->out;
    const float *a = j->a, *b = j->b;
    size_t i = lo;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES) {
        float t[DT_CPU_LANES];
        for (int k = 0; k < DT_CPU_LANES; k++)
            t[k] = a[i + k] + b[i + k];
        for (int k = 0; k < DT_CPU_LANES; k++)
            out[i + k] = t[k];
    }
    for (; i < n; i++)
        out[i] = a[i] + b[i];
}

dt_status dt_cpu_add(dt_backend_t *be, float *out, const float *a, const float *b, size_t n)
{
    dt_status st = check_add(out, a, b);
    struct ew_job j = {.out = out, .a = a, .b = b};
    if (st == DT_OK)
        dt_cpu_for(be, n, DT_CPU_GRAIN, add_range, &j);
    return st;
}

DT_CPU_CLONES static void accumulate_range(void *arg, size_t lo, size_t n)
{
    const struct ew_job *j = arg;
    float *dst = j->out;
    const float *src = j->a;
    size_t i = lo;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES) {
        float t[DT_CPU_LANES];
        for (int k = 0; k < DT_CPU_LANES; k++)
            t[k] = dst[i + k] + src[i + k];
        for (int k = 0; k < DT_CPU_LANES; k++)
            dst[i + k] = t[k];
    }
    for (; i < n; i++)
        dst[i] += src[i];
}

dt_status dt_cpu_accumulate(dt_backend_t *be, float *dst, const float *src, size_t n)
{
    dt_status st = check_accumulate(dst, src);
    struct ew_job j = {.out = dst, .a = src};
    if (st == DT_OK)
        dt_cpu_for(be, n, DT_CPU_GRAIN, accumulate_range, &j);
    return st;
}

DT_CPU_CLONES static void mul_range(void *arg, size_t lo, size_t n)
{
    const struct ew_job *j = arg;
    float *out = j->out;
    const float *a = j->a, *b = j->b;
    size_t i = lo;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES) {
        float t[DT_CPU_LANES];
        for (int k = 0; k < DT_CPU_LANES; k++)
            t[k] = a[i + k] * b[i + k];
        for (int k = 0; k < DT_CPU_LANES; k++)
            out[i + k] = t[k];
    }
    for (; i < n; i++)
        out[i] = a[i] * b[i];
}

dt_status dt_cpu_mul(dt_backend_t *be, float *out, const float *a, const float *b, size_t n)
{
    dt_status st = check_mul(out, a, b);
    struct ew_job j = {.out = out, .a = a, .b = b};
    if (st == DT_OK)
        dt_cpu_for(be, n, DT_CPU_GRAIN, mul_range, &j);
    return st;
}
