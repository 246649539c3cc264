/*
 * probe.cu - the first CUDA translation unit: finds out whether this
 * machine can run dtrain's kernels, by asking the runtime for devices and
 * launching one tiny kernel. The runtime is linked statically, so the
 * binary starts on machines without a driver and reports why it cannot
 * use a GPU instead of failing to load.
 */
#include <cuda_runtime.h>
#include <stdio.h>

#include "cuda_launch.h"
#include "cuda_probe.h"

#define PROBE_THREADS 32

static __global__ void probe_fill(int *out, int value)
{
    if (threadIdx.x == 0 && blockIdx.x == 0)
        *out = value;
}

static int kernel_runs(char *why, size_t len, const cudaDeviceProp *prop)
{
    int *dev = NULL;
    int host = 0;
    const int magic = 0x5eed;
    cudaError_t err = cudaMalloc((void **)&dev, sizeof(int));
    if (err == cudaSuccess) {
        DT_CUDA_LAUNCH(probe_fill, 1, PROBE_THREADS, 0, 0, dev, magic);
        err = cudaGetLastError();
    }
    if (err == cudaSuccess)
        err = cudaMemcpy(&host, dev, sizeof(int), cudaMemcpyDeviceToHost);
    if (dev)
        cudaFree(dev);
    if (err == cudaErrorNoKernelImageForDevice) {
        snprintf(why, len,
                 "this binary has no kernels for the GPU's compute capability %d.%d; rebuild "
                 "with -DCMAKE_CUDA_ARCHITECTURES=%d%d",
                 prop->major, prop->minor, prop->major, prop->minor);
        return 0;
    }
    if (err != cudaSuccess || host != magic) {
        snprintf(why, len, "a test kernel failed on the GPU: %s", cudaGetErrorString(err));
        return 0;
    }
    return 1;
}

extern "C" void dt_cuda_driver_text(char *buf, size_t len)
{
    int drv = 0, rt = 0;
    if (cudaDriverGetVersion(&drv) != cudaSuccess || cudaRuntimeGetVersion(&rt) != cudaSuccess)
        (void)cudaGetLastError();
    if (drv == 0)
        snprintf(buf, len, "no NVIDIA driver is installed");
    else
        snprintf(buf, len,
                 "the NVIDIA driver supports CUDA %d.%d but this dtrain needs CUDA %d.%d; "
                 "upgrade the driver",
                 drv / 1000, (drv % 1000) / 10, rt / 1000, (rt % 1000) / 10);
}

extern "C" int dt_cuda_probe(char *why, size_t len) { return dt_cuda_probe_device(0, why, len); }

extern "C" int dt_cuda_probe_device(int device, char *why, size_t len)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaErrorInsufficientDriver) {
        dt_cuda_driver_text(why, len);
        return 0;
    }
    if (err == cudaErrorNoDevice || (err == cudaSuccess && count == 0)) {
#ifdef DT_CUDA_EMU
        snprintf(why, len, "this dtrain's cuda backend is the host emulation "
                 "(-DDTRAIN_CUDA=EMU): set DTRAIN_CUDA_EMU=1 to run on it");
#else
        snprintf(why, len, "no CUDA device is visible (CUDA_VISIBLE_DEVICES may hide them)");
#endif
        return 0;
    }
    if (err != cudaSuccess) {
        snprintf(why, len, "CUDA cannot start: %s", cudaGetErrorString(err));
        return 0;
    }
    if (device < 0 || device >= count) {
        snprintf(why, len, "device %d is not visible (%d visible; CUDA_VISIBLE_DEVICES may hide "
                           "the others)", device, count);
        return 0;
    }
    cudaDeviceProp prop;
    err = cudaGetDeviceProperties(&prop, device);
    if (err == cudaSuccess)
        err = cudaSetDevice(device); /* the test kernel's context goes on this device only */
    if (err != cudaSuccess) {
        snprintf(why, len, "cannot use device %d: %s", device, cudaGetErrorString(err));
        return 0;
    }
    if (!kernel_runs(why, len, &prop))
        return 0;
    snprintf(why, len, "%d device(s); device %d: %s (sm_%d%d, %.0f GiB)", count, device,
             prop.name, prop.major, prop.minor,
             (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    return 1;
}

extern "C" int dt_cuda_probe_count(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess)
        return 0;
    return count;
}
