// read_json_file / write_json_file: errors name the path; a failed write leaves nothing.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/json_file.h"

using stash::input_error;
using stash::read_json_file;
using stash::write_json_file;
using stash::write_text_file;

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

// A write that fails part-way (EFBIG under a file-size limit, SIGXFSZ ignored) leaves the
// file that was there whole, and no temporary beside it.
TEST(JsonFile, AWriteThatFailsPartWayKeepsTheOldFile) {
  const std::string p = temp_path("kept.json");
  write_json_file(p, {{"n", 1}});
  const std::string old = [&] {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  struct sigaction ignore {}, before {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &before), 0);
  struct rlimit small = saved;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string m;
  try {
    write_text_file(p, std::string(1 << 16, 'x'));
  } catch (const input_error& e) {
    m = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::sigaction(SIGXFSZ, &before, nullptr);
  EXPECT_EQ(m, p + ": write failed");
  EXPECT_EQ(1, read_json_file(p)["n"].get<int>());
  std::ifstream in(p);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), old);
  EXPECT_NE(0, ::access((p + ".tmp." + std::to_string(::getpid())).c_str(), F_OK));
  std::remove(p.c_str());
}
