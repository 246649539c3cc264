/*
 * emu_sched.cpp - the host emulation's kernel launches: every thread of a
 * block a fiber of its own, barriers and warp operations that really wait,
 * and each launch run under two schedules whose results are compared (the
 * model is described in emu.h).
 *
 * A block runs on one host thread. Its threads are fibers (their own
 * stacks, switched by a small context switch on x86-64, by swapcontext
 * elsewhere); a thread runs until it reaches a barrier or a warp
 * operation or returns, then the next one in the schedule's order runs. A
 * pass over the block resumes every thread whose barrier has completed, so
 * "forward" runs each phase between barriers in thread order and
 * "reversed" in the opposite order, blocks likewise. A thread that returns
 * without waiting costs two context switches, so element-wise kernels stay
 * cheap; its stack is the next thread's.
 *
 * Before a launch runs, every buffer a kernel could write (the device
 * buffers its non-const pointer arguments point into, or all device memory
 * when an argument is a struct the emulation cannot look into) is copied;
 * after the forward run its bytes are kept, the copy is put back, the
 * reversed run follows, and the two results must agree byte for byte.
 * DTRAIN_CUDA_EMU_SCHEDULES=1 runs the forward schedule only.
 *
 * DTRAIN_CUDA_EMU_REPORT=FILE appends, at exit, one line per launch site:
 * the kernel, its file and line, how many launches and how many blocks ran
 * meeting a barrier or warp operation and without, which is how the test suite lists what the
 * emulation covered.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>
#include <vector>

#include <cuda_runtime.h>

#include "emu_impl.h"

#if defined(__SANITIZE_ADDRESS__)
#define DT_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DT_EMU_ASAN 1
#endif
#endif

#ifdef DT_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#ifndef DT_EMU_ASAN
/* Bounds of the static __shared__ arrays (emu.h puts them in this
 * section); weak, as a program without kernels has none. */
extern "C" char __start_dt_emu_shared[] __attribute__((weak));
extern "C" char __stop_dt_emu_shared[] __attribute__((weak));
#endif

namespace dt_emu
{

uint3 g_thread_idx, g_block_idx;
dim3 g_block_dim, g_grid_dim;

} // namespace dt_emu

#if defined(__x86_64__)
/* dt_emu_switch(save, to): pushes the callee-saved registers, stores the
 * stack pointer in *save, loads `to` and pops the registers saved there. */
extern "C" void dt_emu_switch(void **save, void *to);
__asm__(".text\n"
        ".globl dt_emu_switch\n"
        ".type dt_emu_switch,@function\n"
        "dt_emu_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size dt_emu_switch, .-dt_emu_switch\n"
        ".section .note.GNU-stack,\"\",@progbits\n"
        ".text\n");
#endif

namespace dt_emu
{
namespace
{

constexpr int MAX_THREADS = 1024;
constexpr int WARP = 32;
constexpr size_t MAX_SHARED = 48 * 1024;
#ifdef DT_EMU_ASAN
constexpr size_t STACK_BYTES = (size_t)512 << 10;
#else
constexpr size_t STACK_BYTES = (size_t)128 << 10;
#endif

enum fstate { READY, WAIT_BLOCK, WAIT_WARP, DONE };

/* Where a suspended context resumes. */
struct context {
#if defined(__x86_64__)
    void *sp;
#else
    ucontext_t uc;
#endif
};

struct fiber {
    context ctx;
    char *stack;
    uint3 idx;
    int lin;
    int state;
    unsigned wait_gen;
    int started;
    void *asan_fake;
};

struct warp_t {
    unsigned exists, live, arrived, mask;
    unsigned gen;
    uint64_t slot[WARP];
};

struct exec {
    site *s = nullptr;
    void (*fn)(void *) = nullptr;
    void *ctx = nullptr;
    int live = 0, arrived = 0;
    unsigned gen = 0;
    /* __syncthreads_count: the predicates summed so far, and the total of
     * the last completed barrier (read by every thread before any can
     * reach the next barrier). */
    int count_acc = 0, count_result = 0;
    fiber f[MAX_THREADS];
    warp_t w[MAX_THREADS / WARP];
    fiber *cur = nullptr;
    context sched;
    bool synced = false;
    bool failed = false;
    char why[1024];
    const void *sched_bottom = nullptr;
    size_t sched_size = 0;
    void *sched_fake = nullptr;
};

exec E;
std::vector<char *> stacks;
site *sites = nullptr;

/* ---- context switches ------------------------------------------------------------- */

void asan_start(void **fake, const void *bottom, size_t size)
{
#ifdef DT_EMU_ASAN
    __sanitizer_start_switch_fiber(fake, bottom, size);
#else
    (void)fake;
    (void)bottom;
    (void)size;
#endif
}

void asan_finish(void *fake, const void **bottom, size_t *size)
{
#ifdef DT_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, bottom, size);
#else
    (void)fake;
    (void)bottom;
    (void)size;
#endif
}

/* Saves the running context in `from` and resumes `to`. */
void jump(context &from, context &to)
{
#if defined(__x86_64__)
    dt_emu_switch(&from.sp, to.sp);
#else
    swapcontext(&from.uc, &to.uc);
#endif
}

void thread_exit(fiber *f);

/* Leaves the running fiber for the scheduler; `dying` when it will never
 * be resumed. */
void to_scheduler(fiber *f, bool dying)
{
    asan_start(dying ? nullptr : &f->asan_fake, E.sched_bottom, E.sched_size);
    jump(f->ctx, E.sched);
    asan_finish(f->asan_fake, &E.sched_bottom, &E.sched_size);
}

void fiber_main()
{
    asan_finish(nullptr, &E.sched_bottom, &E.sched_size);
    fiber *f = E.cur;
    E.fn(E.ctx);
    thread_exit(f);
    f->state = DONE;
    to_scheduler(f, true);
    abort(); /* a finished fiber is never resumed */
}

#if !defined(__x86_64__)
void fiber_main_uc()
{
    fiber_main();
}
#endif

char *stack_for(int i)
{
    while ((int)stacks.size() <= i) {
        char *p = (char *)malloc(STACK_BYTES);
        if (!p) {
            report("no host memory for a %zu-byte thread stack", STACK_BYTES);
            abort();
        }
        stacks.push_back(p);
    }
    return stacks[(size_t)i];
}

void resume(fiber *f)
{
    E.cur = f;
    g_thread_idx = f->idx;
    if (!f->started) {
        f->started = 1;
        f->stack = stack_for(f->lin);
#if defined(__x86_64__)
        uintptr_t top = ((uintptr_t)f->stack + STACK_BYTES) & ~(uintptr_t)15;
        void **sp = (void **)top;
        *--sp = nullptr;             /* fiber_main's return address: none */
        *--sp = (void *)&fiber_main; /* where dt_emu_switch returns to */
        for (int r = 0; r < 6; r++)  /* rbp rbx r12 r13 r14 r15 */
            *--sp = nullptr;
        f->ctx.sp = sp;
#else
        getcontext(&f->ctx.uc);
        f->ctx.uc.uc_stack.ss_sp = f->stack;
        f->ctx.uc.uc_stack.ss_size = STACK_BYTES;
        f->ctx.uc.uc_link = nullptr;
        makecontext(&f->ctx.uc, fiber_main_uc, 0);
#endif
    }
    f->state = READY;
    asan_start(&E.sched_fake, f->stack, STACK_BYTES);
    jump(E.sched, f->ctx);
    asan_finish(E.sched_fake, nullptr, nullptr);
}

/* ---- failures ---------------------------------------------------------------------- */

void where(char *buf, size_t len)
{
    const fiber *f = E.cur;
    snprintf(buf, len, "kernel %s (%s:%d), block (%u,%u,%u), thread (%u,%u,%u)", E.s->kernel,
             E.s->file, E.s->line, g_block_idx.x, g_block_idx.y, g_block_idx.z, f ? f->idx.x : 0,
             f ? f->idx.y : 0, f ? f->idx.z : 0);
}

/* The launch fails with `why`; the running fiber is abandoned. */
[[noreturn]] void fail_here(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fail_here(const char *fmt, ...)
{
    char msg[384], at[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    where(at, sizeof at);
    if (!E.failed) {
        snprintf(E.why, sizeof E.why, "%s: %s", at, msg);
        E.failed = true;
    }
    E.cur->state = DONE;
    to_scheduler(E.cur, true);
    abort();
}

void note_sync()
{
    E.synced = true;
}

/* ---- barriers and warps -------------------------------------------------------------- */

void release_block_if_complete()
{
    if (E.arrived > 0 && E.arrived >= E.live) {
        E.arrived = 0;
        E.count_result = E.count_acc;
        E.count_acc = 0;
        E.gen++;
    }
}

void thread_exit(fiber *f)
{
    E.live--;
    warp_t &w = E.w[f->lin / WARP];
    const unsigned bit = 1u << (f->lin % WARP);
    w.live &= ~bit;
    if (w.arrived && (w.mask & bit) && !(w.arrived & bit))
        fail_here("returned while other lanes of its warp wait for it in a warp operation "
                  "(mask 0x%08x)",
                  w.mask);
    release_block_if_complete();
}

void warp_arrive(warp_t &w, unsigned mask, unsigned bit)
{
    fiber *f = E.cur;
    if (!(mask & bit))
        fail_here("calls a warp operation with mask 0x%08x, which leaves out its own lane %d", mask,
                  f->lin % WARP);
    if (w.arrived == 0)
        w.mask = mask;
    else if (w.mask != mask)
        fail_here("lanes of one warp pass different masks to a warp operation (0x%08x, 0x%08x)",
                  w.mask, mask);
    const unsigned need = mask & w.exists;
    if (need & ~w.live)
        fail_here("warp operation with mask 0x%08x names lanes that have returned", mask);
    w.arrived |= bit;
    f->wait_gen = w.gen;
    if ((w.arrived & need) == need) {
        w.arrived = 0;
        w.gen++;
    }
    f->state = WAIT_WARP;
    to_scheduler(f, false);
}

} // namespace

int syncthreads_count(int pred)
{
    note_sync();
    fiber *f = E.cur;
    f->wait_gen = E.gen;
    E.arrived++;
    E.count_acc += pred != 0;
    release_block_if_complete();
    f->state = WAIT_BLOCK;
    to_scheduler(f, false);
    return E.count_result;
}

void syncthreads()
{
    (void)syncthreads_count(0);
}

void syncwarp(unsigned mask)
{
    note_sync();
    fiber *f = E.cur;
    warp_arrive(E.w[f->lin / WARP], mask, 1u << (f->lin % WARP));
}

uint64_t shfl(unsigned mask, uint64_t bits, int mode, int arg, int width)
{
    note_sync();
    fiber *f = E.cur;
    const int lane = f->lin % WARP;
    warp_t &w = E.w[f->lin / WARP];
    const unsigned bit = 1u << lane;
    if (width < 1 || width > WARP || (width & (width - 1)))
        fail_here("warp shuffle width %d is not a power of two up to 32", width);
    w.slot[lane] = bits;
    warp_arrive(w, mask, bit);
    const int seg = lane & ~(width - 1), pos = lane - seg;
    int src = lane;
    switch (mode) {
    case 0:
        src = seg + (arg & (width - 1));
        break;
    case 1:
        src = pos + arg < width ? lane + arg : lane;
        break;
    case 2:
        src = pos - arg >= 0 ? lane - arg : lane;
        break;
    default: {
        const int x = lane ^ arg;
        src = x >= seg && x < seg + width ? x : lane;
        break;
    }
    }
    if (!((mask & w.exists) >> src & 1u))
        fail_here("warp shuffle reads lane %d, which is not in the mask 0x%08x", src, mask);
    const uint64_t v = w.slot[src];
    warp_arrive(w, mask, bit); /* nobody overwrites a slot before every lane has read */
    return v;
}

unsigned vote(unsigned mask, int pred)
{
    note_sync();
    fiber *f = E.cur;
    warp_t &w = E.w[f->lin / WARP];
    const int lane = f->lin % WARP;
    w.slot[lane] = pred ? 1 : 0;
    warp_arrive(w, mask, 1u << lane);
    unsigned ballot = 0;
    for (int l = 0; l < WARP; l++)
        if ((mask & w.exists) >> l & 1u) ballot |= (unsigned)(w.slot[l] != 0) << l;
    warp_arrive(w, mask, 1u << lane);
    return ballot;
}

namespace
{

void poison_shared()
{
#ifndef DT_EMU_ASAN
    const uintptr_t lo = (uintptr_t)__start_dt_emu_shared, hi = (uintptr_t)__stop_dt_emu_shared;
    if (lo && hi > lo) memset(__start_dt_emu_shared, 0xff, (size_t)(hi - lo));
#endif
}

bool resumable(const fiber &f)
{
    switch (f.state) {
    case READY:
        return true;
    case WAIT_BLOCK:
        return f.wait_gen != E.gen;
    case WAIT_WARP:
        return f.wait_gen != E.w[f.lin / WARP].gen;
    default:
        return false;
    }
}

void run_block(bool reversed)
{
    const dim3 b = g_block_dim;
    const int n = (int)(b.x * b.y * b.z);
    E.live = n;
    E.arrived = 0;
    E.gen = 0;
    E.count_acc = E.count_result = 0;
    E.synced = false;
    for (int k = 0; k < (n + WARP - 1) / WARP; k++) {
        warp_t &w = E.w[k];
        const int lanes = n - k * WARP < WARP ? n - k * WARP : WARP;
        w.exists = w.live = lanes == WARP ? 0xffffffffu : (1u << lanes) - 1u;
        w.arrived = w.mask = 0;
        w.gen = 0;
    }
    for (int i = 0; i < n; i++) {
        fiber &f = E.f[i];
        f.lin = i;
        f.idx.x = (unsigned)i % b.x;
        f.idx.y = ((unsigned)i / b.x) % b.y;
        f.idx.z = (unsigned)i / (b.x * b.y);
        f.state = READY;
        f.started = 0;
        f.asan_fake = nullptr;
    }
    auto at = [&](int k) -> fiber & { return E.f[reversed ? n - 1 - k : k]; };
    for (;;) {
        bool progress = false, all_done = true;
        for (int k = 0; k < n; k++) {
            fiber &f = at(k);
            if (f.state == DONE) continue;
            all_done = false;
            if (!resumable(f)) continue;
            resume(&f);
            progress = true;
            if (E.failed) return;
        }
        if (all_done) {
            if (E.synced)
                E.s->sync_blocks++;
            else
                E.s->plain_blocks++;
            return;
        }
        if (!progress) {
            int at_bar = 0, at_warp = 0;
            for (int i = 0; i < n; i++) {
                at_bar += E.f[i].state == WAIT_BLOCK;
                at_warp += E.f[i].state == WAIT_WARP;
            }
            snprintf(E.why, sizeof E.why,
                     "kernel %s (%s:%d), block (%u,%u,%u): the threads wait for each other "
                     "forever (%d at __syncthreads, %d in warp operations, %d returned)",
                     E.s->kernel, E.s->file, E.s->line, g_block_idx.x, g_block_idx.y, g_block_idx.z,
                     at_bar, at_warp, n - E.live);
            E.failed = true;
            return;
        }
    }
}

void run_grid(bool reversed)
{
    const dim3 g = g_grid_dim;
    const unsigned long long blocks = (unsigned long long)g.x * g.y * g.z;
    poison_shared();
    for (unsigned long long k = 0; k < blocks && !E.failed; k++) {
        const unsigned long long i = reversed ? blocks - 1 - k : k;
        g_block_idx.x = (unsigned)(i % g.x);
        g_block_idx.y = (unsigned)((i / g.x) % g.y);
        g_block_idx.z = (unsigned)(i / ((unsigned long long)g.x * g.y));
        run_block(reversed);
    }
}

void write_report()
{
    const char *path = getenv("DTRAIN_CUDA_EMU_REPORT");
    if (!path || !*path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    for (site *s = sites; s; s = s->next)
        fprintf(f, "%s %s:%d launches=%llu sync_blocks=%llu plain_blocks=%llu\n", s->kernel,
                s->file, s->line, s->launches, s->sync_blocks, s->plain_blocks);
    fclose(f);
}

bool config_ok(const site &s, dim3 grid, dim3 block, size_t shared_bytes)
{
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    const char *bad = nullptr;
    if (threads == 0 || threads > MAX_THREADS || block.x > 1024 || block.y > 1024 || block.z > 64)
        bad = "a block of 1 to 1024 threads (z at most 64)";
    else if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
             grid.z > 65535)
        bad = "a grid of 1 to 2^31-1 blocks in x and 1 to 65535 in y and z";
    else if (shared_bytes > MAX_SHARED)
        bad = "at most 48 KiB of dynamic shared memory";
    if (!bad) return true;
    report("kernel %s (%s:%d): launch of grid (%u,%u,%u), block (%u,%u,%u), %zu shared bytes: "
           "CUDA takes %s",
           s.kernel, s.file, s.line, grid.x, grid.y, grid.z, block.x, block.y, block.z,
           shared_bytes, bad);
    return false;
}

/* The device buffers the launch may write. */
std::vector<region> writable(const arg_ptr *ptrs, int nptrs, int opaque)
{
    if (opaque) return device_regions();
    std::vector<region> out;
    for (int i = 0; i < nptrs; i++) {
        if (!ptrs[i].writable || !ptrs[i].p) continue;
        const region *r = find_device(ptrs[i].p, 0);
        bool seen = false;
        for (const region &o : out)
            seen = seen || o.base == r->base;
        if (!seen) out.push_back(*r);
    }
    return out;
}

void compare(const std::vector<region> &regs, const std::vector<std::vector<char>> &first)
{
    for (size_t i = 0; i < regs.size(); i++) {
        const char *a = first[i].data(), *b = regs[i].base;
        if (memcmp(a, b, regs[i].bytes) == 0) continue;
        size_t off = 0;
        while (a[off] == b[off])
            off++;
        const size_t word = off / 4 * 4;
        float fa = 0, fb = 0;
        if (word + 4 <= regs[i].bytes) {
            memcpy(&fa, a + word, 4);
            memcpy(&fb, b + word, 4);
        }
        snprintf(E.why, sizeof E.why,
                 "kernel %s (%s:%d): the forward and the reversed schedule left different bytes "
                 "in a %zu-byte device buffer, first at byte %zu (as float: %g and %g): the "
                 "result depends on the order of the threads (a race or a missing barrier)",
                 E.s->kernel, E.s->file, E.s->line, regs[i].bytes, off, (double)fa, (double)fb);
        E.failed = true;
        return;
    }
}

} // namespace

bool admit(site &s, dim3 grid, dim3 block, size_t shared_bytes, const arg_ptr *ptrs, int nptrs)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    if (sticky_error()) {
        set_error(sticky_error(), true);
        return false;
    }
    if (!enabled()) {
        set_error(cudaErrorNoDevice, false);
        return false;
    }
    if (!config_ok(s, grid, block, shared_bytes)) {
        set_error(cudaErrorInvalidConfiguration, false);
        return false;
    }
    for (int i = 0; i < nptrs; i++) {
        if (ptrs[i].p && !find_device(ptrs[i].p, 0)) {
            report("kernel %s (%s:%d): pointer argument %p is not in device memory", s.kernel,
                   s.file, s.line, ptrs[i].p);
            set_error(cudaErrorIllegalAddress, true);
            return false;
        }
    }
    return true;
}

void run(site &s, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
         void (*fn)(void *), void *ctx, const arg_ptr *ptrs, int nptrs, int opaque_args)
{
    (void)stream;
    std::lock_guard<std::recursive_mutex> g(lock());
    if (!s.registered) {
        s.registered = 1;
        if (!sites) atexit(write_report);
        s.next = sites;
        sites = &s;
    }
    s.launches++;
    if (!admit(s, grid, block, shared_bytes, ptrs, nptrs)) return;
    E.s = &s;
    E.fn = fn;
    E.ctx = ctx;
    E.failed = false;
    E.cur = nullptr;
    g_grid_dim = grid;
    g_block_dim = block;
    const bool twice = schedules() == 2;
    std::vector<region> regs;
    static std::vector<std::vector<char>> before, first;
    if (twice) {
        regs = writable(ptrs, nptrs, opaque_args);
        before.resize(regs.size());
        first.resize(regs.size());
        for (size_t i = 0; i < regs.size(); i++)
            before[i].assign(regs[i].base, regs[i].base + regs[i].bytes);
    }
    run_grid(false);
    if (twice && !E.failed) {
        for (size_t i = 0; i < regs.size(); i++) {
            first[i].assign(regs[i].base, regs[i].base + regs[i].bytes);
            memcpy(regs[i].base, before[i].data(), regs[i].bytes);
        }
        run_grid(true);
        if (!E.failed) compare(regs, first);
    }
    E.cur = nullptr;
    if (E.failed) {
        report("%s", E.why);
        set_error(cudaErrorLaunchFailure, true);
    }
}

} // namespace dt_emu
