// pinned_pool.h: the pinned (page-locked) host pool that offloaded activations live in.
//
// Slabs of pinned memory (pinned_slab.h) are carved by a block_map (best fit, split,
// coalesce, no power-of-two rounding). Slabs come from an up-front reservation (in the
// background if asked, with progress on stderr) or, when no reservation covers a request,
// from growth by one slab. No slab is larger than slab_bytes, and the pool never pins more
// than cap_bytes in all (default: host_memory.h). Freed blocks are reused only after the
// streams that used them are done (Note [Event-guarded reuse] in event_guard.h).
//
// Thread safety: every public method may be called from any thread concurrently; one
// mutex serializes them. The hot path (allocate when a free block fits, deallocate, stats)
// makes no cudaHostAlloc/cudaHostRegister call, no heap allocation (past the high-water
// mark of blocks), no logging and no throwing; it may query events (cudaEventQuery).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "block_map.h"
#include "event_guard.h"
#include "pinned_slab.h"
#include "pool_stats.h"
#include "core/error.h"

namespace stash {

// What allocate does when the cap is reached and nothing free fits.
enum class exhaustion_policy : int {
  fail = 0,  // return out_of_memory with the pool's statistics in the message
  wait = 1,  // wait for pending (event-guarded) blocks, up to wait_timeout_ms; then timeout
};

struct pinned_pool_config {
  int device = -1;                          // GPU the memory feeds (NUMA node); -1: current
  size_t cap_bytes = 0;                     // 0: 0.8 × really available ÷ LOCAL_WORLD_SIZE
  size_t slab_bytes = size_t{1} << 30;      // largest single pin; also the largest block
  size_t growth_bytes = size_t{32} << 20;   // smallest slab added by growth
  size_t alignment = 4096;                  // Note [Pinned alignment]
  size_t reserve_bytes = 0;                 // pinned up front, kept for the pool's life
  bool reserve_in_background = false;       // reserve on a thread; allocate waits for it
  bool report_progress = true;              // background reservation progress on stderr
  bool numa_placement = true;               // Note [NUMA placement of pinned slabs]
  exhaustion_policy on_exhausted = exhaustion_policy::fail;
  uint32_t wait_timeout_ms = 1000;
};

// Note [Pinned alignment]
// Blocks start on 4 KiB boundaries by default: the page size, which is what the DMA
// engines and the IOMMU map, and more than the 256 B that copy engines need for full
// speed. A block then never shares a page with its neighbour, so a block can be
// registered, madvised or protected (the preload library's checks) on its own, and a
// copy of one block never touches another block's pages. The cost, under 4 KiB per block,
// is noise next to the ≥ 1 MiB tensors that are ever offloaded. Any power of two from 256
// B to 2 MiB may be configured.

class pinned_pool {
 public:
  // Throws stash::error (invalid_argument for a bad config, cuda_error or out_of_memory
  // when a synchronous reservation fails; nothing stays pinned then).
  explicit pinned_pool(const pinned_pool_config& config);
  ~pinned_pool();
  pinned_pool(const pinned_pool&) = delete;
  pinned_pool& operator=(const pinned_pool&) = delete;

  // A block of at least `bytes` (> 0, ≤ slab_bytes), aligned to config().alignment.
  status allocate(size_t bytes, void** out) noexcept;
  // Frees a block. streams[0..n): streams whose work (already enqueued) uses the block; it
  // is reused only once that work is done. n = 0: the caller guarantees no work is
  // pending. p == nullptr is a no-op. Double free, a foreign pointer or one inside a block
  // return unknown_pointer and change nothing.
  status deallocate(void* p, const cudaStream_t* streams, size_t n) noexcept;

  // Pins `bytes` more now, in slabs of at most slab_bytes, kept for the pool's life.
  status reserve(size_t bytes) noexcept;
  // Gives back slabs grown on demand that are entirely free. Returns the bytes released.
  size_t release_cached() noexcept;

  pool_stats stats() noexcept;
  void reset_peak() noexcept;
  bool owns(const void* p) noexcept;
  // Frozen: allocate never pins (no cudaHostAlloc) and never waits; it serves free blocks
  // or returns out_of_memory at once. For graph capture, where both are forbidden (Note
  // [Capturing a step] in runtime/engine/prefetch_engine.h).
  void set_frozen(bool frozen) noexcept;
  // Blocks until a background reservation has finished; its status.
  status wait_for_reservation() noexcept;

  const pinned_pool_config& config() const noexcept { return config_; }
  int numa_node() const noexcept { return source_.numa_node(); }

 private:
  status try_allocate(size_t bytes, size_t requested, void** out,
                      std::unique_lock<std::mutex>& lock) noexcept;
  status grow(size_t bytes, bool* cap_reached) noexcept;     // lock held
  bool frozen_ = false;                                      // lock held
  status insert_slab(const pinned_slab& slab, bool keep) noexcept;  // lock held
  status reserve_locked(size_t bytes) noexcept;              // lock held
  size_t release_cached_locked(size_t below_bytes) noexcept;  // lock held
  void reap() noexcept;                                       // lock held
  status exhausted(size_t requested, status s) noexcept;     // lock held; the report
  void release_all() noexcept;
  void background_reserve(size_t bytes) noexcept;

  pinned_pool_config config_;
  int device_ = 0;
  pinned_slab_source source_;
  std::mutex mutex_;
  std::condition_variable slab_added_;
  block_map map_;
  event_guard guard_;
  struct slab_record {
    void* usable_base;
    pinned_slab slab;
  };
  std::vector<slab_record> slabs_;
  // Background reservation.
  std::thread reserver_;
  std::atomic<bool> stop_{false};
  bool reserving_ = false;                 // guarded by mutex_
  status reservation_status_ = status::ok; // guarded by mutex_
  char reservation_error_[512] = "";       // guarded by mutex_
};

}  // namespace stash
