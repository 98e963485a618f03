// The shared struct_size/version check (bindings/struct_version.h) on a struct that grew:
// what no public struct can show yet, since every config is still as it first shipped.
// A caller built against the older layout gets the newer field's default.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "core/error.h"
#include "struct_version.h"

namespace {

// "Version 1" ended after a; b came in "version 2".
struct grown_config {
  std::size_t struct_size;
  unsigned version;
  int a;
  double b;
};

}  // namespace

template <>
struct stash::api::struct_version<grown_config> {
  static constexpr const char* name = "grown_config";
  static constexpr const char* init = "grown_config_init";
  static constexpr std::size_t min_size = STASH_END_OF(grown_config, a);
  static constexpr unsigned version = 2;
  static void defaults(grown_config* c) noexcept { *c = grown_config{sizeof *c, 2, 10, 2.5}; }
};

namespace {

using stash::status;
using stash::api::read_config;

TEST(StructVersion, AnOlderLayoutKeepsTheNewerFieldsDefaults) {
  // The older caller's struct ends after a; what follows in memory is not its.
  grown_config given{};
  given.struct_size = STASH_END_OF(grown_config, a);
  given.version = 1;
  given.a = 7;
  given.b = -1;  // beyond the caller's struct_size: must not be read
  grown_config out{};
  ASSERT_EQ(read_config("f", "config", &given, &out), status::ok) << stash::last_error();
  EXPECT_EQ(out.a, 7);
  EXPECT_EQ(out.b, 2.5);
  EXPECT_EQ(out.struct_size, sizeof out);

  given.struct_size = sizeof given;
  given.version = 2;
  ASSERT_EQ(read_config("f", "config", &given, &out), status::ok);
  EXPECT_EQ(out.b, -1);

  ASSERT_EQ(read_config<grown_config>("f", "config", nullptr, &out), status::ok);
  EXPECT_EQ(out.a, 10);
  EXPECT_EQ(out.b, 2.5);
}

TEST(StructVersion, UnknownSizesAndVersionsAreRefusedWithTheRange) {
  grown_config given{sizeof(grown_config), 2, 1, 1};
  grown_config out{};
  const std::string range = std::to_string(STASH_END_OF(grown_config, a)) + ".." +
                            std::to_string(sizeof(grown_config));
  given.struct_size = STASH_END_OF(grown_config, a) - 1;
  EXPECT_EQ(read_config("f", "config", &given, &out), status::version_mismatch);
  EXPECT_EQ(std::string(stash::last_error()),
            "f: config->struct_size is " + std::to_string(given.struct_size) +
                ", too small for any grown_config; stash " STASH_VERSION_STRING
                " takes struct_size " + range + " (fill it with grown_config_init)");
  given.struct_size = sizeof given + 1;
  EXPECT_EQ(read_config("f", "config", &given, &out), status::version_mismatch);
  EXPECT_NE(std::string(stash::last_error()).find("larger than"), std::string::npos);
  EXPECT_NE(std::string(stash::last_error()).find(range), std::string::npos);
  given.struct_size = sizeof given;
  given.version = 3;
  EXPECT_EQ(read_config("f", "config", &given, &out), status::version_mismatch);
  EXPECT_EQ(std::string(stash::last_error()),
            "f: config->version is 3, unknown to stash " STASH_VERSION_STRING
            ", which takes grown_config version 1..2 (fill it with grown_config_init)");
  given.version = 0;
  EXPECT_EQ(read_config("f", "config", &given, &out), status::version_mismatch);
}

}  // namespace
