/*
 * nvml.c - NVML through dlopen (see nvml.h).
 *
 * Only a handful of NVML's C entry points are used, declared here with
 * the types of NVML's documented API (nvmlReturn_t is an int, 0 success;
 * a device handle is an opaque pointer), so no NVML header is needed at
 * build time either. The _v2 entry points exist since driver 325.
 */
#define _GNU_SOURCE
#include "nvml.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"

#define NVML_LIBRARY "libnvidia-ml.so.1"
#define NVML_SUCCESS 0

typedef void *nvml_device;
struct nvml_utilization {
    unsigned int gpu, memory; /* percent */
};
struct nvml_memory {
    unsigned long long total, free, used; /* bytes */
};

struct dt_nvml {
    void *lib;
    nvml_device dev;
    int (*shutdown)(void);
    int (*utilization)(nvml_device, struct nvml_utilization *);
    int (*memory)(nvml_device, struct nvml_memory *);
    int (*power)(nvml_device, unsigned int *); /* milliwatts */
};

/* dlsym into a function pointer without a cast between object and
 * function pointers (which ISO C leaves undefined). */
static int bind_symbol(void *lib, const char *name, void *fn)
{
    void *p = dlsym(lib, name);
    if (!p) {
        DT_LOG_DEBUG("nvml", "%s has no symbol %s: no GPU samples", NVML_LIBRARY, name);
        return 0;
    }
    memcpy(fn, &p, sizeof p);
    return 1;
}

dt_nvml_t *dt_nvml_open(const char *uuid)
{
    int (*init)(void) = NULL;
    int (*by_uuid)(const char *, nvml_device *) = NULL;
    int rc;
    if (!uuid || !uuid[0])
        return NULL;
    dt_nvml_t *nv = calloc(1, sizeof *nv);
    if (!nv)
        return NULL;
    nv->lib = dlopen(NVML_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (!nv->lib) {
        DT_LOG_DEBUG("nvml", "cannot load %s (%s): no GPU samples", NVML_LIBRARY, dlerror());
        goto fail;
    }
    if (!bind_symbol(nv->lib, "nvmlInit_v2", &init) ||
        !bind_symbol(nv->lib, "nvmlShutdown", &nv->shutdown) ||
        !bind_symbol(nv->lib, "nvmlDeviceGetHandleByUUID", &by_uuid) ||
        !bind_symbol(nv->lib, "nvmlDeviceGetUtilizationRates", &nv->utilization) ||
        !bind_symbol(nv->lib, "nvmlDeviceGetMemoryInfo", &nv->memory) ||
        !bind_symbol(nv->lib, "nvmlDeviceGetPowerUsage", &nv->power))
        goto fail;
    if ((rc = init()) != NVML_SUCCESS) {
        DT_LOG_DEBUG("nvml", "nvmlInit failed (NVML error %d): no GPU samples", rc);
        goto fail;
    }
    if ((rc = by_uuid(uuid, &nv->dev)) != NVML_SUCCESS) {
        DT_LOG_DEBUG("nvml", "NVML does not know device %s (NVML error %d): no GPU samples", uuid,
                     rc);
        nv->shutdown();
        goto fail;
    }
    DT_LOG_DEBUG("nvml", "sampling %s through %s", uuid, NVML_LIBRARY);
    return nv;
fail:
    if (nv->lib)
        dlclose(nv->lib);
    free(nv);
    return NULL;
}

void dt_nvml_close(dt_nvml_t *nv)
{
    if (!nv)
        return;
    nv->shutdown();
    dlclose(nv->lib);
    free(nv);
}

int dt_nvml_sample(dt_nvml_t *nv, struct dt_nvml_sample *s)
{
    struct nvml_utilization u;
    struct nvml_memory m;
    unsigned int mw;
    memset(s, 0, sizeof *s);
    if (!nv)
        return 0;
    if (nv->utilization(nv->dev, &u) == NVML_SUCCESS) {
        s->has_util = 1;
        s->util = u.gpu / 100.0;
    }
    if (nv->memory(nv->dev, &m) == NVML_SUCCESS) {
        s->has_mem = 1;
        s->mem_used = m.used;
    }
    if (nv->power(nv->dev, &mw) == NVML_SUCCESS) {
        s->has_power = 1;
        s->power_w = mw / 1000.0;
    }
    return s->has_util || s->has_mem || s->has_power;
}
