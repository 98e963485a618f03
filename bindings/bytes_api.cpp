// Byte counts through the C API (stash.h, "Byte counts"): Note [One byte-count syntax]
// (core/bytes.h), so that no binding keeps a parser of its own.
#include <cstdint>
#include <cstring>
#include <string>

#include "api_boundary.h"
#include "core/bytes.h"

using namespace stash;
using stash::api::api_call;

extern "C" {

STASH_API stash_status_t stash_parse_bytes(const char* text, uint64_t* bytes) {
  static const char* fn = "stash_parse_bytes";
  return api_call(fn, [&]() -> status {
    if (bytes) *bytes = 0;
    if (!text || !bytes) {
      return fail(status::invalid_argument, "%s: %s is NULL", fn, !text ? "text" : "bytes");
    }
    const byte_count r = parse_byte_count(text, std::strlen(text));
    if (r.error != byte_count_error::none) {
      const std::string s(text);
      return fail(status::invalid_argument, "%s: byte count \"%s\": %s", fn, s.c_str(),
                  byte_count_problem(s, r).c_str());
    }
    *bytes = r.bytes;
    return status::ok;
  });
}

STASH_API stash_status_t stash_format_bytes(uint64_t bytes, char* buf, size_t size) {
  static const char* fn = "stash_format_bytes";
  return api_call(fn, [&]() -> status {
    if (!buf) return fail(status::invalid_argument, "%s: buf is NULL", fn);
    const std::string text = format_bytes(bytes);
    static_assert(STASH_FORMAT_BYTES_SIZE > sizeof "17179869184.00 GiB");
    if (text.size() >= size) {
      if (size > 0) buf[0] = '\0';
      return fail(status::invalid_argument, "%s: \"%s\" needs %zu bytes, buf has %zu", fn,
                  text.c_str(), text.size() + 1, size);
    }
    std::memcpy(buf, text.c_str(), text.size() + 1);
    return status::ok;
  });
}

}  // extern "C"
