/*
 * backend.c - the registry of compute backends and the thin wrappers that
 * dispatch through a backend's vtable. The #ifdef for CUDA lives here and
 * in kernels/cuda/ only. The registry is also where the rest of the tree
 * asks what a backend is (dt_backend_caps*, dt_backend_auto), so that the
 * names of backends are compared here and nowhere above kernels/.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_impl.h"
#include "core/alloc.h"

#ifdef DT_HAVE_CUDA
#include "kernels/cuda/cuda_probe.h"
#endif

const char *dt_backend_list(void)
{
#ifdef DT_HAVE_CUDA
    return "cpu, cuda";
#else
    return "cpu";
#endif
}

int dt_cuda_usable(char *why, size_t len) { return dt_cuda_usable_device(0, why, len); }

int dt_cuda_usable_device(int device, char *why, size_t len)
{
#ifdef DT_HAVE_CUDA
    return dt_cuda_probe_device(device, why, len);
#else
    (void)device;
    snprintf(why, len, "this dtrain was built without CUDA (DTRAIN_CUDA=OFF or no nvcc)");
    return 0;
#endif
}

int dt_cuda_device_count(void)
{
#ifdef DT_HAVE_CUDA
    return dt_cuda_probe_count();
#else
    return 0;
#endif
}

int dt_cuda_device_info(int device, struct dt_gpu_info *info, char *why, size_t len)
{
#ifdef DT_HAVE_CUDA
    return dt_cuda_info_device(device, info, why, len);
#else
    memset(info, 0, sizeof *info);
    info->device = -1;
    (void)device;
    snprintf(why, len, "this dtrain was built without CUDA (DTRAIN_CUDA=OFF or no nvcc)");
    return 0;
#endif
}

static const char *const op_names[DT_OP_COUNT] = {
#define DT_OP_NAME(name, params) [DT_OP_##name] = #name,
    DT_OP_LIST(DT_OP_NAME)
#undef DT_OP_NAME
};

const char *dt_op_name(enum dt_op_id op)
{
    return (int)op >= 0 && op < DT_OP_COUNT ? op_names[op] : "unknown";
}

int dt_backend_supports(const dt_backend_t *be, enum dt_op_id op, enum dt_dtype t)
{
    if (!be || (int)op < 0 || op >= DT_OP_COUNT || t != DT_F32)
        return 0;
    const struct dt_ops *ops = be->ops;
    switch (op) {
#define DT_OP_CASE(name, params)                                                                   \
    case DT_OP_##name:                                                                             \
        return ops->name != NULL;
        DT_OP_LIST(DT_OP_CASE)
#undef DT_OP_CASE
    default:
        return 0;
    }
}

const char *dt_precision_name(enum dt_dtype p)
{
    switch (p) {
    case DT_F32: return "fp32";
    case DT_BF16: return "bf16";
    case DT_F16: return "fp16";
    default: return "unknown precision";
    }
}

int dt_precision_parse(const char *name)
{
    static const struct {
        const char *name;
        enum dt_dtype t;
    } names[] = {{"fp32", DT_F32}, {"bf16", DT_BF16}, {"fp16", DT_F16}};
    for (int i = 0; i < 3; i++)
        if (name && strcmp(name, names[i].name) == 0)
            return (int)names[i].t;
    return -1;
}

/* ---- the registry ------------------------------------------------------- */

static int cpu_usable(int device, char *why, size_t len)
{
    (void)device;
    if (len) why[0] = '\0';
    return 1;
}

/* Every backend this version knows, in the order runtime.device: auto
 * prefers them. One this build lacks keeps its entry (its probe says why
 * it is missing) with no create and no caps. */
struct backend_entry {
    const char *name;
    int (*usable)(int device, char *why, size_t len);
    dt_status (*create)(const struct dt_backend_opts *opts, dt_backend_t **out);
    const struct dt_backend_caps *caps;
};

static const struct backend_entry backends[] = {
#ifdef DT_HAVE_CUDA
    {"cuda", dt_cuda_usable_device, dt_cuda_backend_create, &dt_cuda_backend_caps},
#else
    {"cuda", dt_cuda_usable_device, NULL, NULL},
#endif
    {"cpu", cpu_usable, dt_cpu_backend_create, &dt_cpu_backend_caps},
};

#define NBACKENDS (sizeof backends / sizeof backends[0])

static const struct backend_entry *find_backend(const char *name)
{
    for (size_t i = 0; name && i < NBACKENDS; i++)
        if (strcmp(name, backends[i].name) == 0) return &backends[i];
    return NULL;
}

const struct dt_backend_caps *dt_backend_caps(const dt_backend_t *be)
{
    return be->caps;
}

const struct dt_backend_caps *dt_backend_caps_named(const char *name)
{
    const struct backend_entry *e = find_backend(name);
    return e ? e->caps : NULL;
}

int dt_backend_available(const char *name, int device, char *why, size_t len)
{
    const struct backend_entry *e = find_backend(name);
    if (!e) {
        snprintf(why, len, "unknown compute backend '%s' (this build has: %s)", name ? name : "",
                 dt_backend_list());
        return 0;
    }
    return e->usable(device, why, len) && e->create != NULL;
}

const char *dt_backend_auto(int device, char *why, size_t len)
{
    for (size_t i = 0; i + 1 < NBACKENDS; i++)
        if (dt_backend_available(backends[i].name, device, why, len)) {
            if (len) why[0] = '\0';
            return backends[i].name;
        }
    /* the last one, the cpu, is always there */
    return backends[NBACKENDS - 1].name;
}

dt_status dt_backend_create(const char *name, const struct dt_backend_opts *opts,
                            dt_backend_t **out)
{
    *out = NULL;
    const struct backend_entry *e = find_backend(name);
    char why[512];
    if (!e)
        return dt_set_error(DT_ERR_UNSUPPORTED, "unknown compute backend '%s' (this build has: %s)",
                            name, dt_backend_list());
    if (!e->usable(opts ? opts->device : 0, why, sizeof why))
        return dt_set_error(DT_ERR_UNSUPPORTED, "the %s backend is not usable: %s", e->name, why);
    if (!e->create)
        return dt_set_error(DT_ERR_UNSUPPORTED,
                            "the %s backend is not built into this dtrain "
                            "(this build has: %s)",
                            e->name, dt_backend_list());
    return e->create(opts, out);
}

void dt_backend_destroy(dt_backend_t *be)
{
    if (be)
        be->destroy(be);
}

const char *dt_backend_name(const dt_backend_t *be) { return be->name; }
const char *dt_backend_device(const dt_backend_t *be) { return be->device; }
const char *dt_backend_device_uuid(const dt_backend_t *be) { return be->uuid; }
void *dt_backend_stream(const dt_backend_t *be) { return be->stream; }
const struct dt_ops *dt_backend_ops(const dt_backend_t *be) { return be->ops; }

dt_status dt_backend_alloc(dt_backend_t *be, size_t bytes, void **out)
{
    return be->alloc(be, bytes, out);
}

void dt_backend_free(dt_backend_t *be, void *ptr)
{
    if (ptr)
        be->free(be, ptr);
}

dt_status dt_backend_host_alloc(dt_backend_t *be, size_t bytes, void **out)
{
    if (be->host_alloc) return be->host_alloc(be, bytes, out);
    return dt_calloc(1, bytes ? bytes : 1, "host buffer", out);
}

void dt_backend_host_free(dt_backend_t *be, void *ptr)
{
    if (!ptr) return;
    if (be->host_free)
        be->host_free(be, ptr);
    else
        free(ptr);
}

dt_status dt_backend_host_idle(dt_backend_t *be, const void *ptr)
{
    return be->host_idle && ptr ? be->host_idle(be, ptr) : DT_OK;
}

dt_status dt_backend_copy(dt_backend_t *be, void *dst, const void *src, size_t bytes,
                          enum dt_copy_kind kind)
{
    return be->copy(be, dst, src, bytes, kind);
}

dt_status dt_backend_sync(dt_backend_t *be) { return be->sync(be); }

static dt_status check_slot(int slot, const char *fn)
{
    if (slot >= 0 && slot < DT_BACKEND_INPUT_SLOTS)
        return DT_OK;
    return dt_set_error(DT_ERR_INVALID_ARG, "%s: slot %d outside 0..%d", fn, slot,
                        DT_BACKEND_INPUT_SLOTS - 1);
}

dt_status dt_backend_upload_ahead(dt_backend_t *be, int slot, void *dst, const void *src,
                                  size_t bytes)
{
    dt_status st = check_slot(slot, "dt_backend_upload_ahead");
    if (st != DT_OK)
        return st;
    return be->upload_ahead ? be->upload_ahead(be, slot, dst, src, bytes)
                            : be->copy(be, dst, src, bytes, DT_COPY_H2D);
}

dt_status dt_backend_slot_free(dt_backend_t *be, int slot)
{
    dt_status st = check_slot(slot, "dt_backend_slot_free");
    if (st != DT_OK)
        return st;
    return be->slot_free ? be->slot_free(be, slot) : DT_OK;
}

dt_status dt_backend_set_params(dt_backend_t *be, const float *p, size_t n)
{
    return be->set_params ? be->set_params(be, p, n) : DT_OK;
}

size_t dt_backend_kept_operand_bytes(const dt_backend_t *be)
{
    return be && be->kept_operand_bytes ? be->kept_operand_bytes(be) : 0;
}

dt_status dt_backend_settle(dt_backend_t *be)
{
    return be->settle ? be->settle(be) : be->sync(be);
}

/* A "Key:   N kB" line of a /proc file, in bytes; 0 when absent. */
static uint64_t proc_kb(const char *path, const char *key)
{
    char line[256];
    unsigned long long kb = 0;
    size_t n = strlen(key);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && line[n] == ':') {
            kb = strtoull(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return (uint64_t)kb * 1024;
}

dt_status dt_backend_reserve(dt_backend_t *be, enum dt_op_id op, int64_t a, int64_t b, int64_t c)
{
    if (a < 0 || b < 0 || c < 0)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "dt_backend_reserve: sizes must be >= 0 (%lld, %lld, %lld)",
                            (long long)a, (long long)b, (long long)c);
    return be && be->reserve ? be->reserve(be, op, a, b, c) : DT_OK;
}

void dt_backend_waits(const dt_backend_t *be, struct dt_backend_waits *out)
{
    out->count = 0;
    out->seconds = 0;
    if (be && be->waits) be->waits(be, out);
}

dt_status dt_backend_mem_info(dt_backend_t *be, struct dt_backend_mem *out)
{
    if (be && be->mem_info)
        return be->mem_info(be, out);
    out->used = proc_kb("/proc/self/status", "VmRSS");
    out->peak = proc_kb("/proc/self/status", "VmHWM");
    out->total = proc_kb("/proc/meminfo", "MemTotal");
    out->device = 0;
    return DT_OK;
}
