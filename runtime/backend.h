/*
 * backend.h - compute backends (cpu, cuda) behind one small interface:
 * allocate and free device memory, copy, synchronise, and the op table of
 * kernels/ops.h. A backend handle belongs to one thread at a time.
 */
#ifndef DT_BACKEND_H
#define DT_BACKEND_H

#include <stddef.h>

#include "../kernels/ops.h"
#include "status.h"

enum dt_copy_kind { DT_COPY_H2D, DT_COPY_D2H, DT_COPY_D2D };

struct dt_backend_opts {
    int threads;           /* CPU threads for BLAS (>= 1) */
    int reference_kernels; /* use the plain C reference ops (tests) */
};

/* Creates backend `name` ("cpu"; "cuda" in CUDA builds). Unknown or
 * unavailable names fail with DT_ERR_UNSUPPORTED and say why. */
dt_status dt_backend_create(const char *name, const struct dt_backend_opts *opts,
                            dt_backend_t **out);
void dt_backend_destroy(dt_backend_t *be);

const char *dt_backend_name(const dt_backend_t *be);
const struct dt_ops *dt_backend_ops(const dt_backend_t *be);

/* Zero-initialised, 64-byte aligned device memory. */
dt_status dt_backend_alloc(dt_backend_t *be, size_t bytes, void **out);
void dt_backend_free(dt_backend_t *be, void *ptr);
dt_status dt_backend_copy(dt_backend_t *be, void *dst, const void *src, size_t bytes,
                          enum dt_copy_kind kind);
dt_status dt_backend_sync(dt_backend_t *be);

/* Names of backends compiled into this build, comma separated. */
const char *dt_backend_list(void);

/* CUDA probe: 1 and a device description when a usable GPU exists, else 0
 * and the reason (no CUDA in this build, no driver, no device, ...). */
int dt_cuda_usable(char *why, size_t len);

#endif
