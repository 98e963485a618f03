#include "block_map.h"

#include <algorithm>
#include <stdexcept>

namespace stash {

block_map::block_map(size_t alignment, size_t expected_blocks)
    : alignment_(alignment),
      arena_(expected_blocks),
      blocks_(block_index::key_compare(), block_index::allocator_type(&arena_)),
      free_(free_index::key_compare(), free_index::allocator_type(&arena_)) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw std::invalid_argument("block_map: alignment must be a power of two");
  }
}

size_t block_map::round_up(size_t bytes) const noexcept {
  if (bytes == 0 || bytes > SIZE_MAX - (alignment_ - 1)) return 0;
  return (bytes + alignment_ - 1) & ~(alignment_ - 1);
}

void block_map::add_slab(void* base, size_t bytes, tag_t tag, bool keep) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(base);
  if (!base || bytes == 0 || b % alignment_ != 0 || bytes % alignment_ != 0 ||
      b > UINTPTR_MAX - bytes) {
    throw std::invalid_argument("block_map: slab is empty or not aligned");
  }
  // Overlap check against the neighbouring blocks (slabs are few; this is a cold path).
  auto next = blocks_.lower_bound(b);
  if (next != blocks_.end() && next->first < b + bytes) {
    throw std::invalid_argument("block_map: slab overlaps an existing slab");
  }
  if (next != blocks_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > b) {
      throw std::invalid_argument("block_map: slab overlaps an existing slab");
    }
  }
  slabs_.reserve(slabs_.size() + 1);
  const uint32_t id = next_slab_id_++;
  auto [it, inserted] = blocks_.emplace(b, block{bytes, 0, id, 0, tag, state::free});
  (void)inserted;
  try {
    free_.insert(free_key{tag, bytes, b});
  } catch (...) {
    blocks_.erase(it);
    throw;
  }
  slabs_.push_back(slab{b, bytes, id, tag, keep});
  stats_.reserved_bytes += bytes;
  stats_.slab_count += 1;
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
}

void* block_map::allocate(size_t bytes, tag_t tag, size_t requested) noexcept {
  auto fit = free_.lower_bound(free_key{tag, bytes, 0});
  if (fit == free_.end() || fit->tag != tag) return nullptr;
  const uintptr_t addr = fit->addr;
  auto it = blocks_.find(addr);
  block& blk = it->second;
  const size_t rest = blk.size - bytes;
  try {
    if (rest > 0) {
      // Insert the remainder's nodes before changing anything, so that a failed node
      // allocation leaves the map as it was.
      auto [rit, ok] = blocks_.emplace(addr + bytes,
                                       block{rest, 0, blk.slab, 0, tag, state::free});
      (void)ok;
      try {
        free_.insert(free_key{tag, rest, addr + bytes});
      } catch (...) {
        blocks_.erase(rit);
        throw;
      }
    }
  } catch (...) {
    return nullptr;
  }
  free_.erase(fit);
  blk.size = bytes;
  blk.requested = requested;
  blk.st = state::in_use;
  stats_.current_count += 1;
  stats_.total_count += 1;
  stats_.current_bytes += bytes;
  stats_.total_bytes += bytes;
  stats_.requested_bytes += requested;
  note_peak();
  return reinterpret_cast<void*>(addr);
}

block_map::lookup block_map::find(const void* p) const noexcept {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = blocks_.upper_bound(a);
  if (it == blocks_.begin()) return lookup::unknown;
  --it;
  if (a >= it->first + it->second.size) return lookup::unknown;
  if (a != it->first) return lookup::inside_block;
  switch (it->second.st) {
    case state::in_use: return lookup::in_use;
    case state::pending: return lookup::pending;
    case state::free: return lookup::free;
  }
  return lookup::unknown;
}

bool block_map::release(void* p) noexcept {
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(p));
  if (it == blocks_.end() || it->second.st != state::in_use) return false;
  stats_.current_count -= 1;
  stats_.current_bytes -= it->second.size;
  stats_.requested_bytes -= it->second.requested;
  if (!free_block(it)) {
    // Node storage could not grow: keep the block accounted as in use rather than lose it.
    stats_.current_count += 1;
    stats_.current_bytes += it->second.size;
    stats_.requested_bytes += it->second.requested;
    return false;
  }
  return true;
}

bool block_map::mark_pending(void* p, uint32_t guards) noexcept {
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(p));
  if (it == blocks_.end() || it->second.st != state::in_use || guards == 0) return false;
  block& blk = it->second;
  blk.st = state::pending;
  blk.guards = guards;
  stats_.current_count -= 1;
  stats_.current_bytes -= blk.size;
  stats_.requested_bytes -= blk.requested;
  stats_.pending_count += 1;
  stats_.pending_bytes += blk.size;
  return true;
}

bool block_map::complete_guard(void* p) noexcept {
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(p));
  if (it == blocks_.end() || it->second.st != state::pending) return false;
  if (--it->second.guards > 0) return false;
  const size_t size = it->second.size;
  if (!free_block(it)) {
    it->second.guards = 1;  // retried at the next reap
    return false;
  }
  stats_.pending_count -= 1;
  stats_.pending_bytes -= size;
  return true;
}

// Marks *it free and coalesces it with free neighbours of the same slab (same slab
// implies same tag). The free-index node for the result is inserted first: erasing
// neighbours' keys afterwards only returns nodes to the arena, and the final re-insert
// reuses one of them, so nothing after the first insert can fail.
bool block_map::free_block(block_index::iterator it) noexcept {
  block& blk = it->second;
  try {
    free_.insert(free_key{blk.tag, blk.size, it->first});
  } catch (...) {
    return false;
  }
  blk.st = state::free;
  blk.requested = 0;
  blk.guards = 0;
  auto merged = it;
  bool changed = false;
  auto next = std::next(it);
  if (next != blocks_.end() && next->second.st == state::free &&
      next->second.slab == blk.slab && next->first == it->first + blk.size) {
    free_.erase(free_key{blk.tag, blk.size, it->first});
    free_.erase(free_key{next->second.tag, next->second.size, next->first});
    blk.size += next->second.size;
    blocks_.erase(next);
    changed = true;
  }
  if (merged != blocks_.begin()) {
    auto prev = std::prev(merged);
    if (prev->second.st == state::free && prev->second.slab == blk.slab &&
        prev->first + prev->second.size == merged->first) {
      if (!changed) free_.erase(free_key{blk.tag, blk.size, merged->first});
      free_.erase(free_key{prev->second.tag, prev->second.size, prev->first});
      prev->second.size += merged->second.size;
      blocks_.erase(merged);
      merged = prev;
      changed = true;
    }
  }
  if (changed) free_.insert(free_key{merged->second.tag, merged->second.size, merged->first});
  return true;
}

size_t block_map::block_size(const void* p) const noexcept {
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(p));
  return it == blocks_.end() ? 0 : it->second.size;
}

block_map::tag_t block_map::block_tag(const void* p) const noexcept {
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(p));
  return it == blocks_.end() ? 0 : it->second.tag;
}

size_t block_map::largest_free(tag_t tag) const noexcept {
  auto it = free_.upper_bound(free_key{tag, SIZE_MAX, UINTPTR_MAX});
  if (it == free_.begin()) return 0;
  --it;
  return it->tag == tag ? it->size : 0;
}

size_t block_map::largest_free() const noexcept {
  size_t best = 0;
  for (auto it = free_.begin(); it != free_.end();) {
    const tag_t tag = it->tag;
    auto end = free_.upper_bound(free_key{tag, SIZE_MAX, UINTPTR_MAX});
    best = std::max(best, std::prev(end)->size);
    it = end;
  }
  return best;
}

size_t block_map::remove_free_slabs(
    const std::function<void(void*, size_t, tag_t)>& on_removed, size_t below_bytes) {
  size_t removed = 0;
  for (size_t i = 0; i < slabs_.size();) {
    const slab s = slabs_[i];
    auto it = blocks_.find(s.base);
    if (s.keep || s.bytes >= below_bytes || it == blocks_.end() ||
        it->second.st != state::free || it->second.size != s.bytes) {
      ++i;
      continue;
    }
    free_.erase(free_key{s.tag, s.bytes, s.base});
    blocks_.erase(it);
    slabs_.erase(slabs_.begin() + static_cast<ptrdiff_t>(i));
    stats_.reserved_bytes -= s.bytes;
    stats_.slab_count -= 1;
    removed += s.bytes;
    on_removed(reinterpret_cast<void*>(s.base), s.bytes, s.tag);
  }
  return removed;
}

void block_map::clear(const std::function<void(void*, size_t, tag_t)>& on_removed) {
  std::vector<slab> slabs;
  slabs.swap(slabs_);
  free_.clear();
  blocks_.clear();
  stats_ = pool_stats{};
  for (const slab& s : slabs) on_removed(reinterpret_cast<void*>(s.base), s.bytes, s.tag);
}

pool_stats block_map::stats() const noexcept {
  pool_stats s = stats_;
  s.largest_free_bytes = largest_free();
  return s;
}

void block_map::reset_peak() noexcept {
  stats_.peak_count = stats_.current_count;
  stats_.peak_bytes = stats_.current_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

uint64_t block_map::take_held_peak() noexcept {
  const uint64_t peak = std::max(held_window_peak_, held_bytes());
  held_window_peak_ = held_bytes();
  return peak;
}

void block_map::note_peak() noexcept {
  stats_.peak_count = std::max(stats_.peak_count, stats_.current_count);
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
  held_window_peak_ = std::max(held_window_peak_, held_bytes());  // only allocation raises it
}

bool block_map::check_invariants(const char** why) const noexcept {
  auto bad = [&](const char* w) {
    if (why) *why = w;
    return false;
  };
  size_t free_blocks = 0, in_use = 0, in_use_bytes = 0, pending_bytes = 0, total = 0;
  for (const slab& s : slabs_) {
    uintptr_t at = s.base;
    auto it = blocks_.find(s.base);
    bool prev_free = false;
    while (at < s.base + s.bytes) {
      if (it == blocks_.end() || it->first != at) return bad("gap inside a slab");
      const block& b = it->second;
      if (b.slab != s.id || b.tag != s.tag) return bad("block carries the wrong slab or tag");
      if (b.size == 0 || b.size % alignment_ || at % alignment_) return bad("misaligned block");
      const bool is_free = b.st == state::free;
      if (is_free && prev_free) return bad("two adjacent free blocks");
      if (is_free) {
        ++free_blocks;
        if (!free_.count(free_key{b.tag, b.size, at})) return bad("free block not indexed");
      }
      if (b.st == state::in_use) ++in_use, in_use_bytes += b.size;
      if (b.st == state::pending) pending_bytes += b.size;
      prev_free = is_free;
      at += b.size;
      ++it;
    }
    if (at != s.base + s.bytes) return bad("block runs past its slab");
    total += s.bytes;
  }
  if (free_blocks != free_.size()) return bad("free index holds stale keys");
  if (in_use != stats_.current_count || in_use_bytes != stats_.current_bytes)
    return bad("in-use statistics disagree with the blocks");
  if (pending_bytes != stats_.pending_bytes) return bad("pending statistics disagree");
  if (total != stats_.reserved_bytes) return bad("reserved bytes disagree with the slabs");
  return true;
}

}  // namespace stash
