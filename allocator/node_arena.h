// node_arena.h: recycled node storage for the block_map's ordered containers.
//
// Note [No heap allocation on the hot path]
// block_map keeps its blocks in std::map / std::set, whose every insert allocates a node.
// Their allocator is an arena_allocator that draws fixed-size slots from a node_arena:
// slots freed by erase go onto a per-size free list and are reused by the next insert,
// so once the number of blocks has reached its high-water mark, alloc and free allocate
// nothing. The arena grows in chunks of `chunk_slots` slots (sized at construction from
// the expected block count), so growth is rare and amortized; it is the only heap
// allocation a pool makes after creation, and it happens only when the pool holds more
// blocks than ever before. Slots are never returned to the system before the arena dies.
// Not thread-safe: the owning pool's mutex covers it.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <vector>

namespace stash {

class node_arena {
 public:
  explicit node_arena(size_t chunk_slots = 256) : chunk_slots_(chunk_slots ? chunk_slots : 1) {}
  node_arena(const node_arena&) = delete;
  node_arena& operator=(const node_arena&) = delete;

  void* allocate(size_t bytes) {
    const size_t cls = size_class(bytes);
    if (cls >= classes) return ::operator new(bytes);
    slot*& head = free_[cls];
    if (!head) grow(cls);
    slot* s = head;
    head = s->next;
    return s;
  }

  void deallocate(void* p, size_t bytes) noexcept {
    const size_t cls = size_class(bytes);
    if (cls >= classes) {
      ::operator delete(p);
      return;
    }
    slot* s = static_cast<slot*>(p);
    s->next = free_[cls];
    free_[cls] = s;
  }

  size_t chunk_count() const noexcept { return chunks_.size(); }

 private:
  struct slot {
    slot* next;
  };
  static constexpr size_t granule = 16;
  static constexpr size_t classes = 16;  // slots up to 256 bytes
  static size_t size_class(size_t bytes) noexcept { return (bytes + granule - 1) / granule; }

  void grow(size_t cls) {
    const size_t slot_bytes = cls * granule;
    chunks_.emplace_back(new std::byte[slot_bytes * chunk_slots_]);
    std::byte* base = chunks_.back().get();
    for (size_t i = chunk_slots_; i-- > 0;) {
      slot* s = reinterpret_cast<slot*>(base + i * slot_bytes);
      s->next = free_[cls];
      free_[cls] = s;
    }
  }

  size_t chunk_slots_;
  slot* free_[classes] = {};
  std::vector<std::unique_ptr<std::byte[]>> chunks_;
};

// A standard allocator over a node_arena. Single-object requests (container nodes) use
// the arena; arrays fall through to operator new.
template <class T>
class arena_allocator {
 public:
  using value_type = T;
  explicit arena_allocator(node_arena* arena) noexcept : arena_(arena) {}
  template <class U>
  arena_allocator(const arena_allocator<U>& other) noexcept : arena_(other.arena()) {}

  T* allocate(size_t n) {
    if (n != 1) return static_cast<T*>(::operator new(n * sizeof(T)));
    return static_cast<T*>(arena_->allocate(sizeof(T)));
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n != 1) {
      ::operator delete(p);
      return;
    }
    arena_->deallocate(p, sizeof(T));
  }
  node_arena* arena() const noexcept { return arena_; }

  template <class U>
  bool operator==(const arena_allocator<U>& o) const noexcept { return arena_ == o.arena(); }
  template <class U>
  bool operator!=(const arena_allocator<U>& o) const noexcept { return arena_ != o.arena(); }

 private:
  node_arena* arena_;
};

}  // namespace stash
