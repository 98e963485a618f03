// status.h: result codes of the allocator, and the thread-local error text behind them.
//
// The numeric values are those of stash_status_t in bindings/include/stash.h, which must
// never change; bindings/ static_asserts that they agree.
//
// Hot paths (alloc/free/stats) return a status and never throw. Their message goes into a
// fixed thread-local buffer (no heap allocation), read back with last_error(). Creation
// paths throw stash::error, which the C API turns into a status at its boundary.
#pragma once

#include <stdexcept>

namespace stash {

enum class status : int {
  ok = 0,
  invalid_argument = 1,
  out_of_memory = 2,
  cuda_error = 3,
  timeout = 4,
  unknown_pointer = 5,  // foreign pointer, double free, or not the start of a block
  version_mismatch = 6,
  internal = 7,
};

const char* status_name(status s) noexcept;

// Formats into this thread's error buffer (truncates at 1 KiB; never allocates) and
// returns `s`, so that a failing path reads `return fail(status::..., "...", ...);`.
status fail(status s, const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));
// Appends to this thread's error buffer (truncating).
void append_error(const char* fmt, ...) noexcept __attribute__((format(printf, 1, 2)));
// The message of this thread's most recent failure ("" when none).
const char* last_error() noexcept;
void clear_last_error() noexcept;

// Thrown by constructors and other cold paths; never by alloc/free/stats.
class error : public std::runtime_error {
 public:
  error(status code, const char* what) : std::runtime_error(what), code_(code) {}
  status code() const noexcept { return code_; }

 private:
  status code_;
};

// Throws stash::error carrying this thread's current error text.
[[noreturn]] void throw_last_error(status s);

}  // namespace stash
