// parse_budget: bytes with units, or a share of the keep-all peak (the syntax alone:
// tests/core/budget_test.cpp).
#include <gtest/gtest.h>

#include "plan_fixtures.h"
#include "planner/solvers/planner.h"

using namespace stash::planner;
using stash::input_error;

TEST(ParseBudget, BytesAndUnitsPassThrough) {
  const step_profile p = stash::planner::testing::llama_like(4, 1);
  EXPECT_EQ(80ull << 30, parse_budget("80GiB", p));
  EXPECT_EQ(123456u, parse_budget("123456", p));
}

TEST(ParseBudget, PercentIsShareOfKeepAllPeak) {
  const step_profile p = stash::planner::testing::llama_like(4, 1);
  const std::uint64_t peak = evaluate(p, keep_all(p), UINT64_MAX).peak_bytes;
  EXPECT_EQ(peak, parse_budget("100%", p));
  EXPECT_EQ(static_cast<std::uint64_t>(static_cast<long double>(peak) * 0.7L),
            parse_budget("70%", p));
  EXPECT_EQ(parse_budget("70%", p), parse_budget("70 %", p));
  EXPECT_LT(parse_budget("55%", p), parse_budget("70%", p));
}

TEST(ParseBudget, BadPercentNamesTheText) {
  const step_profile p = stash::planner::testing::llama_like(2, 1);
  for (const char* bad : {"%", "0%", "-5%", "abc%", "70x%", "2000%"}) {
    try {
      parse_budget(bad, p);
      ADD_FAILURE() << bad << " accepted";
    } catch (const input_error& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}
