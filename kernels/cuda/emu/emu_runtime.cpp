/*
 * emu_runtime.cpp - the CUDA runtime calls of dtrain's CUDA backend, on
 * the host, for the emulation build (-DDTRAIN_CUDA=EMU).
 *
 * One emulated device, present only when DTRAIN_CUDA_EMU=1 is set (without
 * it the runtime reports no device, as a CUDA build on a machine without a
 * GPU does, so the CPU suites behave the same in both builds). Its memory
 * is host memory, registered by address so that copies, memsets, kernel
 * arguments and cuBLAS operands can be checked against the allocation they
 * belong to: a copy that runs past its buffer or has the wrong direction
 * is an error here, as it may only corrupt memory on a GPU. Allocations
 * are 256-byte aligned, as cudaMalloc's are, and exactly as long as asked
 * (so AddressSanitizer sees a kernel's overrun). New
 * allocations are filled with 0xff bytes (NaN) so that a read before any
 * write shows. DTRAIN_CUDA_EMU_MEMORY (bytes) sets the device's size, so
 * out-of-memory paths can be exercised; the default is 16 GiB.
 *
 * Streams and events are emu_stream.cpp's: by default every call
 * completes before it returns (DTRAIN_CUDA_EMU_STREAMS defers them).
 * Errors follow CUDA's rules: cudaGetLastError returns and clears
 * the pending error, and a fault in a kernel is sticky (every later call
 * returns it), as a GPU context's is.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <cuda_runtime.h>

#include "emu_impl.h"

namespace dt_emu
{

namespace
{

struct state {
    std::map<uintptr_t, region> device; /* by base address */
    std::map<uintptr_t, size_t> pinned;
    size_t used = 0, total = 0;
    cudaError_t pending = cudaSuccess, sticky = cudaSuccess;
    int current = 0;
};

state &st()
{
    static state s;
    return s;
}

constexpr size_t DEFAULT_TOTAL = (size_t)16 << 30;
constexpr int POISON = 0xff;
constexpr size_t ALIGN = 256; /* cudaMalloc's alignment */

size_t total_bytes()
{
    state &s = st();
    if (!s.total) {
        const char *e = getenv("DTRAIN_CUDA_EMU_MEMORY");
        char *end = NULL;
        unsigned long long v = e ? strtoull(e, &end, 10) : 0;
        s.total = e && end != e && *end == '\0' && v > 0 ? (size_t)v : DEFAULT_TOTAL;
    }
    return s.total;
}

cudaError_t fail(cudaError_t err)
{
    set_error(err, false);
    return err;
}

/* The sticky error, if any, for calls that would otherwise succeed. */
cudaError_t ok()
{
    return st().sticky;
}

} // namespace

std::recursive_mutex &lock()
{
    static std::recursive_mutex m;
    return m;
}

bool enabled()
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("DTRAIN_CUDA_EMU");
        on = e && strcmp(e, "1") == 0;
    }
    return on == 1;
}

int schedules()
{
    static int n = 0;
    if (!n) {
        const char *e = getenv("DTRAIN_CUDA_EMU_SCHEDULES");
        n = e && strcmp(e, "1") == 0 ? 1 : 2;
    }
    return n;
}

void set_error(cudaError_t err, bool sticky)
{
    state &s = st();
    if (err == cudaSuccess) return;
    if (s.pending == cudaSuccess) s.pending = err;
    if (sticky && s.sticky == cudaSuccess) s.sticky = err;
}

cudaError_t sticky_error()
{
    return st().sticky;
}

void report(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "dtrain CUDA emulation: %s\n", buf);
    fflush(stderr);
}

const region *find_device(const void *p, size_t bytes)
{
    state &s = st();
    const uintptr_t a = (uintptr_t)p;
    auto it = s.device.upper_bound(a);
    if (it == s.device.begin()) return NULL;
    --it;
    const region &r = it->second;
    const uintptr_t base = (uintptr_t)r.base;
    if (a < base || a - base > r.bytes || bytes > r.bytes - (a - base)) return NULL;
    return &r;
}

std::vector<region> device_regions()
{
    std::vector<region> out;
    for (auto &kv : st().device)
        out.push_back(kv.second);
    return out;
}

/* What [p, p + bytes) is, for messages and direction checks. */
enum where { W_DEVICE, W_HOST, W_PARTIAL };

static where locate(const void *p, size_t bytes)
{
    if (find_device(p, bytes)) return W_DEVICE;
    return find_device(p, 0) ? W_PARTIAL : W_HOST;
}

static const char *where_name(where w)
{
    return w == W_DEVICE ? "device memory"
           : w == W_HOST ? "host memory"
                         : "past the end of a device buffer";
}

/* Checks a copy's direction and extent (nothing is copied). */
static cudaError_t check_copy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind)
{
    if (st().sticky) return st().sticky;
    if (bytes == 0) return cudaSuccess;
    if (!dst || !src) return fail(cudaErrorInvalidValue);
    const where d = locate(dst, bytes), s = locate(src, bytes);
    bool okdir;
    switch (kind) {
    case cudaMemcpyHostToDevice:
        okdir = d == W_DEVICE && s == W_HOST;
        break;
    case cudaMemcpyDeviceToHost:
        okdir = d == W_HOST && s == W_DEVICE;
        break;
    case cudaMemcpyDeviceToDevice:
        okdir = d == W_DEVICE && s == W_DEVICE;
        break;
    case cudaMemcpyHostToHost:
        okdir = d == W_HOST && s == W_HOST;
        break;
    case cudaMemcpyDefault:
        okdir = d != W_PARTIAL && s != W_PARTIAL;
        break;
    default:
        okdir = false;
        break;
    }
    if (!okdir) {
        report("cudaMemcpy of %zu bytes (kind %d): the destination is %s and the source %s", bytes,
               (int)kind, where_name(d), where_name(s));
        return fail(d == W_PARTIAL || s == W_PARTIAL ? cudaErrorInvalidValue
                                                     : cudaErrorInvalidMemcpyDirection);
    }
    return cudaSuccess;
}

/* [p, p + bytes) lies in pinned host memory (cudaMallocHost). */
static bool pinned(const void *p, size_t bytes)
{
    state &s = st();
    const uintptr_t a = (uintptr_t)p;
    auto it = s.pinned.upper_bound(a);
    if (it == s.pinned.begin()) return false;
    --it;
    return a - it->first <= it->second && bytes <= it->second - (a - it->first);
}

} // namespace dt_emu

using namespace dt_emu;

extern "C" {

cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count) return fail(cudaErrorInvalidValue);
    *count = enabled() ? 1 : 0;
    return enabled() ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device)
{
    if (!enabled()) return fail(cudaErrorNoDevice);
    if (device != 0) return fail(cudaErrorInvalidDevice);
    st().current = device;
    return ok();
}

cudaError_t cudaGetDevice(int *device)
{
    if (!device) return fail(cudaErrorInvalidValue);
    *device = st().current;
    return enabled() ? ok() : fail(cudaErrorNoDevice);
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (!prop) return fail(cudaErrorInvalidValue);
    if (!enabled()) return fail(cudaErrorNoDevice);
    if (device != 0) return fail(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "dtrain host emulation");
    memcpy(prop->uuid.bytes, "dtrain-emulation", 16);
    prop->totalGlobalMem = total_bytes();
    prop->sharedMemPerBlock = 48 * 1024;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 0x7fffffff;
    prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 4;
    return ok();
}

cudaError_t cudaDriverGetVersion(int *version)
{
    if (!version) return fail(cudaErrorInvalidValue);
    *version = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *version)
{
    if (!version) return fail(cudaErrorInvalidValue);
    *version = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return ok();
}

cudaError_t cudaGetLastError(void)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    state &s = st();
    cudaError_t e = s.pending;
    s.pending = s.sticky;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    return st().pending;
}

const char *cudaGetErrorName(cudaError_t err)
{
    switch (err) {
    case cudaSuccess:
        return "cudaSuccess";
    case cudaErrorInvalidValue:
        return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
        return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError:
        return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration:
        return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer:
        return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection:
        return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInsufficientDriver:
        return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice:
        return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
        return "cudaErrorInvalidDevice";
    case cudaErrorNoKernelImageForDevice:
        return "cudaErrorNoKernelImageForDevice";
    case cudaErrorUnsupportedPtxVersion:
        return "cudaErrorUnsupportedPtxVersion";
    case cudaErrorInvalidResourceHandle:
        return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
        return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
        return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure:
        return "cudaErrorLaunchFailure";
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t err)
{
    switch (err) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorInitializationError:
        return "initialization error";
    case cudaErrorInvalidConfiguration:
        return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer:
        return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection:
        return "invalid copy direction for memcpy";
    case cudaErrorInsufficientDriver:
        return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice:
        return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
        return "invalid device ordinal";
    case cudaErrorNoKernelImageForDevice:
        return "no kernel image is available for execution on the device";
    case cudaErrorUnsupportedPtxVersion:
        return "the provided PTX was compiled with an unsupported toolchain";
    case cudaErrorInvalidResourceHandle:
        return "invalid resource handle";
    case cudaErrorNotReady:
        return "device not ready";
    case cudaErrorIllegalAddress:
        return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure:
        return "unspecified launch failure";
    }
    return "unknown error";
}

cudaError_t cudaMalloc(void **ptr, size_t bytes)
{
    if (!ptr) return fail(cudaErrorInvalidValue);
    *ptr = NULL;
    std::lock_guard<std::recursive_mutex> g(lock());
    state &s = st();
    if (s.sticky) return s.sticky;
    if (!enabled()) return fail(cudaErrorNoDevice);
    if (bytes == 0) return cudaSuccess;
    if (bytes > total_bytes() - s.used) return fail(cudaErrorMemoryAllocation);
    void *mem = NULL;
    if (posix_memalign(&mem, ALIGN, bytes) != 0) return fail(cudaErrorMemoryAllocation);
    char *p = (char *)mem;
    memset(p, POISON, bytes);
    s.device[(uintptr_t)p] = region{p, bytes};
    s.used += bytes;
    *ptr = p;
    return cudaSuccess;
}

/* cudaFree and cudaFreeHost wait for every stream first, as CUDA's do. */
cudaError_t cudaFree(void *ptr)
{
    if (!ptr) return cudaSuccess;
    std::lock_guard<std::recursive_mutex> g(lock());
    drain_all();
    state &s = st();
    auto it = s.device.find((uintptr_t)ptr);
    if (it == s.device.end()) {
        report("cudaFree(%p): not the start of a device allocation", ptr);
        return fail(cudaErrorInvalidDevicePointer);
    }
    s.used -= it->second.bytes;
    free(it->second.base);
    s.device.erase(it);
    return ok();
}

cudaError_t cudaMallocHost(void **ptr, size_t bytes)
{
    if (!ptr) return fail(cudaErrorInvalidValue);
    *ptr = NULL;
    std::lock_guard<std::recursive_mutex> g(lock());
    if (!enabled()) return fail(cudaErrorNoDevice);
    char *p = (char *)malloc(bytes ? bytes : 1);
    if (!p) return fail(cudaErrorMemoryAllocation);
    st().pinned[(uintptr_t)p] = bytes;
    *ptr = p;
    return ok();
}

cudaError_t cudaFreeHost(void *ptr)
{
    if (!ptr) return cudaSuccess;
    std::lock_guard<std::recursive_mutex> g(lock());
    drain_all();
    auto it = st().pinned.find((uintptr_t)ptr);
    if (it == st().pinned.end()) {
        report("cudaFreeHost(%p): not a pinned allocation", ptr);
        return fail(cudaErrorInvalidValue);
    }
    st().pinned.erase(it);
    free(ptr);
    return ok();
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes_out)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    if (!enabled()) return fail(cudaErrorNoDevice);
    const size_t t = total_bytes();
    if (free_bytes) *free_bytes = t - st().used;
    if (total_bytes_out) *total_bytes_out = t;
    return ok();
}

/* Synchronous: after everything queued on every stream. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    drain_all();
    cudaError_t err = check_copy(dst, src, bytes, kind);
    if (err == cudaSuccess && bytes) memmove(dst, src, bytes);
    return err;
}

/* Queued on the stream, as CUDA does: from pageable host memory the bytes
 * are taken at the call (the caller may reuse its buffer at once); into
 * pageable host memory the call returns once the copy is done; pinned
 * host memory is read or written when the copy runs. */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    cudaError_t err = check_copy(dst, src, bytes, kind);
    if (err != cudaSuccess || bytes == 0) return err;
    const bool from_host = !find_device(src, bytes), to_host = !find_device(dst, bytes);
    if (to_host && !pinned(dst, bytes)) {
        drain_stream(stream);
        memmove(dst, src, bytes);
        return ok();
    }
    if (from_host && !pinned(src, bytes)) {
        const char *from = (const char *)src;
        auto taken = std::make_shared<std::vector<char>>(from, from + bytes);
        enqueue(stream, [dst, taken]() { memcpy(dst, taken->data(), taken->size()); });
        return ok();
    }
    enqueue(stream, [dst, src, bytes]() { memmove(dst, src, bytes); });
    return ok();
}

static cudaError_t check_memset(void *dst, size_t bytes)
{
    if (st().sticky) return st().sticky;
    if (bytes && !find_device(dst, bytes)) {
        report("cudaMemset of %zu bytes at %p: not inside one device allocation", bytes, dst);
        return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaMemset(void *dst, int value, size_t bytes)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    drain_all();
    cudaError_t err = check_memset(dst, bytes);
    if (err == cudaSuccess && bytes) memset(dst, value, bytes);
    return err;
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    cudaError_t err = check_memset(dst, bytes);
    if (err == cudaSuccess && bytes)
        enqueue(stream, [dst, value, bytes]() { memset(dst, value, bytes); });
    return err;
}

cudaError_t dt_emu_func_attributes(struct cudaFuncAttributes *attr, const void *func)
{
    if (!attr || !func) return fail(cudaErrorInvalidValue);
    memset(attr, 0, sizeof *attr);
    attr->maxThreadsPerBlock = 1024;
    attr->binaryVersion = 90;
    attr->ptxVersion = 90;
    return enabled() ? ok() : fail(cudaErrorNoDevice);
}

} /* extern "C" */
