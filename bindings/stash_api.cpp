// Process-wide entry points: version, status strings, last error, statistics helper.
#include <algorithm>
#include <cstring>

#include "api_boundary.h"
#include "c_stats.h"
#include "pool_stats.h"
#include "struct_version.h"

using namespace stash;

extern "C" {

STASH_API unsigned stash_version(void) { return STASH_VERSION_NUMBER; }
STASH_API const char* stash_version_string(void) { return STASH_VERSION_STRING; }

// One table for every range (common, engine, profiler): a status from any part of the
// library gets its name here. Switching on the int keeps values outside the enum defined.
STASH_API const char* stash_status_string(stash_status_t s) {
  switch (static_cast<int>(s)) {
    case STASH_OK: return "ok";
    case STASH_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case STASH_ERROR_OUT_OF_MEMORY: return "out of memory";
    case STASH_ERROR_CUDA: return "CUDA error";
    case STASH_ERROR_TIMEOUT: return "timed out";
    case STASH_ERROR_UNKNOWN_POINTER: return "unknown pointer";
    case STASH_ERROR_VERSION_MISMATCH: return "version mismatch";
    case STASH_ERROR_INTERNAL: return "internal error";
    case STASH_ERROR_NO_PLAN: return "no plan loaded";
    case STASH_ERROR_BAD_PLAN: return "bad plan";
    case STASH_ERROR_UNKNOWN_TENSOR: return "unknown tensor";
    case STASH_ERROR_ILLEGAL_TRANSITION: return "illegal transition";
    case STASH_ERROR_TENSOR_FAILED: return "tensor failed";
    case STASH_ERROR_BAD_PROFILE: return "bad profile";
    case STASH_ERROR_INFEASIBLE_BUDGET: return "infeasible budget";
    case STASH_ERROR_PROFILING_UNAVAILABLE: return "profiling unavailable";
    case STASH_ERROR_PROFILER_STATE: return "profiler in the wrong state";
    default: return "unknown status";
  }
}

STASH_API const char* stash_last_error(void) { return last_error(); }

STASH_API void stash_pool_stats_init(stash_pool_stats_t* stats) {
  if (!stats) return;
  std::memset(stats, 0, sizeof *stats);
  stats->struct_size = sizeof *stats;
}

}  // extern "C"

namespace stash::api {

status copy_stats(const pool_stats& in, stash_pool_stats_t* out, const char* function) noexcept {
  if (!out) return fail(status::invalid_argument, "%s: stats is NULL", function);
  if (const status s = check_size(function, "stats", *out); s != status::ok) return s;
  bindings::fill_c_stats(in, out);  // struct_size checked above
  return status::ok;
}

}  // namespace stash::api
