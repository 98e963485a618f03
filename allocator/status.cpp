#include "status.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace stash {

namespace {
constexpr size_t error_capacity = 1024;
thread_local char error_text[error_capacity];
}  // namespace

const char* status_name(status s) noexcept {
  switch (s) {
    case status::ok: return "ok";
    case status::invalid_argument: return "invalid argument";
    case status::out_of_memory: return "out of memory";
    case status::cuda_error: return "CUDA error";
    case status::timeout: return "timed out";
    case status::unknown_pointer: return "unknown pointer";
    case status::version_mismatch: return "version mismatch";
    case status::internal: return "internal error";
  }
  return "unknown status";
}

status fail(status s, const char* fmt, ...) noexcept {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(error_text, error_capacity, fmt, ap);
  va_end(ap);
  return s;
}

void append_error(const char* fmt, ...) noexcept {
  const size_t used = std::strlen(error_text);
  if (used + 1 >= error_capacity) return;
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(error_text + used, error_capacity - used, fmt, ap);
  va_end(ap);
}

const char* last_error() noexcept { return error_text; }
void clear_last_error() noexcept { error_text[0] = '\0'; }

void throw_last_error(status s) { throw error(s, error_text); }

}  // namespace stash
