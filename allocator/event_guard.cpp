#include "event_guard.h"

#include <algorithm>

#include "cuda_prim.h"

namespace stash {

event_guard::~event_guard() {
  for (queue& q : queues_) {
    for (size_t i = q.head; i < q.items.size(); ++i) {
      if (q.items[i].event) prim::event_destroy(q.items[i].event);
    }
  }
  for (cudaEvent_t ev : idle_) prim::event_destroy(ev);
}

event_guard::queue* event_guard::find_queue(cudaStream_t s) noexcept {
  for (queue& q : queues_) {
    if (q.stream == s) return &q;
  }
  return nullptr;
}

status event_guard::guard(void* block, const cudaStream_t* streams, size_t n) noexcept {
  // 1. Make room for everything this call may push, so nothing below can fail for memory.
  try {
    if (queues_.size() >= 32) {
      // Forget the queues of streams with nothing pending (streams come and go).
      queues_.erase(std::remove_if(queues_.begin(), queues_.end(),
                                   [](const queue& q) { return q.head == q.items.size(); }),
                    queues_.end());
    }
    for (size_t i = 0; i < n; ++i) {
      queue* q = find_queue(streams[i]);
      if (!q) {
        queues_.push_back(queue{streams[i], {}, 0});
        q = &queues_.back();
      }
      q->items.reserve(q->items.size() + n);
    }
    idle_.reserve(events_created_ + n);
  } catch (...) {
    return fail(status::internal, "out of host memory for the pool's event queues");
  }
  // 2. Record one event per stream; a stream in capture gets its event later.
  cudaEvent_t recorded[16];
  cudaEvent_t* events = recorded;
  std::vector<cudaEvent_t> many;
  if (n > 16) {
    try {
      many.resize(n);
    } catch (...) {
      return fail(status::internal, "out of host memory for the pool's event queues");
    }
    events = many.data();
  }
  for (size_t i = 0; i < n; ++i) {
    events[i] = nullptr;
    bool capturing = false;
    prim::stream_capturing(streams[i], &capturing);
    if (capturing) continue;
    cudaEvent_t ev = nullptr;
    cudaError_t err = cudaSuccess;
    if (!idle_.empty()) {
      ev = idle_.back();
      idle_.pop_back();
    } else {
      err = prim::event_create(&ev);
      if (err == cudaSuccess) {
        ++events_created_;
        try {
          idle_.reserve(events_created_);
        } catch (...) {
        }
      }
    }
    if (err == cudaSuccess) {
      err = prim::event_record(ev, streams[i]);
      if (err != cudaSuccess) idle_.push_back(ev);
    }
    if (err != cudaSuccess) {
      for (size_t j = 0; j < i; ++j) {
        if (events[j]) idle_.push_back(events[j]);
      }
      return prim::record_cuda_error(err, "cudaEventRecord(guard of a freed block)", __FILE__,
                                     __LINE__);
    }
    events[i] = ev;
  }
  // 3. Queue them (capacity reserved above).
  for (size_t i = 0; i < n; ++i) {
    find_queue(streams[i])->items.push_back(entry{events[i], block});
    ++entries_;
  }
  return status::ok;
}

bool event_guard::ready_to_query(const queue& q) const noexcept {
  bool capturing = false;
  prim::stream_capturing(q.stream, &capturing);
  return !capturing;
}

bool event_guard::record_deferred(queue& q, entry& e) noexcept {
  cudaEvent_t ev = nullptr;
  if (!idle_.empty()) {
    ev = idle_.back();
    idle_.pop_back();
  } else {
    if (prim::event_create(&ev) != cudaSuccess) return false;
    ++events_created_;
    try {
      idle_.reserve(events_created_);
    } catch (...) {
      prim::event_destroy(ev);
      return false;
    }
  }
  if (prim::event_record(ev, q.stream) != cudaSuccess) {
    prim::clear_runtime_error();
    idle_.push_back(ev);
    return false;
  }
  e.event = ev;
  return true;
}

// Called by reap and drain with the thread's capture mode relaxed (Note [Event-guarded
// reuse]).
bool event_guard::complete(cudaEvent_t ev) noexcept {
  // An error other than "not ready" (a broken context) keeps the block pending for good:
  // handing it out could let new work overlap the failed work that used it.
  return prim::event_query(ev) == cudaSuccess;
}

void event_guard::wait(cudaEvent_t ev) noexcept { prim::event_synchronize(ev); }

void event_guard::pop(queue& q) noexcept {
  ++q.head;
  --entries_;
  if (q.head == q.items.size()) {
    q.items.clear();  // keeps capacity
    q.head = 0;
  } else if (q.head >= 64 && 2 * q.head >= q.items.size()) {
    q.items.erase(q.items.begin(), q.items.begin() + static_cast<ptrdiff_t>(q.head));
    q.head = 0;
  }
}

status check_freeable(const block_map& map, const void* p, const char* pool) noexcept {
  switch (map.find(p)) {
    case block_map::lookup::unknown:
      return fail(status::unknown_pointer, "%s: %p was not allocated by this pool", pool, p);
    case block_map::lookup::inside_block:
      return fail(status::unknown_pointer, "%s: %p points inside a block, not at its start",
                  pool, p);
    case block_map::lookup::free:
    case block_map::lookup::pending:
      return fail(status::unknown_pointer, "%s: double free of %p", pool, p);
    case block_map::lookup::in_use:
      break;
  }
  return status::ok;
}

status free_or_guard(block_map& map, event_guard& guard, void* p, const cudaStream_t* streams,
                     size_t n, const char* pool) noexcept {
  if (n == 0) {
    if (!map.release(p)) return fail(status::internal, "%s: out of node storage", pool);
    return status::ok;
  }
  const status s = guard.guard(p, streams, n);
  if (s != status::ok) return s;
  map.mark_pending(p, static_cast<uint32_t>(n));
  return status::ok;
}

}  // namespace stash
