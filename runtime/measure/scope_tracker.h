// scope_tracker.h: per-thread stacks of open host scopes, fed by NVTX push/pop callbacks or
// by the C API, producing the scope records that attribution reads.
//
// Note [One external correlation id per thread]
// CUPTI keeps a stack of external correlation ids per thread and stamps each API call with
// the top of it. NVTX ranges, however, nest per (thread, domain), and a program may
// interleave domains (push A in "stash", push B in the default domain, pop A, pop B), so
// mirroring pushes and pops onto CUPTI's single stack would pop the wrong id. Instead the
// tracker reports the thread's innermost open stash scope before and after every change,
// and the caller keeps exactly one id pushed per thread: pop the old one, push the new
// one. The whole nesting is recovered from scope_record::parent, so one id per API call
// is enough to attribute a kernel to its tensor scope and its layer scope at once.
//
// Ranges whose name is not a stash scope are tracked only as stack entries (so that their
// pops match), never recorded. A pop with nothing pushed (a range opened before the
// profiler started) is ignored.
//
// Thread safety: every method may be called from any thread; one mutex guards the state.
// The callbacks run on the application's threads, inside its NVTX calls, so the work per
// call is a map lookup and a vector push.
#pragma once

#include <cstdint>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/measure/records.h"

namespace stash::measure {

class scope_tracker {
 public:
  struct change {
    std::uint64_t before = 0;  // the thread's innermost open stash scope id (0: none)
    std::uint64_t after = 0;
    bool changed() const { return before != after; }
  };

  // `domain` tells NVTX domains apart (any value; 0 for the default domain).
  change push(std::uint64_t thread, std::uint64_t domain, std::string_view name,
              std::uint64_t now_ns);
  change pop(std::uint64_t thread, std::uint64_t domain, std::uint64_t now_ns);

  // Every stash scope opened so far; scopes still open have end_ns == 0.
  std::vector<scope_record> scopes() const;

 private:
  struct thread_state {
    // Per domain: the stack of entries (a scope id, or 0 for a non-stash range).
    std::unordered_map<std::uint64_t, std::vector<std::uint64_t>> stacks;
    // The open stash scopes of this thread in the order they opened; back() is innermost.
    std::vector<std::uint64_t> open;
  };

  mutable std::mutex mutex_;
  std::unordered_map<std::uint64_t, thread_state> threads_;
  std::vector<scope_record> scopes_;  // scopes_[id - 1]
};

}  // namespace stash::measure
