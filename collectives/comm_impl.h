/*
 * comm_impl.h - the communicator vtable. Only backends, the registry in
 * comm.c and white-box tests include this.
 *
 * A backend allocates a struct whose first member is struct dt_comm, fills
 * the common fields and points `ops` at its table. comm.c checks the
 * arguments every backend would otherwise check (dtype, op, NULL buffers,
 * AVG on integers, root range), so an entry point sees only valid calls.
 * `struct dt_comm_req` is defined by each backend in its own source file;
 * comm.c passes the pointer through untouched.
 */
#ifndef DT_COMM_IMPL_H
#define DT_COMM_IMPL_H

#include "comm.h"

#define DT_COMM_HOST_MAX 256

struct dt_comm_ops {
    const char *name;
    dt_status (*allreduce)(dt_comm_t *c, void *buf, size_t count, enum dt_dtype t,
                           enum dt_comm_op op);
    dt_status (*iallreduce)(dt_comm_t *c, void *buf, size_t count, enum dt_dtype t,
                            enum dt_comm_op op, dt_comm_req_t **req);
    /* Optional (NULL: dt_comm_iring is unsupported). */
    dt_status (*iring)(dt_comm_t *c, void *buf, size_t count, enum dt_dtype t,
                       enum dt_comm_ring_part part, dt_comm_req_t **req);
    /* test and wait free the request when they report it done, and also
     * when they fail (the caller cannot use it again either way). */
    dt_status (*test)(dt_comm_t *c, dt_comm_req_t *req, int *done);
    dt_status (*wait)(dt_comm_t *c, dt_comm_req_t *req);
    dt_status (*broadcast)(dt_comm_t *c, void *buf, size_t bytes, int root);
    dt_status (*allgather)(dt_comm_t *c, const void *send, void *recv, size_t bytes);
    dt_status (*reduce_scatter)(dt_comm_t *c, const void *send, void *recv, size_t count,
                                enum dt_dtype t, enum dt_comm_op op);
    dt_status (*barrier)(dt_comm_t *c);
    /* Optional (NULL: dt_comm_sendrecv is unsupported). */
    dt_status (*sendrecv)(dt_comm_t *c, const void *send, size_t sbytes, int to, void *recv,
                          size_t rbytes, int from);
    /* May return if the library could not abort; comm.c then _exits. */
    void (*abort)(dt_comm_t *c, int exit_code);
    /* Frees the backend's resources and the struct itself. */
    void (*destroy)(dt_comm_t *c);
    /* Optional (NULL: only a NULL stream is accepted). */
    dt_status (*bind_stream)(dt_comm_t *c, void *stream);
    /* dt_comm_caps: the backend's entry in comm.c's registry */
    const struct dt_comm_caps *caps;
};

struct dt_comm {
    const struct dt_comm_ops *ops;
    int rank, size;
    int local_rank, local_size;
    char host[DT_COMM_HOST_MAX];
    /* Most elements (or bytes, for byte collectives) one library call
     * takes; a backend splits larger calls into pieces of this size. The
     * mpi backend sets INT_MAX; tests lower it to exercise the splitting. */
    size_t max_count;
    /* Pointer to the MPI_Comm the backend runs on or was bootstrapped
     * from (dt_comm_mpi_handle). */
    const void *mpi_handle;
    double timeout_s;     /* dt_comm_set_timeout; 0 = none */
    int abort_any_thread; /* dt_comm_abort_from_any_thread */
    /* mpi: fp32/bf16 sums of at least this many bytes in iallreduce run
     * as dtrain's ring (comm_mpi.c); SIZE_MAX: never. Tests lower it. */
    size_t ring_min_bytes;
};

/* First element of chunk k (0..size) of a count-element buffer cut into
 * size chunks for the ring all-reduce (comm.h): count * k / size. */
static inline size_t dt_ring_chunk_start(size_t count, int size, int k)
{
    return (size_t)(((unsigned __int128)count * (unsigned)k) / (unsigned)size);
}

/* What each backend this version knows is, built or not (comm.c). */
extern const struct dt_comm_caps dt_mpi_comm_caps;
extern const struct dt_comm_caps dt_nccl_comm_caps;

/* collectives/mpi/comm_mpi.c */
dt_status dt_mpi_comm_create(dt_comm_t **out);
/* MPI-side helpers every backend bootstraps with (MPI handles are passed
 * as pointers to an MPI_Comm, so this header needs no mpi.h). */
/* 1 when MPI is initialised and not yet finalised. */
int dt_mpi_usable(void);
/* 1 when MPI runs with MPI_THREAD_MULTIPLE (threads may call it at once). */
int dt_mpi_thread_multiple(void);
/* Duplicates MPI_COMM_WORLD into *(MPI_Comm *)world with MPI_ERRORS_RETURN
 * and fills c's rank, size, local rank and size (from a shared-memory
 * split, freed again) and host. Collective. On failure *world may hold a
 * communicator the caller must free (MPI_COMM_NULL otherwise). */
dt_status dt_mpi_bootstrap(dt_comm_t *c, void *world);
/* DT_OK for MPI_SUCCESS, else DT_ERR_COMM: "<what> failed on rank R:
 * <MPI's text>". */
dt_status dt_mpi_check(int rc, int rank, const char *what);
/* collectives/nccl/comm_nccl.c (NCCL builds only) */
dt_status dt_nccl_comm_create(dt_comm_t **out);
/* Library versions for dt_comm_library_version: collectives/mpi/mpi_info.c
 * and collectives/nccl/nccl_info.c (NCCL builds only). */
void dt_mpi_library_version(char *buf, size_t len);
void dt_nccl_library_version(char *buf, size_t len);

#endif
