// Property test over 1,000 random profiles: greedy and ilp never emit an invalid plan, and
// no plan's step time falls below its lower_bound_ms. Their step time against exact is
// printed as a summary line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "plan_fixtures.h"
#include "planner/solvers/planner.h"

using namespace stash::planner;
using namespace stash::planner::testing;

TEST(Property, ValidPlansAboveTheBoundOnRandomProfiles) {
  std::mt19937 rng(1000003);
  int plans = 0, infeasible = 0, proved = 0;
  double worst[2] = {1, 1}, sum[2] = {0, 0};
  int within[2] = {0, 0};
  for (int k = 0; k < 1000; ++k) {
    const step_profile p = random_profile(rng, 5, 5);
    const std::uint64_t hi = evaluate(p, keep_all(p), UINT64_MAX).peak_bytes;
    bool min_proved = true;
    const std::uint64_t lo = min_feasible_budget(p, &min_proved);
    ASSERT_LE(lo, hi);
    // One budget in ten just under the smallest: it must be refused, never "planned".
    const bool below = k % 10 == 9 && lo > p.fixed_bytes;
    const std::uint64_t budget =
        below ? lo - 1
              : lo + static_cast<std::uint64_t>(static_cast<double>(hi - lo) *
                                                std::uniform_real_distribution<double>(0, 1)(rng));
    double exact_step = 0;
    bool exact_proved = false;
    for (solver_kind s : {solver_kind::exact, solver_kind::greedy, solver_kind::ilp}) {
      plan_options opt;
      opt.solver = s;
      opt.time_limit_s = 10;
      step_plan plan;
      try {
        plan = make_plan(p, budget, opt);
      } catch (const infeasible_budget& e) {
        EXPECT_TRUE(below) << "case " << k << " " << to_string(s) << ": " << e.what();
        EXPECT_GT(e.min_feasible_bytes(), budget);
        if (s == solver_kind::exact) ++infeasible;
        continue;
      }
      ++plans;
      EXPECT_FALSE(below && min_proved) << "case " << k << ": planned under the least peak";
      const evaluation ev = evaluate(p, plan.decisions(), budget);
      ASSERT_TRUE(ev.valid) << "case " << k << " " << to_string(s) << ": "
                            << ev.violations.front();
      EXPECT_NEAR(ev.step_ms, plan.predicted.step_ms, 1e-12);
      EXPECT_GE(plan.predicted.step_ms,
                plan.predicted.lower_bound_ms * (1 - 1e-9) - 1e-9)
          << "case " << k << " " << to_string(s);
      if (s == solver_kind::exact) {
        exact_step = plan.predicted.step_ms;
        exact_proved = plan.proved_optimal;
        proved += exact_proved;
        continue;
      }
      if (!exact_proved) continue;
      const int w = s == solver_kind::greedy ? 0 : 1;
      const double ratio = plan.predicted.step_ms / exact_step;
      EXPECT_GE(ratio, 1 - 1e-9) << "case " << k << ": beat a proved optimum";
      worst[w] = std::max(worst[w], ratio);
      sum[w] += ratio;
      within[w] += ratio <= 1 + 1e-9;
    }
  }
  EXPECT_GT(infeasible, 50);
  std::printf("[property] 1000 profiles, %d plans, %d infeasible refusals, exact proved %d; "
              "vs exact: greedy mean %.5f worst %.5f optimal in %d; ilp mean %.5f worst %.5f "
              "optimal in %d\n",
              plans, infeasible, proved, sum[0] / std::max(proved, 1), worst[0], within[0],
              sum[1] / std::max(proved, 1), worst[1], within[1]);
}
