// Note [The status table] (core/error.h): the one table of status codes against the C
// header's enum. bindings/api_boundary.h static_asserts every row against the header; this
// reads the header's enum and requires every enumerator to be a row (so a code added to
// stash.h alone fails here), and checks stash_status_string() answers with the row's text.
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "stash.h"
#include "test_paths.h"

namespace {

std::map<std::string, int> header_enum() {
  std::ifstream in(STASH_TEST_PATH(STASH_HEADER));
  std::stringstream all;
  all << in.rdbuf();
  const std::string text = all.str();
  const size_t begin = text.find("typedef enum stash_status_t {");
  const size_t end = text.find("} stash_status_t;", begin);
  EXPECT_NE(begin, std::string::npos);
  EXPECT_NE(end, std::string::npos);
  const std::string body = text.substr(begin, end - begin);
  std::map<std::string, int> out;
  const std::regex row(R"((STASH_(?:OK|ERROR_[A-Z_]+))\s*=\s*(\d+))");
  for (auto it = std::sregex_iterator(body.begin(), body.end(), row); it != std::sregex_iterator();
       ++it)
    out[(*it)[1]] = std::stoi((*it)[2]);
  return out;
}

TEST(StatusTable, EveryHeaderCodeIsARowWithItsNumber) {
  const std::map<std::string, int> header = header_enum();
  ASSERT_FALSE(header.empty());
  std::map<std::string, int> table;
  for (const stash::status_entry& e : stash::status_table)
    table[e.c_name] = static_cast<int>(e.code);
  EXPECT_EQ(header, table);
}

TEST(StatusTable, StatusStringIsTheRowsText) {
  for (const stash::status_entry& e : stash::status_table) {
    EXPECT_STREQ(stash_status_string(static_cast<stash_status_t>(e.code)), e.text) << e.c_name;
    EXPECT_STREQ(stash::status_name(e.code), e.text) << e.c_name;
  }
  EXPECT_STREQ(stash_status_string(static_cast<stash_status_t>(99)), "unknown status");
}

}  // namespace
