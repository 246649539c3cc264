/*
 * backend.h - compute backends (cpu, cuda) behind one small interface:
 * allocate and free device memory, copy, synchronise, and the op table of
 * kernels/ops.h. A backend handle belongs to one thread at a time.
 */
#ifndef DT_BACKEND_H
#define DT_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "ops.h"
#include "core/status.h"
#include "core/tensor.h"

enum dt_copy_kind { DT_COPY_H2D, DT_COPY_D2H, DT_COPY_D2D };

/* The type matmul inputs (and, on cuda, the GEMM operands) are rounded to.
 * Master weights, gradients and optimizer state stay fp32 on every backend. */

struct dt_backend_opts {
    int threads;           /* CPU threads for BLAS (>= 1) */
    int reference_kernels; /* use the plain C reference ops (tests) */
    int device;            /* cuda: ordinal among the visible devices (>= 0) */
    int allow_tf32;        /* cuda: fp32 GEMMs may use TF32 tensor cores */
    enum dt_dtype precision; /* cpu: DT_F32 only */
    int tiny_tasks;          /* cpu: cut ops into the smallest tasks, so the small shapes of
                                tests spread over every thread */
};

/* "fp32", "bf16" or "fp16"; dt_precision_parse returns -1 for anything else. */
const char *dt_precision_name(enum dt_dtype p);
int dt_precision_parse(const char *name);

/* What a backend is, for the decisions that depend on it (which memory a
 * run budgets, which communicator serves it, whether a reduced precision
 * is worth it) so that no caller needs to know backends by name. The same
 * for every instance of a backend in one build: asked of a backend
 * (dt_backend_caps) or, before one exists, of a name
 * (dt_backend_caps_named). */
#define DT_PRECISION_BIT(t) (1u << (unsigned)(t))
struct dt_backend_caps {
    /* 1: dt_backend_alloc returns device memory, which the host reaches
     * only through dt_backend_copy; 0: host memory (cpu). */
    int device_memory;
    /* 1: ops and copies are queued on one stream (dt_backend_stream) and
     * complete at dt_backend_sync; 0: each completes before it returns. */
    int has_stream;
    /* 1: an instance runs on one of the node's devices, picked by
     * dt_backend_opts.device and named by dt_backend_device_uuid. */
    int per_device;
    /* DT_PRECISION_BIT(t) for each train.precision t (DT_F32, DT_BF16,
     * DT_F16) the backend takes, and for those of them it computes in
     * natively, at least as fast as fp32 (cpu: fp32 alone; its bf16 and
     * fp16 round fp32 matmul inputs). */
    unsigned precisions;
    unsigned native_precisions;
    /* Why this build's backend may lack an op and what to do about it, for
     * the message that names the op ("" when there is nothing to say). */
    const char *missing_op_hint;
};
/* Never NULL. */
const struct dt_backend_caps *dt_backend_caps(const dt_backend_t *be);
/* The capabilities of backend `name` as built into this dtrain; NULL for
 * a name this build does not have (an unknown one, or cuda without CUDA). */
const struct dt_backend_caps *dt_backend_caps_named(const char *name);
/* 1 when backend `name` is built in and can run on visible device
 * `device` (a GPU backend probes it), else 0 and the reason in why. */
int dt_backend_available(const char *name, int device, char *why, size_t len);
/* The backend runtime.device: auto stands for on visible device `device`:
 * the first backend, in the order of preference (a GPU before the cpu),
 * that is available there; why gets the reason the one preferred before it
 * is not ("" when the first is taken). Never NULL. */
const char *dt_backend_auto(int device, char *why, size_t len);

/* Creates backend `name` ("cpu"; "cuda" in CUDA builds). Unknown or
 * unavailable names fail with DT_ERR_UNSUPPORTED and say why. */
dt_status dt_backend_create(const char *name, const struct dt_backend_opts *opts,
                            dt_backend_t **out);
void dt_backend_destroy(dt_backend_t *be);

const char *dt_backend_name(const dt_backend_t *be);
const struct dt_ops *dt_backend_ops(const dt_backend_t *be);
/* The CPU backend's op table, for host-side questions asked before any
 * backend exists (a layer's workspace size for the memory estimate). Its
 * ops take be == NULL as "the default CPU backend". Never NULL. */
const struct dt_ops *dt_backend_host_ops(void);

/* 1 when backend be has op `op` for tensors of dtype t, else 0. Every op
 * of this version computes in fp32 (the reduced-precision matmul inputs
 * of train.precision are the backend's own business), so t is DT_F32 for
 * every op a backend has. */
int dt_backend_supports(const dt_backend_t *be, enum dt_op_id op, enum dt_dtype t);

/* Zero-initialised, 64-byte aligned device memory. */
dt_status dt_backend_alloc(dt_backend_t *be, size_t bytes, void **out);
void dt_backend_free(dt_backend_t *be, void *ptr);
dt_status dt_backend_copy(dt_backend_t *be, void *dst, const void *src, size_t bytes,
                          enum dt_copy_kind kind);
/* Host memory for buffers that are uploaded again and again (the loader's
 * batches), zero-filled: on cuda pinned, so an upload from it needs no
 * host copy and no wait; elsewhere plain host memory. Such a buffer may
 * be read by an upload after dt_backend_copy has returned: before writing
 * it again, call dt_backend_host_idle, which returns once no queued copy
 * reads it (at once elsewhere). Safe to call from any thread. */
dt_status dt_backend_host_alloc(dt_backend_t *be, size_t bytes, void **out);
void dt_backend_host_free(dt_backend_t *be, void *ptr);
dt_status dt_backend_host_idle(dt_backend_t *be, const void *ptr);
dt_status dt_backend_sync(dt_backend_t *be);
/* Uploads that run beside the compute queued before them (the model's
 * input batches): on cuda a copy stream takes them, so that the next
 * micro-batch travels while this one's backward and the update still
 * run. The buffers they write are grouped in DT_BACKEND_INPUT_SLOTS
 * slots. An upload into slot k writes dst only after the ops queued
 * before the last dt_backend_slot_free(be, k) have run (all of them read
 * what the slot held before; when none came after the last
 * dt_backend_alloc, every op queued so far, its zero-fill among them),
 * and every op queued after it reads the new bytes; nothing waits on the
 * host. From host memory that is not
 * dt_backend_host_alloc's, and on backends without a stream, it is
 * dt_backend_copy (H2D), ordered after everything before it. */
#define DT_BACKEND_INPUT_SLOTS 2
dt_status dt_backend_upload_ahead(dt_backend_t *be, int slot, void *dst, const void *src,
                                  size_t bytes);
/* The ops queued so far are the last to read slot's buffers. */
dt_status dt_backend_slot_free(dt_backend_t *be, int slot);
/* The model's flat parameter buffer (n floats of this backend's memory;
 * NULL forgets it). A backend that rounds GEMM operands (cuda in bf16 or
 * fp16) keeps one rounded copy of it, made at the first GEMM after a
 * write into the buffer, so each weight is rounded once per optimizer
 * step instead of at every GEMM that reads it. Every write into the
 * buffer must go through this backend (its updates, copies, fill, scale,
 * step_gate), which is how it knows the copy is stale. The copy is
 * allocated here (DT_ERR_NOMEM when the device is full). */
dt_status dt_backend_set_params(dt_backend_t *be, const float *p, size_t n);
/* Bytes per element of linear_fwd's in_kept, the input rounded to the
 * GEMM operand type that linear_bwd reads again (kernels/ops.h): 2 on
 * cuda in bf16 or fp16; 0 where the operands are read as they are (fp32,
 * and the cpu, which rounds as it reads), and for be == NULL. A layer
 * keeps that much per input element beside its activations when it is
 * not 0, and passes NULL otherwise. */
size_t dt_backend_kept_operand_bytes(const dt_backend_t *be);
/* Waits until the results queued so far reach the host (the loss totals,
 * a step_gate's record; see kernels/ops.h), not necessarily for the work
 * queued after them: on cuda, an update queued after step_gate may still
 * run. Without a step_gate since the last wait it is dt_backend_sync. */
dt_status dt_backend_settle(dt_backend_t *be);

/* What the backend runs on, for logs: "cpu" or e.g.
 * "cuda:0 NVIDIA H200 (sm_90, 139.8 GiB, PCI 0000:1b:00.0)". */
const char *dt_backend_device(const dt_backend_t *be);
/* A string naming the physical device, the same in every process that
 * uses it ("GPU-<uuid>" for cuda), or "" for cpu: ranks on one node
 * compare these to find a GPU shared by accident. */
const char *dt_backend_device_uuid(const dt_backend_t *be);
/* The cudaStream_t every op and copy of the backend is queued on, for
 * communicators that must order their work after it; NULL for cpu. */
void *dt_backend_stream(const dt_backend_t *be);

/* Memory of what the backend computes on, in bytes (0 where unknown).
 * cpu: this process's resident set now and its peak (VmRSS, VmHWM), and
 * the node's memory. cuda: device memory in use now (by every process on
 * the device, cudaMemGetInfo), the most seen in use after any allocation
 * or stream synchronisation of this backend, and the device's memory. */
struct dt_backend_mem {
    uint64_t used, peak, total;
    int device; /* 1: device memory (cuda), 0: host memory (cpu) */
};
dt_status dt_backend_mem_info(dt_backend_t *be, struct dt_backend_mem *out);

/* Makes room now, at build time, for the scratch `op` takes when called
 * with these sizes, so that a training step does not grow it (a wait for
 * the device, and memory the out-of-memory fallback would not see):
 * linear_fwd, linear_bwd (B, In, Out); bias_bwd (B, C); layernorm_bwd,
 * rmsnorm_bwd (rows, D); softmax_xent_fwd (B, the rows the loss is taken
 * over); sumsq (n); step_gate (n, ranges). Other ops, and backends without a scratch (cpu), need
 * nothing. A failure is the allocation's (DT_ERR_NOMEM when the device is
 * full). be may be NULL (sizing a model without a backend). */
dt_status dt_backend_reserve(dt_backend_t *be, enum dt_op_id op, int64_t a, int64_t b, int64_t c);

/* Times the host has waited for the device since the backend was made,
 * and the seconds spent in those waits: every wait for the stream (a
 * download, sync, settle, an op that returns a value to the host, such as
 * sumsq) and every wait for an upload buffer to come free. Both 0 for cpu, whose
 * ops complete before they return. */
struct dt_backend_waits {
    uint64_t count;
    double seconds;
};
void dt_backend_waits(const dt_backend_t *be, struct dt_backend_waits *out);

/* Names of backends compiled into this build, comma separated. */
const char *dt_backend_list(void);

/* CUDA probe: 1 and a device description when a usable GPU exists, else 0
 * and the reason (no CUDA in this build, no driver, no device, ...). */
int dt_cuda_usable(char *why, size_t len);
/* The same for visible device `device` (a rank probes its own GPU only). */
int dt_cuda_usable_device(int device, char *why, size_t len);
/* CUDA devices visible to this process (CUDA_VISIBLE_DEVICES applied);
 * 0 without CUDA, driver or device. */
int dt_cuda_device_count(void);

/* What dtrain doctor reports about one GPU and the CUDA stack. */
struct dt_gpu_info {
    int driver_version;  /* CUDA version the driver supports, 1000*major + 10*minor; 0: none */
    int runtime_version; /* CUDA runtime this build carries (same encoding); 0 without CUDA */
    int driver_ok;       /* driver_version >= runtime_version */
    int device;          /* the visible device described below; -1: none */
    char name[128];
    char uuid[64];       /* "GPU-<uuid>", as dt_backend_device_uuid */
    char pci[32];        /* "0000:1b:00.0" */
    unsigned long long mem_bytes;
    int cc_major, cc_minor;
    /* The architecture of the kernel code the runtime picked for this
     * device: 10*major + minor of the binary (SASS) and of the PTX it came
     * from; binary 0 with has_kernels 0 means no kernel image fits. */
    int kernel_binary, kernel_ptx, has_kernels;
    char cublas[32]; /* cuBLAS version, "" when unknown */
    /* cuDNN version loaded ("9.19.0"), or why there is none ("" without
     * CUDA) */
    char cudnn[96];
};

/* Fills *info for visible device `device` (the versions alone when it is
 * not visible). Returns 1 when the device could be described, else 0 with
 * the reason in why (no CUDA in this build, no driver, no such device). */
int dt_cuda_device_info(int device, struct dt_gpu_info *info, char *why, size_t len);

/* The CPU BLAS: name, version and build (openblas_get_config for
 * OpenBLAS), or what little is known of another CBLAS. */
void dt_blas_info(char *buf, size_t len);

/* When OpenBLAS did not know this CPU and chose kernels from before AVX2
 * for it, the kernels it should run (a name for OPENBLAS_CORETYPE), with
 * the ones it chose in chosen; else NULL (OPENBLAS_CORETYPE is set, the
 * choice fits the CPU, or the BLAS is not OpenBLAS). main() acts on it
 * and marks the restart with DT_BLAS_FALLBACK_ENV = the kernels chosen. */
const char *dt_blas_better_core(char *chosen, size_t len);
/* The rule it applies: for OpenBLAS kernels named chosen (any case), the
 * kernels this CPU calls for when chosen is from before AVX2 and the CPU
 * has AVX2 and FMA ("SkylakeX" with AVX-512 F, BW, DQ, VL and CD, else
 * "Haswell"); NULL otherwise. */
const char *dt_blas_core_for(const char *chosen);
#define DT_BLAS_FALLBACK_ENV "DTRAIN_BLAS_FALLBACK"

#endif
