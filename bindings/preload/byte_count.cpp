// byte_count.cpp: options from environment variables (byte_count.h).
#include "byte_count.h"

#include "core/bytes.h"

namespace stash::preload {

namespace {

char lower(char c) noexcept { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

// Case-insensitive equality of [s, end) with the lowercase literal `word`.
bool equals(const char* s, const char* end, const char* word) noexcept {
  for (; s < end && *word; ++s, ++word) {
    if (lower(*s) != *word) return false;
  }
  return s == end && *word == '\0';
}

}  // namespace

bool parse_byte_count(const char* text, uint64_t* out) noexcept {
  if (!text) return false;
  const char* end = text;
  while (*end) ++end;
  const byte_count r = stash::parse_byte_count(text, static_cast<std::size_t>(end - text));
  if (r.error != byte_count_error::none) return false;
  *out = r.bytes;
  return true;
}

bool parse_flag(const char* text) noexcept {
  if (!text) return false;
  const char* end = text;
  while (*end) ++end;
  return equals(text, end, "1") || equals(text, end, "true") || equals(text, end, "yes") ||
         equals(text, end, "on");
}

}  // namespace stash::preload
