// The preload library's options from the environment (bindings/preload/byte_count.h): byte
// counts in stash's one syntax (Note [One byte-count syntax] in core/bytes.h; the syntax's
// own test is tests/core/bytes_test.cpp), and NULL, as getenv answers for an unset name.
#include <gtest/gtest.h>

#include "byte_count.h"

using stash::preload::parse_byte_count;
using stash::preload::parse_flag;

namespace {

uint64_t parsed(const char* text) {
  uint64_t v = 12345;
  EXPECT_TRUE(parse_byte_count(text, &v)) << text;
  return v;
}

bool rejects(const char* text) {
  uint64_t v = 12345;
  return !parse_byte_count(text, &v) && v == 12345;  // and leaves *out alone
}

TEST(ByteCount, PlainIntegers) {
  EXPECT_EQ(parsed("0"), 0u);
  EXPECT_EQ(parsed("123456"), 123456u);
  EXPECT_EQ(parsed("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(parsed(" 42 "), 42u);
}

TEST(ByteCount, Units) {
  EXPECT_EQ(parsed("8GiB"), uint64_t{8} << 30);
  EXPECT_EQ(parsed("512MiB"), uint64_t{512} << 20);
  EXPECT_EQ(parsed("4 kib"), 4096u);
  EXPECT_EQ(parsed("2TiB"), uint64_t{2} << 40);
  EXPECT_EQ(parsed("10B"), 10u);
  EXPECT_EQ(parsed("3KB"), 3000u);
  EXPECT_EQ(parsed("85.9GB"), 85900000000u);
  EXPECT_EQ(parsed("0.1gb"), 100000000u);
  EXPECT_EQ(parsed("1.5KiB"), 1536u);
  EXPECT_EQ(parsed("1.5 TiB"), uint64_t{3} << 39);
}

TEST(ByteCount, Rejects) {
  EXPECT_FALSE(parse_byte_count(nullptr, nullptr));
  EXPECT_TRUE(rejects(""));
  EXPECT_TRUE(rejects("  "));
  EXPECT_TRUE(rejects("-1"));
  EXPECT_TRUE(rejects("+1"));
  EXPECT_TRUE(rejects("1.5"));  // a fraction of a byte
  EXPECT_TRUE(rejects("8 GiB x"));
  EXPECT_TRUE(rejects("8XB"));
  EXPECT_TRUE(rejects("8G"));  // the planner has no bare-letter units either
  EXPECT_TRUE(rejects("1."));
  EXPECT_TRUE(rejects(".5GiB"));
  EXPECT_TRUE(rejects("18446744073709551616"));
  EXPECT_TRUE(rejects("17179869184GiB"));  // 2^64 bytes
}

TEST(ByteCount, Flags) {
  EXPECT_TRUE(parse_flag("1"));
  EXPECT_TRUE(parse_flag("TRUE"));
  EXPECT_TRUE(parse_flag("yes"));
  EXPECT_TRUE(parse_flag("On"));
  EXPECT_FALSE(parse_flag(nullptr));
  EXPECT_FALSE(parse_flag(""));
  EXPECT_FALSE(parse_flag("0"));
  EXPECT_FALSE(parse_flag("no"));
  EXPECT_FALSE(parse_flag("10"));
}

}  // namespace
