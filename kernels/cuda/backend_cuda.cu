/*
 * backend_cuda.cu - the CUDA compute backend: one GPU, one stream, one
 * cuBLAS handle, device memory, copies, and the op table whose kernels live
 * in the op files beside this one (linear.cu, activation.cu, ...), and,
 * where cuDNN was found at build time, a cuDNN handle (dnn.cu) for the
 * convolution and pooling ops.
 *
 * Everything is queued on the backend's non-blocking stream, so ops and
 * copies run in the order they are called and the host only waits where
 * it must: a download (the caller reads the data next), sync, and the ops
 * that hand a scalar back; each such wait also hands over the loss totals
 * and reads the verdicts of the token-id and label checks queued before
 * it, and is counted (dt_backend_waits). The one exception is the model's
 * input batches (dt_backend_upload_ahead): from the loader's pinned
 * buffers they go on a second stream, the copy stream, ordered by events
 * after the compute that last read their slot and before the compute that
 * reads them, so the next micro-batch travels while this one computes.
 * Other uploads from pinned memory are queued straight from it; from
 * pageable memory they are memcpy'd into a small ring of pinned staging
 * buffers and queued from there, so the host does not wait for the
 * transfer and may reuse its buffer at once. A staging slot is reused only
 * after the event recorded behind its last copy has fired.
 *
 * Failed CUDA and cuBLAS calls become a status here (dt_cuda_status,
 * dt_cublas_status) with the library's own text, the device, the op and its
 * shapes, and, where the user can act, what to change: a smaller
 * micro-batch on out-of-memory, a newer driver, a rebuild for the GPU's
 * architecture.
 */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuda_impl.h"
#include "cuda_probe.h"

extern "C" {
#include "core/clock.h"
#include "core/log.h"
}

#define SYNC_UPLOAD_BYTES ((size_t)64 << 20) /* larger uploads skip the staging ring */
#define STAGING_MIN_BYTES ((size_t)1 << 20)  /* smallest staging slot */
#define SCRATCH_GRAIN ((size_t)1 << 20)      /* the GEMM scratch grows in these steps */
#define ALLOC_MIN_BYTES 256                  /* what a zero-byte allocation gets */
#define GIB (1024.0 * 1024.0 * 1024.0)

#define OOM_HINT                                                                                   \
    "lower train.micro_batch (train.global_batch stays; accumulation makes up the rest) or use "   \
    "train.precision=bf16"

/* ---- errors ------------------------------------------------------------ */

/* "cuda:0 (NVIDIA H200)" from base.device, which is "cuda:0 NVIDIA H200
 * (sm_90, ...)" once the device is open and just "cuda:0" before. */
static void device_label(const struct cuda_backend *cb, char *buf, size_t len)
{
    if (!cb) {
        snprintf(buf, len, "cuda");
        return;
    }
    const char *dev = cb->base.device;
    const char *name = strchr(dev, ' ');
    const char *end = NULL;
    for (const char *p = name ? strstr(name, " (") : NULL; p; p = strstr(p + 1, " ("))
        end = p;
    if (!name || !end || end <= name + 1) {
        snprintf(buf, len, "cuda:%d", cb->device);
        return;
    }
    snprintf(buf, len, "cuda:%d (%.*s)", cb->device, (int)(end - name - 1), name + 1);
}

/* "; asked for ... with X GiB of Y GiB free: <what to change>" */
static void oom_hint(const struct cuda_backend *cb, size_t bytes, char *buf, size_t len)
{
    size_t free_b = 0, total_b = 0;
    char asked[96] = "", avail[96] = "";
    if (bytes)
        snprintf(asked, sizeof asked, " asked for %.2f GiB (%zu bytes)", (double)bytes / GIB,
                 bytes);
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
        snprintf(avail, sizeof avail, "%s %.2f GiB of %.1f GiB free on the device",
                 bytes ? " with" : "", (double)free_b / GIB, (double)total_b / GIB);
    else
        (void)cudaGetLastError();
    snprintf(buf, len, ";%s%s: " OOM_HINT, asked, avail);
}

/* The architectures this file was compiled for, e.g. "sm_80, sm_90", or ""
 * when the compiler does not say. */
static void compiled_archs(char *buf, size_t len)
{
    buf[0] = '\0';
#ifdef __CUDA_ARCH_LIST__
    static const int archs[] = {__CUDA_ARCH_LIST__};
    size_t used = 0;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0] && used < len; i++) {
        int w = snprintf(buf + used, len - used, "%ssm_%d", i ? ", " : "", archs[i] / 10);
        if (w < 0)
            break;
        used += (size_t)w;
    }
#endif
}

static void arch_hint(const struct cuda_backend *cb, char *buf, size_t len)
{
    char archs[128];
    compiled_archs(archs, sizeof archs);
    if (!cb || cb->cc_major == 0) {
        snprintf(buf, len,
                 "; rebuild with -DCMAKE_CUDA_ARCHITECTURES set to the GPU's compute capability "
                 "(e.g. 90 for sm_90)");
        return;
    }
    if (archs[0])
        snprintf(buf, len,
                 "; the GPU has compute capability %d.%d but this build has kernels for %s only: "
                 "rebuild with -DCMAKE_CUDA_ARCHITECTURES=%d%d",
                 cb->cc_major, cb->cc_minor, archs, cb->cc_major, cb->cc_minor);
    else
        snprintf(buf, len,
                 "; the GPU has compute capability %d.%d, which this build has no kernels for: "
                 "rebuild with -DCMAKE_CUDA_ARCHITECTURES=%d%d",
                 cb->cc_major, cb->cc_minor, cb->cc_major, cb->cc_minor);
}

static void driver_hint(char *buf, size_t len)
{
    char text[256];
    dt_cuda_driver_text(text, sizeof text);
    snprintf(buf, len, "; %s", text);
}

/* "<lib> error on cuda:0 (NAME) in OP (shapes)" */
static void error_where(const struct cuda_backend *cb, const char *lib, const char *op,
                        const char *fmt, va_list ap, char *buf, size_t len)
{
    char dev[160], shapes[256] = "";
    device_label(cb, dev, sizeof dev);
    if (fmt)
        vsnprintf(shapes, sizeof shapes, fmt, ap);
    if (shapes[0])
        snprintf(buf, len, "%s error on %s in %s (%s)", lib, dev, op ? op : "?", shapes);
    else
        snprintf(buf, len, "%s error on %s in %s", lib, dev, op ? op : "?");
}

dt_status dt_cuda_status(struct cuda_backend *cb, cudaError_t err, size_t bytes, const char *op,
                         const char *fmt, ...)
{
    if (err == cudaSuccess)
        return DT_OK;
    /* Consume it: a non-sticky error (out of memory, a bad argument) would
     * otherwise resurface at the next launch check. */
    (void)cudaGetLastError();
    char where[512], extra[512] = "";
    va_list ap;
    va_start(ap, fmt);
    error_where(cb, "CUDA", op, fmt, ap, where, sizeof where);
    va_end(ap);
    dt_status st = DT_ERR_CUDA;
    switch (err) {
    case cudaErrorMemoryAllocation:
        st = DT_ERR_NOMEM;
        oom_hint(cb, bytes, extra, sizeof extra);
        break;
    case cudaErrorInsufficientDriver:
        st = DT_ERR_UNSUPPORTED;
        driver_hint(extra, sizeof extra);
        break;
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
        st = DT_ERR_UNSUPPORTED;
        arch_hint(cb, extra, sizeof extra);
        break;
    default:
        break;
    }
    return dt_set_error(st, "%s: %s (%s)%s", where, cudaGetErrorString(err), cudaGetErrorName(err),
                        extra);
}

dt_status dt_cublas_status(struct cuda_backend *cb, cublasStatus_t bst, const char *op,
                           const char *fmt, ...)
{
    if (bst == CUBLAS_STATUS_SUCCESS)
        return DT_OK;
    /* a CUDA error under it belongs to this failure, not to the next launch */
    (void)cudaGetLastError();
    char where[512], extra[512] = "";
    va_list ap;
    va_start(ap, fmt);
    error_where(cb, "cuBLAS", op, fmt, ap, where, sizeof where);
    va_end(ap);
    dt_status st = DT_ERR_CUDA;
    switch (bst) {
    case CUBLAS_STATUS_ALLOC_FAILED:
        st = DT_ERR_NOMEM;
        oom_hint(cb, 0, extra, sizeof extra);
        break;
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
        st = DT_ERR_UNSUPPORTED;
        if (cb)
            snprintf(extra, sizeof extra,
                     "; the GPU (compute capability %d.%d) cannot run this GEMM in %s%s",
                     cb->cc_major, cb->cc_minor, dt_precision_name(cb->precision),
                     cb->precision != DT_F32 ? ": try train.precision=fp32" : "");
        break;
    default:
        break;
    }
    return dt_set_error(st, "%s: %s (%s)%s", where, cublasGetStatusString(bst),
                        cublasGetStatusName(bst), extra);
}

void dt_cuda_note_usage(struct cuda_backend *cb)
{
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    if (total_b - free_b > cb->peak_used)
        cb->peak_used = total_b - free_b;
}

void dt_cuda_note_wait(struct cuda_backend *cb, double seconds)
{
    cb->waits++;
    cb->wait_s += seconds;
}

/* Device memory grows only where the backend allocates (dt_cuda_note_usage
 * there) and is read whole by cuda_mem_info, so a wait for the stream does
 * not also ask the driver for its memory figures. */
/* After a wait that covered every pending result: hands them over. */
static dt_status take_results(struct cuda_backend *cb, dt_status st)
{
    cb->results_marked = 0;
    if (st != DT_OK) {
        cb->xent_pending = cb->gate_pending = 0; /* the results are lost with the stream */
        return st;
    }
    dt_cuda_gate_result(cb);
    /* both verdicts are read (and reset); the id check's message wins */
    dt_status xent = dt_cuda_xent_result(cb);
    dt_status emb = dt_cuda_emb_check_result(cb);
    return emb != DT_OK ? emb : xent;
}

dt_status dt_cuda_sync_op(struct cuda_backend *cb, const char *op)
{
    double t0 = dt_now();
    cudaError_t err = cudaStreamSynchronize(cb->stream);
    dt_cuda_note_wait(cb, dt_now() - t0);
    return take_results(cb, dt_cuda_status(cb, err, 0, op,
                                            "waiting for the stream; the fault may be in any op "
                                            "queued before it, CUDA_LAUNCH_BLOCKING=1 names it"));
}

/* The event follows the copies of every pending result while it is
 * marked: the loss totals and id checks are queued before step_gate, and
 * each of them clears the mark when queued after it. */
dt_status dt_cuda_settle(struct cuda_backend *cb)
{
    if (!cb->results_marked)
        return dt_cuda_sync_op(cb, "settle");
    double t0 = dt_now();
    cudaError_t err = cudaEventSynchronize(cb->results_done);
    dt_cuda_note_wait(cb, dt_now() - t0);
    return take_results(cb, dt_cuda_status(cb, err, 0, "settle",
                                            "waiting for the step's results; the fault may be in "
                                            "any op queued before them, CUDA_LAUNCH_BLOCKING=1 "
                                            "names it"));
}

dt_status dt_cuda_scratch(struct cuda_backend *cb, size_t bytes, void **out)
{
    *out = NULL;
    if (cb->gemm_scratch && bytes <= cb->gemm_scratch_bytes) {
        *out = cb->gemm_scratch;
        return DT_OK;
    }
    /* Queued GEMMs may still read the old scratch. */
    dt_status st = dt_cuda_sync_op(cb, "scratch");
    if (st != DT_OK)
        return st;
    if (cb->gemm_scratch) {
        size_t old = cb->gemm_scratch_bytes;
        cudaError_t err = cudaFree(cb->gemm_scratch);
        cb->gemm_scratch = NULL;
        cb->gemm_scratch_bytes = 0;
        if (err != cudaSuccess)
            return dt_cuda_status(cb, err, 0, "scratch", "freeing %zu bytes", old);
    }
    size_t want = bytes <= SCRATCH_GRAIN
                      ? SCRATCH_GRAIN
                      : (bytes + SCRATCH_GRAIN - 1) / SCRATCH_GRAIN * SCRATCH_GRAIN;
    cudaError_t err = cudaMalloc(&cb->gemm_scratch, want);
    if (err != cudaSuccess) {
        cb->gemm_scratch = NULL;
        return dt_cuda_status(cb, err, want, "scratch", "%zu bytes", want);
    }
    cb->gemm_scratch_bytes = want;
    dt_cuda_note_usage(cb);
    *out = cb->gemm_scratch;
    return DT_OK;
}

/* ---- memory and copies ------------------------------------------------- */

/* Zero-initialised: the fill is queued on the stream, which every later op
 * and copy of this backend follows (communicators order after it too). */
static dt_status cuda_alloc(dt_backend_t *be, size_t bytes, void **out)
{
    struct cuda_backend *cb = dt_cuda_of(be);
    if (!out)
        return dt_set_error(DT_ERR_INVALID_ARG, "cuda alloc: out must not be NULL");
    *out = NULL;
    size_t want = bytes < ALLOC_MIN_BYTES ? ALLOC_MIN_BYTES : bytes;
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, want);
    if (err != cudaSuccess)
        return dt_cuda_status(cb, err, bytes, "alloc", "%zu bytes", bytes);
    err = cudaMemsetAsync(p, 0, want, cb->stream);
    if (err != cudaSuccess) {
        dt_status st = dt_cuda_status(cb, err, bytes, "alloc", "zero-filling %zu bytes", bytes);
        (void)cudaFree(p);
        (void)cudaGetLastError();
        return st;
    }
    dt_cuda_note_usage(cb);
    /* the fill is on the compute stream: an upload ahead into the new
     * buffer waits for it (cuda_upload_ahead) */
    memset(cb->slot_marked, 0, sizeof cb->slot_marked);
    *out = p;
    return DT_OK;
}

static void cuda_free(dt_backend_t *be, void *ptr)
{
    if (!ptr)
        return;
    cudaError_t err = cudaFree(ptr);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        DT_LOG_WARN("cuda", "cudaFree on cuda:%d failed: %s (%s)", dt_cuda_of(be)->device,
                    cudaGetErrorString(err), cudaGetErrorName(err));
    }
}

/* ---- pinned host buffers (dt_backend_host_alloc) ------------------------ */

/* The pinned buffer holding [p, p + bytes), or NULL; under pinned_mu. */
static struct dt_cuda_pinned *pinned_of(struct cuda_backend *cb, const void *p, size_t bytes)
{
    const char *c = (const char *)p;
    for (int i = 0; i < cb->npinned; i++) {
        struct dt_cuda_pinned *e = &cb->pinned[i];
        if (c >= e->p && c < e->p + e->bytes && bytes <= (size_t)(e->p + e->bytes - c))
            return e;
    }
    return NULL;
}

/* The upload event of the pinned buffer holding [p, p + bytes), or NULL
 * when p is not in one (pageable memory). */
static cudaEvent_t pinned_event(struct cuda_backend *cb, const void *p, size_t bytes)
{
    pthread_mutex_lock(&cb->pinned_mu);
    struct dt_cuda_pinned *e = p ? pinned_of(cb, p, bytes) : NULL;
    cudaEvent_t ev = e ? e->read : NULL;
    pthread_mutex_unlock(&cb->pinned_mu);
    return ev;
}

static dt_status cuda_host_alloc(dt_backend_t *be, size_t bytes, void **out)
{
    struct cuda_backend *cb = dt_cuda_of(be);
    *out = NULL;
    size_t want = bytes ? bytes : 1;
    struct dt_cuda_pinned e = {NULL, want, NULL};
    cudaError_t err = cudaMallocHost((void **)&e.p, want);
    if (err != cudaSuccess) {
        e.p = NULL;
        return dt_cuda_status(cb, err, 0, "host_alloc", "%zu bytes of pinned host memory", want);
    }
    err = cudaEventCreateWithFlags(&e.read, cudaEventDisableTiming);
    if (err != cudaSuccess) {
        (void)cudaFreeHost(e.p);
        return dt_cuda_status(cb, err, 0, "host_alloc", "the upload event of a pinned buffer");
    }
    memset(e.p, 0, want);
    pthread_mutex_lock(&cb->pinned_mu);
    if (cb->npinned == cb->pinned_cap) {
        int cap = cb->pinned_cap ? 2 * cb->pinned_cap : 16;
        void *grown = realloc(cb->pinned, (size_t)cap * sizeof *cb->pinned);
        if (!grown) {
            pthread_mutex_unlock(&cb->pinned_mu);
            (void)cudaEventDestroy(e.read);
            (void)cudaFreeHost(e.p);
            return dt_set_error(DT_ERR_NOMEM, "cuda host_alloc: out of host memory for the "
                                              "list of pinned buffers");
        }
        cb->pinned = (struct dt_cuda_pinned *)grown;
        cb->pinned_cap = cap;
    }
    cb->pinned[cb->npinned++] = e;
    pthread_mutex_unlock(&cb->pinned_mu);
    *out = e.p;
    return DT_OK;
}

/* Waits for the last upload out of the buffer holding p (none queued: at
 * once). The caller is a loader worker, not the training loop, so this is
 * not counted in dt_backend_waits. */
static dt_status cuda_host_idle(dt_backend_t *be, const void *p)
{
    struct cuda_backend *cb = dt_cuda_of(be);
    cudaEvent_t ev = pinned_event(cb, p, 1);
    if (!ev)
        return DT_OK;
    cudaError_t err = cudaEventSynchronize(ev);
    return dt_cuda_status(cb, err, 0, "host_idle", "waiting for an upload out of a pinned buffer");
}

static void cuda_host_free(dt_backend_t *be, void *p)
{
    struct cuda_backend *cb = dt_cuda_of(be);
    pthread_mutex_lock(&cb->pinned_mu);
    struct dt_cuda_pinned *e = pinned_of(cb, p, 1);
    struct dt_cuda_pinned gone = {NULL, 0, NULL};
    if (e) {
        gone = *e;
        *e = cb->pinned[--cb->npinned];
    }
    pthread_mutex_unlock(&cb->pinned_mu);
    if (!gone.p)
        return;
    (void)cudaEventSynchronize(gone.read);
    (void)cudaEventDestroy(gone.read);
    (void)cudaFreeHost(gone.p);
    (void)cudaGetLastError();
}

/* A staging slot of at least `bytes` whose previous upload has finished;
 * *slot = -1 when pinned memory for it cannot be had (the caller then
 * copies synchronously from the caller's buffer). */
static dt_status staging_slot(struct cuda_backend *cb, size_t bytes, int *slot)
{
    int k = cb->staging_next;
    *slot = -1;
    cudaError_t err = cudaEventQuery(cb->staging_done[k]);
    if (err == cudaErrorNotReady) { /* the copy out of it is still queued */
        if (cudaPeekAtLastError() == cudaErrorNotReady)
            (void)cudaGetLastError(); /* not a failure for the next launch to find */
        double t0 = dt_now();
        err = cudaEventSynchronize(cb->staging_done[k]);
        dt_cuda_note_wait(cb, dt_now() - t0);
    }
    if (err != cudaSuccess)
        return dt_cuda_status(cb, err, 0, "copy", "waiting for upload staging slot %d", k);
    if (cb->staging_bytes[k] < bytes) {
        size_t want = STAGING_MIN_BYTES;
        while (want < bytes)
            want *= 2;
        err = cb->staging[k] ? cudaFreeHost(cb->staging[k]) : cudaSuccess;
        cb->staging[k] = NULL;
        cb->staging_bytes[k] = 0;
        if (err != cudaSuccess)
            return dt_cuda_status(cb, err, 0, "copy", "freeing upload staging slot %d", k);
        err = cudaMallocHost(&cb->staging[k], want);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            cb->staging[k] = NULL;
            DT_LOG_DEBUG("cuda", "no pinned memory for a %zu-byte upload buffer (%s); copying "
                         "synchronously", want, cudaGetErrorString(err));
            return DT_OK;
        }
        cb->staging_bytes[k] = want;
    }
    cb->staging_next = (k + 1) % DT_CUDA_STAGING;
    *slot = k;
    return DT_OK;
}

/* Host to device. From a pinned buffer of dt_backend_host_alloc: queued
 * straight from it, with its event after the copy (host_idle waits for
 * that). From pageable memory: the caller may reuse src as soon as this
 * returns, in both paths. */
static dt_status upload(struct cuda_backend *cb, void *dst, const void *src, size_t bytes)
{
    cudaEvent_t read = pinned_event(cb, src, bytes);
    if (read) {
        cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cb->stream);
        if (err == cudaSuccess)
            err = cudaEventRecord(read, cb->stream);
        return dt_cuda_status(cb, err, 0, "copy", "host (pinned) to device, %zu bytes", bytes);
    }
    int k = -1;
    if (bytes <= SYNC_UPLOAD_BYTES) {
        dt_status st = staging_slot(cb, bytes, &k);
        if (st != DT_OK)
            return st;
    }
    cudaError_t err;
    if (k < 0) {
        err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cb->stream);
        if (err != cudaSuccess)
            return dt_cuda_status(cb, err, 0, "copy", "host to device, %zu bytes", bytes);
        return dt_cuda_sync_op(cb, "copy (host to device)");
    }
    memcpy(cb->staging[k], src, bytes);
    err = cudaMemcpyAsync(dst, cb->staging[k], bytes, cudaMemcpyHostToDevice, cb->stream);
    if (err == cudaSuccess)
        err = cudaEventRecord(cb->staging_done[k], cb->stream);
    return dt_cuda_status(cb, err, 0, "copy", "host to device, %zu bytes", bytes);
}

/* Device to host: queued behind every op so far, then waited for. */
static dt_status download(struct cuda_backend *cb, void *dst, const void *src, size_t bytes)
{
    cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cb->stream);
    if (err != cudaSuccess)
        return dt_cuda_status(cb, err, 0, "copy", "device to host, %zu bytes", bytes);
    return dt_cuda_sync_op(cb, "copy (device to host)");
}

static dt_status cuda_copy(dt_backend_t *be, void *dst, const void *src, size_t bytes,
                           enum dt_copy_kind kind)
{
    struct cuda_backend *cb = dt_cuda_of(be);
    if (bytes == 0)
        return DT_OK;
    if (!dst || !src)
        return dt_set_error(DT_ERR_INVALID_ARG, "cuda copy: NULL %s for %zu bytes",
                            dst ? "source" : "destination", bytes);
    if (kind != DT_COPY_D2H)
        dt_cuda_params_written(cb, dst, bytes);
    switch (kind) {
    case DT_COPY_H2D:
        return upload(cb, dst, src, bytes);
    case DT_COPY_D2H:
        return download(cb, dst, src, bytes);
    case DT_COPY_D2D:
        if (dst == src)
            return DT_OK;
        return dt_cuda_status(
            cb, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cb->stream), 0, "copy",
            "device to device, %zu bytes", bytes);
    }
    return dt_set_error(DT_ERR_INVALID_ARG, "cuda copy: unknown copy kind %d", (int)kind);
}

static dt_status cuda_slot_free(dt_backend_t *be, int slot)
{
    struct cuda_backend *cb = dt_cuda_of(be);
    cudaError_t err = cudaEventRecord(cb->slot_free[slot], cb->stream);
    cb->slot_marked[slot] = err == cudaSuccess;
    return dt_cuda_status(cb, err, 0, "slot_free", "marking input slot %d", slot);
}

/* From a pinned buffer: on the copy stream, after the compute that last
 * read the slot, with the buffer's event after it, which the compute stream
 * waits for before anything queued next (and host_idle before the buffer
 * is refilled). Otherwise an ordinary upload. */
static dt_status cuda_upload_ahead(dt_backend_t *be, int slot, void *dst, const void *src,
                                   size_t bytes)
{
    struct cuda_backend *cb = dt_cuda_of(be);
    if (bytes == 0)
        return DT_OK;
    cudaEvent_t read = pinned_event(cb, src, bytes);
    if (!read || !dst)
        return cuda_copy(be, dst, src, bytes, DT_COPY_H2D);
    dt_cuda_params_written(cb, dst, bytes);
    /* a slot not freed since the last allocation waits for everything so
     * far (the new buffer's zero-fill among it) */
    dt_status st = cb->slot_marked[slot] ? DT_OK : cuda_slot_free(be, slot);
    if (st != DT_OK)
        return st;
    cudaError_t err = cudaStreamWaitEvent(cb->copy_stream, cb->slot_free[slot], 0);
    if (err == cudaSuccess)
        err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cb->copy_stream);
    if (err == cudaSuccess)
        err = cudaEventRecord(read, cb->copy_stream);
    if (err == cudaSuccess)
        err = cudaStreamWaitEvent(cb->stream, read, 0);
    return dt_cuda_status(cb, err, 0, "upload_ahead",
                          "host (pinned) to device on the copy stream, %zu bytes, slot %d", bytes,
                          slot);
}

static dt_status cuda_sync(dt_backend_t *be) { return dt_cuda_sync_op(dt_cuda_of(be), "sync"); }

/* linear.cu rounds the input into in_kept in bf16 and fp16 (2 bytes). */
static size_t cuda_kept_operand_bytes(const dt_backend_t *be)
{
    const struct cuda_backend *cb = (const struct cuda_backend *)be->impl;
    return cb->precision == DT_F32 ? 0 : sizeof(uint16_t);
}

static dt_status cuda_settle(dt_backend_t *be) { return dt_cuda_settle(dt_cuda_of(be)); }

static dt_status cuda_reserve(dt_backend_t *be, enum dt_op_id op, int64_t a, int64_t b,
                              int64_t c)
{
    struct cuda_backend *cb = dt_cuda_of(be);
    const int ia = a > INT_MAX ? INT_MAX : (int)a, ib = b > INT_MAX ? INT_MAX : (int)b;
    size_t bytes = 0;
    switch (op) {
    case DT_OP_linear_fwd:
    case DT_OP_linear_bwd:
        bytes = dt_cuda_linear_scratch(cb, (size_t)a, (size_t)b, (size_t)c);
        break;
    case DT_OP_bias_bwd:
        bytes = dt_cuda_colsum_scratch(DT_CUDA_COLSUM_PLAIN, ia, ib);
        break;
    case DT_OP_layernorm_bwd:
        bytes = dt_cuda_colsum_scratch(DT_CUDA_COLSUM_LAYERNORM, ia, ib);
        break;
    case DT_OP_rmsnorm_bwd:
        bytes = dt_cuda_colsum_scratch(DT_CUDA_COLSUM_RMSNORM, ia, ib);
        break;
    case DT_OP_softmax_xent_fwd:
        bytes = dt_cuda_xent_scratch((size_t)a);
        break;
    case DT_OP_sumsq:
        bytes = dt_cuda_sumsq_scratch((size_t)a);
        break;
    case DT_OP_step_gate:
        bytes = dt_cuda_gate_scratch((size_t)a, (size_t)b);
        break;
    default:
        break;
    }
    if (bytes == 0)
        return DT_OK;
    void *p = NULL;
    dt_status st = dt_cuda_scratch(cb, bytes, &p);
    return st != DT_OK ? dt_error_context(st, "cuda: reserving scratch for %s", dt_op_name(op))
                       : DT_OK;
}

static void cuda_waits(const dt_backend_t *be, struct dt_backend_waits *out)
{
    const struct cuda_backend *cb = (const struct cuda_backend *)be->impl;
    out->count = cb->waits;
    out->seconds = cb->wait_s;
}

static dt_status cuda_mem_info(dt_backend_t *be, struct dt_backend_mem *out)
{
    struct cuda_backend *cb = dt_cuda_of(be);
    size_t free_b = 0, total_b = 0;
    cudaError_t err = cudaMemGetInfo(&free_b, &total_b);
    if (err != cudaSuccess)
        return dt_cuda_status(cb, err, 0, "memory info", "reading free and total memory");
    out->used = total_b - free_b;
    out->peak = cb->peak_used > out->used ? cb->peak_used : out->used;
    out->total = total_b;
    out->device = 1;
    return DT_OK;
}

/* ---- op table ---------------------------------------------------------- */

/* The element-wise ops, one pair per row of DT_UNARY_LIST (activation.cu). */
#define CUDA_UNARY_OPS(a, name, s, forward, gradient, cpu, doc)                                    \
    .name##_fwd = dt_cuda_##name##_fwd, .name##_bwd = dt_cuda_##name##_bwd,                        \
    .name##_fwd_keep = dt_cuda_##name##_fwd_keep,

/* In DT_OP_LIST order (C++ takes designated initializers in order only).
 * Without cuDNN the convolution and pooling ops stay NULL and
 * dt_backend_supports says so. */
static const struct dt_ops cuda_ops = {
    .linear_fwd = dt_cuda_linear_fwd,
    .linear_bwd = dt_cuda_linear_bwd,
    .bias_fwd = dt_cuda_bias_fwd,
    .bias_bwd = dt_cuda_bias_bwd,
    .channel_bias_fwd = dt_cuda_channel_bias_fwd,
    .channel_bias_bwd = dt_cuda_channel_bias_bwd,
    // clang-format off
    DT_UNARY_LIST(CUDA_UNARY_OPS, _)
    .dropout_fwd = dt_cuda_dropout_fwd,
    // clang-format on
    .dropout_bwd = dt_cuda_dropout_bwd,
    .flatten_fwd = dt_cuda_flatten_fwd,
    .flatten_bwd = dt_cuda_flatten_bwd,
    .add = dt_cuda_add,
    .accumulate = dt_cuda_accumulate,
    .mul = dt_cuda_mul,
    .softmax_xent_fwd = dt_cuda_softmax_xent_fwd,
    .softmax_xent_bwd = dt_cuda_softmax_xent_bwd,
#ifdef DT_HAVE_CUDNN
    .conv2d_workspace = dt_cuda_conv2d_workspace,
    .conv2d_fwd = dt_cuda_conv2d_fwd,
    .conv2d_bwd_data = dt_cuda_conv2d_bwd_data,
    .conv2d_bwd_filter = dt_cuda_conv2d_bwd_filter,
    .maxpool2d_fwd = dt_cuda_maxpool2d_fwd,
    .maxpool2d_bwd = dt_cuda_maxpool2d_bwd,
    .avgpool2d_fwd = dt_cuda_avgpool2d_fwd,
    .avgpool2d_bwd = dt_cuda_avgpool2d_bwd,
#endif
    .batchnorm_stats = dt_cuda_batchnorm_stats,
    .batchnorm_fwd = dt_cuda_batchnorm_fwd,
    .batchnorm_infer = dt_cuda_batchnorm_infer,
    .batchnorm_bwd_reduce = dt_cuda_batchnorm_bwd_reduce,
    .batchnorm_bwd = dt_cuda_batchnorm_bwd,
    .layernorm_fwd = dt_cuda_layernorm_fwd,
    .layernorm_bwd = dt_cuda_layernorm_bwd,
    .rmsnorm_fwd = dt_cuda_rmsnorm_fwd,
    .rmsnorm_bwd = dt_cuda_rmsnorm_bwd,
    .embedding_fwd = dt_cuda_embedding_fwd,
    .embedding_bwd = dt_cuda_embedding_bwd,
    .attention_workspace = dt_cuda_attention_workspace,
    .attention_fwd = dt_cuda_attention_fwd,
    .attention_bwd = dt_cuda_attention_bwd,
    .attention_decode = dt_cuda_attention_decode,
    .sgd_update = dt_cuda_sgd_update,
    .adamw_update = dt_cuda_adamw_update,
    .sumsq = dt_cuda_sumsq,
    .step_gate = dt_cuda_step_gate,
    .scale = dt_cuda_scale,
    .fill = dt_cuda_fill,
    .all_finite = dt_cuda_all_finite,
    .to_bf16 = dt_cuda_to_bf16,
    .from_bf16 = dt_cuda_from_bf16,
};

/* ---- create and destroy ------------------------------------------------ */

/* Frees whatever of cb exists; used by destroy and by a failed create.
 * Errors here have nowhere to go and are dropped. */
static void release(struct cuda_backend *cb)
{
    if (!cb)
        return;
    if (cb->stream)
        (void)cudaStreamSynchronize(cb->stream);
    if (cb->copy_stream)
        (void)cudaStreamSynchronize(cb->copy_stream);
    for (int i = 0; i < cb->npinned; i++) { /* buffers the owner did not free */
        (void)cudaEventDestroy(cb->pinned[i].read);
        (void)cudaFreeHost(cb->pinned[i].p);
    }
    free(cb->pinned);
    pthread_mutex_destroy(&cb->pinned_mu);
    if (cb->blas)
        (void)cublasDestroy(cb->blas);
#ifdef DT_HAVE_CUDNN
    dt_cuda_dnn_release(cb);
#endif
    dt_cuda_emb_release(cb);
    dt_cuda_xent_release(cb);
    for (int k = 0; k < DT_CUDA_STAGING; k++) {
        if (cb->staging_done[k])
            (void)cudaEventDestroy(cb->staging_done[k]);
        if (cb->staging[k])
            (void)cudaFreeHost(cb->staging[k]);
    }
    if (cb->results_done)
        (void)cudaEventDestroy(cb->results_done);
    if (cb->mirror)
        (void)cudaFree(cb->mirror);
    if (cb->gemm_scratch)
        (void)cudaFree(cb->gemm_scratch);
    if (cb->dscalars)
        (void)cudaFree(cb->dscalars);
    if (cb->hscalars)
        (void)cudaFreeHost(cb->hscalars);
    for (int k = 0; k < DT_BACKEND_INPUT_SLOTS; k++)
        if (cb->slot_free[k])
            (void)cudaEventDestroy(cb->slot_free[k]);
    if (cb->copy_stream)
        (void)cudaStreamDestroy(cb->copy_stream);
    if (cb->stream)
        (void)cudaStreamDestroy(cb->stream);
    (void)cudaGetLastError();
    free(cb);
}

static void cuda_destroy(dt_backend_t *be) { release(dt_cuda_of(be)); }

/* Checks the ordinal, makes the device current, and describes it in
 * base.device and base.uuid. */
static dt_status open_device(struct cuda_backend *cb)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaErrorNoDevice) { /* said below, with CUDA_VISIBLE_DEVICES */
        (void)cudaGetLastError();
        count = 0;
    } else if (err != cudaSuccess) {
        return dt_cuda_status(cb, err, 0, "create", "counting devices");
    }
    if (cb->device >= count) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cuda backend: device %d was asked for but %d CUDA device(s) are "
                            "visible, numbered from 0 (CUDA_VISIBLE_DEVICES%s%s%s)",
                            cb->device, count, vis ? "=\"" : " is not set", vis ? vis : "",
                            vis ? "\"" : "");
    }
    err = cudaSetDevice(cb->device);
    if (err != cudaSuccess)
        return dt_cuda_status(cb, err, 0, "create", "selecting the device");
    cudaDeviceProp prop;
    err = cudaGetDeviceProperties(&prop, cb->device);
    if (err != cudaSuccess)
        return dt_cuda_status(cb, err, 0, "create", "querying the device");
    cb->cc_major = prop.major;
    cb->cc_minor = prop.minor;
    cb->total_mem = prop.totalGlobalMem;
    cb->sm_count = prop.multiProcessorCount;
    snprintf(cb->base.device, sizeof cb->base.device,
             "cuda:%d %.100s (sm_%d%d, %.1f GiB, PCI %04x:%02x:%02x.0)", cb->device, prop.name,
             prop.major, prop.minor, (double)prop.totalGlobalMem / GIB,
             (unsigned)prop.pciDomainID, (unsigned)prop.pciBusID, (unsigned)prop.pciDeviceID);
    const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
    snprintf(cb->base.uuid, sizeof cb->base.uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
             u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
             u[14], u[15]);
    if (cb->precision == DT_BF16 && cb->cc_major < 8)
        return dt_set_error(DT_ERR_UNSUPPORTED,
                            "train.precision=bf16 needs a GPU of compute capability 8.0 or newer, "
                            "but %s is %d.%d: use train.precision=fp16 or fp32",
                            cb->base.device, cb->cc_major, cb->cc_minor);
    return DT_OK;
}

/* n events without timing into ev[] (one that fails stays NULL). */
static dt_status make_events(struct cuda_backend *cb, cudaEvent_t *ev, int n, const char *what)
{
    for (int k = 0; k < n; k++) {
        cudaError_t err = cudaEventCreateWithFlags(&ev[k], cudaEventDisableTiming);
        if (err != cudaSuccess) {
            ev[k] = NULL;
            return n == 1 ? dt_cuda_status(cb, err, 0, "create", "%s", what)
                          : dt_cuda_status(cb, err, 0, "create", "%s %d", what, k);
        }
    }
    return DT_OK;
}

/* The stream every op and copy goes on, and cuBLAS bound to it; the copy
 * stream for the uploads ahead and its slot events. TF32 only when
 * allowed; otherwise fp32 GEMMs compute in full fp32. */
static dt_status open_stream(struct cuda_backend *cb)
{
    cudaError_t err = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
        cb->stream = NULL;
        return dt_cuda_status(cb, err, 0, "create", "creating the stream");
    }
    err = cudaStreamCreateWithFlags(&cb->copy_stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
        cb->copy_stream = NULL;
        return dt_cuda_status(cb, err, 0, "create", "creating the copy stream");
    }
    dt_status st =
        make_events(cb, cb->slot_free, DT_BACKEND_INPUT_SLOTS, "the event of input slot");
    if (st != DT_OK)
        return st;
    cublasStatus_t bst = cublasCreate(&cb->blas);
    if (bst != CUBLAS_STATUS_SUCCESS) {
        cb->blas = NULL;
        return dt_cublas_status(cb, bst, "create", "creating the cuBLAS handle");
    }
    bst = cublasSetStream(cb->blas, cb->stream);
    if (bst != CUBLAS_STATUS_SUCCESS)
        return dt_cublas_status(cb, bst, "create", "binding cuBLAS to the stream");
    bst = cublasSetMathMode(cb->blas, cb->allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                     : CUBLAS_DEFAULT_MATH);
    return dt_cublas_status(cb, bst, "create", "setting the math mode (allow_tf32=%d)",
                            cb->allow_tf32);
}

/* Reduction scalars (device and pinned host) and the staging events. The
 * staging buffers themselves are allocated by the first upload. */
static dt_status open_buffers(struct cuda_backend *cb)
{
    cudaError_t err = cudaMalloc(&cb->dscalars, DT_CUDA_SCALAR_BYTES);
    if (err != cudaSuccess) {
        cb->dscalars = NULL;
        return dt_cuda_status(cb, err, DT_CUDA_SCALAR_BYTES, "create", "reduction scalars");
    }
    err = cudaMallocHost(&cb->hscalars, DT_CUDA_SCALAR_BYTES);
    if (err != cudaSuccess) {
        cb->hscalars = NULL;
        return dt_cuda_status(cb, err, 0, "create", "pinned host scalars");
    }
    dt_status st = make_events(cb, &cb->results_done, 1, "the results event");
    return st == DT_OK ? make_events(cb, cb->staging_done, DT_CUDA_STAGING, "staging event") : st;
}

static dt_status check_opts(const struct dt_backend_opts *o)
{
    if (o->device < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "cuda backend: device must be >= 0 (got %d)",
                            o->device);
    if (o->precision != DT_F32 && o->precision != DT_BF16 &&
        o->precision != DT_F16)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cuda backend: unknown precision %d (fp32, bf16 or fp16)",
                            (int)o->precision);
    return DT_OK;
}

/* Device memory on one GPU, one stream; fp32, bf16 and fp16 on the GPU's
 * own units. Without cuDNN the convolution and pooling ops are missing. */
extern "C" const struct dt_backend_caps dt_cuda_backend_caps = {
    .device_memory = 1,
    .has_stream = 1,
    .per_device = 1,
    .precisions = DT_PRECISION_BIT(DT_F32) | DT_PRECISION_BIT(DT_BF16) | DT_PRECISION_BIT(DT_F16),
    .native_precisions =
        DT_PRECISION_BIT(DT_F32) | DT_PRECISION_BIT(DT_BF16) | DT_PRECISION_BIT(DT_F16),
#ifdef DT_HAVE_CUDNN
    .missing_op_hint = "",
#else
    .missing_op_hint = "this dtrain was built without cuDNN; rebuild with cuDNN installed, or "
                       "run on runtime.device: cpu",
#endif
};

/* reference_kernels has no meaning here: cuda has one op table. */
extern "C" dt_status dt_cuda_backend_create(const struct dt_backend_opts *opts, dt_backend_t **out)
{
    if (!out)
        return dt_set_error(DT_ERR_INVALID_ARG, "cuda backend: out must not be NULL");
    *out = NULL;
    struct dt_backend_opts o;
    memset(&o, 0, sizeof o);
    o.threads = 1;
    if (opts)
        o = *opts;
    dt_status st = check_opts(&o);
    if (st != DT_OK)
        return st;
    struct cuda_backend *cb = (struct cuda_backend *)calloc(1, sizeof *cb);
    if (!cb)
        return dt_set_error(DT_ERR_NOMEM, "cuda backend: out of host memory");
    pthread_mutex_init(&cb->pinned_mu, NULL);
    cb->device = o.device;
    cb->allow_tf32 = o.allow_tf32 != 0;
    cb->precision = o.precision;
    snprintf(cb->base.device, sizeof cb->base.device, "cuda:%d", o.device);
    DT_CHECK(open_device(cb));
    DT_CHECK(open_stream(cb));
    DT_CHECK(open_buffers(cb));
    cb->base.name = "cuda";
    cb->base.ops = &cuda_ops;
    cb->base.caps = &dt_cuda_backend_caps;
    cb->base.alloc = cuda_alloc;
    cb->base.free = cuda_free;
    cb->base.host_alloc = cuda_host_alloc;
    cb->base.host_free = cuda_host_free;
    cb->base.host_idle = cuda_host_idle;
    cb->base.copy = cuda_copy;
    cb->base.sync = cuda_sync;
    cb->base.kept_operand_bytes = cuda_kept_operand_bytes;
    cb->base.upload_ahead = cuda_upload_ahead;
    cb->base.slot_free = cuda_slot_free;
    cb->base.settle = cuda_settle;
    cb->base.set_params = dt_cuda_set_params;
    cb->base.destroy = cuda_destroy;
    cb->base.mem_info = cuda_mem_info;
    cb->base.waits = cuda_waits;
    cb->base.reserve = cuda_reserve;
    cb->base.impl = cb;
    cb->base.stream = cb->stream;
    *out = &cb->base;
    return DT_OK;
out:
    release(cb);
    return st;
}
