/*
 * emu.h - the device side of dtrain's host emulation of the CUDA
 * execution model (-DDTRAIN_CUDA=EMU). The .cu files of kernels/cuda/ are
 * compiled by the host C++ compiler with this header (through the emulation's
 * cuda_runtime.h) and every DT_CUDA_LAUNCH runs the kernel on the CPU:
 *
 *   - Every thread of a block is its own context with its own stack
 *     (a fiber, emu_sched.cpp). __syncthreads waits until every thread of
 *     the block that has not exited has arrived; the warp shuffles and
 *     votes exchange values among the lanes named in the mask, which all
 *     wait for each other. A lane missing from a warp operation, a mask
 *     that differs between the lanes, or threads that wait on each other
 *     forever are reported as errors of the launch.
 *   - Blocks run one after another. Each launch runs twice, under two
 *     schedules (blocks and threads in forward order, then both reversed,
 *     switching threads only at barriers and warp operations), from the
 *     same device memory; when the two leave different bytes in any buffer
 *     the kernel could write, the launch fails and says which kernel,
 *     buffer and offset. A missing barrier or a race through shared or
 *     global memory shows up there (and, usually, as a wrong result).
 *   - __shared__ arrays are static storage of the kernel: filled with 0xff
 *     bytes (NaN) before every block in ordinary builds, so a read before
 *     the block wrote gives NaN; under AddressSanitizer they keep its red
 *     zones instead, so an access past their end is reported.
 *   - Pointer arguments must point into device memory (cudaMalloc) or be
 *     NULL; a host pointer handed to a kernel fails the launch.
 *
 *   - A launch is queued on its stream: by default it runs before the call
 *     returns; DTRAIN_CUDA_EMU_STREAMS=deferred or split runs streams late
 *     (emu_stream.cpp), so work not ordered by events shows.
 *
 * What it does not model: timing, streams running side by side (a stream's
 * work runs on the host thread that waits for it), the memory model beyond barriers, warp
 * divergence costs, cuDNN and NCCL (absent from emulation builds), and the
 * hardware's floating-point details beyond IEEE single precision (the host
 * computes expf, logf and friends with its own libm).
 */
#ifndef DT_CUDA_EMU_H
#define DT_CUDA_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include <cuda_runtime.h>

/* ---- qualifiers ----------------------------------------------------------- */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
/* Shared memory: static storage of the kernel (see the top of the file). */
#if defined(__SANITIZE_ADDRESS__)
#define __shared__ static
#else
#define __shared__ static __attribute__((section("dt_emu_shared")))
#endif

static constexpr int warpSize = 32;

namespace dt_emu
{

/* The running thread's coordinates, set by the scheduler before it runs or
 * resumes a thread. Kernels read them through threadIdx and friends. */
extern uint3 g_thread_idx, g_block_idx;
extern dim3 g_block_dim, g_grid_dim;

/* A launch site: the kernel's name and place, and what the emulation has
 * learnt about it (written by the scheduler). */
struct site {
    const char *kernel;
    const char *file;
    int line;
    unsigned long long launches = 0;
    unsigned long long sync_blocks = 0;  /* blocks that met a barrier or warp operation */
    unsigned long long plain_blocks = 0; /* blocks that did not */
    site *next = nullptr;
    int registered = 0;
};

/* A device buffer a kernel argument points into (emu_runtime.cpp). */
struct arg_ptr {
    const void *p;
    int writable;
};

/* Checks a launch at the call: the context, its shape, its pointer
 * arguments; false (and the launch's error for cudaGetLastError) when it
 * may not run. */
bool admit(site &s, dim3 grid, dim3 block, size_t shared_bytes, const arg_ptr *ptrs, int nptrs);
/* Queues work on a stream (emu_stream.cpp). */
void enqueue(cudaStream_t stream, std::function<void()> op);
/* Runs the launch: fn(ctx) is one thread's body. Returns nothing; errors
 * become the launch's error (cudaGetLastError). */
void run(site &s, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
         void (*fn)(void *), void *ctx, const arg_ptr *ptrs, int nptrs, int opaque_args);

void syncthreads();
/* __syncthreads_count: the barrier, then how many threads passed pred != 0. */
int syncthreads_count(int pred);
void syncwarp(unsigned mask);
/* A warp exchange: mode 0 = __shfl_sync (arg = source lane), 1 = down
 * (arg = delta), 2 = up, 3 = xor (arg = lane mask). */
uint64_t shfl(unsigned mask, uint64_t bits, int mode, int arg, int width);
/* The ballot of pred over the lanes in mask. */
unsigned vote(unsigned mask, int pred);

template <class T> static inline void note_arg(const T &v, arg_ptr *ptrs, int *n, int *opaque)
{
    if constexpr (std::is_pointer<T>::value) {
        ptrs[*n].p = (const void *)v;
        ptrs[*n].writable = !std::is_const<typename std::remove_pointer<T>::type>::value;
        (*n)++;
    } else if constexpr (!std::is_arithmetic<T>::value && !std::is_enum<T>::value) {
        /* a struct by value may hold pointers the emulation cannot see */
        (*opaque)++;
    }
}

/* One launch: the kernel, its arguments converted to the kernel's
 * parameter types once (as a launch copies them), and the pointers among
 * them; every thread calls the kernel with its own copy. */
template <class K, class Tuple> struct launch_job {
    K kernel;
    Tuple args;
    arg_ptr ptrs[std::tuple_size<Tuple>::value + 1];
    int n = 0, opaque = 0;
    launch_job(K k, Tuple &&a) : kernel(k), args(std::move(a))
    {
        std::apply([&](const auto &...e) { (note_arg(e, ptrs, &n, &opaque), ...); }, args);
    }
    static void body(void *ctx)
    {
        launch_job *j = (launch_job *)ctx;
        std::apply(j->kernel, j->args);
    }
};

/* DT_CUDA_LAUNCH's emulation: the launch is checked at the call (its
 * shape, its pointers) and queued on the stream (emu_stream.cpp). */
template <class... P, class... A>
static inline void launch(site &s, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                          void (*kernel)(P...), A &&...a)
{
    using job = launch_job<void (*)(P...), std::tuple<typename std::decay<P>::type...>>;
    using args = std::tuple<typename std::decay<P>::type...>;
    auto j = std::make_shared<job>(kernel, args(std::forward<A>(a)...));
    if (!admit(s, grid, block, shared_bytes, j->ptrs, j->n)) return;
    enqueue(stream, [j, &s, grid, block, shared_bytes, stream]() {
        run(s, grid, block, shared_bytes, stream, &job::body, j.get(), j->ptrs, j->n, j->opaque);
    });
}

} // namespace dt_emu

#define threadIdx (static_cast<const uint3 &>(::dt_emu::g_thread_idx))
#define blockIdx (static_cast<const uint3 &>(::dt_emu::g_block_idx))
#define blockDim (static_cast<const dim3 &>(::dt_emu::g_block_dim))
#define gridDim (static_cast<const dim3 &>(::dt_emu::g_grid_dim))

static inline void __syncthreads(void)
{
    dt_emu::syncthreads();
}
static inline int __syncthreads_count(int pred)
{
    return dt_emu::syncthreads_count(pred);
}
static inline int __syncthreads_or(int pred)
{
    return dt_emu::syncthreads_count(pred) != 0;
}
static inline int __syncthreads_and(int pred)
{
    return dt_emu::syncthreads_count(pred) == (int)(blockDim.x * blockDim.y * blockDim.z);
}
static inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    dt_emu::syncwarp(mask);
}

template <class T> static inline T dt_emu_shfl(unsigned mask, T v, int mode, int arg, int width)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                  "warp shuffles move values of at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    b = dt_emu::shfl(mask, b, mode, arg, width);
    T r;
    memcpy(&r, &b, sizeof r);
    return r;
}
template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    return dt_emu_shfl(mask, v, 0, src, width);
}
template <class T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32)
{
    return dt_emu_shfl(mask, v, 1, (int)d, width);
}
template <class T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32)
{
    return dt_emu_shfl(mask, v, 2, (int)d, width);
}
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32)
{
    return dt_emu_shfl(mask, v, 3, m, width);
}
static inline unsigned __ballot_sync(unsigned mask, int pred)
{
    return dt_emu::vote(mask, pred);
}
static inline int __any_sync(unsigned mask, int pred)
{
    return dt_emu::vote(mask, pred) != 0;
}
/* every lane of the mask has pred: none has !pred */
static inline int __all_sync(unsigned mask, int pred)
{
    return dt_emu::vote(mask, !pred) == 0;
}

/* ---- bit casts and rounded arithmetic ----------------------------------------- */
static inline unsigned __float_as_uint(float x)
{
    unsigned u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static inline float __uint_as_float(unsigned u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
static inline int __float_as_int(float x)
{
    return (int)__float_as_uint(x);
}
static inline float __int_as_float(int i)
{
    return __uint_as_float((unsigned)i);
}
/* The _rn operations are IEEE single precision, which the host's float
 * arithmetic is (emulation sources are built without FMA contraction). */
static inline float __fadd_rn(float a, float b)
{
    return a + b;
}
static inline float __fsub_rn(float a, float b)
{
    return a - b;
}
static inline float __fmul_rn(float a, float b)
{
    return a * b;
}
static inline float __fdiv_rn(float a, float b)
{
    return a / b;
}
static inline float __frcp_rn(float a)
{
    return 1.0f / a;
}
static inline float __fsqrt_rn(float a)
{
    return sqrtf(a);
}
static inline float __fmaf_rn(float a, float b, float c)
{
    return fmaf(a, b, c);
}
static inline float rsqrtf(float a)
{
    return 1.0f / sqrtf(a);
}
#define __expf(a) expf(a)
#define __logf(a) logf(a)
static inline float __fdividef(float a, float b)
{
    return a / b;
}
static inline float __saturatef(float a)
{
    return a < 0.0f ? 0.0f : a > 1.0f ? 1.0f : a;
}
template <class T> static inline T __ldg(const T *p)
{
    return *p;
}

/* CUDA's min and max overloads for device code. */
#define DT_EMU_MINMAX(T)                                                                           \
    static inline T min(T a, T b)                                                                  \
    {                                                                                              \
        return b < a ? b : a;                                                                      \
    }                                                                                              \
    static inline T max(T a, T b)                                                                  \
    {                                                                                              \
        return a < b ? b : a;                                                                      \
    }
DT_EMU_MINMAX(int)
DT_EMU_MINMAX(unsigned)
DT_EMU_MINMAX(long)
DT_EMU_MINMAX(unsigned long)
DT_EMU_MINMAX(long long)
DT_EMU_MINMAX(unsigned long long)
#undef DT_EMU_MINMAX
static inline float min(float a, float b)
{
    return fminf(a, b);
}
static inline float max(float a, float b)
{
    return fmaxf(a, b);
}

/* ---- bf16 and fp16 ------------------------------------------------------------- */
struct __nv_bfloat16 {
    unsigned short __x;
};
struct __half {
    unsigned short __x;
};

/* Round to nearest, ties to even; a NaN becomes the canonical 0x7fff. */
static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    unsigned u = __float_as_uint(f);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.__x = 0x7fff;
        return r;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    r.__x = (unsigned short)(u >> 16);
    return r;
}
static inline float __bfloat162float(__nv_bfloat16 b)
{
    return __uint_as_float((unsigned)b.__x << 16);
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b)
{
    return b.__x;
}
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short x)
{
    __nv_bfloat16 r;
    r.__x = x;
    return r;
}

/* IEEE binary16, round to nearest, ties to even, with subnormals; too
 * large becomes infinity; a NaN becomes the canonical 0x7fff. */
static inline __half __float2half_rn(float f)
{
    const unsigned u = __float_as_uint(f);
    const unsigned sign = (u >> 16) & 0x8000u;
    const unsigned a = u & 0x7fffffffu;
    __half r;
    if (a > 0x7f800000u) {
        r.__x = 0x7fff;
        return r;
    }
    if (a >= 0x477ff000u) { /* rounds to 65520 or more: infinity */
        r.__x = (unsigned short)(sign | 0x7c00u);
        return r;
    }
    if (a < 0x38800000u) { /* below the smallest normal half, 2^-14 */
        /* the value in units of 2^-24, rounded to nearest even */
        const int e = (int)(a >> 23);
        if (e < 102) { /* below 2^-25: zero (exactly half rounds to even, zero) */
            r.__x = (unsigned short)sign;
            return r;
        }
        const unsigned m = (a & 0x7fffffu) | 0x800000u;
        const int shift = 126 - e; /* m * 2^(e-150) / 2^-24 = m >> (126 - e) */
        unsigned q = m >> shift;
        const unsigned rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        r.__x = (unsigned short)(sign | q);
        return r;
    }
    unsigned v = a - 0x38000000u; /* rebias the exponent from 127 to 15 */
    v += 0xfffu + ((v >> 13) & 1u);
    r.__x = (unsigned short)(sign | (v >> 13));
    return r;
}
static inline float __half2float(__half h)
{
    const unsigned sign = ((unsigned)h.__x & 0x8000u) << 16;
    const unsigned e = ((unsigned)h.__x >> 10) & 0x1fu, m = (unsigned)h.__x & 0x3ffu;
    if (e == 0x1f) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    if (e == 0) { /* zero or subnormal: m * 2^-24 exactly */
        const float v = (float)m * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}
static inline unsigned short __half_as_ushort(__half h)
{
    return h.__x;
}
static inline __half __ushort_as_half(unsigned short x)
{
    __half r;
    r.__x = x;
    return r;
}

#endif
