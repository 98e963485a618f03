// tensor_table.h: the engine's per-tensor records, micro-batch slots, the queue of copies
// in flight and the recycled CUDA events. All storage is sized when a plan is loaded, so
// the submit path (offload) allocates nothing from the heap.
//
// Note [Tensor state machine]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
//   (absent) --offload--> ON_DEVICE   keep / recompute (pass-through), or an offload tensor
//                                     kept because the pinned pool was exhausted or its
//                                     copy failed (then `error` says why)
//   (absent) --offload--> OFFLOADING  D2H enqueued; the device block is the engine's
//   OFFLOADING --copy observed done--> ON_HOST
//   OFFLOADING | ON_HOST --prefetch--> PREFETCHING   H2D enqueued into a consumer block
//   PREFETCHING | ON_DEVICE --acquire--> READY        consumer stream waits on its event
//   any offered state --release--> RELEASED
// OFFLOADING may go straight to PREFETCHING: the H2D waits for the D2H's event on the
// device, so the host never has to observe the copy first. acquire() of a tensor whose
// prefetch was not issued yet (OFFLOADING / ON_HOST) issues it on demand. Everything else
// is an illegal transition: acquire or release before offload, offload twice, release
// twice (stash::engine::illegal_transition), and a key outside the plan (unknown_tensor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "engine_plan.h"
#include "core/error.h"

namespace stash::engine {

struct tensor_key {
  std::uint32_t micro_batch = 0;
  std::uint32_t layer = 0;
  std::uint32_t index = 0;
};

enum class tensor_state : std::uint8_t {
  absent = 255,  // not offered yet this step (not a C API state)
  on_device = 0,
  offloading = 1,
  on_host = 2,
  prefetching = 3,
  ready = 4,
  released = 5,
};
const char* to_string(tensor_state s) noexcept;  // "ON_DEVICE", ...

struct tensor_record {
  tensor_state state = tensor_state::absent;
  bool owns_device = false;   // the engine frees `device` at release (kept offload tensor)
  status error = status::ok;  // a failed copy: acquire reports it
  void* device = nullptr;     // the producer's block while the engine holds it
  void* host = nullptr;       // pinned block
  void* prefetched = nullptr; // block allocated for the consumer stream
  std::size_t bytes = 0;
  cudaStream_t producer = nullptr;
  cudaStream_t consumer = nullptr;
  cudaEvent_t d2h_done = nullptr;  // owned by the in-flight queue entry; null once retired
  cudaEvent_t h2d_done = nullptr;  // owned by the record until release
  char message[224] = "";          // the failure's text (fixed: no heap on the hot path)
};

struct micro_batch_slot {
  std::uint32_t id = 0;
  std::uint32_t generation = 0;
  bool used = false;
  bool backward_started = false;
  bool turn_waited = false;  // the loss turn's wait enqueued (Note [The step's schedule])
  bool finished = false;  // backward_end of layer 0 seen
  std::size_t live = 0;   // offered and not yet released
  std::vector<tensor_record> tensors;    // plan.total()
  std::vector<cudaEvent_t> layer_copies; // per layer: after its latest D2H (or null)
  std::vector<std::uint64_t> layer_copies_seq;  // per layer: the D2H seq that event follows
  std::vector<cudaEvent_t> compute_begin;  // per layer x {fwd, bwd}: timing begin event
  std::vector<char> prefetch_issued;       // per layer
};

// A D2H copy not yet observed complete. Carries what retiring needs even if the slot has
// been recycled meanwhile (generation check).
struct in_flight_copy {
  std::size_t slot = 0;
  std::uint32_t generation = 0;
  std::size_t flat = 0;
  cudaEvent_t done = nullptr;
  // The offloaded block, until handed back (Note [Handing offloaded blocks back]).
  void* device = nullptr;
  std::size_t bytes = 0;
  cudaStream_t producer = nullptr;
  std::uint64_t seq = 0;   // position on the D2H stream (1, 2, ...)
};

// A fixed-capacity FIFO.
class in_flight_queue {
 public:
  void reset(std::size_t capacity) {
    items_.assign(capacity + 1, in_flight_copy{});
    head_ = tail_ = 0;
  }
  bool empty() const noexcept { return head_ == tail_; }
  bool full() const noexcept { return (tail_ + 1) % items_.size() == head_; }
  std::size_t size() const noexcept { return (tail_ + items_.size() - head_) % items_.size(); }
  in_flight_copy& front() noexcept { return items_[head_]; }
  void pop() noexcept { head_ = (head_ + 1) % items_.size(); }
  void push(const in_flight_copy& c) noexcept {
    items_[tail_] = c;
    tail_ = (tail_ + 1) % items_.size();
  }
  // Oldest first; stops when f returns false.
  template <class F>
  void for_each(F&& f) noexcept {
    for (std::size_t i = head_; i != tail_; i = (i + 1) % items_.size())
      if (!f(items_[i])) return;
  }

 private:
  std::vector<in_flight_copy> items_{1};
  std::size_t head_ = 0, tail_ = 0;
};

// Recycled events. Re-recording an event is legal once every wait on it has been
// enqueued (cudaStreamWaitEvent captures the event's state at call time), which is when the
// engine gives one back. Not thread-safe: the engine's mutex covers it.
class event_pool {
 public:
  explicit event_pool(bool timing) : timing_(timing) {}
  ~event_pool();
  event_pool(const event_pool&) = delete;
  event_pool& operator=(const event_pool&) = delete;
  // Creates events until `n` are idle (cold path).
  status reserve(std::size_t n) noexcept;
  // An idle event; creates one only when none is idle.
  status take(cudaEvent_t* out) noexcept;
  void give(cudaEvent_t ev) noexcept {
    if (ev) idle_.push_back(ev);  // capacity reserved: all_ holds every event
  }
  bool timing() const noexcept { return timing_; }
  // Frozen: take never creates an event (graph capture: events are made up front).
  void set_frozen(bool frozen) noexcept { frozen_ = frozen; }
  std::size_t idle() const noexcept { return idle_.size(); }

 private:
  bool timing_;
  bool frozen_ = false;
  std::vector<cudaEvent_t> idle_;
  std::vector<cudaEvent_t> all_;
};

}  // namespace stash::engine
