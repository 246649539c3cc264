/*
 * nvml.h - GPU utilisation, memory and power of this rank's device through
 * NVML, the library nvidia-smi uses.
 *
 * libnvidia-ml.so.1 comes with the NVIDIA driver, not with the CUDA
 * toolkit, so it is opened with dlopen at run time: dtrain has no
 * link-time dependency on it, and a machine without the driver (or a CPU
 * run) simply has no GPU samples. Nothing here is an error: a library,
 * symbol or device that cannot be found leaves a debug line only.
 */
#ifndef DT_NVML_H
#define DT_NVML_H

#include <stdint.h>

typedef struct dt_nvml dt_nvml_t;

/* One sample; each part is present only when NVML gave it. */
struct dt_nvml_sample {
    int has_util, has_mem, has_power;
    double util;       /* fraction of the last sample period a kernel ran, [0, 1] */
    uint64_t mem_used; /* bytes of device memory in use (all processes) */
    double power_w;    /* board power draw, watts */
};

/* Opens NVML and finds the device named uuid ("GPU-..." as CUDA gives
 * it). NULL when the library, its symbols or the device are missing. */
dt_nvml_t *dt_nvml_open(const char *uuid);
void dt_nvml_close(dt_nvml_t *nv);

/* Reads the device now; 0 when nothing could be read (nv NULL too). */
int dt_nvml_sample(dt_nvml_t *nv, struct dt_nvml_sample *s);

#endif
