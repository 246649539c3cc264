/*
 * allreduce_perf.h - the all-reduce measurement (`dtrain bench allreduce`, `dtrain doctor`).
 *
 * The all-reduce benchmark times in-place fp32 SUM all-reduces over a
 * range of power-of-two sizes, like nccl-tests' all_reduce_perf, and checks
 * every size's result exactly on every rank, so a number it prints is the
 * speed of a collective that gave the right answer. A device-buffer
 * communicator (nccl) all-reduces device memory of a compute backend; the
 * benchmark's own bookkeeping (agreeing on failures, the slowest time, the
 * host names) then goes over a host-buffer control communicator.
 */
#ifndef DT_ALLREDUCE_PERF_H
#define DT_ALLREDUCE_PERF_H

#include <stddef.h>
#include <stdio.h>

#include "kernels/backend.h"
#include "core/status.h"
#include "comm.h"

#define DT_BENCH_MIN_BYTES ((size_t)8)
#define DT_BENCH_MAX_BYTES ((size_t)256 << 20)
#define DT_BENCH_WARMUP 2
#define DT_BENCH_TARGET_S 0.2 /* timed seconds per size when iters is adaptive */
#define DT_BENCH_MIN_ITERS 3
#define DT_BENCH_MAX_ITERS 1000

/* Device memory for a device-buffer communicator: a compute backend and
 * its entry points (dt_backend_alloc, _free, _copy, _sync). They come as
 * pointers so that the communicator objects, which tests link alone, do
 * not depend on the compute backends. */
struct dt_bench_device {
    dt_backend_t *be;
    dt_status (*alloc)(dt_backend_t *be, size_t bytes, void **out);
    void (*free)(dt_backend_t *be, void *ptr);
    dt_status (*copy)(dt_backend_t *be, void *dst, const void *src, size_t bytes,
                      enum dt_copy_kind kind);
    dt_status (*sync)(dt_backend_t *be);
};

struct dt_bench_allreduce_opts {
    size_t min_bytes; /* smallest size, rounded up to a power of two >= 8; 0: 8 */
    size_t max_bytes; /* largest size (the largest power of two <= it); 0: 256 MiB */
    int iters;        /* timed ops per size; 0: adaptive, about DT_BENCH_TARGET_S per size */
    int warmup;       /* untimed ops per size before timing; 0: DT_BENCH_WARMUP */
    int nonblocking;  /* 1: dt_comm_iallreduce then dt_comm_wait, as the gradient
                         reducer does; 0: dt_comm_allreduce */
    /* Device-buffer communicators only (NULL for mpi): the backend whose
     * memory is all-reduced (the communicator bound to its stream), and a
     * host-buffer communicator over the same ranks for the bookkeeping. */
    const struct dt_bench_device *device;
    dt_comm_t *control;
    /* When not NULL: gets the average bus bandwidth over the sizes (GB/s,
     * the same on every rank), for callers that print their own report. */
    double *busbw_gbs;
};

/* Collective: every rank calls it with the same options. Uses one buffer of
 * the largest size per rank (and a host copy of it with a backend). Rank 0
 * writes the table to `out` (other ranks may pass NULL). A wrong result
 * anywhere makes every rank return DT_ERR_INTERNAL naming size, rank and
 * index; bad options or a failed allocation make every rank return the
 * same status. After DT_ERR_COMM, DT_ERR_TIMEOUT or DT_ERR_CUDA the ranks
 * may disagree: the caller should abort the communicator. */
dt_status dt_bench_allreduce(dt_comm_t *c, const struct dt_bench_allreduce_opts *o, FILE *out);

#endif
