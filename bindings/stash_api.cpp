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

// The one status table (Note [The status table] in core/error.h). The argument is read
// as an int: a caller's number need not be a stash_status_t, and status_name() answers
// "unknown status" for any number that is not a row.
STASH_API const char* stash_status_string(stash_status_t s) {
  return status_name(static_cast<status>(static_cast<int>(s)));
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
