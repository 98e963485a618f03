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
// Note [Foreign memory as device memory]
// A host framework can stand in for a device on the double: PyTorch's CPU build allocates
// its tensors with its own host allocator, and stash's bindings hand those pointers to the
// engine as "device" blocks (offload copies them device-to-host into pinned memory,
// prefetch copies back into a tensor the framework allocated). By default such memory is
// pageable host memory, and a device-to-host copy from it fails the kind check (Note [Copy
// kinds]). With the opt-in (STASHDBL_FOREIGN_IS_DEVICE=1 in the environment when the
// library loads, or stashdbl_set_foreign_is_device), every address outside the double's
// blocks counts as device memory instead: copies from and to it are device-side, async
// copies between it and pinned memory are asynchronous, and cudaPointerGetAttributes
// reports cudaMemoryTypeDevice. What the double allocated keeps its kind; the option has
// no notion of foreign block bounds (nothing is known about them), so range checks apply
// only to the double's own blocks. Only cudaMemGetInfo accounting ignores foreign memory.
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
#include <vector>

#include "cudart_api.h"

namespace stash::dbl {

enum class MemKind { kDevice, kPinned, kRegistered };

struct Block {
  uintptr_t base = 0;
  size_t size = 0;
  MemKind kind = MemKind::kDevice;
  unsigned flags = 0;
  bool from_pool = false;  // cudaMallocAsync / cudaMallocFromPoolAsync
  bool graph = false;      // a graph allocation (Note [Graph memory] in capture.h)
  void* mapping = nullptr;
  size_t mapping_size = 0;  // 0: not owned (registered memory)
  ~Block();
};
using BlockRef = std::shared_ptr<Block>;

// Where a range lives, for copies and memsets.
struct Location {
  BlockRef block;               // null: memory the double did not allocate or register
  bool foreign_device = false;  // no block, and foreign memory counts as device memory
  bool device() const { return block ? block->kind == MemKind::kDevice : foreign_device; }
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
  // Note [Graph memory] in capture.h: puts mapped graph allocations into the table,
  // counted as default-pool memory; cudaErrorMemoryAllocation (and nothing done) when
  // they do not fit.
  cudaError_t adopt_pool(const std::vector<BlockRef>& blocks);
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
  Location locate(const void* p, size_t n) const {
    Location loc{containing(p, n)};
    loc.foreign_device = !loc.block && foreign_is_device_;
    return loc;
  }

  // Note [Foreign memory as device memory]: memory outside every block is pageable host
  // memory by default; with this on, it is device memory (for host frameworks standing in
  // for a device, such as PyTorch's CPU build handing its tensors to stash).
  bool foreign_is_device() const { return foreign_is_device_; }
  void set_foreign_is_device(bool on) { foreign_is_device_ = on; }

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
  bool foreign_is_device_ = false;

 public:
  static constexpr size_t kDefaultTotal = size_t{80} << 30;
};

}  // namespace stash::dbl
