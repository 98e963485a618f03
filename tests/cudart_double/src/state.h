// state.h: the double's process-wide state, the one mutex that guards it, and the
// helpers every entry point uses (fault injection, the per-thread last error).
//
// Note [One lock]
// All state (streams, events, blocks, clocks, checker) sits behind one mutex and one
// condition variable. Entry points hold it only for bookkeeping; copies and host
// functions run in the stream workers without it. The double serves tests, where
// determinism and obvious correctness beat throughput.
//
// Note [Process exit]
// The State is allocated once and never destroyed (it stays reachable, so LeakSanitizer
// does not report it), because static destructors of the program may still call the
// runtime after ours ran. A static object's destructor in this library (registered when
// the library initializes, so it runs after the program's own static destructors) stops
// and joins every stream worker, dropping work still queued. From then on entry points
// return cudaErrorCudartUnloading, as the real runtime does while it unloads.
#pragma once

#include <condition_variable>
#include <cstring>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cudart_api.h"

#include "checker.h"
#include "link_model.h"
#include "memory.h"
#include "vector_clock.h"

namespace stash::dbl {

struct Stream;
struct Event;
struct Capture;
struct Graph;
struct GraphExec;

struct State {
  std::mutex mu;
  std::condition_variable cv;  // any op completed, stream resumed, or shutdown
  bool shutting_down = false;

  LinkConfig link_cfg;
  LinkModel link;
  double host_now = 0.0;  // the host's virtual time, ms
  VectorClock host_clock;
  Agent next_agent = 1;
  uint64_t next_stream_id = 2;  // 0: host, 1: legacy default stream

  Checker checker;
  MemoryTable memory;
  // STASHDBL_FOREIGN_IS_DEVICE=1 at load; what stashdbl_reset restores.
  const bool foreign_is_device_default;

  std::unique_ptr<Stream> legacy;  // created on first use
  std::unordered_map<const void*, std::unique_ptr<Stream>> streams;
  std::vector<std::unique_ptr<Stream>> graveyard;  // destroyed, worker still draining
  std::unordered_map<const void*, std::unique_ptr<Event>> events;

  // Note [Capture rules] (capture.h): captures under way, graphs, executable graphs.
  std::vector<std::shared_ptr<Capture>> captures;
  uint64_t next_capture_id = 1;
  std::unordered_map<const void*, std::shared_ptr<Graph>> graphs;
  std::unordered_map<const void*, std::unique_ptr<GraphExec>> execs;

  State();  // out of line: Stream and Event are complete only in streams.h
  ~State();
};

// The State; the caller takes state().mu where it touches it.
State& state();

// Stops and joins all workers (Note [Process exit]); idempotent.
void shutdown();

// --- entry-point helpers -------------------------------------------------------------

// Counts a call of `api` for fault injection. Returns the error to fail with (an armed
// fault or cudaErrorCudartUnloading after shutdown), already recorded as the last error,
// or cudaSuccess.
cudaError_t api_enter(const char* api);

// Records `err` as this thread's last error (cudaSuccess and cudaErrorNotReady are not
// recorded, as in CUDA) and returns it.
cudaError_t fail(cudaError_t err);
cudaError_t ret(cudaError_t err);  // same as fail; reads better on mixed paths

cudaError_t take_last_error();  // cudaGetLastError
cudaError_t peek_last_error();  // cudaPeekAtLastError

void arm_fault(const char* api, int nth, cudaError_t error);

// The integer value of an enum argument, read without loading it as the enum type:
// callers may pass values outside the enumerators (an invalid cudaMemcpyKind is a
// documented error, not undefined behaviour), which UBSan's enum check would flag.
template <class E>
int enum_value(const E& e) {
  static_assert(sizeof(E) == sizeof(int), "runtime enums are int-sized");
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}
void clear_faults();

}  // namespace stash::dbl

// Every exported runtime function starts with this: it counts the call under its exact
// name for fault injection and returns an injected error without doing anything.
#define STASHDBL_ENTER(name)                                               \
  do {                                                                     \
    const cudaError_t stashdbl_injected_ = ::stash::dbl::api_enter(name);  \
    if (stashdbl_injected_ != cudaSuccess) return stashdbl_injected_;      \
  } while (0)

// Exported symbols: the version script decides the version node; this makes them visible.
#define STASHDBL_EXPORT extern "C" __attribute__((visibility("default")))
