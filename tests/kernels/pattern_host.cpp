#include <cstring>

#include "pattern.h"

namespace stash::kernels {

// Bytes past the last whole word take the low bytes of the next pattern word, so a fill
// of any length is a prefix of a longer fill with the same seed.
void fill_pattern_host(void* dst, std::size_t bytes, std::uint64_t seed) {
  auto* out = static_cast<unsigned char*>(dst);
  const std::size_t words = bytes / 8;
  for (std::size_t i = 0; i < words; ++i) {
    const std::uint64_t w = pattern_word(seed, i);
    std::memcpy(out + 8 * i, &w, 8);
  }
  if (const std::size_t tail = bytes % 8) {
    const std::uint64_t w = pattern_word(seed, words);
    std::memcpy(out + 8 * words, &w, tail);
  }
}

// The tail is zero-extended to a word.
std::uint64_t checksum_host(const void* src, std::size_t bytes) {
  const auto* in = static_cast<const unsigned char*>(src);
  const std::size_t words = bytes / 8;
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < words; ++i) {
    std::uint64_t w;
    std::memcpy(&w, in + 8 * i, 8);
    sum += checksum_term(w, i);
  }
  if (const std::size_t tail = bytes % 8) {
    std::uint64_t w = 0;
    std::memcpy(&w, in + 8 * words, tail);
    sum += checksum_term(w, words);
  }
  return sum;
}

}  // namespace stash::kernels
