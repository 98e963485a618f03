// bytes.h: byte counts as users write them ("80GiB", "85.9GB", "123456") and as stash
// prints them ("80.00 GiB").
//
// Note [One byte-count syntax]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every C++ reader of a byte count calls parse_byte_count: budgets (core/budget.h, hence
// the planner, the CLI and the C API's budget parsing), the CLI's size options
// (parse_bytes), the preload library's environment options and the PyTorch allocator's
// (bindings/preload/byte_count.h), and the C API's stash_parse_bytes (bindings/bytes_api.cpp),
// which Python's stash.parse_bytes calls: no binding keeps a parser of its own. The text is:
//   [space] digits [ "." digits ] [space] [unit] [space]
// where space is any run of " \t\n\v\f\r" and the unit is B, KB, MB, GB, TB (powers of
// 1000) or KiB, MiB, GiB, TiB (powers of 1024), in any case. No sign, no leading or
// trailing ".", no exponent, no bare-letter units ("8G"). A fraction needs a unit ("1.5"
// bytes is not a count). The value is truncated to whole bytes, never rounded up, so a
// budget is never more than its text says ("1.0005KiB" is 1024). The fraction is kept in
// integers, not a float: "0.1GB" is exactly 100000000, and any fraction of up to 26 digits
// is exact (26 digits times 2^40 fit in 128 bits; later digits are ignored, and move a
// result by at most one byte, only in made-up cases). The largest count is 2^64 - 1.
//
// parse_byte_count neither allocates nor throws nor reads the locale: the preload library
// parses its options before main and from inside cudaMalloc (mimalloc's rule for options
// read from the environment). The messages for a bad count are made apart, on the cold
// path (byte_count_problem).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace stash {

enum class byte_count_error {
  none,
  no_number,              // empty, a sign, ".5", "1.", a letter first
  fraction_without_unit,  // "1.5"
  unknown_unit,           // "12XB", "8G"
  trailing_text,          // "8 GiB x"
  too_large,              // 2^64 bytes or more
};

struct byte_count {
  std::uint64_t bytes = 0;  // meaningful only when error is none
  byte_count_error error = byte_count_error::none;
  // Where the unit lies in the text (offset, length), for the message of unknown_unit.
  std::size_t unit_offset = 0, unit_size = 0;
};

// Parses [text, text + size) (Note [One byte-count syntax]). text may be NULL when size is 0.
byte_count parse_byte_count(const char* text, std::size_t size) noexcept;

// What is wrong with `text`, whose parse is `r` (r.error != none), in words, without the
// text itself: "unknown unit \"XB\" (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)".
std::string byte_count_problem(const std::string& text, const byte_count& r);

// parse_byte_count on the cold path: the count, or input_error
// "byte count \"<text>\": <byte_count_problem>". The CLI's size options take it.
std::uint64_t parse_bytes(const std::string& text);

// "80.00 GiB"-style rendering for messages: two decimals in the largest binary unit that
// the count reaches, whole bytes below 1 KiB ("17 B").
std::string format_bytes(std::uint64_t bytes);

}  // namespace stash
