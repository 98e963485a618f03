// streams.h: streams as in-order queues served by worker threads, and events.
//
// Every function here expects state().mu held by the caller (the ones that wait take
// the caller's unique_lock and release it while they wait).
//
// Note [Legacy default stream]
// Stream 0, cudaStreamLegacy and cudaStreamPerThread all name one legacy default stream
// (per-thread default streams are not modelled: treating them as the legacy stream only
// adds ordering, so code that is correct with per-thread streams stays correct). An op
// on it waits for all work already enqueued on every blocking stream, and an op on a
// blocking stream (created without cudaStreamNonBlocking) waits for the legacy stream's
// work, in real time, in virtual time and for the checker alike.
//
// Note [Stream workers]
// Each stream has one worker thread that runs its ops in order. An op waits until the
// ops it depends on (an event's record, implicit legacy dependencies) have completed and
// its stream is not paused, then runs without the lock (copies, host functions), then
// completes under the lock. A completion wakes the host waiters (State::cv) and only the
// workers whose next op depends on something (each stream has its own condition
// variable), so that many ops on few cores do not thrash. Destroying a stream lets its
// worker drain the queue (resuming it if paused: nobody could resume it any more); the
// thread is joined later by reap_streams() or at exit.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "state.h"

namespace stash::dbl {

struct Capture;

struct Completion {
  bool done = false;
};
using CompletionRef = std::shared_ptr<Completion>;

struct Op {
  std::function<void()> run;            // outside the lock, in the worker
  std::function<void(State&)> finish;   // under the lock, when the op completes
  std::vector<CompletionRef> deps;
  CompletionRef done;
  std::vector<BlockRef> keep;  // Note [Deferred release]
};

struct Stream {
  uint64_t id = 0;  // 1: the legacy default stream
  Agent agent = 0;
  unsigned flags = 0;
  int priority = 0;
  bool legacy = false;

  VectorClock clock;      // clock of the last op enqueued (or waited on)
  double last_end = 0.0;  // virtual end of the last op
  CompletionRef last;     // completion of the last op enqueued; null when none

  std::deque<Op> queue;
  std::condition_variable wake;  // the worker's: work queued, a dependency done, resumed
  bool paused = false;
  bool destroyed = false;
  bool exited = false;
  std::thread worker;

  // Note [Capture rules] (capture.h): the capture this stream is a member of, its lane
  // there, the nodes its next node depends on, and what cudaStreamGetCaptureInfo hands
  // out for them (valid until the next call on the stream).
  std::shared_ptr<Capture> capture;
  size_t capture_lane = 0;
  std::vector<size_t> capture_deps;
  std::vector<cudaGraphNode_t> capture_dep_handles;
  std::vector<cudaGraphEdgeData> capture_edges;

  bool blocking() const { return !legacy && (flags & cudaStreamNonBlocking) == 0; }
  cudaStream_t handle() { return legacy ? nullptr : reinterpret_cast<cudaStream_t>(this); }
};

struct Event {
  unsigned flags = 0;
  bool recorded = false;
  VectorClock clock;  // the recording stream's clock at the record
  double end = 0.0;   // virtual completion time of the record
  CompletionRef done;
  // Last recorded in this capture (Note [Capture rules]): the recording stream's
  // dependency set then. The fields above keep the last record outside a capture.
  std::shared_ptr<Capture> capture;
  std::vector<size_t> capture_deps;
  bool timing() const { return (flags & cudaEventDisableTiming) == 0; }
};

// A byte range an op reads or writes, for the checker.
struct Access {
  const void* ptr;
  size_t bytes;
  bool is_write;
};

struct OpSpec {
  const char* api = "";
  std::function<void()> run;
  std::function<void(State&)> finish;
  std::vector<CompletionRef> deps;
  std::vector<BlockRef> keep;
  std::vector<Access> accesses;
  double duration_ms = 0.0;  // compute
  bool is_copy = false;      // H2D/D2H: uses a copy engine
  CopyDir dir = CopyDir::kH2D;
  size_t bytes = 0;
};

struct Enqueued {
  CompletionRef done;
  double end = 0.0;
};

// Resolves a handle (0, cudaStreamLegacy and cudaStreamPerThread: the legacy stream);
// null for a handle that is not a live stream.
Stream* find_stream(State& st, cudaStream_t handle);
Stream* create_stream(State& st, unsigned flags, int priority);
void destroy_stream(State& st, Stream* s);
void reap_streams(State& st);  // joins workers of destroyed streams that have drained
// Wakes every worker (pause state changed, shutdown).
void wake_all_workers(State& st);

Event* find_event(State& st, cudaEvent_t handle);

// Stamps, checks and queues an op (Note [Virtual clock], Note [Happens-before model]).
Enqueued enqueue(State& st, Stream& s, OpSpec spec);

void record_event(State& st, Event& ev, Stream& s);
void wait_event(State& st, Stream& s, const Event& ev);

// Host-side waits. They release the lock while waiting; on return the host has observed
// what it waited for: its clock joined, its virtual time advanced, the pool trimmed.
void wait_done(State& st, std::unique_lock<std::mutex>& lk, const CompletionRef& c);
void host_observe(State& st, const VectorClock& clock, double end);
void sync_stream(State& st, std::unique_lock<std::mutex>& lk, Stream& s);
void sync_event(State& st, std::unique_lock<std::mutex>& lk, const Event& ev);
void sync_device(State& st, std::unique_lock<std::mutex>& lk);

// Queries: true when complete (and then observed like a sync).
bool query_stream(State& st, Stream& s);
bool query_event(State& st, const Event& ev);

// Host access for the checker (annotations, cudaFree, cudaFreeHost).
void host_access(State& st, const void* p, size_t n, bool is_write, const char* api);

}  // namespace stash::dbl
