#include "state.h"

#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "capture.h"
#include "streams.h"

namespace stash::dbl {

namespace {
// Note [Foreign memory as device memory] (memory.h): the opt-in from the environment.
bool foreign_is_device_from_env() {
  const char* v = std::getenv("STASHDBL_FOREIGN_IS_DEVICE");
  return v != nullptr && std::strcmp(v, "1") == 0;
}
}  // namespace

State::State() : foreign_is_device_default(foreign_is_device_from_env()) {
  host_clock.tick(kHostAgent);
  memory.set_foreign_is_device(foreign_is_device_default);
}
State::~State() = default;

State& state() {
  static State* const s = new State;  // Note [Process exit]: never destroyed
  return *s;
}

namespace {

// Set once shutdown starts: entry points check it without taking the lock.
std::atomic<bool> unloading{false};

// Note [Fork]
// A child forked while streams exist (gtest's "fast" death tests) has none of their
// worker threads, and a worker may have held the state mutex at the fork. Joining or
// locking there would hang, so in a forked child shutdown does nothing: exit just ends
// the process. Using the runtime in such a child is unsupported, as with real CUDA.
std::atomic<bool> forked_child{false};
void on_fork_child() { forked_child.store(true); }
[[maybe_unused]] const int fork_hook = pthread_atfork(nullptr, nullptr, on_fork_child);

}  // namespace

void shutdown() {
  if (forked_child.load()) return;
  State& st = state();
  std::vector<std::thread> workers;
  {
    std::lock_guard<std::mutex> lk(st.mu);
    if (st.shutting_down) return;
    st.shutting_down = true;
    unloading.store(true);
    auto take = [&](Stream& s) {
      if (s.worker.joinable()) workers.push_back(std::move(s.worker));
    };
    if (st.legacy) take(*st.legacy);
    for (auto& [h, s] : st.streams) take(*s);
    for (auto& s : st.graveyard) take(*s);
    st.cv.notify_all();
    wake_all_workers(st);
  }
  for (std::thread& t : workers) t.join();
  // Queued ops that never ran still hold blocks; release them so LeakSanitizer sees the
  // mappings go (they are mmaps, but the Block objects are heap).
  std::lock_guard<std::mutex> lk(st.mu);
  if (st.legacy) st.legacy->queue.clear();
  for (auto& [h, s] : st.streams) s->queue.clear();
  for (auto& s : st.graveyard) s->queue.clear();
}

namespace {

// Registered when this library initializes, before the program's own static objects, so
// it is destroyed after them (Note [Process exit]).
struct ExitHook {
  ExitHook() { state(); }
  ~ExitHook() { shutdown(); }
} exit_hook;

// --- fault injection ------------------------------------------------------------------

struct Fault {
  char api[128];
  int remaining;
  cudaError_t error;
};

std::mutex fault_mu;
std::vector<Fault>* faults() {
  static auto* const f = new std::vector<Fault>;  // outlives every static destructor
  return f;
}
std::atomic<bool> any_fault{false};

thread_local cudaError_t last_error = cudaSuccess;

}  // namespace

void arm_fault(const char* api, int nth, cudaError_t error) {
  if (api == nullptr || nth < 1) return;
  Fault f{};
  std::strncpy(f.api, api, sizeof f.api - 1);
  f.remaining = nth;
  f.error = error;
  std::lock_guard<std::mutex> lk(fault_mu);
  faults()->push_back(f);
  any_fault.store(true, std::memory_order_release);
}

void clear_faults() {
  std::lock_guard<std::mutex> lk(fault_mu);
  faults()->clear();
  any_fault.store(false, std::memory_order_release);
}

cudaError_t api_enter(const char* api) {
  if (unloading.load(std::memory_order_acquire)) return fail(cudaErrorCudartUnloading);
  if (!any_fault.load(std::memory_order_acquire)) return cudaSuccess;
  cudaError_t fire = cudaSuccess;
  {
    std::lock_guard<std::mutex> lk(fault_mu);
    auto& fs = *faults();
    // Every armed fault for this name counts the call; the first to reach zero fires.
    for (auto it = fs.begin(); it != fs.end();) {
      if (std::strcmp(it->api, api) == 0 && --it->remaining == 0) {
        if (fire == cudaSuccess) fire = it->error;
        it = fs.erase(it);
      } else {
        ++it;
      }
    }
    if (fs.empty()) any_fault.store(false, std::memory_order_release);
  }
  return fail(fire);
}

cudaError_t fail(cudaError_t err) {
  if (err != cudaSuccess && err != cudaErrorNotReady) last_error = err;
  return err;
}

cudaError_t ret(cudaError_t err) { return fail(err); }

cudaError_t take_last_error() {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

cudaError_t peek_last_error() { return last_error; }

}  // namespace stash::dbl
