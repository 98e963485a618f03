#include "memory.h"

#include <sys/mman.h>

#include <algorithm>

namespace stash::dbl {

Block::~Block() {
  if (mapping_size != 0) munmap(mapping, mapping_size);
}

// mmap rather than malloc: sizes are up to the configured device total (tens of GiB are
// fine untouched, with MAP_NORESERVE), pages are 256-byte aligned, and the sanitizer
// allocators, which abort on huge requests, stay out of it.
BlockRef MemoryTable::map(size_t bytes, MemKind kind) {
  const size_t len = std::max<size_t>(bytes, 1);
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) return nullptr;
  auto b = std::make_shared<Block>();
  b->base = reinterpret_cast<uintptr_t>(p);
  b->size = bytes;
  b->kind = kind;
  b->mapping = p;
  b->mapping_size = len;
  return b;
}

cudaError_t MemoryTable::alloc_device(size_t bytes, bool from_pool, BlockRef* out) {
  uint64_t from_cache = 0;
  if (from_pool) from_cache = std::min<uint64_t>(pool_.cached, bytes);
  const uint64_t need = bytes - from_cache;
  if (device_in_use() + need > total_) {
    trim_pool(0);  // a real pool gives cached memory back before failing
    from_cache = 0;
    if (device_in_use() + bytes > total_) return cudaErrorMemoryAllocation;
  }
  BlockRef b = map(bytes, MemKind::kDevice);
  if (!b) return cudaErrorMemoryAllocation;
  b->from_pool = from_pool;
  if (from_pool) {
    pool_.cached -= from_cache;
    pool_.used += bytes;
    pool_.used_high = std::max(pool_.used_high, pool_.used);
    pool_.reserved_high = std::max(pool_.reserved_high, pool_.reserved());
  } else {
    malloc_bytes_ += bytes;
  }
  insert(b);
  *out = b;
  return cudaSuccess;
}

cudaError_t MemoryTable::adopt_pool(const std::vector<BlockRef>& blocks) {
  uint64_t need = 0;
  for (const BlockRef& b : blocks) need += b->size;
  uint64_t from_cache = std::min<uint64_t>(pool_.cached, need);
  if (device_in_use() + need - from_cache > total_) {
    trim_pool(0);
    from_cache = 0;
    if (device_in_use() + need > total_) return cudaErrorMemoryAllocation;
  }
  pool_.cached -= from_cache;
  pool_.used += need;
  pool_.used_high = std::max(pool_.used_high, pool_.used);
  pool_.reserved_high = std::max(pool_.reserved_high, pool_.reserved());
  for (const BlockRef& b : blocks) {
    b->from_pool = true;
    insert(b);
  }
  return cudaSuccess;
}

void MemoryTable::release_device(const BlockRef& b) {
  if (b->from_pool) {
    pool_.used -= b->size;
    pool_.cached += b->size;
  } else {
    malloc_bytes_ -= b->size;
  }
}

void MemoryTable::trim_pool(uint64_t keep) {
  if (pool_.reserved() <= keep) return;
  const uint64_t excess = pool_.reserved() - keep;
  pool_.cached -= std::min(pool_.cached, excess);
}

BlockRef MemoryTable::at_base(const void* p) const {
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(p));
  return it == blocks_.end() ? nullptr : it->second;
}

BlockRef MemoryTable::containing(const void* p, size_t n) const {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p);
  auto it = blocks_.upper_bound(lo);
  if (it == blocks_.begin()) return nullptr;
  --it;
  const Block& b = *it->second;
  const size_t span = std::max<size_t>(b.size, 1);
  if (lo >= b.base && lo + n <= b.base + span && lo < b.base + span) return it->second;
  return nullptr;
}

bool MemoryTable::overlaps(const void* p, size_t n) const {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p);
  const uintptr_t hi = lo + std::max<size_t>(n, 1);
  auto it = blocks_.lower_bound(hi);
  if (it == blocks_.begin()) return false;
  --it;
  return it->second->base + std::max<size_t>(it->second->size, 1) > lo;
}

void MemoryTable::clear() {
  blocks_.clear();
  malloc_bytes_ = 0;
  pool_ = PoolStats{};
}

}  // namespace stash::dbl
