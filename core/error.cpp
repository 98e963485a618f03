// error.cpp: Note [One error model at the bottom] (error.h).
#include "core/error.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace stash {

namespace {
constexpr size_t error_capacity = 1024;
thread_local char error_text[error_capacity];
}  // namespace

const char* status_name(status s) noexcept {
  for (const status_entry& e : status_table)
    if (e.code == s) return e.text;
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
