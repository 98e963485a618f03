// byte_count.h: parses byte counts from environment variables without allocating.
//
// The preload library reads its options before main, possibly before the C++ runtime of
// the program is up, and from inside cudaMalloc; the planner's parse_bytes builds
// std::strings and throws, so this is a separate, allocation-free parser that accepts the
// same language: a bare integer ("123456") or a number with a unit, binary (KiB MiB GiB
// TiB) or decimal (B KB MB GB TB), case-insensitive, optional space: "8GiB", "1.5 GB".
#pragma once

#include <cstdint>

namespace stash::preload {

// true and *out on success; false (and *out untouched) for NULL, empty, negative,
// malformed or overflowing text. Fractions are allowed only with a unit, and the result
// is truncated to whole bytes ("1.5KiB" = 1536).
bool parse_byte_count(const char* text, uint64_t* out) noexcept;

// "1", "true", "yes", "on" (case-insensitive): true; everything else, NULL included: false.
bool parse_flag(const char* text) noexcept;

}  // namespace stash::preload
