/*
 * reduce.c - whole-buffer helpers on the CPU: sum of squares (gradient
 * norms for clipping), scale (unscaling, clipping), fill, and the finite
 * check that decides whether a step is skipped.
 *
 * The fast versions work on fixed blocks of DT_CPU_LANES elements so GCC
 * vectorises them at -O2, and are built for AVX-512, AVX2 and the baseline
 * (picked at load time): they stream whole gradient buffers every step, so
 * the baseline's 16-byte vectors would leave most of the cache bandwidth
 * unused. Filling with +0.0 is memset (all bits zero). sumsq keeps
 * SUMSQ_LANES double accumulators, so the additions of one lane do not
 * wait on each other (its rounding differs from the reference's single
 * running sum, by far less
 * than fp32 resolution). all_finite tests the exponent bits instead of
 * calling isfinite(), which vectorises and cannot be folded away by
 * -ffinite-math-only; it reads the whole buffer (no early exit), since the
 * common case is a clean buffer.
 *
 * step_gate sums each range with the table's own sumsq and adds the range
 * totals in order, decides (kernels/gate.h), and multiplies through the
 * table's own scale, so it gives the bits of those ops called one by one.
 *
 * These ops produce no gradients (parameter gradients ACCUMULATE (+=) and
 * activation gradients are WRITTEN (=) elsewhere); scale, fill and
 * step_gate work in place.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"
#include "kernels/gate.h"

/* fp32 exponent field; all ones means Inf or NaN */
#define F32_EXP_MASK 0x7f800000u

static inline uint32_t nonfinite_bits(uint32_t u) { return (u & F32_EXP_MASK) == F32_EXP_MASK; }

/* ---- reference ------------------------------------------------------- */

/* *out = sum_i x_i^2, in double */
dt_status dt_cpu_sumsq_ref(dt_backend_t *be, const float *x, size_t n, double *out)
{
    DT_CPU_REQUIRE(x && out, "sumsq", "pointers must not be NULL");
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    *out = s;
    return DT_OK;
}

/* x *= s */
dt_status dt_cpu_scale_ref(dt_backend_t *be, float *x, size_t n, float s)
{
    DT_CPU_REQUIRE(x, "scale", "x must not be NULL");
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
    return DT_OK;
}

/* x = v */
dt_status dt_cpu_fill_ref(dt_backend_t *be, float *x, size_t n, float v)
{
    DT_CPU_REQUIRE(x, "fill", "x must not be NULL");
    for (size_t i = 0; i < n; i++)
        x[i] = v;
    return DT_OK;
}

/* *out = 1 if every x_i is finite, else 0 */
dt_status dt_cpu_all_finite_ref(dt_backend_t *be, const float *x, size_t n, int *out)
{
    DT_CPU_REQUIRE(x && out, "all_finite", "pointers must not be NULL");
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++)
        ok = isfinite(x[i]);
    *out = ok;
    return DT_OK;
}

/* ---- fast ------------------------------------------------------------ */

#define SUMSQ_LANES (2 * DT_CPU_LANES)

/* Sum of squares of the first multiple of SUMSQ_LANES elements; *done
 * gets how many that is. Lane k of SUMSQ_LANES is lo[k] for k below
 * DT_CPU_LANES, hi[k - DT_CPU_LANES] above: two loops of DT_CPU_LANES
 * keep the accumulators in registers (one loop over all SUMSQ_LANES is
 * not unrolled whole, and its accumulators then live on the stack, a
 * store and a load per addition), with the same sums in the same order. */
DT_CPU_CLONES static double
sumsq_blocks(const float *x, size_t n, size_t *done)
{
    double lo[DT_CPU_LANES] = {0}, hi[DT_CPU_LANES] = {0};
    size_t i = 0;
    for (; i + SUMSQ_LANES <= n; i += SUMSQ_LANES) {
        for (int k = 0; k < DT_CPU_LANES; k++)
            lo[k] += (double)x[i + k] * x[i + k];
        for (int k = 0; k < DT_CPU_LANES; k++)
            hi[k] += (double)x[i + DT_CPU_LANES + k] * x[i + DT_CPU_LANES + k];
    }
    double s = 0.0;
    for (int k = 0; k < DT_CPU_LANES; k++)
        s += lo[k];
    for (int k = 0; k < DT_CPU_LANES; k++)
        s += hi[k];
    *done = i;
    return s;
}

/* The threaded passes: blocks of DT_CPU_GRAIN elements. A sum is taken
 * per block (each as on one thread) and the blocks' sums added in block
 * order, so it does not depend on the thread count. */
struct reduce_job {
    float *x;
    const float *cx;
    float v;
    size_t n, block; /* all_finite: elements per block */
    double *part;
    uint32_t *bad;
};

static double sumsq_one(const float *x, size_t n)
{
    size_t i = 0;
    double s = sumsq_blocks(x, n, &i);
    for (; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}

static void sumsq_block(void *a, int t, int thread)
{
    const struct reduce_job *j = a;
    size_t lo = (size_t)t * DT_CPU_GRAIN, hi = lo + DT_CPU_GRAIN < j->n ? lo + DT_CPU_GRAIN : j->n;
    j->part[t] = sumsq_one(j->cx + lo, hi - lo);
}

dt_status dt_cpu_sumsq(dt_backend_t *be, const float *x, size_t n, double *out)
{
    DT_CPU_REQUIRE(x && out, "sumsq", "pointers must not be NULL");
    if (n <= DT_CPU_GRAIN) { /* else in blocks, on one thread as on many */
        *out = sumsq_one(x, n);
        return DT_OK;
    }
    size_t blocks = (n + DT_CPU_GRAIN - 1) / DT_CPU_GRAIN;
    struct reduce_job j = {.cx = x, .n = n};
    DT_CPU_REQUIRE(blocks <= INT32_MAX && (j.part = malloc(blocks * sizeof *j.part)) != NULL,
                   "sumsq", "out of host memory for %zu partial sums", blocks);
    dt_cpu_run(be, (int)blocks, sumsq_block, &j);
    double s = 0.0;
    for (size_t b = 0; b < blocks; b++)
        s += j.part[b];
    free(j.part);
    *out = s;
    return DT_OK;
}

DT_CPU_CLONES static size_t
scale_blocks(float *x, size_t n, float s)
{
    size_t i = 0;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES)
        for (int k = 0; k < DT_CPU_LANES; k++)
            x[i + k] *= s;
    return i;
}

static void scale_range(void *a, size_t lo, size_t hi)
{
    const struct reduce_job *j = a;
    float *x = j->x + lo;
    size_t n = hi - lo;
    for (size_t i = scale_blocks(x, n, j->v); i < n; i++)
        x[i] *= j->v;
}

dt_status dt_cpu_scale(dt_backend_t *be, float *x, size_t n, float s)
{
    DT_CPU_REQUIRE(x, "scale", "x must not be NULL");
    struct reduce_job j = {.x = x, .v = s};
    dt_cpu_for(be, n, DT_CPU_GRAIN, scale_range, &j);
    return DT_OK;
}

DT_CPU_CLONES static size_t
fill_blocks(float *x, size_t n, float v)
{
    size_t i = 0;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES)
        for (int k = 0; k < DT_CPU_LANES; k++)
            x[i + k] = v;
    return i;
}

dt_status dt_cpu_fill(dt_backend_t *be, float *x, size_t n, float v)
{
    DT_CPU_REQUIRE(x, "fill", "x must not be NULL");
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    if (bits == 0) { /* +0.0 */
        memset(x, 0, n * sizeof *x);
        return DT_OK;
    }
    for (size_t i = fill_blocks(x, n, v); i < n; i++)
        x[i] = v;
    return DT_OK;
}

/* Nonzero when one of the first multiple of DT_CPU_LANES elements is not
 * finite; *done gets how many that is. */
DT_CPU_CLONES static uint32_t
nonfinite_blocks(const float *x, size_t n, size_t *done)
{
    uint32_t bad[DT_CPU_LANES] = {0};
    size_t i = 0;
    for (; i + DT_CPU_LANES <= n; i += DT_CPU_LANES) {
        uint32_t u[DT_CPU_LANES];
        memcpy(u, x + i, sizeof u);
        for (int k = 0; k < DT_CPU_LANES; k++)
            bad[k] |= nonfinite_bits(u[k]);
    }
    uint32_t any = 0;
    for (int k = 0; k < DT_CPU_LANES; k++)
        any |= bad[k];
    *done = i;
    return any;
}

static void finite_block(void *a, int t, int thread)
{
    const struct reduce_job *j = a;
    size_t lo = (size_t)t * j->block, hi = lo + j->block < j->n ? lo + j->block : j->n;
    const float *x = j->cx + lo;
    size_t i = 0, n = hi - lo;
    uint32_t any = nonfinite_blocks(x, n, &i);
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        any |= nonfinite_bits(u);
    }
    j->bad[t] = any;
}

dt_status dt_cpu_all_finite(dt_backend_t *be, const float *x, size_t n, int *out)
{
    DT_CPU_REQUIRE(x && out, "all_finite", "pointers must not be NULL");
    uint32_t one = 0;
    size_t blocks = n > DT_CPU_GRAIN && dt_cpu_threads(be) > 1 && n / DT_CPU_GRAIN < INT32_MAX
                        ? (n + DT_CPU_GRAIN - 1) / DT_CPU_GRAIN
                        : 1;
    struct reduce_job j = {.cx = x, .n = n, .block = blocks > 1 ? DT_CPU_GRAIN : n, .bad = &one};
    if (blocks > 1) {
        DT_CPU_REQUIRE((j.bad = calloc(blocks, sizeof *j.bad)) != NULL, "all_finite",
                       "out of host memory for %zu partial results", blocks);
        dt_cpu_run(be, (int)blocks, finite_block, &j);
    } else {
        finite_block(&j, 0, 0);
    }
    uint32_t any = 0;
    for (size_t b = 0; b < blocks; b++)
        any |= j.bad[b];
    if (j.bad != &one)
        free(j.bad);
    *out = !any;
    return DT_OK;
}

/* ---- the step gate (both tables) --------------------------------------- */

typedef dt_status (*sumsq_fn)(dt_backend_t *be, const float *x, size_t n, double *out);
typedef dt_status (*scale_fn)(dt_backend_t *be, float *x, size_t n, float s);

static dt_status step_gate(dt_backend_t *be, float *g, const struct dt_gate_args *a,
                           struct dt_gate *out, sumsq_fn sumsq, scale_fn scale)
{
    DT_CPU_REQUIRE(g && a && out, "step_gate", "pointers must not be NULL");
    DT_CPU_REQUIRE(a->count == 0 || (a->lo && a->hi), "step_gate",
                   "the ranges must not be NULL (count=%zu)", a->count);
    for (size_t k = 0; k < a->count; k++)
        DT_CPU_REQUIRE(a->lo[k] <= a->hi[k], "step_gate", "range %zu is [%zu, %zu)", k, a->lo[k],
                       a->hi[k]);
    DT_CPU_REQUIRE(!a->decide || (a->unscale > 0.0f && isfinite(a->unscale) && a->clip_norm >= 0),
                   "step_gate", "need unscale > 0 and clip_norm >= 0 (unscale=%g, clip_norm=%g)",
                   (double)a->unscale, a->clip_norm);
    double total = 0;
    for (size_t k = 0; k < a->count; k++) {
        double part = 0;
        dt_status st = sumsq(be, g + a->lo[k], a->hi[k] - a->lo[k], &part);
        if (st != DT_OK) return st;
        total += part;
    }
    *out = (struct dt_gate){.sumsq = total, .factor = 1.0f};
    if (!a->decide) return DT_OK;
    out->skip = dt_gate_decide(total, a->unscale, a->clip_norm, &out->factor);
    dt_cpu_set_gate(be, out->skip);
    if (out->skip) return DT_OK;
    dt_status st = DT_OK;
    for (size_t k = 0; k < a->count && st == DT_OK; k++) {
        float *x = g + a->lo[k];
        size_t n = a->hi[k] - a->lo[k];
        if (a->unscale != 1.0f) st = scale(be, x, n, a->unscale);
        if (st == DT_OK && out->factor != 1.0f) st = scale(be, x, n, out->factor);
    }
    return st;
}

dt_status dt_cpu_step_gate_ref(dt_backend_t *be, float *g, const struct dt_gate_args *a,
                               struct dt_gate *out)
{
    return step_gate(be, g, a, out, dt_cpu_sumsq_ref, dt_cpu_scale_ref);
}

dt_status dt_cpu_step_gate(dt_backend_t *be, float *g, const struct dt_gate_args *a,
                           struct dt_gate *out)
{
    return step_gate(be, g, a, out, dt_cpu_sumsq, dt_cpu_scale);
}
