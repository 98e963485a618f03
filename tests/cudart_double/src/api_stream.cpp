// api_stream.cpp: stream, event and host-function entry points.
// Semantics live in streams.h (capture in capture.h, its entry points in api_graph.cpp);
// this file validates arguments and takes the lock.
#include <algorithm>
#include <mutex>
#include <utility>

#include "capture.h"
#include "streams.h"

namespace stash::dbl {
namespace {

// Priorities as on current NVIDIA parts: 0 is the least, -5 the greatest; out-of-range
// requests are clamped, as CUDA does.
constexpr int kLeastPriority = 0;
constexpr int kGreatestPriority = -5;

cudaError_t create(cudaStream_t* out, unsigned flags, int priority) {
  if (out == nullptr || (flags & ~unsigned{cudaStreamNonBlocking}) != 0) {
    return fail(cudaErrorInvalidValue);
  }
  priority = std::min(kLeastPriority, std::max(kGreatestPriority, priority));
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  *out = create_stream(st, flags, priority)->handle();
  return cudaSuccess;
}

// The legacy stream and the handles that name it report flags 0 and priority 0.
template <class F>
cudaError_t with_stream(cudaStream_t h, F&& f) {
  State& st = state();
  std::unique_lock<std::mutex> lk(st.mu);
  Stream* s = find_stream(st, h);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  return f(st, lk, *s);
}

template <class F>
cudaError_t with_event(cudaEvent_t h, F&& f) {
  State& st = state();
  std::unique_lock<std::mutex> lk(st.mu);
  Event* ev = find_event(st, h);
  if (ev == nullptr) return fail(cudaErrorInvalidResourceHandle);
  return f(st, lk, *ev);
}

using Lock = std::unique_lock<std::mutex>;

cudaError_t event_create(cudaEvent_t* event, unsigned flags) {
  constexpr unsigned kKnown = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (event == nullptr || (flags & ~kKnown) != 0) return fail(cudaErrorInvalidValue);
  // CUDA: an interprocess event must also disable timing.
  if ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming)) {
    return fail(cudaErrorInvalidValue);
  }
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  auto ev = std::make_unique<Event>();
  ev->flags = flags;
  *event = reinterpret_cast<cudaEvent_t>(ev.get());
  st.events.emplace(ev.get(), std::move(ev));
  return cudaSuccess;
}

cudaError_t event_record(cudaEvent_t event, cudaStream_t stream, unsigned flags) {
  if ((flags & ~unsigned{cudaEventRecordExternal}) != 0) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  Stream* s = find_stream(st, stream);
  Event* ev = find_event(st, event);
  if (s == nullptr || ev == nullptr) return fail(cudaErrorInvalidResourceHandle);
  // Note [Capture rules]: external event nodes are not modelled.
  if (flags != 0 && s->capture) return fail(cudaErrorNotSupported);
  return ret(capture_aware_record(st, *ev, *s));
}

}  // namespace
}  // namespace stash::dbl

using namespace stash::dbl;

STASHDBL_EXPORT cudaError_t cudaStreamCreate(cudaStream_t* pStream) {
  STASHDBL_ENTER("cudaStreamCreate");
  return create(pStream, cudaStreamDefault, 0);
}

STASHDBL_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  STASHDBL_ENTER("cudaStreamCreateWithFlags");
  return create(pStream, flags, 0);
}

STASHDBL_EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t* pStream, unsigned int flags,
                                                        int priority) {
  STASHDBL_ENTER("cudaStreamCreateWithPriority");
  return create(pStream, flags, priority);
}

STASHDBL_EXPORT cudaError_t cudaDeviceGetStreamPriorityRange(int* leastPriority,
                                                            int* greatestPriority) {
  STASHDBL_ENTER("cudaDeviceGetStreamPriorityRange");
  if (leastPriority) *leastPriority = kLeastPriority;
  if (greatestPriority) *greatestPriority = kGreatestPriority;
  return cudaSuccess;
}

// Returns at once; queued work still runs (Note [Stream workers]).
STASHDBL_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  STASHDBL_ENTER("cudaStreamDestroy");
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    return fail(cudaErrorInvalidResourceHandle);
  }
  return with_stream(stream, [](State& st, Lock&, Stream& s) {
    leave_capture(st, s);
    destroy_stream(st, &s);
    return cudaSuccess;
  });
}

STASHDBL_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  STASHDBL_ENTER("cudaStreamSynchronize");
  return with_stream(stream, [](State& st, Lock& lk, Stream& s) {
    if (cudaError_t e = refuse_stream_sync(st, s); e != cudaSuccess) return fail(e);
    sync_stream(st, lk, s);
    return cudaSuccess;
  });
}

STASHDBL_EXPORT cudaError_t cudaStreamQuery(cudaStream_t stream) {
  STASHDBL_ENTER("cudaStreamQuery");
  return with_stream(stream, [](State& st, Lock&, Stream& s) {
    if (cudaError_t e = refuse_stream_sync(st, s); e != cudaSuccess) return fail(e);
    return query_stream(st, s) ? cudaSuccess : cudaErrorNotReady;
  });
}

STASHDBL_EXPORT cudaError_t cudaStreamGetFlags(cudaStream_t hStream, unsigned int* flags) {
  STASHDBL_ENTER("cudaStreamGetFlags");
  if (flags == nullptr) return fail(cudaErrorInvalidValue);
  return with_stream(hStream, [flags](State&, Lock&, Stream& s) {
    *flags = s.flags;
    return cudaSuccess;
  });
}

STASHDBL_EXPORT cudaError_t cudaStreamGetPriority(cudaStream_t hStream, int* priority) {
  STASHDBL_ENTER("cudaStreamGetPriority");
  if (priority == nullptr) return fail(cudaErrorInvalidValue);
  return with_stream(hStream, [priority](State&, Lock&, Stream& s) {
    *priority = s.priority;
    return cudaSuccess;
  });
}

STASHDBL_EXPORT cudaError_t cudaStreamGetId(cudaStream_t hStream, unsigned long long* streamId) {
  STASHDBL_ENTER("cudaStreamGetId");
  if (streamId == nullptr) return fail(cudaErrorInvalidValue);
  return with_stream(hStream, [streamId](State&, Lock&, Stream& s) {
    *streamId = s.id;
    return cudaSuccess;
  });
}

STASHDBL_EXPORT cudaError_t cudaStreamGetDevice(cudaStream_t hStream, int* device) {
  STASHDBL_ENTER("cudaStreamGetDevice");
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  return with_stream(hStream, [device](State&, Lock&, Stream&) {
    *device = 0;
    return cudaSuccess;
  });
}

STASHDBL_EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                               unsigned int flags) {
  STASHDBL_ENTER("cudaStreamWaitEvent");
  if ((flags & ~unsigned{cudaEventWaitExternal}) != 0) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  Stream* s = find_stream(st, stream);
  Event* ev = find_event(st, event);
  if (s == nullptr || ev == nullptr) return fail(cudaErrorInvalidResourceHandle);
  // Note [Capture rules]: external event nodes are not modelled.
  if (flags != 0 && (s->capture || in_active_capture(*ev))) return fail(cudaErrorNotSupported);
  return ret(capture_aware_wait(st, *s, *ev));
}

STASHDBL_EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn,
                                              void* userData) {
  STASHDBL_ENTER("cudaLaunchHostFunc");
  if (fn == nullptr) return fail(cudaErrorInvalidValue);
  return with_stream(stream, [fn, userData](State& st, Lock&, Stream& s) {
    bool captured = false;
    if (cudaError_t e = route_op(st, s, &captured); e != cudaSuccess) return fail(e);
    if (captured) {
      Node n;
      n.kind = NodeKind::kHost;
      n.api = "cudaLaunchHostFunc";
      n.fn = fn;
      n.user = userData;
      add_node(st, s, std::move(n));
      return cudaSuccess;
    }
    OpSpec spec;
    spec.api = "cudaLaunchHostFunc";
    spec.run = [fn, userData] { fn(userData); };
    enqueue(st, s, std::move(spec));
    return cudaSuccess;
  });
}

STASHDBL_EXPORT cudaError_t cudaStreamAddCallback(cudaStream_t stream,
                                                 cudaStreamCallback_t callback, void* userData,
                                                 unsigned int flags) {
  STASHDBL_ENTER("cudaStreamAddCallback");
  if (callback == nullptr || flags != 0) return fail(cudaErrorInvalidValue);
  return with_stream(stream, [stream, callback, userData](State& st, Lock&, Stream& s) {
    bool captured = false;
    if (cudaError_t e = route_op(st, s, &captured); e != cudaSuccess) return fail(e);
    if (captured) return fail(cudaErrorNotSupported);  // Note [Capture rules]
    OpSpec spec;
    spec.api = "cudaStreamAddCallback";
    spec.run = [stream, callback, userData] { callback(stream, cudaSuccess, userData); };
    enqueue(st, s, std::move(spec));
    return cudaSuccess;
  });
}

// --- events ----------------------------------------------------------------------------

STASHDBL_EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  STASHDBL_ENTER("cudaEventCreateWithFlags");
  return event_create(event, flags);
}

STASHDBL_EXPORT cudaError_t cudaEventCreate(cudaEvent_t* event) {
  STASHDBL_ENTER("cudaEventCreate");
  return event_create(event, cudaEventDefault);
}

STASHDBL_EXPORT cudaError_t cudaEventDestroy(cudaEvent_t event) {
  STASHDBL_ENTER("cudaEventDestroy");
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  // A pending record keeps its completion alive through the stream's queue.
  if (st.events.erase(event) == 0) return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream,
                                                    unsigned int flags) {
  STASHDBL_ENTER("cudaEventRecordWithFlags");
  return event_record(event, stream, flags);
}

STASHDBL_EXPORT cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  STASHDBL_ENTER("cudaEventRecord");
  return event_record(event, stream, cudaEventRecordDefault);
}

STASHDBL_EXPORT cudaError_t cudaEventQuery(cudaEvent_t event) {
  STASHDBL_ENTER("cudaEventQuery");
  return with_event(event, [](State& st, Lock&, Event& ev) {
    if (in_active_capture(ev)) {  // Note [Capture rules]: the real runtime's answer
      ev.capture->invalidated = true;
      return fail(cudaErrorCapturedEvent);
    }
    if (cudaError_t e = refuse_unsafe(st); e != cudaSuccess) return fail(e);
    return query_event(st, ev) ? cudaSuccess : cudaErrorNotReady;
  });
}

STASHDBL_EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  STASHDBL_ENTER("cudaEventSynchronize");
  return with_event(event, [](State& st, Lock& lk, Event& ev) {
    if (in_active_capture(ev)) {  // Note [Capture rules]: the real runtime's answer
      ev.capture->invalidated = true;
      return fail(cudaErrorCapturedEvent);
    }
    if (cudaError_t e = refuse_unsafe(st); e != cudaSuccess) return fail(e);
    sync_event(st, lk, ev);
    return cudaSuccess;
  });
}

// Reads the virtual clock (Note [Virtual clock]): exact, independent of the machine.
STASHDBL_EXPORT cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  STASHDBL_ENTER("cudaEventElapsedTime");
  if (ms == nullptr) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  Event* a = find_event(st, start);
  Event* b = find_event(st, end);
  if (a == nullptr || b == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (in_active_capture(*a) || in_active_capture(*b)) return fail(cudaErrorCapturedEvent);
  if (!a->timing() || !b->timing()) return fail(cudaErrorInvalidResourceHandle);
  if (!a->recorded || !b->recorded) return fail(cudaErrorInvalidResourceHandle);
  if (!a->done->done || !b->done->done) return fail(cudaErrorNotReady);
  *ms = static_cast<float>(b->end - a->end);
  return cudaSuccess;
}

// --- per-thread default stream variants (Note [Legacy default stream]) -----------------

STASHDBL_EXPORT cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t s) {
  return cudaStreamSynchronize(s);
}
STASHDBL_EXPORT cudaError_t cudaStreamQuery_ptsz(cudaStream_t s) { return cudaStreamQuery(s); }
STASHDBL_EXPORT cudaError_t cudaStreamGetFlags_ptsz(cudaStream_t s, unsigned int* f) {
  return cudaStreamGetFlags(s, f);
}
STASHDBL_EXPORT cudaError_t cudaStreamGetPriority_ptsz(cudaStream_t s, int* p) {
  return cudaStreamGetPriority(s, p);
}
STASHDBL_EXPORT cudaError_t cudaStreamGetId_ptsz(cudaStream_t s, unsigned long long* id) {
  return cudaStreamGetId(s, id);
}
STASHDBL_EXPORT cudaError_t cudaStreamGetDevice_ptsz(cudaStream_t s, int* d) {
  return cudaStreamGetDevice(s, d);
}
STASHDBL_EXPORT cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t s, cudaEvent_t e, unsigned f) {
  return cudaStreamWaitEvent(s, e, f);
}
STASHDBL_EXPORT cudaError_t cudaEventRecord_ptsz(cudaEvent_t e, cudaStream_t s) {
  return cudaEventRecord(e, s);
}
STASHDBL_EXPORT cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t e, cudaStream_t s,
                                                         unsigned f) {
  return cudaEventRecordWithFlags(e, s, f);
}
STASHDBL_EXPORT cudaError_t cudaLaunchHostFunc_ptsz(cudaStream_t s, cudaHostFn_t fn, void* u) {
  return cudaLaunchHostFunc(s, fn, u);
}
STASHDBL_EXPORT cudaError_t cudaStreamAddCallback_ptsz(cudaStream_t s, cudaStreamCallback_t cb,
                                                      void* u, unsigned f) {
  return cudaStreamAddCallback(s, cb, u, f);
}
STASHDBL_EXPORT cudaError_t cudaMallocAsync_ptsz(void** p, size_t n, cudaStream_t s) {
  return cudaMallocAsync(p, n, s);
}
STASHDBL_EXPORT cudaError_t cudaFreeAsync_ptsz(void* p, cudaStream_t s) {
  return cudaFreeAsync(p, s);
}
STASHDBL_EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void** p, size_t n, cudaMemPool_t m,
                                                        cudaStream_t s) {
  return cudaMallocFromPoolAsync(p, n, m, s);
}
