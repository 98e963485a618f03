// parse_budget_spec (core/budget.h): a budget's syntax, a byte count or a share; what a
// share comes to is the planner's (tests/planner/budget_test.cpp).
#include <string>

#include <gtest/gtest.h>

#include "core/budget.h"
#include "core/error.h"

using namespace stash;

namespace {

TEST(BudgetSpec, ByteCountsAreBytes) {
  const budget_spec b = parse_budget_spec("80GiB");
  EXPECT_FALSE(b.is_share);
  EXPECT_EQ(b.bytes, 80ull << 30);
  EXPECT_EQ(parse_budget_spec("123456").bytes, 123456u);
  EXPECT_EQ(parse_budget_spec("85.9GB").bytes, 85900000000ull);
}

TEST(BudgetSpec, SharesArePercent) {
  const budget_spec b = parse_budget_spec("70%");
  EXPECT_TRUE(b.is_share);
  EXPECT_DOUBLE_EQ(b.percent, 70.0);
  EXPECT_DOUBLE_EQ(parse_budget_spec(" 70 % ").percent, 70.0);
  EXPECT_DOUBLE_EQ(parse_budget_spec("12.5%").percent, 12.5);
  EXPECT_DOUBLE_EQ(parse_budget_spec("1000%").percent, 1000.0);
}

TEST(BudgetSpec, ErrorsNameTheTextAndWhatIsWrong) {
  const auto message = [](const std::string& text) -> std::string {
    try {
      parse_budget_spec(text);
    } catch (const input_error& e) {
      return e.what();
    }
    return "accepted";
  };
  for (const char* bad : {"%", "0%", "-5%", "abc%", "70x%", "2000%"}) {
    EXPECT_EQ(message(bad), std::string("budget \"") + bad +
                                "\": expected a share of the keep-all peak in (0, 1000]%, e.g. 70%");
  }
  EXPECT_EQ(message("12XB"),
            "budget \"12XB\": unknown unit \"XB\" (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)");
  EXPECT_EQ(message(""), "budget \"\": expected a number of bytes, e.g. 80GiB or 85.9GB");
  EXPECT_EQ(message("1.5"), "budget \"1.5\": a bare byte count must be an integer");
}

}  // namespace
