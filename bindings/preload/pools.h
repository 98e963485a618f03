// pools.h: the preload library's pools, built on first use, and its counters.
//
// Note [Lazy pools in the preload library]
// Nothing CUDA happens before the first hooked call: a constructor runs before the
// program's main and possibly before the runtime can take calls (and a process that never
// allocates should not pay for a CUDA context). Each device's pool, and the one pinned
// pool, is constructed in static storage on the first allocation that needs it, under a
// mutex; after that the pointer is read lock-free. A pool whose construction failed is
// remembered as failed and its calls pass through from then on. The pools are never
// destroyed: at exit the runtime tears down its own memory, and a cudaFree from a static
// destructor could run after that teardown.
#pragma once

#include <atomic>
#include <cstdint>

#include "device_pool.h"
#include "pinned_pool.h"

namespace stash::preload {

constexpr int kMaxDevices = 64;

// The device pool of `device` (0..kMaxDevices), constructing it if needed; nullptr when
// construction failed or the device number is out of range.
device_pool* device_pool_for(int device) noexcept;
// The constructed device pool that owns p, and its device in *device; nullptr if none.
device_pool* device_pool_owning(const void* p, int* device) noexcept;
// Constructed pools only (nullptr otherwise); for statistics.
device_pool* device_pool_if_built(int device) noexcept;

pinned_pool* pinned_pool_get() noexcept;       // constructs on first use
pinned_pool* pinned_pool_if_built() noexcept;  // nullptr until constructed

// Every figure the report shows besides the pools' own statistics. Relaxed atomics: each
// is an independent tally.
struct counters {
  std::atomic<uint64_t> device_alloc{0}, device_free{0}, device_largest{0};
  std::atomic<uint64_t> device_refused{0};  // over STASH_DEVICE_BUDGET
  std::atomic<uint64_t> device_failed{0};   // other pool failures (CUDA errors, capture)
  std::atomic<uint64_t> device_foreign_free{0};  // pointers stash did not allocate
  std::atomic<uint64_t> device_passthrough_alloc{0};  // size 0, or pool unavailable
  std::atomic<uint64_t> pinned_alloc{0}, pinned_free{0}, pinned_largest{0};
  std::atomic<uint64_t> pinned_passthrough_alloc{0};  // flags, size, cap or pool unavailable
  std::atomic<uint64_t> pinned_foreign_free{0};
};
counters& tally() noexcept;

inline void raise_max(std::atomic<uint64_t>& m, uint64_t v) noexcept {
  uint64_t cur = m.load(std::memory_order_relaxed);
  while (v > cur && !m.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

}  // namespace stash::preload
