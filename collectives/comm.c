/*
 * comm.c - the public dt_comm_* entry points and the backend registry.
 *
 * Each entry point checks its arguments once, here, with messages that say
 * which call and which value was wrong, then dispatches through the
 * backend's vtable (comm_impl.h). The checks depend only on the arguments,
 * so when every rank makes the same call every rank rejects it alike and
 * none is left waiting in a collective. The registry is the one place that
 * knows which backends are built (the NCCL #ifdef lives here) and what
 * each one is (dt_comm_caps*, dt_comm_auto), so that the names of
 * communicators are compared here and nowhere above collectives/.
 */
#include "comm.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "comm_impl.h"

/* What each backend is. nccl's entry exists in every build, so that a
 * job can be checked against it (and told that this build lacks it)
 * before anything is created. */
#define ALL_COLLECTIVES                                                                            \
    (DT_COMM_HAS_ALLREDUCE | DT_COMM_HAS_IALLREDUCE | DT_COMM_HAS_BROADCAST |                      \
     DT_COMM_HAS_ALLGATHER | DT_COMM_HAS_REDUCE_SCATTER | DT_COMM_HAS_BARRIER)

const struct dt_comm_caps dt_mpi_comm_caps = {
    .built = 1,
    .device_buffers = 0,
    .device_backend = NULL,
    .shares_device = 1,
    .nonblocking = 1,
    .collectives = ALL_COLLECTIVES | DT_COMM_HAS_RING,
};

const struct dt_comm_caps dt_nccl_comm_caps = {
#ifdef DT_HAVE_NCCL
    .built = 1,
#else
    .built = 0,
#endif
    .device_buffers = 1,
    .device_backend = "cuda",
    .shares_device = 0,
    .nonblocking = 1,
    .collectives = ALL_COLLECTIVES,
};

/* In the order comm.backend: auto prefers them; create is NULL for a
 * backend this build lacks. */
struct backend_entry {
    const char *name;
    dt_status (*create)(dt_comm_t **out);
    const struct dt_comm_caps *caps;
};

static const struct backend_entry backends[] = {
    {"mpi", dt_mpi_comm_create, &dt_mpi_comm_caps},
#ifdef DT_HAVE_NCCL
    {"nccl", dt_nccl_comm_create, &dt_nccl_comm_caps},
#else
    {"nccl", NULL, &dt_nccl_comm_caps},
#endif
};

#define NBACKENDS (sizeof backends / sizeof backends[0])

static const struct backend_entry *find_backend(const char *name)
{
    for (size_t i = 0; name && i < NBACKENDS; i++)
        if (!strcmp(name, backends[i].name)) return &backends[i];
    return NULL;
}

const struct dt_comm_caps *dt_comm_caps(const dt_comm_t *c)
{
    return c->ops->caps;
}

const struct dt_comm_caps *dt_comm_caps_named(const char *backend)
{
    const struct backend_entry *e = find_backend(backend);
    return e ? e->caps : NULL;
}

const char *dt_comm_auto(int device_memory, int shared)
{
    for (size_t i = 0; device_memory && i < NBACKENDS; i++)
        if (backends[i].caps->device_buffers && (!shared || backends[i].caps->shares_device))
            return backends[i].name;
    for (size_t i = 0; i < NBACKENDS; i++)
        if (!backends[i].caps->device_buffers) return backends[i].name;
    return backends[0].name;
}

int dt_comm_is(const dt_comm_t *c, const char *backend)
{
    return backend && !strcmp(c->ops->name, backend);
}

#ifdef DT_HAVE_NCCL
static const char built_names[] = "mpi, nccl";
#else
static const char built_names[] = "mpi";
#endif

dt_status dt_comm_create(const char *backend, dt_comm_t **out)
{
    *out = NULL;
    if (!backend || !backend[0])
        return dt_set_error(DT_ERR_INVALID_ARG, "no communicator backend named (built: %s)",
                            built_names);
    const struct backend_entry *e = find_backend(backend);
    if (e && e->create) return e->create(out);
    if (e && e->caps == &dt_nccl_comm_caps)
        return dt_set_error(DT_ERR_UNSUPPORTED,
                            "this dtrain was built without NCCL, so it has no nccl communicator "
                            "(built: %s); use the mpi backend, or rebuild with nvcc and NCCL "
                            "present",
                            built_names);
    return dt_set_error(DT_ERR_UNSUPPORTED, "unknown communicator backend '%s' (built: %s)",
                        backend, built_names);
}

dt_status dt_comm_create_side(dt_comm_t **out)
{
    *out = NULL;
    if (!dt_mpi_usable() || !dt_mpi_thread_multiple())
        return dt_set_error(DT_ERR_UNSUPPORTED,
                            "MPI was started without MPI_THREAD_MULTIPLE, so no second thread may "
                            "run collectives beside the training thread");
    return dt_mpi_comm_create(out);
}

void dt_comm_library_version(const char *backend, char *buf, size_t len)
{
    if (!strcmp(backend, "mpi")) {
        dt_mpi_library_version(buf, len);
        return;
    }
#ifdef DT_HAVE_NCCL
    if (!strcmp(backend, "nccl")) {
        dt_nccl_library_version(buf, len);
        return;
    }
#endif
    snprintf(buf, len, "not built into this dtrain (communicators built: %s)", built_names);
    (void)backend;
}

void dt_comm_destroy(dt_comm_t *c)
{
    if (c) c->ops->destroy(c);
}

void dt_comm_abort(dt_comm_t *c, int exit_code)
{
    fflush(NULL);
    if (c) c->ops->abort(c, exit_code);
    _exit(exit_code);
}

const void *dt_comm_mpi_handle(const dt_comm_t *c) { return c->mpi_handle; }

int dt_comm_abort_from_any_thread(const dt_comm_t *c) { return c->abort_any_thread; }

const char *dt_comm_backend(const dt_comm_t *c)
{
    return c->ops->name;
}
int dt_comm_rank(const dt_comm_t *c)
{
    return c->rank;
}
int dt_comm_size(const dt_comm_t *c)
{
    return c->size;
}
int dt_comm_local_rank(const dt_comm_t *c)
{
    return c->local_rank;
}
int dt_comm_local_size(const dt_comm_t *c)
{
    return c->local_size;
}
const char *dt_comm_host(const dt_comm_t *c)
{
    return c->host;
}

/* The element types every communicator reduces (DT_F16 and DT_U16 are
 * not among them). */
static int comm_dtype(enum dt_dtype t)
{
    return t == DT_F32 || t == DT_F64 || t == DT_I32 || t == DT_I64 || t == DT_U8 || t == DT_BF16;
}

/* ---- argument checks ---------------------------------------------------- */

static dt_status check_buf(const char *call, const void *buf, size_t count, const char *what)
{
    if (!buf && count > 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: %s is NULL but the count is %zu", call, what,
                            count);
    return DT_OK;
}

static dt_status check_reduce(const char *call, const void *buf, size_t count, enum dt_dtype t,
                              enum dt_comm_op op)
{
    if (!comm_dtype(t))
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: dtype %s (%d) is not one a communicator reduces", call,
                            dt_dtype_name(t), (int)t);
    if (op != DT_COMM_SUM && op != DT_COMM_AVG && op != DT_COMM_MAX && op != DT_COMM_MIN)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: unknown reduction %d", call, (int)op);
    if (t == DT_BF16 && op != DT_COMM_SUM)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: bf16 supports SUM only", call);
    if (op == DT_COMM_AVG && t != DT_F32 && t != DT_F64)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "%s: AVG needs a floating-point dtype (use SUM for integers)", call);
    return check_buf(call, buf, count, "the buffer");
}

/* ---- collectives -------------------------------------------------------- */

dt_status dt_comm_allreduce(dt_comm_t *c, void *buf, size_t count, enum dt_dtype t,
                            enum dt_comm_op op)
{
    dt_status st = check_reduce("dt_comm_allreduce", buf, count, t, op);
    return st != DT_OK ? st : c->ops->allreduce(c, buf, count, t, op);
}

dt_status dt_comm_iallreduce(dt_comm_t *c, void *buf, size_t count, enum dt_dtype t,
                             enum dt_comm_op op, dt_comm_req_t **req)
{
    if (!req) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_iallreduce: req is NULL");
    *req = NULL;
    dt_status st = check_reduce("dt_comm_iallreduce", buf, count, t, op);
    return st != DT_OK ? st : c->ops->iallreduce(c, buf, count, t, op, req);
}

dt_status dt_comm_test(dt_comm_t *c, dt_comm_req_t *req, int *done)
{
    *done = 0;
    if (!req) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_test: req is NULL");
    return c->ops->test(c, req, done);
}

dt_status dt_comm_wait(dt_comm_t *c, dt_comm_req_t *req)
{
    if (!req) return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_wait: req is NULL");
    return c->ops->wait(c, req);
}

dt_status dt_comm_broadcast(dt_comm_t *c, void *buf, size_t bytes, int root)
{
    if (root < 0 || root >= c->size)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "dt_comm_broadcast: root %d is not a rank of this job (0..%d)", root,
                            c->size - 1);
    dt_status st = check_buf("dt_comm_broadcast", buf, bytes, "the buffer");
    return st != DT_OK ? st : c->ops->broadcast(c, buf, bytes, root);
}

dt_status dt_comm_sendrecv(dt_comm_t *c, const void *send, size_t sbytes, int to, void *recv,
                           size_t rbytes, int from)
{
    if (to < 0 || to >= c->size || from < 0 || from >= c->size)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "dt_comm_sendrecv: ranks %d and %d: not both ranks of this job (0..%d)",
                            to, from, c->size - 1);
    if (!c->ops->sendrecv)
        return dt_set_error(DT_ERR_UNSUPPORTED, "the %s communicator has no point-to-point sends",
                            c->ops->name);
    dt_status st = check_buf("dt_comm_sendrecv", send, sbytes, "the send buffer");
    if (st == DT_OK) st = check_buf("dt_comm_sendrecv", recv, rbytes, "the receive buffer");
    return st != DT_OK ? st : c->ops->sendrecv(c, send, sbytes, to, recv, rbytes, from);
}

dt_status dt_comm_allgather(dt_comm_t *c, const void *send, void *recv, size_t bytes)
{
    if (bytes > SIZE_MAX / (size_t)c->size)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "dt_comm_allgather: %zu bytes from each of %d ranks overflow size_t",
                            bytes, c->size);
    dt_status st = check_buf("dt_comm_allgather", send, bytes, "send");
    if (st == DT_OK) st = check_buf("dt_comm_allgather", recv, bytes, "recv");
    return st != DT_OK ? st : c->ops->allgather(c, send, recv, bytes);
}

dt_status dt_comm_reduce_scatter(dt_comm_t *c, const void *send, void *recv, size_t count,
                                 enum dt_dtype t, enum dt_comm_op op)
{
    if (count > SIZE_MAX / (size_t)c->size)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "dt_comm_reduce_scatter: %zu elements for each of %d ranks overflow "
                            "size_t",
                            count, c->size);
    dt_status st = check_reduce("dt_comm_reduce_scatter", send, count, t, op);
    if (st == DT_OK) st = check_buf("dt_comm_reduce_scatter", recv, count, "recv");
    return st != DT_OK ? st : c->ops->reduce_scatter(c, send, recv, count, t, op);
}

dt_status dt_comm_barrier(dt_comm_t *c)
{
    return c->ops->barrier(c);
}

/* ---- device buffers and limits ------------------------------------------- */

dt_status dt_comm_bind_stream(dt_comm_t *c, void *stream)
{
    if (c->ops->bind_stream) return c->ops->bind_stream(c, stream);
    if (stream)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "dt_comm_bind_stream: the %s communicator works on host buffers and "
                            "takes no stream (pass NULL)",
                            c->ops->name);
    return DT_OK;
}

int dt_comm_device_buffers(const dt_comm_t *c)
{
    return c->ops->caps->device_buffers;
}

dt_status dt_comm_iring(dt_comm_t *c, void *buf, size_t count, enum dt_dtype t,
                        enum dt_comm_ring_part part, dt_comm_req_t **req)
{
    *req = NULL;
    if (!c->ops->iring)
        return dt_set_error(DT_ERR_UNSUPPORTED,
                            "dt_comm_iring: the %s communicator has no ring all-reduce",
                            c->ops->name);
    if (t != DT_F32 && t != DT_BF16)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_comm_iring: only fp32 and bf16 are summed");
    dt_status st = check_buf("dt_comm_iring", buf, count, "the buffer");
    return st != DT_OK ? st : c->ops->iring(c, buf, count, t, part, req);
}

int dt_comm_has_ring(const dt_comm_t *c) { return c->ops->iring != NULL; }

void dt_comm_ring_owned(const dt_comm_t *c, size_t count, size_t *lo, size_t *hi)
{
    int k = (c->rank + 1) % c->size;
    *lo = dt_ring_chunk_start(count, c->size, k);
    *hi = dt_ring_chunk_start(count, c->size, k + 1);
}

void dt_comm_set_ring_min_bytes(dt_comm_t *c, size_t bytes) { c->ring_min_bytes = bytes; }

void dt_comm_set_timeout(dt_comm_t *c, double seconds)
{
    c->timeout_s = seconds > 0 && isfinite(seconds) ? seconds : 0;
}
