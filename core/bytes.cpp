// bytes.cpp: Note [One byte-count syntax] (bytes.h).
#include "core/bytes.h"

#include <cstdio>

#include "core/error.h"

namespace stash {

namespace {

// Fraction digits kept: 10^26 * 2^40 < 2^128 (Note [One byte-count syntax]).
constexpr int kept_fraction_digits = 26;

// The C locale's isspace, without reading the locale.
bool is_space(char c) noexcept {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}
bool is_digit(char c) noexcept { return c >= '0' && c <= '9'; }
char lower(char c) noexcept { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

// Case-insensitive equality of [s, end) with the lowercase literal `word`.
bool equals(const char* s, const char* end, const char* word) noexcept {
  for (; s < end && *word; ++s, ++word) {
    if (lower(*s) != *word) return false;
  }
  return s == end && *word == '\0';
}

bool unit_multiplier(const char* s, const char* end, std::uint64_t* mult) noexcept {
  struct unit {
    const char* name;
    std::uint64_t mult;
  };
  static constexpr unit units[] = {
      {"b", 1},
      {"kib", std::uint64_t{1} << 10}, {"mib", std::uint64_t{1} << 20},
      {"gib", std::uint64_t{1} << 30}, {"tib", std::uint64_t{1} << 40},
      {"kb", 1000ull}, {"mb", 1000000ull}, {"gb", 1000000000ull}, {"tb", 1000000000000ull},
  };
  for (const unit& u : units) {
    if (equals(s, end, u.name)) {
      *mult = u.mult;
      return true;
    }
  }
  return false;
}

byte_count failed(byte_count_error e) noexcept {
  byte_count r;
  r.error = e;
  return r;
}

}  // namespace

byte_count parse_byte_count(const char* text, std::size_t size) noexcept {
  if (text == nullptr) size = 0;
  const char* p = text;
  const char* const end = text + size;
  while (p < end && is_space(*p)) ++p;
  if (p == end || !is_digit(*p)) return failed(byte_count_error::no_number);
  std::uint64_t whole = 0;
  for (; p < end && is_digit(*p); ++p) {
    const std::uint64_t digit = static_cast<std::uint64_t>(*p - '0');
    if (whole > (UINT64_MAX - digit) / 10) return failed(byte_count_error::too_large);
    whole = whole * 10 + digit;
  }
  // The fraction is frac / scale in integers, so that decimal units come out exact.
  unsigned __int128 frac = 0, scale = 1;
  bool has_fraction = false;
  if (p < end && *p == '.') {
    has_fraction = true;
    ++p;
    if (p == end || !is_digit(*p)) return failed(byte_count_error::no_number);
    for (int kept = 0; p < end && is_digit(*p); ++p) {
      if (kept == kept_fraction_digits) continue;
      frac = frac * 10 + static_cast<unsigned>(*p - '0');
      scale *= 10;
      ++kept;
    }
  }
  while (p < end && is_space(*p)) ++p;
  const char* const unit_begin = p;
  while (p < end && !is_space(*p)) ++p;
  const char* const unit_end = p;
  while (p < end && is_space(*p)) ++p;
  if (p != end) return failed(byte_count_error::trailing_text);
  std::uint64_t mult = 1;
  if (unit_begin == unit_end) {
    if (has_fraction) return failed(byte_count_error::fraction_without_unit);
  } else if (!unit_multiplier(unit_begin, unit_end, &mult)) {
    byte_count r = failed(byte_count_error::unknown_unit);
    r.unit_offset = static_cast<std::size_t>(unit_begin - text);
    r.unit_size = static_cast<std::size_t>(unit_end - unit_begin);
    return r;
  }
  if (whole != 0 && mult > UINT64_MAX / whole) return failed(byte_count_error::too_large);
  const std::uint64_t bytes = whole * mult;
  // frac / scale < 1, so the part is below mult and fits in 64 bits.
  const auto part = static_cast<std::uint64_t>(frac * mult / scale);
  if (bytes > UINT64_MAX - part) return failed(byte_count_error::too_large);
  byte_count r;
  r.bytes = bytes + part;
  return r;
}

std::string byte_count_problem(const std::string& text, const byte_count& r) {
  switch (r.error) {
    case byte_count_error::none:
      return "";
    case byte_count_error::no_number:
      return "expected a number of bytes, e.g. 80GiB or 85.9GB";
    case byte_count_error::fraction_without_unit:
      return "a bare byte count must be an integer";
    case byte_count_error::unknown_unit:
      return "unknown unit \"" + text.substr(r.unit_offset, r.unit_size) +
             "\" (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)";
    case byte_count_error::trailing_text:
      return "trailing characters";
    case byte_count_error::too_large:
      return "too large (at most 2^64 - 1 bytes)";
  }
  return "not a byte count";
}

std::uint64_t parse_bytes(const std::string& text) {
  const byte_count r = parse_byte_count(text.data(), text.size());
  if (r.error != byte_count_error::none) {
    throw input_error("byte count \"" + text + "\": " + byte_count_problem(text, r));
  }
  return r.bytes;
}

std::string format_bytes(std::uint64_t bytes) {
  char buf[64];
  if (bytes >= (std::uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024 * 1024));
  } else if (bytes >= (std::uint64_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024));
  } else if (bytes >= 1024) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", static_cast<double>(bytes) / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  }
  return buf;
}

}  // namespace stash
