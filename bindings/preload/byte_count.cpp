#include "byte_count.h"

#include <cmath>

namespace stash::preload {

namespace {

char lower(char c) noexcept { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

// Case-insensitive equality of [s, end) with the literal `word`.
bool equals(const char* s, const char* end, const char* word) noexcept {
  for (; s < end && *word; ++s, ++word) {
    if (lower(*s) != *word) return false;
  }
  return s == end && *word == '\0';
}

bool unit_multiplier(const char* s, const char* end, uint64_t* mult) noexcept {
  struct unit {
    const char* name;
    uint64_t mult;
  };
  static constexpr unit units[] = {
      {"b", 1},
      {"kib", uint64_t{1} << 10}, {"mib", uint64_t{1} << 20},
      {"gib", uint64_t{1} << 30}, {"tib", uint64_t{1} << 40},
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

}  // namespace

bool parse_byte_count(const char* text, uint64_t* out) noexcept {
  if (!text) return false;
  const char* p = text;
  while (*p == ' ' || *p == '\t') ++p;
  if (*p < '0' || *p > '9') return false;  // no sign, no empty text
  uint64_t whole = 0;
  for (; *p >= '0' && *p <= '9'; ++p) {
    const uint64_t digit = static_cast<uint64_t>(*p - '0');
    if (whole > (UINT64_MAX - digit) / 10) return false;
    whole = whole * 10 + digit;
  }
  // The fraction is kept as digits/scale in integers, so "0.1GB" is exactly 100000000.
  uint64_t frac = 0, scale = 1;
  bool has_fraction = false;
  if (*p == '.') {
    has_fraction = true;
    ++p;
    if (*p < '0' || *p > '9') return false;
    for (; *p >= '0' && *p <= '9'; ++p) {
      if (scale >= 1000000000000ull) continue;  // further digits cannot matter to bytes
      frac = frac * 10 + static_cast<uint64_t>(*p - '0');
      scale *= 10;
    }
  }
  while (*p == ' ' || *p == '\t') ++p;
  const char* unit_begin = p;
  while (*p && *p != ' ' && *p != '\t') ++p;
  const char* unit_end = p;
  while (*p == ' ' || *p == '\t') ++p;
  if (*p) return false;  // trailing garbage after the unit
  uint64_t mult = 1;
  if (unit_begin == unit_end) {
    if (has_fraction) return false;  // "1.5" bytes is not a byte count
  } else if (!unit_multiplier(unit_begin, unit_end, &mult)) {
    return false;
  }
  if (whole != 0 && mult > UINT64_MAX / whole) return false;
  uint64_t bytes = whole * mult;
  if (frac != 0) {
    // frac/scale < 1, so frac * (mult / scale) fits; split to keep it exact when scale
    // divides mult (decimal units) and within one byte otherwise.
    const long double part = static_cast<long double>(frac) * static_cast<long double>(mult) /
                             static_cast<long double>(scale);
    const uint64_t add = static_cast<uint64_t>(std::floor(part + 1e-9L));
    if (bytes > UINT64_MAX - add) return false;
    bytes += add;
  }
  *out = bytes;
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
