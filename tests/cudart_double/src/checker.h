// checker.h: the happens-before checker over byte ranges.
//
// Note [Happens-before model]
// Agents: the host, and every stream. Each agent has a vector clock (vector_clock.h).
//  - Enqueueing an op on stream S joins the host clock into S (the op cannot start before
//    it was enqueued), adds the implicit legacy-stream dependencies, then ticks S; the op's
//    accesses are stamped with the epoch (S, clock[S]). The host ticks after every enqueue
//    so its later accesses are not mistaken for earlier ones.
//  - cudaEventRecord snapshots the stream clock into the event; cudaStreamWaitEvent joins
//    it into the waiting stream; stream/event/device synchronize and a successful
//    stream/event query join into the host clock; a cudaMemcpyAsync from pageable memory
//    and every synchronous copy or memset is waited for, so the host joins its op.
//  - An access stamped (A, e) happens-before a later access made with clock C iff
//    C[A] >= e. Accesses are checked when they are enqueued, in program order, so an
//    earlier-recorded access can never be ordered after a later one; the epoch test is
//    complete (FastTrack style) and the verdict never depends on worker timing.
//  - Host threads share one host agent. The double cannot observe the host's own
//    synchronization (thread create/join, mutexes, atomics), so per-thread clocks would
//    report every hand-off between host threads, e.g. a pool whose completion thread
//    observes an event while another thread reuses the block. Host-vs-host pairs are never
//    reported: host memory ordering is the program's business, not CUDA's.
//  - Frees are writes of the whole block (cudaFree/cudaFreeHost by the host,
//    cudaFreeAsync by its stream). A fresh allocation forgets the history of its range:
//    the allocator hands out memory only when it is safe to (CUDA's pools order reuse
//    after the free), so whatever happened to a previous block at that address is not a
//    race with the new owner. cudaMallocAsync then records a write of the whole block on
//    its stream, so using the block on another stream before ordering after the
//    allocation is reported.
//
// Note [Bounded history]
// Every future access is stamped with a clock that includes the host clock as it is now:
// host accesses use it, and every enqueue joins it into the stream's clock. So once the
// host clock covers an access (after the host synchronized with it), no future access can
// be unordered with it and it is dropped. A new access also subsumes older accesses of
// the same agent that it covers byte-for-byte when it is at least as strong (write >=
// read): any later access unordered with the old one is unordered with the new one too.
// Pruning runs when the history has doubled since the last prune, so the amortized cost
// per access stays linear in the live history.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "vector_clock.h"

namespace stash::dbl {

// Who made an access, for violation messages. `api` points to a string with static
// storage or one interned by the checker.
struct AccessSite {
  const char* api = "";
  uint64_t stream_id = 0;  // 0: the host
  bool on_host() const { return stream_id == 0; }
};

class Checker {
 public:
  // Checks [ptr, ptr + bytes) accessed by `agent` with clock `clock` (whose own component
  // is the access's epoch) against the history, records violations, then adds the access.
  void access(const void* ptr, size_t bytes, bool is_write, Agent agent,
              const VectorClock& clock, const AccessSite& site);

  // Forgets every recorded access overlapping [ptr, ptr + bytes): see the Note.
  void forget(const void* ptr, size_t bytes);

  // Drops history covered by the host clock. See Note [Bounded history].
  void prune(const VectorClock& host_clock);
  bool wants_prune() const { return history_.size() >= prune_at_; }

  const char* intern(const std::string& name);

  size_t violation_count() const { return violations_.size(); }
  const std::string* violation(size_t i) const {
    return i < violations_.size() ? &violations_[i] : nullptr;
  }
  void clear_violations() { violations_.clear(); }
  void clear_history() {
    history_.clear();
    prune_at_ = kMinPrune;
  }

 private:
  struct Entry {
    uintptr_t lo, hi;  // [lo, hi)
    bool is_write;
    Agent agent;
    uint64_t epoch;
    AccessSite site;
  };
  static constexpr size_t kMinPrune = 1024;
  static constexpr size_t kMaxViolations = 10000;

  void report(const Entry& earlier, const Entry& later);

  std::vector<Entry> history_;
  size_t prune_at_ = kMinPrune;
  std::vector<std::string> violations_;
  std::set<std::string> names_;
};

std::string describe_site(const AccessSite& site);

}  // namespace stash::dbl
