// read_json_file / write_json_file: errors name the path; a failed write leaves nothing.
#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <unistd.h>

#include "core/json_file.h"

using stash::input_error;
using stash::read_json_file;
using stash::write_json_file;

namespace {
std::string temp_path(const char* name) {
  return ::testing::TempDir() + "stash_json_file_" + std::to_string(::getpid()) + "_" + name;
}
std::string error_of(void (*f)(const std::string&), const std::string& path) {
  try {
    f(path);
  } catch (const input_error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(JsonFile, WriteThenReadRoundTrips) {
  const std::string p = temp_path("ok.json");
  write_json_file(p, {{"schema", "x"}, {"n", 3}});
  EXPECT_EQ(3, read_json_file(p)["n"].get<int>());
  write_json_file(p, {{"n", 4}});  // replaces in place
  EXPECT_EQ(4, read_json_file(p)["n"].get<int>());
  std::remove(p.c_str());
}

TEST(JsonFile, ReadErrorsNameThePath) {
  const std::string missing = temp_path("missing.json");
  const std::string m = error_of([](const std::string& p) { read_json_file(p); }, missing);
  EXPECT_NE(m.find(missing + ": cannot open"), std::string::npos) << m;

  const std::string bad = temp_path("bad.json");
  std::ofstream(bad) << "{\"a\": [1, 2,\n";
  const std::string b = error_of([](const std::string& p) { read_json_file(p); }, bad);
  EXPECT_NE(b.find(bad + ": not valid JSON"), std::string::npos) << b;
  EXPECT_NE(b.find("line"), std::string::npos) << b;
  std::remove(bad.c_str());
}

TEST(JsonFile, FailedWriteNamesPathAndLeavesNoFile) {
  const std::string p = temp_path("no/such/dir/plan.json");
  const std::string m =
      error_of([](const std::string& q) { write_json_file(q, {{"a", 1}}); }, p);
  EXPECT_NE(m.find(p + ": cannot write"), std::string::npos) << m;
  EXPECT_NE(0, ::access(p.c_str(), F_OK));
}
