// memory.h: the double's allocation table. Device memory is host memory.
//
// Every block the double hands out (device, pinned host) or was told about (registered
// host memory) is a Block in an address-ordered table. Callers hold the state mutex.
//
// Note [Deferred release]
// A block leaves the table when it is freed (so a double free or a late use is an error
// at once), but its pages are unmapped only when the last queued op that touches it has
// run: ops hold a shared_ptr to the blocks they copy to or from. A cudaFree issued while a
// paused stream still has a copy from the block therefore neither crashes the worker nor
// hangs the host; the checker reports the race instead (the free is a write of the block).
//
// Note [Device memory accounting]
// cudaMemGetInfo reports free = total - (cudaMalloc bytes + bytes reserved by the default
// pool). Bytes are counted as requested (no rounding). The default pool (cudaMallocAsync)
// keeps freed bytes cached up to its release threshold, as CUDA's pool does: they stay
// reserved until a synchronize or cudaMemPoolTrimTo releases them, and an allocation that
// would not fit first releases the cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

#include "cudart_api.h"

namespace stash::dbl {

enum class MemKind { kDevice, kPinned, kRegistered };

struct Block {
  uintptr_t base = 0;
  size_t size = 0;
  MemKind kind = MemKind::kDevice;
  unsigned flags = 0;
  bool from_pool = false;  // cudaMallocAsync / cudaMallocFromPoolAsync
  void* mapping = nullptr;
  size_t mapping_size = 0;  // 0: not owned (registered memory)
  ~Block();
};
using BlockRef = std::shared_ptr<Block>;

// Where a range lives, for copies and memsets.
struct Location {
  BlockRef block;  // null: pageable (unregistered) host memory
  bool device() const { return block && block->kind == MemKind::kDevice; }
  bool pinned() const { return block && block->kind != MemKind::kDevice; }
};

struct PoolStats {
  uint64_t release_threshold = 0;
  uint64_t used = 0, used_high = 0;
  uint64_t cached = 0;  // freed, still reserved
  uint64_t reserved_high = 0;
  int reuse_follow_event = 1, reuse_opportunistic = 1, reuse_internal_deps = 1;
  uint64_t reserved() const { return used + cached; }
};

class MemoryTable {
 public:
  // Maps `bytes` (aligned to at least 256 B); null on failure.
  static BlockRef map(size_t bytes, MemKind kind);

  // Device memory: fails with cudaErrorMemoryAllocation past the configured total.
  cudaError_t alloc_device(size_t bytes, bool from_pool, BlockRef* out);
  // Takes a device block out of the table; its bytes stop counting (pool: become cached).
  void release_device(const BlockRef& b);

  void insert(const BlockRef& b) { blocks_[b->base] = b; }
  void erase(const BlockRef& b) { blocks_.erase(b->base); }

  // The block whose base is exactly p, or null.
  BlockRef at_base(const void* p) const;
  // The block containing [p, p + n) entirely, or null.
  BlockRef containing(const void* p, size_t n) const;
  // True when any block overlaps [p, p + n).
  bool overlaps(const void* p, size_t n) const;
  Location locate(const void* p, size_t n) const { return {containing(p, n)}; }

  size_t total() const { return total_; }
  void set_total(size_t t) { total_ = t; }
  size_t device_in_use() const { return malloc_bytes_ + pool_.reserved(); }

  PoolStats& pool() { return pool_; }
  // Releases cached pool bytes down to `keep` reserved bytes (never below used).
  void trim_pool(uint64_t keep);
  // What a synchronize does to the pool: release down to the threshold.
  void pool_sync_release() { trim_pool(pool_.release_threshold); }

  // Drops every block (cudaDeviceReset); blocks still referenced by ops stay mapped.
  void clear();

 private:
  std::map<uintptr_t, BlockRef> blocks_;
  size_t total_ = kDefaultTotal;
  size_t malloc_bytes_ = 0;
  PoolStats pool_;

 public:
  static constexpr size_t kDefaultTotal = size_t{80} << 30;
};

}  // namespace stash::dbl
