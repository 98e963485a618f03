// Note [One byte-count syntax] (core/bytes.h): the one parser every C++ reader of a byte
// count calls, its messages, and format_bytes.
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "core/bytes.h"
#include "core/error.h"

using namespace stash;

namespace {

std::uint64_t bytes_of(const std::string& text) {
  const byte_count r = parse_byte_count(text.data(), text.size());
  EXPECT_EQ(r.error, byte_count_error::none) << text;
  return r.bytes;
}

byte_count_error error_of(const std::string& text) {
  return parse_byte_count(text.data(), text.size()).error;
}

TEST(ByteSyntax, IntegersAndUnits) {
  EXPECT_EQ(bytes_of("0"), 0u);
  EXPECT_EQ(bytes_of("123456"), 123456u);
  EXPECT_EQ(bytes_of("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(bytes_of("7B"), 7u);
  EXPECT_EQ(bytes_of("4KB"), 4000u);
  EXPECT_EQ(bytes_of("3 mb"), 3000000u);
  EXPECT_EQ(bytes_of("2GB"), 2000000000u);
  EXPECT_EQ(bytes_of("1TB"), 1000000000000u);
  EXPECT_EQ(bytes_of("4 kib"), 4096u);
  EXPECT_EQ(bytes_of("512MiB"), 512ull << 20);
  EXPECT_EQ(bytes_of("80GiB"), 80ull << 30);
  EXPECT_EQ(bytes_of("80 gib"), 80ull << 30);
  EXPECT_EQ(bytes_of("2TiB"), 2ull << 40);
}

TEST(ByteSyntax, SpaceAroundEveryPart) {
  EXPECT_EQ(bytes_of(" 42 "), 42u);
  EXPECT_EQ(bytes_of("\t8 GiB\n"), 8ull << 30);
  EXPECT_EQ(bytes_of("8\tGiB"), 8ull << 30);
}

// Fractions are exact in integers and truncated, never rounded up.
TEST(ByteSyntax, FractionsAreExactAndTruncated) {
  EXPECT_EQ(bytes_of("85.9GB"), 85900000000ull);
  EXPECT_EQ(bytes_of("0.1gb"), 100000000u);  // 0.1 has no exact double; the integers do
  EXPECT_EQ(bytes_of("1.5KiB"), 1536u);
  EXPECT_EQ(bytes_of("1.5 TiB"), 3ull << 39);
  EXPECT_EQ(bytes_of("1.0005KiB"), 1024u);  // 1024.512 bytes
  EXPECT_EQ(bytes_of("1.999KB"), 1999u);
  EXPECT_EQ(bytes_of("0.9999B"), 0u);
  // 2^-30 GiB is one byte: 0.000000000931322574615478515625 (30 digits) is exact, and
  // the first 26 of them (0.00000000093132257461547851) come to 0.99999999... bytes.
  EXPECT_EQ(bytes_of("0.00000000093132257461547851GiB"), 0u);
  EXPECT_EQ(bytes_of("0.00000000093132257461547852GiB"), 1u);
  // 1 - 10^-26 of a TiB: the 26 digits are all kept, so the count stays below 2^40.
  EXPECT_EQ(bytes_of("0.99999999999999999999999999TiB"), (1ull << 40) - 1);
}

TEST(ByteSyntax, Rejects) {
  for (const char* text : {"", "  ", "-1", "+1", "GiB", ".5GiB", "1.", "1.GiB", "1..5GB", "abc"})
    EXPECT_EQ(error_of(text), byte_count_error::no_number) << text;
  EXPECT_EQ(error_of("1.5"), byte_count_error::fraction_without_unit);
  for (const char* text : {"12XB", "8G", "8 GiBs", "1e3", "0x10"})
    EXPECT_EQ(error_of(text), byte_count_error::unknown_unit) << text;
  EXPECT_EQ(error_of("8 GiB x"), byte_count_error::trailing_text);
  EXPECT_EQ(error_of("80GiB extra"), byte_count_error::trailing_text);
  EXPECT_EQ(error_of("18446744073709551616"), byte_count_error::too_large);
  EXPECT_EQ(error_of("17179869184GiB"), byte_count_error::too_large);  // 2^64 bytes
  EXPECT_EQ(error_of("18446744073709551615.5KB"), byte_count_error::too_large);
  EXPECT_EQ(parse_byte_count(nullptr, 0).error, byte_count_error::no_number);
  // The size bounds the text: what follows it is not read.
  EXPECT_EQ(parse_byte_count("12GiB", 2).bytes, 12u);
}

TEST(ByteSyntax, MessagesNameTheTextAndTheUnit) {
  const std::string text = "  12XB ";
  const byte_count r = parse_byte_count(text.data(), text.size());
  EXPECT_EQ(text.substr(r.unit_offset, r.unit_size), "XB");
  EXPECT_EQ(byte_count_problem(text, r),
            "unknown unit \"XB\" (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)");
  try {
    parse_bytes("12XB");
    ADD_FAILURE() << "12XB accepted";
  } catch (const input_error& e) {
    EXPECT_EQ(std::string(e.what()),
              "byte count \"12XB\": unknown unit \"XB\" (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)");
    EXPECT_EQ(e.code(), status::invalid_argument);
  }
  EXPECT_EQ(parse_bytes("85.9GB"), 85900000000ull);
  for (const char* bad : {"", "GiB", "-5GB", "12XB", "1.5", "80GiB extra", "1..5GB", "abc"})
    EXPECT_THROW(parse_bytes(bad), input_error) << bad;
}

TEST(ByteSyntax, FormatBytes) {
  EXPECT_EQ(format_bytes(80ull << 30), "80.00 GiB");
  EXPECT_EQ(format_bytes(3ull << 20), "3.00 MiB");
  EXPECT_EQ(format_bytes(2048), "2.00 KiB");
  EXPECT_EQ(format_bytes(17), "17 B");
}

}  // namespace
