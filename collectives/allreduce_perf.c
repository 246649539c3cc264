/*
 * allreduce_perf.c - the all-reduce benchmark behind `dtrain bench
 * allreduce`: nccl-tests' all_reduce_perf for a dt_comm.
 *
 * For each power-of-two size it runs untimed warm-up all-reduces (whose
 * time, agreed over ranks, sizes the adaptive iteration count), times
 * `iters` in-place fp32 SUM all-reduces after a barrier, and reports the
 * slowest rank's mean time per op. It then refills the buffer and checks one
 * more all-reduce exactly on every rank: rank r holds (i mod P) + (r mod 7)
 * at index i, small integers whose sum over ranks is exact in fp32, so the
 * expected value is known in closed form and any error is a real one. The
 * ranks agree on the count of wrong values before anyone returns, so a
 * failure on one rank never leaves the others waiting.
 *
 * With a device-buffer communicator (nccl) the buffer is device memory:
 * the pattern is written into a host copy and uploaded, and the result is
 * downloaded into it to be checked. The agreement traffic (small host
 * values) then goes over the control communicator, as in training.
 */
#include "allreduce_perf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"

#define PATTERN_MAX_PERIOD 8191 /* a prime, so misplaced blocks show */
#define FP32_EXACT (1u << 24)   /* integers up to this are exact in fp32 */
#define HOST_NAME_BYTES 256
#define HOSTS_SHOWN 4

struct bench {
    dt_comm_t *c;                      /* the communicator measured */
    dt_comm_t *ctl;                    /* bookkeeping: c itself, or the control one */
    const struct dt_bench_device *dev; /* NULL: host buffers */
    int rank, size;
    int iters, warmup;
    int nonblocking;
    FILE *out;     /* rank 0 only */
    float *buf;    /* max size, reused for every size (device memory with dev) */
    float *host;   /* where the pattern is written and checked: buf, or its host copy */
    size_t period; /* the check pattern's period P */
    uint64_t rank_term;
};

struct row {
    size_t bytes;
    int iters;
    double time_s; /* slowest rank's mean per op */
    long long wrong;
};

static size_t floor_pow2(size_t x)
{
    size_t p = 1;
    while (p <= x / 2)
        p *= 2;
    return p;
}

static dt_status resolve_sizes(const struct dt_bench_allreduce_opts *o, size_t *lo, size_t *hi)
{
    size_t min = o->min_bytes ? o->min_bytes : DT_BENCH_MIN_BYTES;
    size_t max = o->max_bytes ? o->max_bytes : DT_BENCH_MAX_BYTES;
    if (o->iters < 0 || o->warmup < 0)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "bench allreduce: iterations (%d) and warm-up "
                            "ops (%d) cannot be negative",
                            o->iters, o->warmup);
    if (max < DT_BENCH_MIN_BYTES)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "bench allreduce: the largest size (%zu bytes) must be at least %zu",
                            max, DT_BENCH_MIN_BYTES);
    *hi = floor_pow2(max);
    *lo = floor_pow2(min < DT_BENCH_MIN_BYTES ? DT_BENCH_MIN_BYTES : min);
    if (*lo < min) *lo *= 2;
    if (*lo > *hi)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "bench allreduce: no power-of-two size between %zu and %zu bytes", min,
                            max);
    return DT_OK;
}

/* The communicators and device agree with each other (same on every rank). */
static dt_status check_setup(const struct dt_bench_allreduce_opts *o, dt_comm_t *c)
{
    const char *name = dt_comm_backend(c);
    const struct dt_bench_device *d = o->device;
    if (!dt_comm_device_buffers(c)) {
        if (d)
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "bench allreduce: the %s communicator takes host buffers, but a "
                                "device was given",
                                name);
        return DT_OK;
    }
    if (!d || !d->be || !d->alloc || !d->free || !d->copy || !d->sync)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "bench allreduce: the %s communicator all-reduces device memory; "
                            "pass the compute backend it is bound to",
                            name);
    if (!o->control || dt_comm_device_buffers(o->control) ||
        dt_comm_size(o->control) != dt_comm_size(c))
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "bench allreduce: the %s communicator needs a host-buffer control "
                            "communicator (mpi) over the same ranks",
                            name);
    return DT_OK;
}

static dt_status alloc_buffers(struct bench *b, size_t bytes)
{
    dt_status st;
    if (!b->dev) {
        st = dt_malloc(bytes, "the allreduce benchmark buffer", (void **)&b->buf);
        b->host = b->buf;
        return st;
    }
    st = b->dev->alloc(b->dev->be, bytes, (void **)&b->buf);
    if (st == DT_OK)
        st = dt_malloc(bytes, "the host copy of the allreduce benchmark buffer", (void **)&b->host);
    return st;
}

static void free_buffers(struct bench *b)
{
    if (b->dev) {
        if (b->buf) b->dev->free(b->dev->be, b->buf);
        free(b->host);
    } else {
        free(b->buf);
    }
    b->buf = b->host = NULL;
}

/* Allocates the buffer on every rank and agrees on success, so a rank that
 * ran out of memory does not leave the others in a collective. */
static dt_status alloc_agreed(struct bench *b, size_t bytes)
{
    dt_status st = alloc_buffers(b, bytes);
    int32_t failed = st != DT_OK;
    dt_status ast = dt_comm_allreduce(b->ctl, &failed, 1, DT_I32, DT_COMM_MAX);
    if (ast != DT_OK) return ast;
    if (failed && st == DT_OK)
        st = dt_set_error(DT_ERR_NOMEM,
                          "bench allreduce: another rank could not allocate %zu bytes", bytes);
    return st;
}

/* Writes the pattern (and uploads it to the device buffer). */
static dt_status fill(const struct bench *b, size_t count)
{
    float base = (float)(b->rank % 7);
    size_t j = 0;
    for (size_t i = 0; i < count; i++) {
        b->host[i] = (float)j + base;
        if (++j == b->period) j = 0;
    }
    if (!b->dev) return DT_OK;
    return b->dev->copy(b->dev->be, b->buf, b->host, count * sizeof(float), DT_COPY_H2D);
}

/* The result where the check can read it. */
static dt_status fetch(const struct bench *b, size_t count)
{
    if (!b->dev) return DT_OK;
    dt_status st = b->dev->copy(b->dev->be, b->host, b->buf, count * sizeof(float), DT_COPY_D2H);
    return st != DT_OK ? st : b->dev->sync(b->dev->be);
}

/* One in-place fp32 sum of the buffer's first count elements. */
static dt_status one_op(const struct bench *b, size_t count)
{
    if (!b->nonblocking)
        return dt_comm_allreduce(b->c, b->buf, count, DT_F32, DT_COMM_SUM);
    dt_comm_req_t *req = NULL;
    dt_status st = dt_comm_iallreduce(b->c, b->buf, count, DT_F32, DT_COMM_SUM, &req);
    return st != DT_OK ? st : dt_comm_wait(b->c, req);
}

/* Runs n all-reduces after a barrier; *max_s gets the slowest rank's time. */
static dt_status timed_ops(struct bench *b, size_t count, int n, double *max_s)
{
    dt_status st;
    DT_CHECK(dt_comm_barrier(b->c));
    double t0 = dt_now();
    for (int i = 0; i < n; i++)
        DT_CHECK(one_op(b, count));
    *max_s = dt_now() - t0;
    DT_CHECK(dt_comm_allreduce(b->ctl, max_s, 1, DT_F64, DT_COMM_MAX));
out:
    return st;
}

static int adaptive_iters(double per_op_s)
{
    double n = per_op_s > 0 ? DT_BENCH_TARGET_S / per_op_s : DT_BENCH_MAX_ITERS;
    if (n < DT_BENCH_MIN_ITERS) return DT_BENCH_MIN_ITERS;
    return n > DT_BENCH_MAX_ITERS ? DT_BENCH_MAX_ITERS : (int)n;
}

/* Counts the wrong values of one fresh all-reduce here, then over ranks. */
static dt_status check_size(struct bench *b, size_t bytes, long long *wrong)
{
    size_t count = bytes / 4, bad_at = 0;
    int64_t local = 0;
    dt_status st;
    DT_CHECK(fill(b, count));
    DT_CHECK(one_op(b, count));
    DT_CHECK(fetch(b, count));
    for (size_t i = 0, j = 0; i < count; i++, j = j + 1 == b->period ? 0 : j + 1) {
        float want = (float)((uint64_t)b->size * j + b->rank_term);
        if (b->host[i] != want && local++ == 0) bad_at = i;
    }
    if (local)
        dt_set_error(DT_ERR_INTERNAL,
                     "allreduce of %zu bytes gave %lld wrong values on rank %d (first at index "
                     "%zu: %g, expected %g)",
                     bytes, (long long)local, b->rank, bad_at, (double)b->host[bad_at],
                     (double)((uint64_t)b->size * (bad_at % b->period) + b->rank_term));
    int64_t total = local;
    DT_CHECK(dt_comm_allreduce(b->ctl, &total, 1, DT_I64, DT_COMM_SUM));
    *wrong = (long long)total;
    if (total && !local)
        dt_set_error(DT_ERR_INTERNAL,
                     "allreduce of %zu bytes gave %lld wrong values, none of them on rank %d",
                     bytes, (long long)total, b->rank);
    st = total ? DT_ERR_INTERNAL : DT_OK;
out:
    return st;
}

static dt_status run_size(struct bench *b, size_t bytes, struct row *row)
{
    size_t count = bytes / 4;
    double warm_s = 0, timed_s = 0;
    dt_status st;
    *row = (struct row){.bytes = bytes};
    DT_CHECK(fill(b, count));
    DT_CHECK(timed_ops(b, count, b->warmup, &warm_s));
    row->iters = b->iters ? b->iters : adaptive_iters(warm_s / b->warmup);
    DT_CHECK(timed_ops(b, count, row->iters, &timed_s));
    row->time_s = timed_s / row->iters;
    st = check_size(b, bytes, &row->wrong);
out:
    if (st != DT_OK && st != DT_ERR_INTERNAL)
        dt_error_context(st, "bench allreduce at %zu bytes", bytes);
    return st;
}

/* ---- output --------------------------------------------------------------- */

static dt_status print_header(const struct bench *b)
{
    char *all = NULL, mine[HOST_NAME_BYTES] = {0};
    dt_status st;
    snprintf(mine, sizeof mine, "%s", dt_comm_host(b->c));
    DT_CHECK(dt_malloc((size_t)b->size * HOST_NAME_BYTES, "host names", (void **)&all));
    DT_CHECK(dt_comm_allgather(b->ctl, mine, all, HOST_NAME_BYTES));
    if (!b->out) goto out;
    int hosts = 0;
    char shown[160] = "";
    for (int r = 0; r < b->size; r++) {
        const char *h = all + (size_t)r * HOST_NAME_BYTES;
        int seen = 0;
        for (int q = 0; q < r && !seen; q++)
            seen = !strcmp(h, all + (size_t)q * HOST_NAME_BYTES);
        if (seen) continue;
        if (hosts++ < HOSTS_SHOWN)
            snprintf(shown + strlen(shown), sizeof shown - strlen(shown), "%s%s",
                     hosts > 1 ? ", " : "", h);
    }
    fprintf(b->out,
            "# dtrain bench allreduce: backend %s%s, %d rank%s on %d host%s (%s%s)\n"
            "# float32 sum in place; time = slowest rank's mean per op; algbw = size / time;"
            " busbw = algbw * 2(n-1)/n\n#\n"
            "# %12s %12s %6s %6s %12s %12s %12s %7s\n",
            dt_comm_backend(b->c), b->nonblocking ? " (non-blocking, as in training)" : "", b->size,
            b->size == 1 ? "" : "s", hosts, hosts == 1 ? "" : "s", shown,
            hosts > HOSTS_SHOWN ? ", ..." : "", "size(B)", "count", "type", "iters", "time(us)",
            "algbw(GB/s)", "busbw(GB/s)", "#wrong");
out:
    free(all);
    return st;
}

static double busbw_of(const struct bench *b, const struct row *r)
{
    double algbw = r->time_s > 0 ? (double)r->bytes / r->time_s / 1e9 : 0;
    return algbw * 2.0 * (b->size - 1) / b->size;
}

static void print_row(const struct bench *b, const struct row *r)
{
    double algbw = r->time_s > 0 ? (double)r->bytes / r->time_s / 1e9 : 0;
    fprintf(b->out, "  %12zu %12zu %6s %6d %12.2f %12.3f %12.3f %7lld\n", r->bytes, r->bytes / 4,
            "float", r->iters, r->time_s * 1e6, algbw, busbw_of(b, r), r->wrong);
    fflush(b->out);
}

/* ---- driver ----------------------------------------------------------------- */

static void init_pattern(struct bench *b)
{
    size_t limit = FP32_EXACT / (size_t)b->size;
    b->period = limit > PATTERN_MAX_PERIOD + 7 ? PATTERN_MAX_PERIOD : limit > 8 ? limit - 7 : 1;
    b->rank_term = 0;
    for (int r = 0; r < b->size; r++)
        b->rank_term += (uint64_t)(r % 7);
}

dt_status dt_bench_allreduce(dt_comm_t *c, const struct dt_bench_allreduce_opts *o, FILE *out)
{
    struct bench b = {.c = c,
                      .ctl = o->control ? o->control : c,
                      .dev = o->device,
                      .rank = dt_comm_rank(c),
                      .size = dt_comm_size(c)};
    size_t lo = 0, hi = 0, nsizes = 0;
    long long wrong = 0;
    double busbw_sum = 0;
    dt_status st;
    DT_CHECK(check_setup(o, c));
    DT_CHECK(resolve_sizes(o, &lo, &hi));
    b.iters = o->iters;
    b.warmup = o->warmup ? o->warmup : DT_BENCH_WARMUP;
    b.nonblocking = o->nonblocking;
    b.out = b.rank == 0 ? out : NULL;
    init_pattern(&b);
    DT_CHECK(alloc_agreed(&b, hi));
    DT_CHECK(print_header(&b));
    for (size_t bytes = lo; bytes <= hi && bytes != 0; bytes *= 2) {
        struct row row;
        st = run_size(&b, bytes, &row);
        if (b.out && (st == DT_OK || st == DT_ERR_INTERNAL)) print_row(&b, &row);
        if (st != DT_OK) goto out;
        wrong += row.wrong;
        busbw_sum += busbw_of(&b, &row);
        nsizes++;
    }
    if (o->busbw_gbs) *o->busbw_gbs = nsizes ? busbw_sum / (double)nsizes : 0.0;
    if (b.out)
        fprintf(b.out, "# wrong values: %lld\n# average busbw: %.3f GB/s\n", wrong,
                nsizes ? busbw_sum / (double)nsizes : 0.0);
out:
    free_buffers(&b);
    return st;
}
