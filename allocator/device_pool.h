// device_pool.h: the stream-ordered caching allocator for device memory.
//
// Note [Device pool: cudaMalloc slabs under our own best fit]
// The pool sits on plain cudaMalloc'd slabs carved by the shared block_map, with one free
// list per stream (the block_map tag), PyTorch-CUDACachingAllocator style, rather than on
// cudaMallocAsync and a cudaMemPool. Why: (1) the budget must be exact and the OOM report
// must name the largest free block; a cudaMemPool reserves and trims on its own schedule
// and cannot tell either. (2) It is the same best-fit core as the pinned pool, so one
// conformance suite covers both, and stash's peak-memory model (planner) reasons about
// the same fragmentation behaviour on both sides. (3) It needs only cudaMalloc/cudaFree
// and events, which behave identically on every driver, in the CPU test double and under
// LD_PRELOAD (where cudaMallocAsync may itself be what is interposed). The cost: reuse
// across streams needs events (below), and graph capture needs care (below); both are
// what cudaMallocAsync would have done for us.
//
// Stream semantics. A block is allocated for a stream S and belongs to S's free list when
// freed: work on S is ordered, so S may reuse it at once. If other streams used the block,
// free() is told so and records an event on each; the block returns to S's free list when
// they complete (Note [Event-guarded reuse] in event_guard.h). A slab belongs to the
// stream that grew it; memory cached for one stream reaches another only through
// release_cached() (cudaFree, which synchronizes the device), done automatically when the
// budget would otherwise be exceeded.
//
// Graph capture: while the allocation stream is capturing, alloc does not query events
// (cudaStreamIsCapturing is checked first) and does not grow (cudaMalloc is not allowed
// in a global-mode capture): it serves from the stream's cached blocks or fails cleanly.
//
// Thread safety: every public method may be called from any thread; one mutex.
#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

#include <cuda_runtime_api.h>

#include "block_map.h"
#include "event_guard.h"
#include "pool_stats.h"
#include "core/error.h"

namespace stash {

struct device_pool_config {
  int device = -1;                          // -1: the current device
  size_t budget_bytes = 0;                  // cap on reserved bytes; 0: no budget
  size_t slab_bytes = size_t{32} << 20;     // smallest slab added by growth (Note below)
  size_t alignment = 512;                   // power of two, at least 256
};

class device_pool {
 public:
  // Throws stash::error (invalid_argument) for a bad config.
  explicit device_pool(const device_pool_config& config);
  // Frees every slab (cudaFree). Blocks still in use are the caller's bug; their memory
  // goes with the pool.
  ~device_pool();
  device_pool(const device_pool&) = delete;
  device_pool& operator=(const device_pool&) = delete;

  // A block of at least `bytes` (> 0) for use on `stream`, aligned to config().alignment.
  // out_of_memory (with the report in last_error()) when the budget would be exceeded.
  status allocate(size_t bytes, cudaStream_t stream, void** out) noexcept;
  // Frees a block. streams[0..n): streams other than its allocation stream whose enqueued
  // work uses it (like PyTorch's recordStream; at most 16). p == nullptr is a no-op; double free and
  // foreign pointers return unknown_pointer and change nothing.
  status deallocate(void* p, const cudaStream_t* streams, size_t n) noexcept;

  // Gives every entirely free slab back to CUDA (cudaFree synchronizes the device).
  // Returns the bytes released.
  size_t release_cached() noexcept;

  pool_stats stats() noexcept;
  // Cheap reads for sampling on the engine's path (no retiring, no free-list walk). Held:
  // blocks in use plus blocks freed but still awaited by their streams (pending): the
  // memory the pool cannot hand out. held_peak_since_last: the highest held level since the
  // previous call of it (one reader per pool), then a new window starts.
  uint64_t held_bytes() noexcept;
  uint64_t held_peak_since_last() noexcept;
  void reset_peak() noexcept;
  bool owns(const void* p) noexcept;
  // The stream a block in use was allocated for; false if p is not the start of one.
  bool stream_of(const void* p, cudaStream_t* out) noexcept;
  const device_pool_config& config() const noexcept { return config_; }

 private:
  status grow(size_t bytes, cudaStream_t stream) noexcept;  // lock held
  size_t release_cached_locked() noexcept;                  // lock held
  void reap() noexcept;                                      // lock held
  status out_of_memory(size_t requested, const char* why) noexcept;  // lock held

  device_pool_config config_;
  std::mutex mutex_;
  block_map map_;
  event_guard guard_;
};

}  // namespace stash
