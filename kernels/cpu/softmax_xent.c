/*
 * softmax_xent.c - fused softmax and cross-entropy on the CPU.
 *
 * Fusing the two keeps the loss numerically stable: a row's loss is
 * logsumexp(logits) - logits[label], with the row maximum subtracted
 * before exponentiating, so logits of any size give a finite loss and
 * probabilities that sum to one (never log(0) of an underflowed softmax).
 * The forward also counts rows whose argmax (lowest index on ties) equals
 * the label, so accuracy costs no extra pass. The loss and the count are
 * ADDED to the caller's totals, so micro-batches can share them.
 *
 * The reference exponentiates and sums in double; the fast version stays
 * in float (expf, one reciprocal per row), which is what a GPU kernel does.
 * Backward, (probs - onehot) * scale, has nothing faster than the
 * reference and both tables use it.
 *
 * No parameters; the activation gradient (dlogits) is WRITTEN (=).
 */
#include <math.h>
#include <stdlib.h>

#include "cpu_ops.h"

static dt_status check_labels(const char *op, const int32_t *labels, int B, int C)
{
    for (int b = 0; b < B; b++)
        if (labels[b] < 0 || labels[b] >= C)
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "cpu %s: label %d of row %d is outside [0, %d) (wrong number of "
                                "classes in the model or the dataset?)",
                                op, (int)labels[b], b, C);
    return DT_OK;
}

static dt_status check_fwd(const float *probs, const float *logits, const int32_t *labels, int B,
                           int C, int per, const double *loss_sum, const int64_t *correct)
{
    DT_CPU_REQUIRE(probs && logits && labels && loss_sum && correct, "softmax_xent_fwd",
                   "pointers must not be NULL");
    DT_CPU_REQUIRE(B >= 0 && C >= 1, "softmax_xent_fwd", "need B >= 0 and C >= 1 (B=%d, C=%d)",
                   B, C);
    DT_CPU_REQUIRE(per >= 1, "softmax_xent_fwd", "need per >= 1 (per=%d)", per);
    return check_labels("softmax_xent_fwd", labels, B, C);
}

static dt_status check_bwd(const float *dlogits, const float *probs, const int32_t *labels, int B,
                           int C)
{
    DT_CPU_REQUIRE(dlogits && probs && labels, "softmax_xent_bwd", "pointers must not be NULL");
    DT_CPU_REQUIRE(B >= 0 && C >= 1, "softmax_xent_bwd", "need B >= 0 and C >= 1 (B=%d, C=%d)",
                   B, C);
    return check_labels("softmax_xent_bwd", labels, B, C);
}

/* Index of the first maximum of x(C). */
static int argmax_first(const float *x, int C)
{
    int arg = 0;
    for (int c = 1; c < C; c++)
        if (x[c] > x[arg])
            arg = c;
    return arg;
}

/* probs(B,C) = softmax(logits(B,C));
 * loss_sum += (sum_b logsumexp(logits[b]) - logits[b, labels[b]]) / per */
dt_status dt_cpu_softmax_xent_fwd_ref(dt_backend_t *be, float *probs, const float *logits,
                                      const int32_t *labels, int B, int C, int per,
                                      double *loss_sum, int64_t *correct)
{
    dt_status st = check_fwd(probs, logits, labels, B, C, per, loss_sum, correct);
    if (st != DT_OK)
        return st;
    double loss = 0.0;
    int64_t hits = 0;
    for (int b = 0; b < B; b++) {
        const float *x = logits + (size_t)b * C; /* (C) */
        float *pr = probs + (size_t)b * C;        /* (C) */
        int arg = argmax_first(x, C);
        double m = x[arg];
        double s = 0.0; /* sum_c exp(x_c - max) */
        for (int c = 0; c < C; c++)
            s += exp((double)x[c] - m);
        for (int c = 0; c < C; c++)
            pr[c] = (float)(exp((double)x[c] - m) / s);
        /* -log softmax[label] = (max - x[label]) + log(s) */
        loss += (m - x[labels[b]]) + log(s);
        hits += arg == labels[b];
    }
    *loss_sum += loss / per;
    *correct += hits;
    return DT_OK;
}

/* Rows [lo, hi): the probabilities, each row's loss and whether its
 * argmax is the label (row[b], or row[0] when `one`). */
struct xent_row {
    double loss;
    int hit;
};

struct xent_job {
    float *probs;
    const float *logits;
    const int32_t *labels;
    int C, one;
    struct xent_row *row;
};

static void xent_rows(void *a, size_t lo, size_t hi)
{
    const struct xent_job *j = a;
    const int C = j->C;
    for (size_t b = lo; b < hi; b++) {
        const float *x = j->logits + b * C; /* (C) */
        float *pr = j->probs + b * C;        /* (C) */
        int arg = argmax_first(x, C);
        float m = x[arg];
        float s = 0.0f;
        for (int c = 0; c < C; c++) {
            float e = expf(x[c] - m);
            pr[c] = e;
            s += e;
        }
        float inv = 1.0f / s;
        for (int c = 0; c < C; c++)
            pr[c] *= inv;
        struct xent_row *r = &j->row[j->one ? 0 : b];
        r->loss = ((double)m - x[j->labels[b]]) + log((double)s);
        r->hit = arg == j->labels[b];
    }
}

/* Rows shared by the threads; the losses summed in row order after, so
 * the sum is the one-thread sum. */
dt_status dt_cpu_softmax_xent_fwd(dt_backend_t *be, float *probs, const float *logits,
                                  const int32_t *labels, int B, int C, int per, double *loss_sum,
                                  int64_t *correct)
{
    dt_status st = check_fwd(probs, logits, labels, B, C, per, loss_sum, correct);
    if (st != DT_OK)
        return st;
    double loss = 0.0;
    int64_t hits = 0;
    struct xent_row one;
    struct xent_job j = {.probs = probs, .logits = logits, .labels = labels, .C = C, .one = 1,
                         .row = &one};
    if (dt_cpu_threads(be) > 1 && (size_t)B * C > DT_CPU_GRAIN) {
        DT_CPU_REQUIRE((j.row = malloc((size_t)B * sizeof *j.row)) != NULL, "softmax_xent_fwd",
                       "out of host memory for %d row losses", B);
        j.one = 0;
        dt_cpu_for(be, (size_t)B, 1 + DT_CPU_GRAIN / (size_t)C, xent_rows, &j);
    }
    for (int b = 0; b < B; b++) {
        if (j.one)
            xent_rows(&j, (size_t)b, (size_t)b + 1);
        loss += j.row[j.one ? 0 : b].loss;
        hits += j.row[j.one ? 0 : b].hit;
    }
    if (!j.one)
        free(j.row);
    *loss_sum += loss / per;
    *correct += hits;
    return DT_OK;
}

/* dlogits(B,C) = (probs(B,C) - onehot(labels)) * scale */
dt_status dt_cpu_softmax_xent_bwd_ref(dt_backend_t *be, float *dlogits, const float *probs,
                                      const int32_t *labels, int B, int C, float scale)
{
    dt_status st = check_bwd(dlogits, probs, labels, B, C);
    if (st != DT_OK)
        return st;
    for (int b = 0; b < B; b++) {
        const float *pr = probs + (size_t)b * C; /* (C) */
        float *d = dlogits + (size_t)b * C;      /* (C) */
        for (int c = 0; c < C; c++) {
            float onehot = c == labels[b] ? 1.0f : 0.0f;
            d[c] = (pr[c] - onehot) * scale;
        }
    }
    return DT_OK;
}

/* The same expression per element as the reference, rows on the pool's
 * threads. */
struct xent_bwd_job {
    float *dlogits;
    const float *probs;
    const int32_t *labels;
    int C;
    float scale;
};

DT_CPU_CLONES static void xent_bwd_rows(void *a, size_t lo, size_t hi)
{
    const struct xent_bwd_job *j = a;
    const int C = j->C;
    for (size_t b = lo; b < hi; b++) {
        const float *pr = j->probs + b * C; /* (C) */
        float *d = j->dlogits + b * C;      /* (C) */
        for (int c = 0; c < C; c++)
            d[c] = pr[c] * j->scale;
        const int y = j->labels[b];
        d[y] = (pr[y] - 1.0f) * j->scale;
    }
}

dt_status dt_cpu_softmax_xent_bwd(dt_backend_t *be, float *dlogits, const float *probs,
                                  const int32_t *labels, int B, int C, float scale)
{
    dt_status st = check_bwd(dlogits, probs, labels, B, C);
    if (st != DT_OK)
        return st;
    struct xent_bwd_job j = {.dlogits = dlogits, .probs = probs, .labels = labels, .C = C,
                             .scale = scale};
    dt_cpu_for(be, (size_t)B, 1 + DT_CPU_GRAIN / (size_t)C, xent_bwd_rows, &j);
    return DT_OK;
}
