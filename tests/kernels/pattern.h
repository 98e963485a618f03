// pattern.h: the byte pattern that the fill kernel writes and the checksum kernel folds,
// as element functions shared by host and device code. The host versions are the
// reference that tests compare GPU results against, and they let offload round-trip tests
// on a CPU machine use the very same pattern.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/hd.h"

namespace stash::kernels {

// SplitMix64 finaliser: a bijection, so distinct (seed, word index) give distinct words.
STASH_HD std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The 64-bit word at word index i of a buffer filled with `seed`.
STASH_HD std::uint64_t pattern_word(std::uint64_t seed, std::uint64_t i) {
  return mix64(seed * 0xD1B54A32D192ED03ull + i);
}

// One word's contribution to a checksum. Contributions are summed mod 2^64, so the
// checksum is independent of reduction order (deterministic under atomics) while still
// sensitive to a word moving to another index.
STASH_HD std::uint64_t checksum_term(std::uint64_t word, std::uint64_t i) {
  return mix64(word ^ mix64(i));
}

// Host reference implementations.
void fill_pattern_host(void* dst, std::size_t bytes, std::uint64_t seed);
std::uint64_t checksum_host(const void* src, std::size_t bytes);

}  // namespace stash::kernels
