// block_map.h: the CPU-only bookkeeping core shared by the pinned and the device pool.
//
// A block_map carves slabs (address ranges some other layer obtained) into blocks:
// address-ordered best-fit with split and coalesce. It never touches the memory it
// manages and makes no CUDA call, so it is tested on its own (tests/allocator).
//
// Invariants
//  - Every byte of every slab belongs to exactly one block; blocks never span slabs.
//  - Block addresses and sizes are multiples of alignment() (slab bases must be aligned
//    and slab sizes are multiples of it). Requests are rounded up to the alignment and to
//    nothing else: no power-of-two size classes (Note [Best fit, not size classes]).
//  - Two adjacent free blocks of one slab never coexist: release() coalesces at once.
//  - A block is in_use (the caller owns it), pending (the caller freed it, but streams
//    that used it have guards outstanding, see event_guard.h) or free.
//  - Each block carries a tag; allocate() only hands out free blocks of the requested tag
//    and blocks of different tags never coalesce. The pinned pool uses one tag; the
//    device pool tags a slab with the stream that owns it (stream-ordered reuse).
//
// Not thread-safe: the owning pool serializes access. No method below allocates from the
// heap once the node arena has reached its high-water mark (Note [No heap allocation on
// the hot path] in node_arena.h), none logs or throws except add_slab.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "node_arena.h"
#include "pool_stats.h"

namespace stash {

// Note [Best fit, not size classes]
// PyTorch's CachingHostAllocator rounds every request up to a power of two and caches
// blocks per size class without splitting: a 129.5 MB tensor pins 256 MB. Offloaded
// activations come in a handful of odd sizes that repeat layer after layer, so stash uses
// best fit with split and coalesce: the smallest free block that fits, the lowest address
// among equal sizes (which keeps allocations packed towards slab starts and leaves large
// free tails to coalesce), split exactly at the request. The free index is ordered by
// (tag, size, address), so best fit is one lower_bound: O(log n) for n free blocks.

class block_map {
 public:
  using tag_t = uint64_t;
  enum class state : uint8_t { free, in_use, pending };
  // What a pointer is to this map.
  enum class lookup : uint8_t { in_use, pending, free, inside_block, unknown };

  // alignment: a power of two. expected_blocks sizes the node arena's chunks.
  block_map(size_t alignment, size_t expected_blocks = 1024);
  block_map(const block_map&) = delete;
  block_map& operator=(const block_map&) = delete;

  size_t alignment() const noexcept { return alignment_; }
  // bytes rounded up to the alignment; 0 when bytes is 0 or the rounding overflows.
  size_t round_up(size_t bytes) const noexcept;

  // Adds [base, base + bytes) as one free block of `tag`. keep: the slab is never handed
  // back by remove_free_slabs (an up-front reservation). Throws std::invalid_argument on a
  // misaligned or overlapping slab, std::bad_alloc when node storage cannot grow.
  void add_slab(void* base, size_t bytes, tag_t tag, bool keep);

  // Best fit among free blocks of `tag` for `bytes` (already round_up'ed, > 0); splits
  // off the remainder. Returns nullptr when no free block of `tag` is large enough (or,
  // exceptionally, when node storage could not grow; the map is unchanged then).
  void* allocate(size_t bytes, tag_t tag, size_t requested) noexcept;

  lookup find(const void* p) const noexcept;
  // in_use -> free, coalescing with free neighbours of the same slab and tag. False when p
  // is not the start of an in_use block (nothing changes).
  bool release(void* p) noexcept;
  // in_use -> pending with `guards` (> 0) outstanding. False when p is not in_use.
  bool mark_pending(void* p, uint32_t guards) noexcept;
  // One guard of a pending block completed; the last one frees it (as release()).
  // Returns true when the block became free.
  bool complete_guard(void* p) noexcept;

  // Size and tag of the block that starts at p (0 when none).
  size_t block_size(const void* p) const noexcept;
  tag_t block_tag(const void* p) const noexcept;

  size_t largest_free(tag_t tag) const noexcept;
  size_t largest_free() const noexcept;
  size_t free_block_count() const noexcept { return free_.size(); }

  // Removes every slab that is entirely free, not kept, and smaller than `below_bytes`;
  // calls on_removed(base, bytes, tag) for each (to give the memory back). Returns bytes.
  size_t remove_free_slabs(const std::function<void(void*, size_t, tag_t)>& on_removed,
                           size_t below_bytes = SIZE_MAX);
  // Forgets every slab (the pool's destructor), calling on_removed for each.
  void clear(const std::function<void(void*, size_t, tag_t)>& on_removed);

  // Current statistics (largest_free_bytes filled in).
  pool_stats stats() const noexcept;
  // p is the start of a block handed out and not yet reusable (in_use or pending).
  bool owns(const void* p) const noexcept {
    const lookup l = find(p);
    return l == lookup::in_use || l == lookup::pending;
  }
  // Bytes held: in_use plus pending (freed, still awaited by their streams' events).
  uint64_t held_bytes() const noexcept { return stats_.current_bytes + stats_.pending_bytes; }
  // The highest held_bytes() since the previous call (since the map was made, the first
  // time); the next window starts at the current level.
  uint64_t take_held_peak() noexcept;
  void reset_peak() noexcept;
  void count_failure() noexcept { ++stats_.failed_count; }
  void set_limit(uint64_t limit) noexcept { stats_.limit_bytes = limit; }

  // Checks every invariant above; for tests. Returns false and says why in `why`.
  bool check_invariants(const char** why) const noexcept;

 private:
  struct block {
    size_t size;
    size_t requested;
    uint32_t slab;
    uint32_t guards;
    tag_t tag;
    state st;
  };
  struct free_key {
    tag_t tag;
    size_t size;
    uintptr_t addr;
    bool operator<(const free_key& o) const noexcept {
      if (tag != o.tag) return tag < o.tag;
      if (size != o.size) return size < o.size;
      return addr < o.addr;
    }
  };
  struct slab {
    uintptr_t base;
    size_t bytes;
    uint32_t id;
    tag_t tag;
    bool keep;
  };
  using block_index = std::map<uintptr_t, block, std::less<uintptr_t>,
                               arena_allocator<std::pair<const uintptr_t, block>>>;
  using free_index = std::set<free_key, std::less<free_key>, arena_allocator<free_key>>;

  bool free_block(block_index::iterator it) noexcept;
  void note_peak() noexcept;

  size_t alignment_;
  node_arena arena_;
  block_index blocks_;
  free_index free_;
  std::vector<slab> slabs_;
  uint32_t next_slab_id_ = 0;
  pool_stats stats_;
  uint64_t held_window_peak_ = 0;  // take_held_peak()
};

}  // namespace stash
