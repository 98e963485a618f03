// byte_count.h: options from environment variables, read without allocating.
//
// The preload library reads its options before main, possibly before the C++ runtime of
// the program is up, and from inside cudaMalloc, so nothing here allocates, throws or
// reads the locale. A byte count is stash's one syntax (Note [One byte-count syntax] in
// core/bytes.h: "123456", "8GiB", "1.5 GB"), parsed by core's allocation-free
// parse_byte_count; this file adds what getenv's answer needs, a NULL-terminated text that
// may be NULL.
#pragma once

#include <cstdint>

namespace stash::preload {

// true and *out on success; false (and *out untouched) for NULL or any text that is not a
// byte count.
bool parse_byte_count(const char* text, uint64_t* out) noexcept;

// "1", "true", "yes", "on" (case-insensitive): true; everything else, NULL included: false.
bool parse_flag(const char* text) noexcept;

}  // namespace stash::preload
