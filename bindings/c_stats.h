// c_stats.h: stash::pool_stats -> stash_pool_stats_t, as far as the caller's struct goes.
//
// Header-only, so that libstash.so and the libraries that do not link libstash (preload,
// torch) share it without exporting a libstash symbol from the latter.
#pragma once

#include <cstddef>
#include <cstring>

#include "pool_stats.h"
#include "stash.h"

namespace stash::bindings {

// false when out is NULL or its struct_size is too small to hold even struct_size.
inline bool fill_c_stats(const pool_stats& in, stash_pool_stats_t* out) noexcept {
  if (!out || out->struct_size < sizeof(size_t)) return false;
  stash_pool_stats_t full;
  full.struct_size = out->struct_size;
  full.current_count = in.current_count;
  full.peak_count = in.peak_count;
  full.total_count = in.total_count;
  full.current_bytes = in.current_bytes;
  full.peak_bytes = in.peak_bytes;
  full.total_bytes = in.total_bytes;
  full.requested_bytes = in.requested_bytes;
  full.pending_count = in.pending_count;
  full.pending_bytes = in.pending_bytes;
  full.reserved_bytes = in.reserved_bytes;
  full.peak_reserved_bytes = in.peak_reserved_bytes;
  full.slab_count = in.slab_count;
  full.largest_free_bytes = in.largest_free_bytes;
  full.limit_bytes = in.limit_bytes;
  full.failed_count = in.failed_count;
  const size_t n = out->struct_size < sizeof full ? out->struct_size : sizeof full;
  std::memcpy(out, &full, n);
  return true;
}

}  // namespace stash::bindings
