// introspection.cpp: the stash_preload_* functions (stash_preload.h).
#include <cstring>

#include "c_stats.h"
#include "options.h"
#include "pools.h"
#include "report.h"
#include "stash_preload.h"

using namespace stash::preload;

namespace {
uint64_t get(const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); }
}  // namespace

extern "C" {

STASH_API stash_status_t stash_preload_counters(stash_preload_counters_t* out) {
  if (!out || out->struct_size == 0) return STASH_ERROR_INVALID_ARGUMENT;
  const counters& c = tally();
  stash_preload_counters_t full;
  std::memset(&full, 0, sizeof full);
  full.struct_size = out->struct_size;
  full.enabled = opts().disabled ? 0 : 1;
  full.device_budget_bytes = opts().device_budget;
  full.device_alloc_count = get(c.device_alloc);
  full.device_free_count = get(c.device_free);
  full.device_largest_alloc_bytes = get(c.device_largest);
  full.device_budget_refusals = get(c.device_refused);
  full.device_failed_count = get(c.device_failed);
  full.device_passthrough_alloc_count = get(c.device_passthrough_alloc);
  full.device_foreign_free_count = get(c.device_foreign_free);
  full.pinned_alloc_count = get(c.pinned_alloc);
  full.pinned_free_count = get(c.pinned_free);
  full.pinned_largest_alloc_bytes = get(c.pinned_largest);
  full.pinned_passthrough_alloc_count = get(c.pinned_passthrough_alloc);
  full.pinned_foreign_free_count = get(c.pinned_foreign_free);
  std::memcpy(out, &full, out->struct_size < sizeof full ? out->struct_size : sizeof full);
  return STASH_OK;
}

STASH_API stash_status_t stash_preload_device_stats(int device, stash_pool_stats_t* out) {
  stash::device_pool* pool = device_pool_if_built(device);
  if (!pool) return STASH_ERROR_INVALID_ARGUMENT;
  return stash::bindings::fill_c_stats(pool->stats(), out) ? STASH_OK
                                                            : STASH_ERROR_INVALID_ARGUMENT;
}

STASH_API stash_status_t stash_preload_pinned_stats(stash_pool_stats_t* out) {
  stash::pinned_pool* pool = pinned_pool_if_built();
  if (!pool) return STASH_ERROR_INVALID_ARGUMENT;
  return stash::bindings::fill_c_stats(pool->stats(), out) ? STASH_OK
                                                            : STASH_ERROR_INVALID_ARGUMENT;
}

STASH_API stash_status_t stash_preload_write_report(const char* path) {
  return write_report(path) == 0 ? STASH_OK : STASH_ERROR_INVALID_ARGUMENT;
}

}  // extern "C"
