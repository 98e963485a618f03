// Byte counts through the C API (stash.h, "Byte counts"): the answers of core/bytes.h,
// statuses and messages for every failure, NULL arguments.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "core/bytes.h"
#include "stash.h"

namespace {

std::string last_error() { return stash_last_error(); }

TEST(CApiBytes, ParsesTheOneSyntax) {
  struct example {
    const char* text;
    std::uint64_t bytes;
  };
  const example examples[] = {
      {"0", 0},
      {"123456", 123456},
      {"8GiB", std::uint64_t{8} << 30},
      {" 1.5 tib ", std::uint64_t{3} << 39},
      {"85.9GB", 85900000000ull},
      {"0.1GB", 100000000ull},
      {"1.0005KiB", 1024},
      {"18446744073709551615", UINT64_MAX},
  };
  for (const example& e : examples) {
    std::uint64_t out = 7;
    EXPECT_EQ(stash_parse_bytes(e.text, &out), STASH_OK) << e.text;
    EXPECT_EQ(out, e.bytes) << e.text;
    // The same answer as the C++ parser the planner and the CLI use.
    EXPECT_EQ(out, stash::parse_byte_count(e.text, std::strlen(e.text)).bytes) << e.text;
  }
}

TEST(CApiBytes, BadTextIsAnInvalidArgumentThatSaysWhy) {
  struct example {
    const char* text;
    const char* problem;
  };
  const example examples[] = {
      {"", "expected a number of bytes"},
      {"-1", "expected a number of bytes"},
      {"GiB", "expected a number of bytes"},
      {"1.5", "a bare byte count must be an integer"},
      {"8G", "unknown unit \"G\" (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)"},
      {"8 GiB x", "trailing characters"},
      {"18446744073709551616", "too large"},
      {"16777216TiB", "too large"},
  };
  for (const example& e : examples) {
    std::uint64_t out = 7;
    EXPECT_EQ(stash_parse_bytes(e.text, &out), STASH_ERROR_INVALID_ARGUMENT) << e.text;
    EXPECT_EQ(out, 0u) << e.text;
    const std::string want = std::string("stash_parse_bytes: byte count \"") + e.text + "\": ";
    EXPECT_EQ(last_error().rfind(want, 0), 0u) << last_error();
    EXPECT_NE(last_error().find(e.problem), std::string::npos) << last_error();
  }
}

TEST(CApiBytes, NullArgumentsAreErrorsNotCrashes) {
  std::uint64_t out = 7;
  EXPECT_EQ(stash_parse_bytes(nullptr, &out), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, 0u);
  EXPECT_EQ(last_error(), "stash_parse_bytes: text is NULL");
  EXPECT_EQ(stash_parse_bytes("8GiB", nullptr), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(last_error(), "stash_parse_bytes: bytes is NULL");
  EXPECT_EQ(stash_format_bytes(1, nullptr, 8), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(last_error(), "stash_format_bytes: buf is NULL");
}

TEST(CApiBytes, FormatsAsTheMessagesDo) {
  const std::uint64_t counts[] = {0, 17, 1023, 1536, std::uint64_t{80} << 30, UINT64_MAX};
  for (std::uint64_t n : counts) {
    char buf[STASH_FORMAT_BYTES_SIZE];
    ASSERT_EQ(stash_format_bytes(n, buf, sizeof buf), STASH_OK) << n;
    EXPECT_EQ(std::string(buf), stash::format_bytes(n));
  }
  char buf[STASH_FORMAT_BYTES_SIZE];
  ASSERT_EQ(stash_format_bytes(std::uint64_t{80} << 30, buf, sizeof buf), STASH_OK);
  EXPECT_STREQ(buf, "80.00 GiB");
  ASSERT_EQ(stash_format_bytes(17, buf, sizeof buf), STASH_OK);
  EXPECT_STREQ(buf, "17 B");
}

TEST(CApiBytes, FormatRefusesABufferTooSmall) {
  char buf[9] = "xxxxxxxx";
  EXPECT_EQ(stash_format_bytes(std::uint64_t{80} << 30, buf, 9), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(buf, "");
  EXPECT_EQ(last_error(), "stash_format_bytes: \"80.00 GiB\" needs 10 bytes, buf has 9");
  EXPECT_EQ(stash_format_bytes(17, buf, 0), STASH_ERROR_INVALID_ARGUMENT);
  char exact[10];
  EXPECT_EQ(stash_format_bytes(std::uint64_t{80} << 30, exact, sizeof exact), STASH_OK);
  EXPECT_STREQ(exact, "80.00 GiB");
}

}  // namespace
