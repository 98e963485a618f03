// api_boundary.h: how an exported C function turns everything into a stash_status_t.
//
// Every exported function body runs inside api_call(), which catches every exception
// (stash::error keeps its status; std::bad_alloc is INTERNAL; anything else INTERNAL) and
// writes its message into the thread-local error buffer (allocator/status.h) that
// stash_last_error() returns. No exception crosses the C boundary.
#pragma once

#include <new>

#include "pool_stats.h"
#include "stash.h"
#include "status.h"

namespace stash::api {

static_assert(static_cast<int>(status::ok) == STASH_OK);
static_assert(static_cast<int>(status::invalid_argument) == STASH_ERROR_INVALID_ARGUMENT);
static_assert(static_cast<int>(status::out_of_memory) == STASH_ERROR_OUT_OF_MEMORY);
static_assert(static_cast<int>(status::cuda_error) == STASH_ERROR_CUDA);
static_assert(static_cast<int>(status::timeout) == STASH_ERROR_TIMEOUT);
static_assert(static_cast<int>(status::unknown_pointer) == STASH_ERROR_UNKNOWN_POINTER);
static_assert(static_cast<int>(status::version_mismatch) == STASH_ERROR_VERSION_MISMATCH);
static_assert(static_cast<int>(status::internal) == STASH_ERROR_INTERNAL);

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
