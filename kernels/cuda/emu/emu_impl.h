/*
 * emu_impl.h - internals shared by the host emulation's parts: the device
 * memory registry and the error state (emu_runtime.cpp), used by the
 * scheduler (emu_sched.cpp) and the cuBLAS shim (emu_blas.cpp).
 */
#ifndef DT_CUDA_EMU_IMPL_H
#define DT_CUDA_EMU_IMPL_H

#include <stddef.h>

#include <functional>
#include <mutex>
#include <vector>

#include <cuda_runtime.h>

namespace dt_emu
{

/* One device allocation. */
struct region {
    char *base;
    size_t bytes;
};

/* Launches, copies and the registry run one at a time. */
std::recursive_mutex &lock();

/* The device allocation holding [p, p + bytes), or NULL (a pointer one
 * past the end with bytes = 0 counts as inside). */
const region *find_device(const void *p, size_t bytes);
/* Every device allocation, in address order. */
std::vector<region> device_regions();

/* The emulation is on: DTRAIN_CUDA_EMU=1 in the environment. Otherwise the
 * runtime reports no device, as a CUDA build on a machine without a GPU. */
bool enabled();

/* Records err as the pending error (cudaGetLastError); sticky errors stay
 * for every later call, as a faulted context does. */
void set_error(cudaError_t err, bool sticky);
cudaError_t sticky_error();

/* "dtrain CUDA emulation: <message>" on stderr. */
void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Streams (emu_stream.cpp): queues op on stream (NULL: the legacy
 * default stream, which first waits for every other); it runs now or, on
 * a deferred stream, once something waits for it. drain_stream runs
 * everything queued on stream (NULL: on every stream), drain_all on every
 * stream. */
void enqueue(cudaStream_t stream, std::function<void()> op);
void drain_stream(cudaStream_t stream);
void drain_all();

/* How many schedules each launch runs under (DTRAIN_CUDA_EMU_SCHEDULES,
 * 1 or 2, default 2). */
int schedules();

} // namespace dt_emu

#endif
