/*
 * backend_cpu.c - the CPU compute backend: host memory and the CPU op
 * tables.
 *
 * "Device" memory is host memory, 256-byte aligned (whole cache lines and
 * AVX-512 vectors; the model's tensor alignment) and zero-filled, so
 * copies are memcpy and sync has nothing to wait for. The backend carries
 * two op tables: the plain C reference ops (opts.reference_kernels, for
 * tests and for checking other backends) and the fast ops (BLAS and
 * vectorised loops), which are what training uses. Each op's two versions
 * live in the op-family files beside this one (linear.c, activation.c,
 * ...), with the same stems as the CUDA backend's files.
 *
 * Threads: the backend owns the rank's compute pool (core/threads.h,
 * opts.threads of them) and the fast ops cut their work into its tasks
 * (dt_cpu_for, dt_cpu_sgemm). BLAS itself runs on one thread, in whichever
 * pool thread calls it: two pools on the same cores would take turns
 * spinning. The BLAS thread count is process-wide in OpenBLAS, so creating
 * a backend sets it to 1 for every backend in the process; dtrain runs one
 * per process.
 * Op conventions (see kernels/ops.h): gradients of parameters ACCUMULATE
 * (+=), gradients of activations are WRITTEN (=).
 */
#include <stdlib.h>
#include <string.h>

#include "core/threads.h"
#include "kernels/backend_impl.h"
#include "cpu_ops.h"

/* Last: it pulls in <complex.h>, whose macro `I` clashes with ops.h. */
#include <cblas.h>
#undef I

/* Every allocation starts on this many bytes: the alignment the model
 * gives each tensor within its flat buffers (DT_MODEL_ALIGN_BYTES), so a
 * tensor's address is as aligned as its offset. */
#define CPU_ALIGN 256

/* One kept dropout mask (dt_cpu_mask_store). */
struct cpu_mask {
    uint8_t *bytes;
    size_t cap;
    struct dt_rng_key key;
    uint64_t row0;
    int rows, cols;
    float p;
    uint64_t used; /* the backend's mask_clock when last stored or found; 0: empty */
};

struct cpu_backend {
    struct dt_backend base;
    int threads;
    dt_threads_t *pool;              /* NULL on one thread */
    void *scratch[DT_CPU_MAX_SCRATCH]; /* per pool thread, grown by dt_cpu_scratch_reserve */
    size_t scratch_cap;
    int tiny; /* opts.tiny_tasks */
    enum dt_dtype precision;
    float *operand[DT_CPU_OPERANDS]; /* rounded GEMM operands, grown on demand */
    size_t operand_cap[DT_CPU_OPERANDS];
    int gate_skip; /* the step gate (step_gate): the gated updates change nothing */
    struct cpu_mask masks[DT_CPU_MASKS];
    uint64_t mask_clock;
};

/* The element-wise ops, one pair per row of DT_UNARY_LIST (activation.c). */
#define CPU_UNARY_REF_OPS(a, name, s, forward, gradient, cpu, doc)                                 \
    .name##_fwd = dt_cpu_##name##_fwd_ref, .name##_bwd = dt_cpu_##name##_bwd_ref,                  \
    .name##_fwd_keep = dt_cpu_##name##_fwd_keep_ref,
#define CPU_UNARY_FAST_OPS(a, name, s, forward, gradient, cpu, doc)                                \
    .name##_fwd = dt_cpu_##name##_fwd, .name##_bwd = dt_cpu_##name##_bwd,                          \
    .name##_fwd_keep = dt_cpu_##name##_fwd_keep,

static const struct dt_ops cpu_ops_ref = {
    .linear_fwd = dt_cpu_linear_fwd_ref,
    .linear_bwd = dt_cpu_linear_bwd_ref,
    .bias_fwd = dt_cpu_bias_fwd_ref,
    .bias_bwd = dt_cpu_bias_bwd_ref,
    .dropout_fwd = dt_cpu_dropout_fwd_ref,
    .dropout_bwd = dt_cpu_dropout_bwd_ref,
    .flatten_fwd = dt_cpu_flatten_fwd_ref,
    .flatten_bwd = dt_cpu_flatten_bwd_ref,
    .softmax_xent_fwd = dt_cpu_softmax_xent_fwd_ref,
    .softmax_xent_bwd = dt_cpu_softmax_xent_bwd_ref,
    .sgd_update = dt_cpu_sgd_update_ref,
    .adamw_update = dt_cpu_adamw_update_ref,
    .sumsq = dt_cpu_sumsq_ref,
    .step_gate = dt_cpu_step_gate_ref,
    .scale = dt_cpu_scale_ref,
    .fill = dt_cpu_fill_ref,
    .all_finite = dt_cpu_all_finite_ref,
    .to_bf16 = dt_cpu_to_bf16,
    .from_bf16 = dt_cpu_from_bf16,
    .channel_bias_fwd = dt_cpu_channel_bias_fwd_ref,
    .channel_bias_bwd = dt_cpu_channel_bias_bwd_ref,
    .add = dt_cpu_add_ref,
    .accumulate = dt_cpu_accumulate_ref,
    .mul = dt_cpu_mul_ref,
    .conv2d_workspace = dt_cpu_conv2d_workspace_ref,
    .conv2d_fwd = dt_cpu_conv2d_fwd_ref,
    .conv2d_bwd_data = dt_cpu_conv2d_bwd_data_ref,
    .conv2d_bwd_filter = dt_cpu_conv2d_bwd_filter_ref,
    .maxpool2d_fwd = dt_cpu_maxpool2d_fwd_ref,
    .maxpool2d_bwd = dt_cpu_maxpool2d_bwd_ref,
    .avgpool2d_fwd = dt_cpu_avgpool2d_fwd_ref,
    .avgpool2d_bwd = dt_cpu_avgpool2d_bwd_ref,
    .batchnorm_stats = dt_cpu_batchnorm_stats_ref,
    .batchnorm_fwd = dt_cpu_batchnorm_fwd_ref,
    .batchnorm_infer = dt_cpu_batchnorm_infer_ref,
    .batchnorm_bwd_reduce = dt_cpu_batchnorm_bwd_reduce_ref,
    .batchnorm_bwd = dt_cpu_batchnorm_bwd_ref,
    .layernorm_fwd = dt_cpu_layernorm_fwd_ref,
    .layernorm_bwd = dt_cpu_layernorm_bwd_ref,
    .rmsnorm_fwd = dt_cpu_rmsnorm_fwd_ref,
    .rmsnorm_bwd = dt_cpu_rmsnorm_bwd_ref,
    .embedding_fwd = dt_cpu_embedding_fwd_ref,
    .embedding_bwd = dt_cpu_embedding_bwd_ref,
    .attention_workspace = dt_cpu_attention_workspace,
    .attention_fwd = dt_cpu_attention_fwd_ref,
    .attention_bwd = dt_cpu_attention_bwd_ref,
    .attention_decode = dt_cpu_attention_decode,
    /* clang-format off */
    DT_UNARY_LIST(CPU_UNARY_REF_OPS, _)
    /* clang-format on */
};

/* softmax-xent backward and RMS norm have no faster version than the
 * reference (see softmax_xent.c, norm.c). */
static const struct dt_ops cpu_ops_fast = {
    .linear_fwd = dt_cpu_linear_fwd,
    .linear_bwd = dt_cpu_linear_bwd,
    .bias_fwd = dt_cpu_bias_fwd,
    .bias_bwd = dt_cpu_bias_bwd,
    .dropout_fwd = dt_cpu_dropout_fwd,
    .dropout_bwd = dt_cpu_dropout_bwd,
    .flatten_fwd = dt_cpu_flatten_fwd,
    .flatten_bwd = dt_cpu_flatten_bwd,
    .softmax_xent_fwd = dt_cpu_softmax_xent_fwd,
    .softmax_xent_bwd = dt_cpu_softmax_xent_bwd,
    .sgd_update = dt_cpu_sgd_update,
    .adamw_update = dt_cpu_adamw_update,
    .sumsq = dt_cpu_sumsq,
    .step_gate = dt_cpu_step_gate,
    .scale = dt_cpu_scale,
    .fill = dt_cpu_fill,
    .all_finite = dt_cpu_all_finite,
    .to_bf16 = dt_cpu_to_bf16,
    .from_bf16 = dt_cpu_from_bf16,
    .channel_bias_fwd = dt_cpu_channel_bias_fwd,
    .channel_bias_bwd = dt_cpu_channel_bias_bwd,
    .add = dt_cpu_add,
    .accumulate = dt_cpu_accumulate,
    .mul = dt_cpu_mul,
    .conv2d_workspace = dt_cpu_conv2d_workspace,
    .conv2d_fwd = dt_cpu_conv2d_fwd,
    .conv2d_bwd_data = dt_cpu_conv2d_bwd_data,
    .conv2d_bwd_filter = dt_cpu_conv2d_bwd_filter,
    .maxpool2d_fwd = dt_cpu_maxpool2d_fwd,
    .maxpool2d_bwd = dt_cpu_maxpool2d_bwd,
    .avgpool2d_fwd = dt_cpu_avgpool2d_fwd,
    .avgpool2d_bwd = dt_cpu_avgpool2d_bwd,
    .batchnorm_stats = dt_cpu_batchnorm_stats,
    .batchnorm_fwd = dt_cpu_batchnorm_fwd,
    .batchnorm_infer = dt_cpu_batchnorm_infer,
    .batchnorm_bwd_reduce = dt_cpu_batchnorm_bwd_reduce,
    .batchnorm_bwd = dt_cpu_batchnorm_bwd,
    .layernorm_fwd = dt_cpu_layernorm_fwd,
    .layernorm_bwd = dt_cpu_layernorm_bwd,
    .rmsnorm_fwd = dt_cpu_rmsnorm_fwd,
    .rmsnorm_bwd = dt_cpu_rmsnorm_bwd,
    .embedding_fwd = dt_cpu_embedding_fwd,
    .embedding_bwd = dt_cpu_embedding_bwd,
    .attention_workspace = dt_cpu_attention_workspace,
    .attention_fwd = dt_cpu_attention_fwd,
    .attention_bwd = dt_cpu_attention_bwd,
    .attention_decode = dt_cpu_attention_decode,
    /* clang-format off */
    DT_UNARY_LIST(CPU_UNARY_FAST_OPS, _)
    /* clang-format on */
};

/* Zero bytes still get a real (one-line) allocation, so a valid buffer is
 * never NULL. */
static dt_status cpu_alloc(dt_backend_t *be, size_t bytes, void **out)
{
    if (!out)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu alloc: out must not be NULL");
    *out = NULL;
    if (bytes > SIZE_MAX - (CPU_ALIGN - 1))
        return dt_set_error(DT_ERR_NOMEM, "cpu alloc: %zu bytes is more than memory can hold",
                            bytes);
    size_t padded = bytes == 0 ? CPU_ALIGN : (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    void *p = NULL;
    if (posix_memalign(&p, CPU_ALIGN, padded) != 0)
        return dt_set_error(DT_ERR_NOMEM,
                            "cpu alloc: out of host memory allocating %zu bytes (use a smaller "
                            "batch or model)",
                            bytes);
    memset(p, 0, padded);
    *out = p;
    return DT_OK;
}

const struct dt_ops *dt_backend_host_ops(void) { return &cpu_ops_fast; }

static void cpu_free(dt_backend_t *be, void *ptr) { free(ptr); }

static dt_status cpu_copy(dt_backend_t *be, void *dst, const void *src, size_t bytes,
                          enum dt_copy_kind kind)
{
    if (bytes == 0)
        return DT_OK;
    if (!dst || !src)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu copy: NULL %s for %zu bytes",
                            dst ? "source" : "destination", bytes);
    if (dst != src)
        memcpy(dst, src, bytes);
    return DT_OK;
}

static dt_status cpu_sync(dt_backend_t *be) { return DT_OK; }

static void cpu_destroy(dt_backend_t *be)
{
    struct cpu_backend *cb = be->impl;
    for (int k = 0; k < DT_CPU_OPERANDS; k++)
        free(cb->operand[k]);
    for (int k = 0; k < DT_CPU_MAX_SCRATCH; k++)
        free(cb->scratch[k]);
    for (int k = 0; k < DT_CPU_MASKS; k++)
        free(cb->masks[k].bytes);
    dt_threads_destroy(cb->pool);
    free(cb);
}

int dt_cpu_gate_skips(const dt_backend_t *be)
{
    const struct cpu_backend *cb = be ? be->impl : NULL;
    return cb && cb->gate_skip;
}

void dt_cpu_set_gate(dt_backend_t *be, int skip)
{
    struct cpu_backend *cb = be ? be->impl : NULL;
    if (cb) cb->gate_skip = skip;
}

int dt_cpu_tiny_tasks(const dt_backend_t *be)
{
    const struct cpu_backend *cb = be ? be->impl : NULL;
    return cb && cb->tiny;
}

int dt_cpu_threads(const dt_backend_t *be)
{
    const struct cpu_backend *cb = be ? be->impl : NULL;
    return cb ? dt_threads_count(cb->pool) : 1;
}

size_t dt_cpu_channel_grain(const dt_backend_t *be, int N, int C, int HW)
{
    size_t grain = 1 + DT_CPU_GRAIN / ((size_t)N * HW + 1);
    size_t tasks = 2 * (size_t)dt_cpu_threads(be);
    size_t share = ((size_t)C + tasks - 1) / tasks;
    return grain > share ? grain : share;
}

dt_status dt_cpu_scratch_reserve(dt_backend_t *be, size_t bytes)
{
    struct cpu_backend *cb = be ? be->impl : NULL;
    if (!cb)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu scratch: no backend");
    if (cb->scratch_cap >= bytes)
        return DT_OK;
    bytes = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    int n = dt_threads_count(cb->pool);
    for (int k = 0; k < n; k++) {
        void *q = NULL;
        if (posix_memalign(&q, CPU_ALIGN, bytes) != 0)
            return dt_set_error(DT_ERR_NOMEM,
                                "cpu scratch: out of host memory for %zu bytes per thread", bytes);
        free(cb->scratch[k]);
        cb->scratch[k] = q;
    }
    cb->scratch_cap = bytes;
    return DT_OK;
}

static int mask_is(const struct cpu_mask *m, const struct dt_rng_key *key, uint64_t row0,
                   int rows, int cols, float p)
{
    return m->used && m->key.seed == key->seed && m->key.purpose == key->purpose &&
           m->key.stream == key->stream && m->key.step == key->step && m->row0 == row0 &&
           m->rows == rows && m->cols == cols && m->p == p;
}

uint8_t *dt_cpu_mask_store(dt_backend_t *be, const struct dt_rng_key *key, uint64_t row0, int rows,
                           int cols, float p)
{
    struct cpu_backend *cb = be ? be->impl : NULL;
    size_t bytes = (size_t)rows * (size_t)cols;
    if (!cb || !key || rows <= 0 || cols <= 0 || bytes > DT_CPU_MASK_MAX)
        return NULL;
    struct cpu_mask *m = &cb->masks[0];
    for (int k = 0; k < DT_CPU_MASKS; k++) {
        struct cpu_mask *c = &cb->masks[k];
        if (mask_is(c, key, row0, rows, cols, p)) {
            m = c;
            break;
        }
        if (c->used < m->used)
            m = c;
    }
    m->used = 0;
    if (m->cap < bytes) {
        uint8_t *q = realloc(m->bytes, bytes);
        if (!q)
            return NULL;
        m->bytes = q;
        m->cap = bytes;
    }
    m->key = *key;
    m->row0 = row0;
    m->rows = rows;
    m->cols = cols;
    m->p = p;
    m->used = ++cb->mask_clock;
    return m->bytes;
}

const uint8_t *dt_cpu_mask_find(dt_backend_t *be, const struct dt_rng_key *key, uint64_t row0,
                                int rows, int cols, float p)
{
    struct cpu_backend *cb = be ? be->impl : NULL;
    if (!cb || !key)
        return NULL;
    for (int k = 0; k < DT_CPU_MASKS; k++) {
        struct cpu_mask *m = &cb->masks[k];
        if (mask_is(m, key, row0, rows, cols, p)) {
            m->used = ++cb->mask_clock;
            return m->bytes;
        }
    }
    return NULL;
}

void *dt_cpu_scratch(dt_backend_t *be, int thread)
{
    struct cpu_backend *cb = be->impl;
    return cb->scratch[thread];
}

struct for_job {
    size_t n, grain;
    dt_cpu_range_fn fn;
    void *arg;
};

static void for_task(void *a, int task, int thread)
{
    const struct for_job *j = a;
    size_t lo = (size_t)task * j->grain, hi = lo + j->grain < j->n ? lo + j->grain : j->n;
    j->fn(j->arg, lo, hi);
}

void dt_cpu_for(dt_backend_t *be, size_t n, size_t grain, dt_cpu_range_fn fn, void *arg)
{
    struct cpu_backend *cb = be ? be->impl : NULL;
    if (grain < 1)
        grain = 1;
    if (cb && cb->tiny) /* element blocks stay whole vectors: multiples of 16 */
        grain = grain % DT_CPU_LANES == 0 ? DT_CPU_LANES : 1;
    if (!cb || !cb->pool || n <= grain) {
        if (n)
            fn(arg, 0, n);
        return;
    }
    size_t tasks = (n + grain - 1) / grain;
    if (tasks > (size_t)1 << 30) { /* keeps the count an int: larger blocks */
        grain = (n + ((size_t)1 << 30) - 1) >> 30;
        tasks = (n + grain - 1) / grain;
    }
    struct for_job j = {.n = n, .grain = grain, .fn = fn, .arg = arg};
    dt_threads_run(cb->pool, (int)tasks, for_task, &j);
}

void dt_cpu_run(dt_backend_t *be, int tasks, dt_task_fn fn, void *arg)
{
    struct cpu_backend *cb = be ? be->impl : NULL;
    dt_threads_run(cb ? cb->pool : NULL, tasks, fn, arg);
}

dt_status dt_cpu_operand(dt_backend_t *be, int slot, const float *x, size_t n, const float **out)
{
    struct cpu_backend *cb = be ? be->impl : NULL;
    *out = x;
    if (!cb || cb->precision == DT_F32 || n == 0)
        return DT_OK;
    DT_ASSERT(slot >= 0 && slot < DT_CPU_OPERANDS);
    if (cb->operand_cap[slot] < n) {
        float *p = realloc(cb->operand[slot], n * sizeof *p);
        if (!p)
            return dt_set_error(DT_ERR_NOMEM, "cpu GEMM operands: out of host memory for a %s copy of "
                                              "%zu operands",
                                dt_precision_name(cb->precision), n);
        cb->operand[slot] = p;
        cb->operand_cap[slot] = n;
    }
    float *r = cb->operand[slot];
    if (cb->precision == DT_BF16)
        for (size_t i = 0; i < n; i++)
            r[i] = dt_cpu_round_bf16(x[i]);
    else
        for (size_t i = 0; i < n; i++)
            r[i] = dt_cpu_round_fp16(x[i]);
    *out = r;
    return DT_OK;
}

/* Host memory, no stream; bf16 and fp16 round fp32 matmul inputs (slower
 * than fp32), and the reference table has every op. */
const struct dt_backend_caps dt_cpu_backend_caps = {
    .device_memory = 0,
    .has_stream = 0,
    .per_device = 0,
    .precisions = DT_PRECISION_BIT(DT_F32) | DT_PRECISION_BIT(DT_BF16) | DT_PRECISION_BIT(DT_F16),
    .native_precisions = DT_PRECISION_BIT(DT_F32),
    .missing_op_hint = "",
};

dt_status dt_cpu_backend_create(const struct dt_backend_opts *opts, dt_backend_t **out)
{
    if (!out)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu backend: out must not be NULL");
    *out = NULL;
    struct dt_backend_opts o = opts ? *opts : (struct dt_backend_opts){.threads = 1};
    if (o.threads < 1)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "cpu backend: threads must be >= 1 (got %d; set runtime.threads)",
                            o.threads);
    if (o.precision != DT_F32 && o.precision != DT_BF16 &&
        o.precision != DT_F16)
        return dt_set_error(DT_ERR_INVALID_ARG, "cpu backend: unknown precision %d",
                            (int)o.precision);
    struct cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb)
        return dt_set_error(DT_ERR_NOMEM, "cpu backend: out of memory");
    cb->threads = o.threads < DT_CPU_MAX_SCRATCH ? o.threads : DT_CPU_MAX_SCRATCH;
    cb->precision = o.precision;
    cb->tiny = o.tiny_tasks;
    if (cb->threads > 1 && !o.reference_kernels) {
        dt_status st = dt_threads_create(cb->threads, &cb->pool);
        if (st != DT_OK) {
            free(cb);
            return st;
        }
    }
    cb->base = (struct dt_backend){
        .name = "cpu",
        .ops = o.reference_kernels ? &cpu_ops_ref : &cpu_ops_fast,
        .caps = &dt_cpu_backend_caps,
        .alloc = cpu_alloc,
        .free = cpu_free,
        .copy = cpu_copy,
        .sync = cpu_sync,
        .destroy = cpu_destroy,
        .impl = cb,
        .device = "cpu",
    };
#ifdef OPENBLAS_VERSION
    openblas_set_num_threads(1);
#endif
    *out = &cb->base;
    return DT_OK;
}
