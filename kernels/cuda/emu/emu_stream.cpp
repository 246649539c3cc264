/*
 * emu_stream.cpp - streams and events of the host emulation
 * (-DDTRAIN_CUDA=EMU): when the work queued on a stream runs, relative to
 * the host and to the other streams.
 *
 * DTRAIN_CUDA_EMU_STREAMS picks how streams run:
 *   sync      (the default) every call completes before it returns;
 *   deferred  work queued on a stream runs only when something waits for
 *             it: the host (cudaStreamSynchronize, cudaEventSynchronize, a
 *             second cudaEventQuery of the same record, a synchronous call
 *             such as cudaMemcpy or cudaFree, a download into pageable
 *             memory) or another stream (cudaStreamWaitEvent), and then
 *             only up to the point waited for;
 *   split     the first stream created while no other exists is deferred,
 *             the streams created beside it run each call at once.
 * Deferred work runs as late as CUDA allows, so a host read or a kernel
 * that is not ordered after the work that writes its input sees stale
 * bytes, and a host write into pinned memory that a queued copy has not
 * read yet changes what the copy brings. Split runs a side stream (a copy
 * stream) as early as CUDA allows against a late main stream, so a write
 * on the side stream that is not ordered after the main stream's reads of
 * the same buffer lands before them. Either way the result differs from
 * the correct order's, and the tests that compare results fail.
 *
 * Positions: a stream counts the operations queued on it and those run; an
 * event records a stream and a count; waiting for an event runs that
 * stream up to the count. A wait that needs work the waiting stream has
 * not reached itself (a cycle, which hangs a GPU) is reported and faults
 * the context. cudaEventQuery of work not yet run answers cudaErrorNotReady
 * once per record, then runs the work (the device has moved on), so a
 * caller that polls sees both answers. Everything runs under the
 * emulation's one lock, on whichever host thread waits.
 */
#include <stdint.h>
#include <stdio.h>
#define DBG(...) do { if (getenv("EMU_DBG")) fprintf(stderr, __VA_ARGS__); } while (0)
#include <stdlib.h>
#include <string.h>

#include <deque>
#include <functional>
#include <map>
#include <mutex>

#include <cuda_runtime.h>

#include "emu_impl.h"

struct dt_emu_stream {
    uint64_t id;
    int priority;
    bool deferred;
    std::deque<std::function<void()>> work;
    uint64_t queued = 0, done = 0; /* operations queued in all, and run */
    bool running = false;
};

struct dt_emu_event {
    uint64_t stream = 0; /* the stream of the last record (an id; 0: none) */
    uint64_t pos = 0;    /* its operations before the record */
    uint64_t asked = 0;  /* 1 + the position a query found not ready */
};

namespace dt_emu
{

namespace
{

enum class stream_mode { sync, deferred, split };

stream_mode mode()
{
    static int m = -1;
    if (m < 0) {
        const char *e = getenv("DTRAIN_CUDA_EMU_STREAMS");
        m = e && strcmp(e, "deferred") == 0 ? (int)stream_mode::deferred
            : e && strcmp(e, "split") == 0  ? (int)stream_mode::split
                                            : (int)stream_mode::sync;
        if (e && *e && strcmp(e, "deferred") != 0 && strcmp(e, "split") != 0 &&
            strcmp(e, "sync") != 0)
            report("DTRAIN_CUDA_EMU_STREAMS=%s: expected sync, deferred or split; using sync", e);
    }
    return (stream_mode)m;
}

struct registry {
    std::map<uint64_t, dt_emu_stream *> live; /* by id */
    uint64_t next_id = 1;
};

registry &reg()
{
    static registry r;
    return r;
}

dt_emu_stream *find(uint64_t id)
{
    auto it = reg().live.find(id);
    return it == reg().live.end() ? nullptr : it->second;
}

/* Runs stream s's work up to position upto. */
void drain(dt_emu_stream *s, uint64_t upto)
{
    while (s && s->done < upto) {
        if (s->running) {
            report("a stream waits for work queued after the wait itself (on its own stream or "
                   "through another): on a GPU the streams would wait for each other forever");
            set_error(cudaErrorLaunchFailure, true);
            return;
        }
        DBG("run s%llu #%llu\n", (unsigned long long)s->id, (unsigned long long)s->done + 1);
        std::function<void()> op = std::move(s->work.front());
        s->work.pop_front();
        s->running = true;
        op();
        s->running = false;
        s->done++;
    }
}

cudaError_t fail(cudaError_t err)
{
    set_error(err, false);
    return err;
}

} // namespace

void enqueue(cudaStream_t stream, std::function<void()> op)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    if (!stream) { /* the legacy default stream waits for every other */
        drain_all();
        op();
        return;
    }
    stream->queued++;
    DBG("enqueue s%llu #%llu deferred=%d\n", (unsigned long long)stream->id, (unsigned long long)stream->queued, stream->deferred);
    stream->work.push_back(std::move(op));
    if (!stream->deferred) drain(stream, stream->queued);
}

void drain_all()
{
    std::lock_guard<std::recursive_mutex> g(lock());
    for (auto &kv : reg().live)
        drain(kv.second, kv.second->queued);
}

void drain_stream(cudaStream_t stream)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    if (!stream)
        drain_all();
    else
        drain(stream, stream->queued);
}

} // namespace dt_emu

using namespace dt_emu;

extern "C" {

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned int flags, int priority)
{
    (void)flags;
    if (!stream) return fail(cudaErrorInvalidValue);
    if (!enabled()) return fail(cudaErrorNoDevice);
    std::lock_guard<std::recursive_mutex> g(lock());
    registry &r = reg();
    const stream_mode m = mode();
    dt_emu_stream *s = new dt_emu_stream;
    s->id = r.next_id++;
    s->priority = priority;
    s->deferred = m == stream_mode::deferred || (m == stream_mode::split && r.live.empty());
    DBG("create s%llu deferred=%d\n", (unsigned long long)s->id, s->deferred);
    r.live[s->id] = s;
    *stream = s;
    return sticky_error();
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    return cudaStreamCreateWithPriority(stream, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t *stream)
{
    return cudaStreamCreateWithPriority(stream, 0, 0);
}

/* Work still queued completes first, as on a GPU. */
cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    if (!stream) return fail(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> g(lock());
    drain(stream, stream->queued);
    reg().live.erase(stream->id);
    delete stream;
    return sticky_error();
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    drain_stream(stream);
    return sticky_error();
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    if (sticky_error()) return sticky_error();
    if (!stream || stream->done == stream->queued) return cudaSuccess;
    drain(stream, stream->queued);
    return cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    (void)flags;
    if (!event) return fail(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> g(lock());
    if (!event->stream) return sticky_error(); /* never recorded: nothing to wait for */
    const uint64_t id = event->stream, pos = event->pos;
    DBG("s%llu waits %p (s%llu at %llu)\n", (unsigned long long)stream->id, (void*)event, (unsigned long long)id, (unsigned long long)pos);
    enqueue(stream, [id, pos]() { drain(find(id), pos); });
    return sticky_error();
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    (void)flags;
    if (!event) return fail(cudaErrorInvalidValue);
    if (!enabled()) return fail(cudaErrorNoDevice);
    *event = new dt_emu_event;
    return sticky_error();
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, 0);
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    delete event;
    return sticky_error();
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    if (!event) return fail(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> g(lock());
    if (!stream) { /* the legacy default stream: everything so far */
        drain_all();
        event->stream = 0;
        return sticky_error();
    }
    event->stream = stream->id;
    event->pos = stream->queued;
    DBG("record %p on s%llu at %llu\n", (void*)event, (unsigned long long)stream->id, (unsigned long long)event->pos);
    event->asked = 0;
    return sticky_error();
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    if (!event) return fail(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> g(lock());
    if (sticky_error()) return sticky_error();
    dt_emu_stream *s = find(event->stream);
    if (!s || s->done >= event->pos) return cudaSuccess;
    if (event->asked != event->pos + 1) {
        event->asked = event->pos + 1;
        return cudaErrorNotReady;
    }
    drain(s, event->pos);
    return sticky_error();
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    if (!event) return fail(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> g(lock());
    DBG("host syncs %p (s%llu at %llu)\n", (void*)event, (unsigned long long)event->stream, (unsigned long long)event->pos);
    drain(find(event->stream), event->pos);
    return sticky_error();
}

/* The emulation keeps no time: every interval is zero. */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    if (!ms || !start || !end) return fail(cudaErrorInvalidValue);
    *ms = 0.0f;
    return sticky_error();
}

cudaError_t cudaDeviceSynchronize(void)
{
    drain_all();
    return sticky_error();
}

} /* extern "C" */
