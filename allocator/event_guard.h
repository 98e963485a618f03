// event_guard.h: keeps a freed block out of reuse until every stream that used it is done.
//
// Note [Event-guarded reuse]
// A caller frees a block while copies that read or write it may still be queued on some
// streams (the offload D2H that fills a pinned block, the H2D that drains it). free(ptr,
// streams) records one event on each of those streams, after the work already enqueued
// there; the block is `pending` (block_map) until all its events have completed, and only
// then goes back to the free index. Completion is discovered by reap(), which the pools
// call at the start of every alloc and free: it queries events with cudaEventQuery (never
// blocks, never cudaEventSynchronize) and hands completed blocks back. Events are kept in
// one FIFO per stream: work on a stream completes in order, so reap only queries the
// oldest event of each stream and stops at the first that is not ready, which bounds its
// cost by the number of streams with pending frees, not the number of pending blocks.
// Events are recycled through an idle list; a new one is created only when all are in use.
//
// Graph capture: an event recorded into a capture is a graph node, and querying events
// while a stream captures is illegal. So nothing is queried on a stream that is capturing
// (and the pools skip reap entirely while their own allocation stream captures), and a
// block freed on a capturing stream is queued without an event; the event is recorded
// once that stream has left capture, and reuse waits for it. (Graph replays that use the
// block afterwards need a graph-private pool, which this pool does not provide.) A capture
// of another stream may be under way, in Global mode (torch.cuda.graph's): a host query
// or wait then invalidates it (seen on an H200), so reap and drain run their queries with
// the thread's capture mode relaxed (prim::relaxed_capture_mode), once per call, and only
// when something is pending.
//
// Not thread-safe: the owning pool's mutex covers it. No heap allocation once the queues
// have reached their high-water marks; no throwing, no logging.
#pragma once

#include <cstddef>
#include <vector>

#include <cuda_runtime_api.h>

#include "block_map.h"
#include "core/error.h"
#include "cuda_prim.h"

namespace stash {

class event_guard {
 public:
  event_guard() = default;
  event_guard(const event_guard&) = delete;
  event_guard& operator=(const event_guard&) = delete;
  // Destroys all events. Call drain() first if pending blocks' memory is about to go.
  ~event_guard();

  // Records an event on each of streams[0..n) for `block`. On success the caller marks
  // the block pending with n guards. On failure nothing is queued (events already recorded
  // are recycled) and the thread-local error says which call failed.
  status guard(void* block, const cudaStream_t* streams, size_t n) noexcept;

  // Hands each block whose guard event has completed to on_done(block) (once per guard).
  // Never blocks. Returns the number of guards completed.
  template <class F>
  size_t reap(F&& on_done) noexcept {
    if (entries_ == 0) return 0;
    prim::relaxed_capture_mode relaxed;
    size_t done = 0;
    for (queue& q : queues_) {
      if (q.head == q.items.size() || !ready_to_query(q)) continue;
      while (q.head < q.items.size()) {
        entry& e = q.items[q.head];
        if (!e.event && !record_deferred(q, e)) break;
        if (!complete(e.event)) break;
        idle_.push_back(e.event);  // capacity reserved in guard()
        void* block = e.block;
        pop(q);
        ++done;
        on_done(block);
      }
    }
    return done;
  }

  // Blocks until every pending event has completed (destructors only), then forgets them.
  template <class F>
  void drain(F&& on_done) noexcept {
    if (entries_ == 0) return;
    prim::relaxed_capture_mode relaxed;
    for (queue& q : queues_) {
      while (q.head < q.items.size()) {
        entry& e = q.items[q.head];
        if (e.event) {
          wait(e.event);
          idle_.push_back(e.event);
        }
        void* block = e.block;
        pop(q);
        on_done(block);
      }
    }
  }

  size_t pending() const noexcept { return entries_; }

 private:
  struct entry {
    cudaEvent_t event;  // nullptr: freed during capture, event not yet recorded
    void* block;
  };
  struct queue {
    cudaStream_t stream;
    std::vector<entry> items;
    size_t head = 0;
  };

  bool ready_to_query(const queue& q) const noexcept;
  bool record_deferred(queue& q, entry& e) noexcept;
  static bool complete(cudaEvent_t ev) noexcept;
  static void wait(cudaEvent_t ev) noexcept;
  void pop(queue& q) noexcept;
  queue* find_queue(cudaStream_t s) noexcept;

  std::vector<queue> queues_;
  std::vector<cudaEvent_t> idle_;
  size_t entries_ = 0;
  size_t events_created_ = 0;
};

// What both pools do with a block map and its guard (lock held by the caller):
// check_freeable: ok when p is the start of an in_use block; otherwise unknown_pointer,
// naming the pool and why (not its block, inside a block, a double free).
status check_freeable(const block_map& map, const void* p, const char* pool) noexcept;
// free_or_guard: the in_use block p goes back to the free index at once when no other
// stream used it (n == 0); otherwise an event is recorded on each of streams[0..n) and the
// block is pending until they complete. `pool` names the pool in the error text.
status free_or_guard(block_map& map, event_guard& guard, void* p, const cudaStream_t* streams,
                     size_t n, const char* pool) noexcept;
// reap_into: blocks whose guards completed go back to the map's free index.
inline void reap_into(block_map& map, event_guard& guard) noexcept {
  guard.reap([&map](void* block) { map.complete_guard(block); });
}

}  // namespace stash
