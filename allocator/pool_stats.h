// pool_stats.h: the statistics both pools keep, exactly (no sampling, no estimates).
#pragma once

#include <cstdint>

namespace stash {

// "Bytes" of a block are its size as carved from a slab: the request rounded up to the
// pool's alignment. requested_bytes keeps the callers' own figures for comparison.
struct pool_stats {
  // Blocks handed to callers and not yet freed by them.
  uint64_t current_count = 0, peak_count = 0, total_count = 0;
  uint64_t current_bytes = 0, peak_bytes = 0, total_bytes = 0;
  uint64_t requested_bytes = 0;  // sum of the requests behind current_bytes
  // Freed by the caller, still guarded by events of streams that used them.
  uint64_t pending_count = 0, pending_bytes = 0;
  // Memory obtained from CUDA, in slabs.
  uint64_t reserved_bytes = 0, peak_reserved_bytes = 0, slab_count = 0;
  uint64_t largest_free_bytes = 0;  // filled in when stats are read
  uint64_t limit_bytes = 0;         // the pinned pool's cap or the device pool's budget
  uint64_t failed_count = 0;        // allocations that returned an error
};

}  // namespace stash
