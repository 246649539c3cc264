/*
 * embedding.c - token embedding lookup on the CPU: out(N,D) = w(V,D)[ids],
 * and its backward, the scatter-add of the output gradient into the rows
 * of the table that the ids picked.
 *
 * Token ids arrive as floats (every tensor of the op table is fp32; whole
 * numbers below 2^24 are exact in a float). Both versions check every id
 * before touching memory: a fraction, NaN, a negative or an id >= V is an
 * invalid argument naming its position, never a read or write outside the
 * table.
 *
 * The backward adds rows in the order n = 0..N-1, so a row of dw picked
 * several times gets its contributions in one fixed order: the same bits
 * on every run and in both versions. (A GPU version that wants the same
 * guarantee sorts by id instead of using atomics.)
 *
 * The reference copies and adds element by element. The fast forward
 * copies whole rows with memcpy; the fast backward adds each row in blocks
 * of DT_CPU_LANES floats that the compiler vectorises, in the same order
 * per element as the reference, so the results are bit-identical.
 *
 * The table's gradient (dw) ACCUMULATES (+=); the output is WRITTEN (=).
 */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"

/* Token ids must be exact in a float, so V is at most 2^24. */
#define EMBEDDING_MAX_V (1 << 24)

static dt_status check_sizes(const char *op, int N, int V, int D)
{
    if (N < 0 || V < 1 || D < 1)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cpu %s: need N >= 0, V >= 1 and D >= 1 (N=%d, V=%d, D=%d)", op, N, V,
                            D);
    if (V > EMBEDDING_MAX_V)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cpu %s: vocabulary size V=%d is above 2^24, the largest whose token "
                            "ids a float holds exactly",
                            op, V);
    return DT_OK;
}

/* Every id a whole number in [0, V). */
static dt_status check_ids(const char *op, const float *ids, int N, int V)
{
    for (int n = 0; n < N; n++) {
        float id = ids[n];
        if (!(id >= 0.0f && id < (float)V) || id != floorf(id))
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "cpu %s: token id %.9g at position %d is not a whole number in "
                                "[0, %d) (is the data's vocabulary larger than the model's?)",
                                op, (double)id, n, V);
    }
    return DT_OK;
}

static dt_status check_fwd(const float *out, const float *ids, const float *w, int N, int V, int D)
{
    DT_CPU_REQUIRE(out && ids && w, "embedding_fwd", "out, ids and w must not be NULL");
    dt_status st = check_sizes("embedding_fwd", N, V, D);
    return st != DT_OK ? st : check_ids("embedding_fwd", ids, N, V);
}

static dt_status check_bwd(const float *dw, const float *dout, const float *ids, int N, int V,
                           int D)
{
    DT_CPU_REQUIRE(dw && dout && ids, "embedding_bwd", "dw, dout and ids must not be NULL");
    dt_status st = check_sizes("embedding_bwd", N, V, D);
    return st != DT_OK ? st : check_ids("embedding_bwd", ids, N, V);
}

/* ---- reference ------------------------------------------------------- */

/* out(n, d) = w(ids[n], d) */
dt_status dt_cpu_embedding_fwd_ref(dt_backend_t *be, float *out, const float *ids, const float *w,
                                   int N, int V, int D)
{
    dt_status st = check_fwd(out, ids, w, N, V, D);
    if (st != DT_OK)
        return st;
    for (int n = 0; n < N; n++) {
        size_t v = (size_t)ids[n];
        for (int d = 0; d < D; d++)
            out[(size_t)n * D + d] = w[v * D + d];
    }
    return DT_OK;
}

/* dw(ids[n], d) += dout(n, d), for n = 0..N-1 in order */
dt_status dt_cpu_embedding_bwd_ref(dt_backend_t *be, float *dw, const float *dout, const float *ids,
                                   int N, int V, int D)
{
    dt_status st = check_bwd(dw, dout, ids, N, V, D);
    if (st != DT_OK)
        return st;
    for (int n = 0; n < N; n++) {
        size_t v = (size_t)ids[n];
        for (int d = 0; d < D; d++)
            dw[v * D + d] += dout[(size_t)n * D + d];
    }
    return DT_OK;
}

/* ---- fast ------------------------------------------------------------ */

/* Forward: blocks of rows. Backward: blocks of DT_CPU_LANES columns, each
 * taking the rows in order, so a row of dw that several ids share sums in
 * the one-thread order. */
struct emb_job {
    float *out, *dw;
    const float *ids, *w, *dout;
    int N, D;
};

static void emb_fwd_rows(void *a, size_t lo, size_t hi)
{
    const struct emb_job *j = a;
    for (size_t n = lo; n < hi; n++)
        memcpy(j->out + n * j->D, j->w + (size_t)j->ids[n] * j->D, (size_t)j->D * sizeof *j->out);
}

dt_status dt_cpu_embedding_fwd(dt_backend_t *be, float *out, const float *ids, const float *w,
                               int N, int V, int D)
{
    dt_status st = check_fwd(out, ids, w, N, V, D);
    if (st != DT_OK)
        return st;
    struct emb_job j = {.out = out, .ids = ids, .w = w, .N = N, .D = D};
    dt_cpu_for(be, (size_t)N, 1 + DT_CPU_GRAIN / ((size_t)D + 1), emb_fwd_rows, &j);
    return DT_OK;
}

/* row(D) += g(D), in blocks computed into a local array so the compiler
 * vectorises without proving that row and g do not overlap. */
static void add_row(float *row, const float *g, int D)
{
    int d = 0;
    for (; d + DT_CPU_LANES <= D; d += DT_CPU_LANES) {
        float t[DT_CPU_LANES];
        for (int k = 0; k < DT_CPU_LANES; k++)
            t[k] = row[d + k] + g[d + k];
        for (int k = 0; k < DT_CPU_LANES; k++)
            row[d + k] = t[k];
    }
    for (; d < D; d++)
        row[d] += g[d];
}

static void emb_bwd_strips(void *a, size_t lo, size_t hi)
{
    const struct emb_job *j = a;
    const int D = j->D, d0 = (int)lo * DT_CPU_LANES;
    const int d1 = (int)hi * DT_CPU_LANES < D ? (int)hi * DT_CPU_LANES : D;
    for (int n = 0; n < j->N; n++)
        add_row(j->dw + (size_t)j->ids[n] * D + d0, j->dout + (size_t)n * D + d0, d1 - d0);
}

dt_status dt_cpu_embedding_bwd(dt_backend_t *be, float *dw, const float *dout, const float *ids,
                               int N, int V, int D)
{
    dt_status st = check_bwd(dw, dout, ids, N, V, D);
    if (st != DT_OK)
        return st;
    struct emb_job j = {.dw = dw, .ids = ids, .dout = dout, .N = N, .D = D};
    size_t strips = ((size_t)D + DT_CPU_LANES - 1) / DT_CPU_LANES;
    dt_cpu_for(be, strips, 1 + DT_CPU_GRAIN / ((size_t)N * DT_CPU_LANES + 1), emb_bwd_strips, &j);
    return DT_OK;
}
