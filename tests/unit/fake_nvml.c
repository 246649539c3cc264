/*
 * fake_nvml.c - a stand-in libnvidia-ml.so.1 for test_monitor: the few
 * NVML entry points dtrain calls, with fixed answers for one device,
 * "GPU-fake", so the sampling path runs on a machine without a GPU.
 */
#include <string.h>

#define FAKE_SUCCESS 0
#define FAKE_NOT_FOUND 6 /* NVML_ERROR_NOT_FOUND */

struct fake_util {
    unsigned int gpu, memory;
};
struct fake_mem {
    unsigned long long total, free, used;
};

static int device = 1;

int nvmlInit_v2(void) { return FAKE_SUCCESS; }
int nvmlShutdown(void) { return FAKE_SUCCESS; }

int nvmlDeviceGetHandleByUUID(const char *uuid, void **dev)
{
    if (strcmp(uuid, "GPU-fake") != 0)
        return FAKE_NOT_FOUND;
    *dev = &device;
    return FAKE_SUCCESS;
}

int nvmlDeviceGetUtilizationRates(void *dev, struct fake_util *u)
{
    (void)dev;
    u->gpu = 42;
    u->memory = 10;
    return FAKE_SUCCESS;
}

int nvmlDeviceGetMemoryInfo(void *dev, struct fake_mem *m)
{
    (void)dev;
    m->total = 16ull << 30;
    m->used = 3ull << 30;
    m->free = m->total - m->used;
    return FAKE_SUCCESS;
}

int nvmlDeviceGetPowerUsage(void *dev, unsigned int *mw)
{
    (void)dev;
    *mw = 87500;
    return FAKE_SUCCESS;
}
