// api_boundary.h: how an exported C function turns everything into a stash_status_t.
//
// Every exported function body runs inside api_call(), which catches every exception
// (stash::error keeps its status; std::bad_alloc is INTERNAL; anything else INTERNAL) and
// writes its message into the thread-local error buffer (core/error.h) that
// stash_last_error() returns. No exception crosses the C boundary.
#pragma once

#include <new>

#include "core/error.h"
#include "pool_stats.h"
#include "stash.h"

namespace stash::api {

// Every row of the one status table (Note [The status table] in core/error.h) is the
// header's enumerator of that name, with the same number.
#define STASH_STATUS_MATCHES_HEADER_(id, c_name, number, text)                   \
  static_assert(static_cast<int>(status::id) == number && c_name == number, \
                #c_name " differs between core/error.h and stash.h");
STASH_STATUS_TABLE(STASH_STATUS_MATCHES_HEADER_)
#undef STASH_STATUS_MATCHES_HEADER_

inline stash_status_t to_c(status s) noexcept { return static_cast<stash_status_t>(s); }

template <class F>
stash_status_t api_call(const char* function, F&& body) noexcept {
  try {
    return to_c(body());
  } catch (const error& e) {
    return to_c(fail(e.code(), "%s: %s", function, e.what()));
  } catch (const std::bad_alloc&) {
    return to_c(fail(status::internal, "%s: out of host memory", function));
  } catch (const std::exception& e) {
    return to_c(fail(status::internal, "%s: %s", function, e.what()));
  } catch (...) {
    return to_c(fail(status::internal, "%s: unknown exception", function));
  }
}

// Fills a caller's stats struct as far as its struct_size reaches.
status copy_stats(const pool_stats& in, stash_pool_stats_t* out, const char* function) noexcept;

}  // namespace stash::api
