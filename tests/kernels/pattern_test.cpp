// The host reference of the fill/checksum pattern: the properties the round-trip tests
// rely on.
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "tests/kernels/pattern.h"

namespace k = stash::kernels;

TEST(Pattern, FillIsDeterministicAndSeeded) {
  std::vector<unsigned char> a(4099), b(4099), c(4099);
  k::fill_pattern_host(a.data(), a.size(), 7);
  k::fill_pattern_host(b.data(), b.size(), 7);
  k::fill_pattern_host(c.data(), c.size(), 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Pattern, ShorterFillIsAPrefix) {
  std::vector<unsigned char> a(1000), b(1003);
  k::fill_pattern_host(a.data(), a.size(), 3);
  k::fill_pattern_host(b.data(), b.size(), 3);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size()));
}

TEST(Pattern, ChecksumDetectsFlipsSwapsAndTails) {
  std::vector<unsigned char> buf(1 << 16 | 5);
  k::fill_pattern_host(buf.data(), buf.size(), 11);
  const auto base = k::checksum_host(buf.data(), buf.size());
  EXPECT_EQ(base, k::checksum_host(buf.data(), buf.size()));

  for (std::size_t at : {std::size_t{0}, std::size_t{12345}, buf.size() - 1}) {
    buf[at] ^= 0x10;
    EXPECT_NE(base, k::checksum_host(buf.data(), buf.size())) << "flip at " << at;
    buf[at] ^= 0x10;
  }
  // Two words trading places changes the sum: terms depend on the index.
  std::swap_ranges(buf.begin(), buf.begin() + 8, buf.begin() + 64);
  EXPECT_NE(base, k::checksum_host(buf.data(), buf.size()));
}

TEST(Pattern, EmptyChecksumIsZero) { EXPECT_EQ(0u, k::checksum_host(nullptr, 0)); }
