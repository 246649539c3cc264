/*
 * backend_impl.h - the backend vtable. Only backend implementations and
 * the registry in backend.c include this.
 */
#ifndef DT_BACKEND_IMPL_H
#define DT_BACKEND_IMPL_H

#include "backend.h"

struct dt_backend {
    const char *name;
    const struct dt_ops *ops;
    const struct dt_backend_caps *caps; /* dt_backend_caps: the backend's own constant */
    dt_status (*alloc)(dt_backend_t *be, size_t bytes, void **out);
    void (*free)(dt_backend_t *be, void *ptr);
    /* dt_backend_host_alloc, _host_free, _host_idle; NULL: plain host memory
     * (calloc, free), never busy */
    dt_status (*host_alloc)(dt_backend_t *be, size_t bytes, void **out);
    void (*host_free)(dt_backend_t *be, void *ptr);
    dt_status (*host_idle)(dt_backend_t *be, const void *ptr);
    dt_status (*copy)(dt_backend_t *be, void *dst, const void *src, size_t bytes,
                      enum dt_copy_kind kind);
    dt_status (*sync)(dt_backend_t *be);
    /* dt_backend_upload_ahead and _slot_free; NULL: copy (H2D), and nothing */
    dt_status (*upload_ahead)(dt_backend_t *be, int slot, void *dst, const void *src,
                              size_t bytes);
    dt_status (*slot_free)(dt_backend_t *be, int slot);
    /* dt_backend_set_params; NULL: nothing to keep */
    dt_status (*set_params)(dt_backend_t *be, const float *p, size_t n);
    /* dt_backend_kept_operand_bytes; NULL: 0 */
    size_t (*kept_operand_bytes)(const dt_backend_t *be);
    /* dt_backend_settle; NULL: sync */
    dt_status (*settle)(dt_backend_t *be);
    void (*destroy)(dt_backend_t *be); /* frees impl and the struct itself */
    /* dt_backend_mem_info; NULL: the process's host memory */
    dt_status (*mem_info)(dt_backend_t *be, struct dt_backend_mem *out);
    /* dt_backend_reserve; NULL: no scratch (cpu) */
    dt_status (*reserve)(dt_backend_t *be, enum dt_op_id op, int64_t a, int64_t b, int64_t c);
    /* dt_backend_waits; NULL: none (cpu) */
    void (*waits)(const dt_backend_t *be, struct dt_backend_waits *out);
    void *impl;
    char device[192];  /* dt_backend_device */
    char uuid[64];     /* dt_backend_device_uuid ("" for cpu) */
    void *stream;      /* dt_backend_stream (NULL for cpu) */
};

/* kernels/cpu/backend_cpu.c */
dt_status dt_cpu_backend_create(const struct dt_backend_opts *opts, dt_backend_t **out);
extern const struct dt_backend_caps dt_cpu_backend_caps;
/* kernels/cuda/backend_cuda.cu (CUDA builds only) */
dt_status dt_cuda_backend_create(const struct dt_backend_opts *opts, dt_backend_t **out);
extern const struct dt_backend_caps dt_cuda_backend_caps;

#endif
