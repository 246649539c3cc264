/*
 * cuda_probe.h - asks the CUDA runtime whether a usable GPU is present.
 * Plain C interface to kernels/cuda/probe.cu.
 */
#ifndef DT_CUDA_PROBE_H
#define DT_CUDA_PROBE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 and "device 0: NAME (sm_XY, N GiB)" in why when a GPU can run this
 * build's kernels; 0 and the reason otherwise (no driver, driver older than
 * the runtime, no device, no kernel image for its compute capability). */
int dt_cuda_probe(char *why, size_t len);
/* The same for visible device `device`; only that device gets a context. */
int dt_cuda_probe_device(int device, char *why, size_t len);
/* Why the driver cannot run this build: none installed, or its CUDA
 * version and the one this build needs (for cudaErrorInsufficientDriver). */
void dt_cuda_driver_text(char *buf, size_t len);
/* dt_cuda_device_info of kernels/backend.h (kernels/cuda/device_info.cu). */
struct dt_gpu_info;
int dt_cuda_info_device(int device, struct dt_gpu_info *info, char *why, size_t len);
/* Visible devices, 0 when CUDA cannot start. */
int dt_cuda_probe_count(void);

#ifdef __cplusplus
}
#endif

#endif
