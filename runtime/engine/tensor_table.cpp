#include "tensor_table.h"

#include "cuda_prim.h"

namespace stash::engine {

const char* to_string(tensor_state s) noexcept {
  switch (s) {
    case tensor_state::absent: return "not offered";
    case tensor_state::on_device: return "ON_DEVICE";
    case tensor_state::offloading: return "OFFLOADING";
    case tensor_state::on_host: return "ON_HOST";
    case tensor_state::prefetching: return "PREFETCHING";
    case tensor_state::ready: return "READY";
    case tensor_state::released: return "RELEASED";
  }
  return "?";
}

event_pool::~event_pool() {
  for (cudaEvent_t ev : all_) prim::event_destroy(ev);
}

status event_pool::reserve(std::size_t n) noexcept {
  try {
    all_.reserve(all_.size() + n);
    idle_.reserve(all_.capacity());
  } catch (...) {
    return fail(status::internal, "event_pool: out of host memory");
  }
  while (idle_.size() < n) {
    cudaEvent_t ev = nullptr;
    STASH_CUDA_FAIL(prim::event_create(&ev, timing_));
    all_.push_back(ev);
    idle_.push_back(ev);
  }
  return status::ok;
}

status event_pool::take(cudaEvent_t* out) noexcept {
  if (idle_.empty()) {
    // Past the reservation: grow (heap, rare). Keep idle_'s capacity >= all_'s size so
    // that give() never allocates.
    if (frozen_)
      return fail(status::capture,
                  "the engine's %zu events are all in use and none may be created during "
                  "a graph capture (cudaEventCreate): too many tensors for the events "
                  "reserved at capture begin",
                  all_.size());
    cudaEvent_t ev = nullptr;
    STASH_CUDA_FAIL(prim::event_create(&ev, timing_));
    try {
      all_.push_back(ev);
      if (idle_.capacity() < all_.size()) idle_.reserve(all_.capacity());
    } catch (...) {
      prim::event_destroy(ev);
      return fail(status::internal, "event_pool: out of host memory");
    }
    *out = ev;
    return status::ok;
  }
  *out = idle_.back();
  idle_.pop_back();
  return status::ok;
}

}  // namespace stash::engine
