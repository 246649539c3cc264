/*
 * comm.h - the communicator: collectives between the ranks of a job.
 *
 * Backends: "mpi" (host buffers; a duplicate of MPI_COMM_WORLD with
 * MPI_ERRORS_RETURN, so every MPI failure comes back as a status carrying
 * MPI's own text) and, in CUDA builds, "nccl" (device buffers, bootstrapped
 * over MPI). Buffers are device pointers of the backend the communicator
 * serves. A communicator is used by one thread.
 *
 * abort() is the non-blocking teardown after an error, so no peer is left
 * waiting in a collective; destroy() is the clean one.
 * A wait can be bounded (dt_comm_set_timeout): a rank whose collective
 * does not complete in time is the one that acts, so the first rank to see
 * a stalled peer ends the job rather than every rank waiting out its own
 * watchdog.
 */
#ifndef DT_COMM_H
#define DT_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"

typedef struct dt_comm dt_comm_t;
typedef struct dt_comm_req dt_comm_req_t;

/* Element types (core/tensor.h): DT_F32, DT_F64, DT_I32, DT_I64,
 * DT_U8 and DT_BF16. DT_BF16: raw bfloat16 bits (uint16_t); reductions on
 * it support SUM only,
 * summing in fp32 and rounding each partial sum to nearest bf16. */
enum dt_comm_op { DT_COMM_SUM, DT_COMM_AVG, DT_COMM_MAX, DT_COMM_MIN };

/* What a communicator backend is, for the decisions that depend on it
 * (which one serves a compute backend's memory, whether gradients go
 * through host memory, which all-reduce options apply) so that no caller
 * needs to know backends by name. The same for every communicator of a
 * backend: asked of one (dt_comm_caps) or, before one exists, of a name
 * (dt_comm_caps_named), also for a backend this build lacks (built 0). */
enum dt_comm_collective {
    DT_COMM_HAS_ALLREDUCE = 1u << 0,
    DT_COMM_HAS_IALLREDUCE = 1u << 1,
    DT_COMM_HAS_BROADCAST = 1u << 2,
    DT_COMM_HAS_ALLGATHER = 1u << 3,
    DT_COMM_HAS_REDUCE_SCATTER = 1u << 4,
    DT_COMM_HAS_BARRIER = 1u << 5,
    /* dt_comm_iring, and an iallreduce that runs as dtrain's ring or as
     * the library's (dt_comm_set_ring_min_bytes, comm.mpi_allreduce) */
    DT_COMM_HAS_RING = 1u << 6,
};
struct dt_comm_caps {
    int built; /* 1: this dtrain has it (dt_comm_create can make one) */
    /* 1: buffers are device memory of the compute backend named by
     * device_backend, and collectives are ordered on its stream
     * (dt_comm_bind_stream); 0: host memory (device_backend NULL). */
    int device_buffers;
    const char *device_backend;
    /* device_buffers: 1 when two ranks may work on one device (NCCL
     * refuses); host-buffer backends have no device and say 1. */
    int shares_device;
    /* 1: iallreduce returns before the sum is done and it progresses while
     * the caller computes (the overlap of gradient buckets). */
    int nonblocking;
    unsigned collectives; /* DT_COMM_HAS_* */
};
/* Never NULL. */
const struct dt_comm_caps *dt_comm_caps(const dt_comm_t *c);
/* NULL for a name this version does not know. */
const struct dt_comm_caps *dt_comm_caps_named(const char *backend);
/* The communicator comm.backend: auto stands for, in the order this
 * version prefers them: for a compute backend whose buffers are device
 * memory (device_memory 1), the first device-buffer communicator that
 * allows ranks on a shared device when `shared`, built or not (a build
 * without it says so when it is created, rather than quietly going
 * through host memory); otherwise, and for host memory, the first
 * host-buffer one. Never NULL. */
const char *dt_comm_auto(int device_memory, int shared);
/* 1 when c is a communicator of backend `backend` (e.g. the control
 * communicator already open is the one a job asks for). */
int dt_comm_is(const dt_comm_t *c, const char *backend);

/* Creates a communicator over every rank of the job. MPI must be
 * initialised. Unknown backend: DT_ERR_UNSUPPORTED naming the ones built. */
dt_status dt_comm_create(const char *backend, dt_comm_t **out);
void dt_comm_destroy(dt_comm_t *c);
/* Creates an mpi communicator over every rank of the job for a second
 * thread's collectives (a background checkpoint writer), beside the
 * communicator the training thread uses: its own MPI communicator, so
 * the two threads' collectives never match each other's. Collective (call
 * from the training thread on every rank). DT_ERR_UNSUPPORTED unless MPI
 * was initialised with MPI_THREAD_MULTIPLE. */
dt_status dt_comm_create_side(dt_comm_t **out);
/* Tears the whole job down without waiting for peers (MPI_Abort for mpi),
 * exiting with `exit_code`. Does not return. Call it from the thread that
 * uses the communicator, unless dt_comm_abort_from_any_thread says
 * otherwise. */
void dt_comm_abort(dt_comm_t *c, int exit_code) __attribute__((noreturn));
/* 1 when another thread (a watchdog) may call dt_comm_abort while the
 * owning thread is inside the library: mpi when MPI was initialised with
 * MPI_THREAD_MULTIPLE (dtrain asks for it when a job may write checkpoints
 * in the background, else for MPI_THREAD_FUNNELED); nccl never. */
int dt_comm_abort_from_any_thread(const dt_comm_t *c);

const char *dt_comm_backend(const dt_comm_t *c);
int dt_comm_rank(const dt_comm_t *c);
int dt_comm_size(const dt_comm_t *c);
/* Rank among the ranks on this node, and how many there are (from a
 * shared-memory split). */
int dt_comm_local_rank(const dt_comm_t *c);
int dt_comm_local_size(const dt_comm_t *c);
/* This node's host name. */
const char *dt_comm_host(const dt_comm_t *c);

/* In place over count elements. AVG divides the sum by the world size. */
dt_status dt_comm_allreduce(dt_comm_t *c, void *buf, size_t count, enum dt_dtype t,
                            enum dt_comm_op op);
/* Non-blocking in-place allreduce; *req must be completed with
 * dt_comm_wait (or dt_comm_test until done) before buf is touched. */
dt_status dt_comm_iallreduce(dt_comm_t *c, void *buf, size_t count, enum dt_dtype t,
                             enum dt_comm_op op, dt_comm_req_t **req);
/* The two halves of the ring all-reduce (mpi backend; see
 * dt_comm_set_ring_min_bytes), for a sharded optimizer update. The buffer
 * is cut into size chunks, chunk k = elements [count*k/size,
 * count*(k+1)/size). DT_RING_REDUCE_SCATTER leaves this rank's chunk
 * (dt_comm_ring_owned) holding the sum over ranks, and the other chunks
 * partial sums; DT_RING_ALLGATHER copies each rank's own chunk to every
 * rank. In place, fp32 or bf16, SUM; completed by dt_comm_test or
 * dt_comm_wait. Backends without it return DT_ERR_UNSUPPORTED. */
enum dt_comm_ring_part { DT_RING_ALL, DT_RING_REDUCE_SCATTER, DT_RING_ALLGATHER };
dt_status dt_comm_iring(dt_comm_t *c, void *buf, size_t count, enum dt_dtype t,
                        enum dt_comm_ring_part part, dt_comm_req_t **req);
/* 1 when the backend has dt_comm_iring. */
int dt_comm_has_ring(const dt_comm_t *c);
/* [*lo, *hi): the chunk of a count-element buffer this rank holds summed
 * after a reduce-scatter and sends in the all-gather. */
void dt_comm_ring_owned(const dt_comm_t *c, size_t count, size_t *lo, size_t *hi);
/* *done = 1 and the request is freed when it has completed; lets the
 * library progress it meanwhile. */
dt_status dt_comm_test(dt_comm_t *c, dt_comm_req_t *req, int *done);
/* Waits for and frees a request. */
dt_status dt_comm_wait(dt_comm_t *c, dt_comm_req_t *req);

dt_status dt_comm_broadcast(dt_comm_t *c, void *buf, size_t bytes, int root);
/* recv gets size * bytes: rank r's `bytes` at offset r * bytes. */
dt_status dt_comm_allgather(dt_comm_t *c, const void *send, void *recv, size_t bytes);
/* send holds size * count elements; recv gets this rank's reduced count. */
dt_status dt_comm_reduce_scatter(dt_comm_t *c, const void *send, void *recv, size_t count,
                                 enum dt_dtype t, enum dt_comm_op op);
dt_status dt_comm_barrier(dt_comm_t *c);
/* Point to point, both at once: sends sbytes to rank `to` while receiving
 * rbytes from rank `from` (each pair of ranks calls it with matching
 * sizes). mpi only: DT_ERR_UNSUPPORTED elsewhere. */
dt_status dt_comm_sendrecv(dt_comm_t *c, const void *send, size_t sbytes, int to, void *recv,
                           size_t rbytes, int from);


/* The library behind backend `backend` ("mpi", "nccl") and its version,
 * as that library reports it at run time; "not built into this dtrain"
 * for a backend this build lacks. Needs no communicator; MPI need not be
 * initialised. */
void dt_comm_library_version(const char *backend, char *buf, size_t len);

/* Device-buffer backends (nccl): from now on, each collective is ordered
 * after the work already queued on `stream` (a cudaStream_t: the compute
 * backend's, dt_backend_stream) when it starts, and that stream waits for
 * the collective when it completes, so the buffers can be used by later
 * work on the stream. Collectives run on the communicator's own stream.
 * Host-buffer backends (mpi) accept only NULL. */
dt_status dt_comm_bind_stream(dt_comm_t *c, void *stream);
/* 1 when the backend's buffers are device memory (nccl), 0 for host (mpi). */
int dt_comm_device_buffers(const dt_comm_t *c);
/* Longest one wait for a collective may take (seconds; 0 = no limit, the
 * default). Past it the call fails with DT_ERR_TIMEOUT naming the
 * collective, the limit and the rank, and the communicator is given up:
 * nccl aborts its NCCL communicator, mpi (whose collectives cannot be
 * cancelled) marks itself broken so that every later call fails at once
 * with DT_ERR_TIMEOUT. Either way the caller should end the job with
 * dt_comm_abort, which makes the other ranks hear of it at once instead of
 * at their own limits. With a limit set the mpi backend runs even its
 * blocking collectives as non-blocking ones that it polls against the
 * limit. Training sets runtime.timeout_s here for the training loop; the
 * watchdog (runtime/monitor/watchdog.h) waits longer, as a backstop for hangs
 * outside a collective. */
void dt_comm_set_timeout(dt_comm_t *c, double seconds);

/* Host-buffer backends (mpi): non-blocking fp32 and bf16 sums of at least
 * `bytes` run as dtrain's own ring (a reduce-scatter then an all-gather of
 * point-to-point messages, the same work on every rank) instead of the MPI
 * library's all-reduce; SIZE_MAX keeps the library's for every size.
 * Default DT_COMM_RING_MIN_BYTES. Other backends ignore it. */
#define DT_COMM_RING_MIN_BYTES 65536
void dt_comm_set_ring_min_bytes(dt_comm_t *c, size_t bytes);

/* The MPI communicator (a pointer to an MPI_Comm) this communicator runs
 * on or was bootstrapped from, for libraries that take one (parallel
 * HDF5). Never NULL. */
const void *dt_comm_mpi_handle(const dt_comm_t *c);

#endif
