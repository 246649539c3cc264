/*
 * device_info.cu - what `dtrain doctor` reports about a GPU and the CUDA
 * stack: the driver's and the runtime's CUDA versions, the device's name,
 * memory, compute capability, UUID and PCI address, cuBLAS's and cuDNN's
 * versions, and which kernel code the runtime picked for the device.
 *
 * The kernel code is read from a kernel of this file with
 * cudaFuncGetAttributes: its binaryVersion is the SASS architecture chosen
 * for the device (built for it, or JIT-compiled from PTX), and it fails
 * when the binary holds nothing that can run there, the case
 * dt_cuda_probe_device reports as "no kernel image". Every kernel of the
 * build is compiled for the same CMAKE_CUDA_ARCHITECTURES, so one stands
 * for all.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#ifdef DT_HAVE_CUDNN
#include <cudnn.h>
#endif
#include <stdio.h>
#include <string.h>

#include "kernels/backend.h"

static __global__ void info_marker(int *out)
{
    if (out)
        *out = 1;
}

/* cuDNN's version as loaded (9.x encodes it as 10000*major + 100*minor +
 * patch), with the headers' when they differ; or why this build has none. */
static void cudnn_version(struct dt_gpu_info *info)
{
#ifdef DT_HAVE_CUDNN
    const size_t v = cudnnGetVersion();
    const size_t built = CUDNN_VERSION;
    char hdr[48] = "";
    if (v != built)
        snprintf(hdr, sizeof hdr, " (built against %zu.%zu.%zu)", built / 10000,
                 built % 10000 / 100, built % 100);
    snprintf(info->cudnn, sizeof info->cudnn, "%zu.%zu.%zu%s", v / 10000, v % 10000 / 100, v % 100,
             hdr);
#else
    snprintf(info->cudnn, sizeof info->cudnn,
             "not in this build (no convolution or pooling on the GPU)");
#endif
}

static void versions(struct dt_gpu_info *info)
{
    int drv = 0, rt = 0;
    if (cudaDriverGetVersion(&drv) != cudaSuccess)
        drv = 0;
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess)
        rt = CUDART_VERSION;
    (void)cudaGetLastError();
    info->driver_version = drv;
    info->runtime_version = rt;
    info->driver_ok = drv > 0 && drv >= rt;
    int major = 0, minor = 0, patch = 0;
    if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
        cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
        cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
        snprintf(info->cublas, sizeof info->cublas, "%d.%d.%d", major, minor, patch);
    cudnn_version(info);
}

static void kernel_code(struct dt_gpu_info *info)
{
    cudaFuncAttributes attr;
    memset(&attr, 0, sizeof attr);
    cudaError_t err = cudaFuncGetAttributes(&attr, info_marker);
    info->has_kernels = err == cudaSuccess && attr.binaryVersion > 0;
    info->kernel_binary = err == cudaSuccess ? attr.binaryVersion : 0;
    info->kernel_ptx = err == cudaSuccess ? attr.ptxVersion : 0;
    (void)cudaGetLastError();
}

extern "C" int dt_cuda_info_device(int device, struct dt_gpu_info *info, char *why, size_t len)
{
    memset(info, 0, sizeof *info);
    info->device = -1;
    versions(info);
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        if (err == cudaErrorInsufficientDriver && info->driver_version == 0)
            snprintf(why, len, "no NVIDIA driver is installed");
        else if (err == cudaErrorInsufficientDriver)
            snprintf(why, len,
                     "the NVIDIA driver supports CUDA %d.%d, older than this build's %d.%d",
                     info->driver_version / 1000, info->driver_version % 1000 / 10,
                     info->runtime_version / 1000, info->runtime_version % 1000 / 10);
        else if (err == cudaErrorNoDevice || count == 0)
            snprintf(why, len, "no CUDA device is visible (CUDA_VISIBLE_DEVICES may hide them)");
        else
            snprintf(why, len, "CUDA cannot start: %s", cudaGetErrorString(err));
        (void)cudaGetLastError();
        return 0;
    }
    if (device < 0 || device >= count) {
        snprintf(why, len, "device %d is not visible (%d visible)", device, count);
        return 0;
    }
    cudaDeviceProp prop;
    err = cudaGetDeviceProperties(&prop, device);
    if (err == cudaSuccess)
        err = cudaSetDevice(device);
    if (err != cudaSuccess) {
        snprintf(why, len, "cannot use device %d: %s", device, cudaGetErrorString(err));
        (void)cudaGetLastError();
        return 0;
    }
    info->device = device;
    snprintf(info->name, sizeof info->name, "%.*s", (int)sizeof info->name - 1, prop.name);
    const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
    snprintf(info->uuid, sizeof info->uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
             u[15]);
    snprintf(info->pci, sizeof info->pci, "%04x:%02x:%02x.0", (unsigned)prop.pciDomainID,
             (unsigned)prop.pciBusID, (unsigned)prop.pciDeviceID);
    info->mem_bytes = (unsigned long long)prop.totalGlobalMem;
    info->cc_major = prop.major;
    info->cc_minor = prop.minor;
    kernel_code(info);
    snprintf(why, len, "%s", info->name);
    return 1;
}
