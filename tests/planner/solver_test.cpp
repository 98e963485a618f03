// Solvers: exact against brute force, the LP bound, infeasibility, plan JSON.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "plan_fixtures.h"
#include "planner/solvers/exact_mip.h"
#include "planner/solvers/outer_lp.h"
#include "planner/solvers/pareto.h"
#include "planner/solvers/planner.h"

using namespace stash::planner;
using stash::input_error;
using namespace stash::planner::testing;

namespace {

std::uint64_t keep_all_peak(const step_profile& p) {
  return evaluate(p, keep_all(p), UINT64_MAX).peak_bytes;
}

plan_options with(solver_kind s) {
  plan_options o;
  o.solver = s;
  o.time_limit_s = 20;
  return o;
}

}  // namespace

// 3^n enumeration on instances of at most 9 tensors: exact must find the same step time,
// and an infeasible budget must report the brute-force least peak as the smallest budget.
TEST(Exact, EqualsBruteForceOptimum) {
  std::mt19937 rng(20260601);
  int feasible = 0, infeasible = 0;
  for (int k = 0; k < 120; ++k) {
    const step_profile p = random_profile(rng, 3, 3);
    const std::uint64_t hi = keep_all_peak(p);
    const std::uint64_t lo = brute_force(p, UINT64_MAX).min_peak;
    // Mostly budgets between the least and the keep-all peak; some just below the least.
    const double f = std::uniform_real_distribution<double>(-0.15, 1.0)(rng);
    std::uint64_t budget =
        f < 0 ? lo - std::min<std::uint64_t>(lo - p.fixed_bytes, 1 + static_cast<std::uint64_t>(-f * 1e7))
              : lo + static_cast<std::uint64_t>(f * static_cast<double>(hi - lo));
    budget = std::max(budget, p.fixed_bytes);
    const brute_force_result bf = brute_force(p, budget);
    if (!bf.any_valid) {
      ++infeasible;
      try {
        make_plan(p, budget, with(solver_kind::exact));
        ADD_FAILURE() << "case " << k << ": plan returned for an infeasible budget";
      } catch (const infeasible_budget& e) {
        EXPECT_EQ(e.min_feasible_bytes(), bf.min_peak) << "case " << k;
        EXPECT_TRUE(e.min_proved());
      }
      continue;
    }
    ++feasible;
    const step_plan plan = make_plan(p, budget, with(solver_kind::exact));
    EXPECT_TRUE(plan.proved_optimal) << "case " << k;
    EXPECT_NEAR(plan.predicted.step_ms, bf.best_step, 1e-9 * bf.best_step) << "case " << k;
    EXPECT_TRUE(evaluate(p, plan.decisions(), budget).valid);
    // The bound never exceeds the true optimum.
    EXPECT_LE(plan.predicted.lower_bound_ms, bf.best_step * (1 + 1e-9)) << "case " << k;
  }
  EXPECT_GT(feasible, 60);
  EXPECT_GT(infeasible, 5);
}

// Note [The loss's position] in plan.h: a position decisions move. Every solver's row for
// it is checked against brute force (exact), against the exact relaxation (the outer LP),
// and by evaluate (greedy and ilp, whose repair must know it).
TEST(Exact, EqualsBruteForceWithALossPosition) {
  std::mt19937 rng(20261203);
  std::uniform_real_distribution<double> u(0, 1);
  int feasible = 0, loss_binds = 0;
  for (int k = 0; k < 80; ++k) {
    step_profile p = random_profile(rng, 3, 3);
    p.loss_bytes = static_cast<std::uint64_t>(u(rng) * 96 * 1048576.0);
    const std::uint64_t hi = keep_all_peak(p);
    const std::uint64_t lo = brute_force(p, UINT64_MAX).min_peak;
    const std::uint64_t budget = lo + static_cast<std::uint64_t>(u(rng) * (hi - lo));
    const brute_force_result bf = brute_force(p, budget);
    if (!bf.any_valid) {  // host cap: no decision fits
      EXPECT_THROW(make_plan(p, budget, with(solver_kind::exact)), infeasible_budget);
      continue;
    }
    ++feasible;
    const step_plan plan = make_plan(p, budget, with(solver_kind::exact));
    EXPECT_NEAR(plan.predicted.step_ms, bf.best_step, 1e-9 * bf.best_step) << "case " << k;
    EXPECT_EQ(min_feasible_budget(p), lo) << "case " << k;
    loss_binds += plan.predicted.peak_at == "loss";
    for (solver_kind s : {solver_kind::greedy, solver_kind::ilp}) {
      const step_plan q = make_plan(p, budget, with(s));
      EXPECT_TRUE(evaluate(p, q.decisions(), budget).valid) << to_string(s) << " case " << k;
      EXPECT_LE(q.predicted.lower_bound_ms, bf.best_step * (1 + 1e-9)) << "case " << k;
    }
    exact_options eo;
    eo.relax = true;
    const exact_result rel = solve_exact(p, budget, eo);
    const outer_lp_result lp = solve_outer_lp(p, budget);
    ASSERT_TRUE(lp.feasible) << "case " << k;
    EXPECT_NEAR(lp.step_lower_bound_ms, rel.objective, 1e-7 * rel.objective) << "case " << k;
  }
  EXPECT_GT(feasible, 50);
  EXPECT_GT(loss_binds, 5);  // the instances do exercise the new row
}

// The outer LP is the projection of the exact MIP's relaxation (Note [Outer LP]); the two
// are built independently, so equal optima cross-check both formulations.
TEST(LowerBound, OuterLpEqualsExactRelaxation) {
  std::mt19937 rng(7);
  for (int k = 0; k < 80; ++k) {
    const step_profile p = random_profile(rng, 6, 6);
    const std::uint64_t lo = min_feasible_budget(p);
    const std::uint64_t budget =
        lo + static_cast<std::uint64_t>((keep_all_peak(p) - lo) *
                                        std::uniform_real_distribution<double>(0, 1)(rng));
    const outer_lp_result lp = solve_outer_lp(p, budget);
    ASSERT_TRUE(lp.feasible) << "case " << k;
    exact_options eo;
    eo.relax = true;
    const exact_result rel = solve_exact(p, budget, eo);
    EXPECT_NEAR(lp.step_lower_bound_ms, rel.objective, 1e-7 * rel.objective) << "case " << k;
  }
}

TEST(LowerBound, PhaseOneFindsTheRelaxationsSmallestBudget) {
  const step_profile p = llama_like(6, 3);
  const std::uint64_t min = min_feasible_budget(p);
  const outer_lp_result below = solve_outer_lp(p, min - (64 << 20));
  EXPECT_FALSE(below.feasible);
  // Without a binding host cap the relaxation's least peak is the integer one.
  EXPECT_NEAR(static_cast<double>(below.lp_min_budget), static_cast<double>(min), 4096.0);
  EXPECT_TRUE(solve_outer_lp(p, min).feasible);
}

TEST(Planner, LlamaLikeAtScaleIsValidAndNearTheBound) {
  const step_profile p = llama_like(32, 11);
  const std::uint64_t lo = min_feasible_budget(p), hi = keep_all_peak(p);
  for (double f : {0.05, 0.3, 0.6, 0.95}) {
    const std::uint64_t budget = lo + static_cast<std::uint64_t>((hi - lo) * f);
    for (solver_kind s : {solver_kind::greedy, solver_kind::ilp}) {
      const step_plan plan = make_plan(p, budget, with(s));
      const evaluation ev = evaluate(p, plan.decisions(), budget);
      ASSERT_TRUE(ev.valid) << to_string(s) << " f=" << f;
      EXPECT_DOUBLE_EQ(ev.step_ms, plan.predicted.step_ms);
      EXPECT_GE(plan.predicted.gap, -1e-9);
      EXPECT_LT(plan.predicted.gap, s == solver_kind::ilp ? 0.01 : 0.02)
          << to_string(s) << " f=" << f;
      EXPECT_LE(plan.predicted.step_ms, plan.keep_all.step_ms + plan.recompute_all.step_ms);
      // Where the budget costs time, some named row must be holding the LP back.
      if (plan.predicted.lower_bound_ms > plan.keep_all.step_ms + 1e-9) {
        EXPECT_FALSE(plan.binding_constraints.empty()) << "f=" << f;
      }
    }
  }
}

// Note [Step overhead]: every solver's decisions are bit-for-bit those without it; the
// predicted step, both baselines and the lower bound move by exactly the overhead.
TEST(Planner, StepOverheadShiftsTimesAndChangesNoDecision) {
  std::mt19937 rng(31);
  int cases = 0;
  for (int k = 0; k < 40; ++k) {
    step_profile p = k < 4 ? llama_like(6 + k, 13 + k) : random_profile(rng, 5, 5);
    const std::uint64_t lo = min_feasible_budget(p), hi = keep_all_peak(p);
    const std::uint64_t budget = lo + (hi - lo) / 3;
    step_profile q = p;
    q.step_overhead_ms = 0.5 + k * 3.25;
    const double c = q.step_overhead_ms;
    for (solver_kind s : {solver_kind::greedy, solver_kind::ilp, solver_kind::exact}) {
      if (s == solver_kind::exact && (k < 4 || k >= 20)) continue;  // small cases only
      plan_options o = with(s);
      o.time_limit_s = 5;
      const step_plan a = make_plan(p, budget, o);
      const step_plan b = make_plan(q, budget, o);
      ASSERT_EQ(a.decisions(), b.decisions()) << "case " << k << " " << to_string(s);
      EXPECT_NEAR(b.predicted.step_ms, a.predicted.step_ms + c, 1e-9 * b.predicted.step_ms);
      EXPECT_NEAR(b.keep_all.step_ms, a.keep_all.step_ms + c, 1e-9 * b.keep_all.step_ms);
      EXPECT_NEAR(b.recompute_all.step_ms, a.recompute_all.step_ms + c,
                  1e-9 * b.recompute_all.step_ms);
      EXPECT_NEAR(b.predicted.lower_bound_ms, a.predicted.lower_bound_ms + c,
                  1e-9 * b.predicted.lower_bound_ms);
      EXPECT_EQ(b.predicted.peak_bytes, a.predicted.peak_bytes);
      EXPECT_EQ(b.binding_constraints, a.binding_constraints);
      EXPECT_GE(b.predicted.gap, -1e-9);
      EXPECT_LE(b.predicted.gap, a.predicted.gap + 1e-12);  // same gap over a larger step
      ++cases;
    }
  }
  EXPECT_GE(cases, 80);
}

TEST(Planner, GenerousBudgetKeepsEverything) {
  const step_profile p = llama_like(8, 5);
  const step_plan plan = make_plan(p, keep_all_peak(p), with(solver_kind::greedy));
  EXPECT_DOUBLE_EQ(plan.predicted.step_ms, plan.keep_all.step_ms);
  EXPECT_NEAR(plan.predicted.gap, 0.0, 1e-9);
  EXPECT_TRUE(plan.binding_constraints.empty());
}

// Note [A budget too small is an answer] in planner.cpp: below the fixed bytes is one more
// infeasible budget, with the smallest feasible one named, from make_plan and the bound.
TEST(Planner, BudgetBelowFixedIsInfeasibleWithTheSmallestNamed) {
  const step_profile p = llama_like(4, 1);
  const std::uint64_t min = min_feasible_budget(p);
  for (const std::uint64_t budget : {p.fixed_bytes - 1, std::uint64_t{1}}) {
    try {
      make_plan(p, budget);
      FAIL() << budget;
    } catch (const infeasible_budget& e) {
      EXPECT_EQ(e.code(), stash::status::infeasible_budget);
      EXPECT_EQ(e.budget(), budget);
      EXPECT_EQ(e.min_feasible_bytes(), min);
      EXPECT_TRUE(e.min_proved());
      const std::string m = e.what();
      EXPECT_NE(m.find("smallest feasible budget is " + std::to_string(min) + " bytes"),
                std::string::npos) << m;
      EXPECT_NE(m.find("below the profile's fixed_bytes " + std::to_string(p.fixed_bytes)),
                std::string::npos) << m;
    }
    EXPECT_THROW(lower_bound_ms(p, budget), infeasible_budget);
  }
}

// Note [One check of the plan options] in planner.h: one rule, one wording, and make_plan
// refuses options nobody checked.
TEST(Planner, PlanOptionsAreCheckedInOnePlace) {
  const step_profile p = llama_like(4, 1);
  const std::uint64_t budget = keep_all_peak(p);
  auto message = [](const plan_options& o) -> std::string {
    try {
      check_plan_options(o);
    } catch (const input_error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(message(plan_options{}), "");
  plan_options o;
  o.time_limit_s = 0;
  EXPECT_EQ(message(o), "the time limit (--time-limit, time_limit_s) must be a positive number "
                        "of seconds, got 0");
  o.time_limit_s = std::nan("");
  EXPECT_NE(message(o), "");
  o = {};
  o.mip_gap = -0.5;
  EXPECT_EQ(message(o), "the MIP gap (--mip-gap, mip_gap) must be a non-negative fraction, "
                        "got -0.5");
  o = {};
  o.solver = static_cast<solver_kind>(7);
  EXPECT_EQ(message(o), "unknown solver 7 (expected greedy, ilp or exact)");
  for (const plan_options& bad : {[] { plan_options b; b.time_limit_s = -1; return b; }(),
                                  [] { plan_options b; b.mip_gap = -1; return b; }(),
                                  [] { plan_options b; b.solver = solver_kind(-1); return b; }()}) {
    EXPECT_THROW(make_plan(p, budget, bad), input_error);
    pareto_options po;
    po.plan = bad;
    EXPECT_THROW(pareto_sweep(p, po), input_error);
  }
}

TEST(Planner, InfeasibleBudgetStatesTheSmallestInBytesAndGiB) {
  const step_profile p = llama_like(16, 2);
  const std::uint64_t min = min_feasible_budget(p);
  try {
    make_plan(p, min - 1);
    FAIL();
  } catch (const infeasible_budget& e) {
    EXPECT_EQ(e.min_feasible_bytes(), min);
    const std::string m = e.what();
    EXPECT_NE(m.find(std::to_string(min) + " bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("GiB"), std::string::npos) << m;
  }
  EXPECT_TRUE(evaluate(p, make_plan(p, min).decisions(), min).valid);
}

TEST(Planner, HostCapBindsAndIsRespected) {
  step_profile p = llama_like(5, 9);
  p.pinnable_bytes = 256ull << 20;
  const std::uint64_t lo = min_feasible_budget(p);
  const std::uint64_t budget = lo + (keep_all_peak(p) - lo) / 3;
  for (solver_kind s : {solver_kind::greedy, solver_kind::ilp, solver_kind::exact}) {
    plan_options o = with(s);
    o.time_limit_s = 3;
    const step_plan plan = make_plan(p, budget, o);
    EXPECT_LE(plan.predicted.offloaded_bytes, p.pinnable_bytes);
    EXPECT_GT(plan.predicted.offloaded_bytes, p.pinnable_bytes / 2);  // the cap is used
    EXPECT_TRUE(evaluate(p, plan.decisions(), budget).valid) << to_string(s);
  }
}

TEST(PlanJson, RoundTripsAndValidates) {
  const step_profile p = llama_like(3, 4);
  const std::uint64_t lo = min_feasible_budget(p);
  const step_plan plan = make_plan(p, lo + (keep_all_peak(p) - lo) / 2, with(solver_kind::exact));
  const nlohmann::json j = plan_to_json(plan);
  EXPECT_EQ(j["schema"], "stash.plan/1");
  EXPECT_EQ(j["profile_sha256"], profile_sha256(p));
  for (const char* key : {"step_ms", "peak_bytes", "peak_at", "exposed_copy_ms", "recompute_ms",
                          "offloaded_bytes", "lower_bound_ms", "gap"}) {
    EXPECT_TRUE(j["predicted"].contains(key)) << key;
  }
  EXPECT_TRUE(j["baselines"]["recompute_all"].contains("step_ms"));
  const step_plan back = plan_from_json(j, p);
  EXPECT_EQ(back.decisions(), plan.decisions());
  EXPECT_EQ(back.budget_bytes, plan.budget_bytes);
  EXPECT_DOUBLE_EQ(back.predicted.step_ms, plan.predicted.step_ms);
  EXPECT_EQ(back.proved_optimal, plan.proved_optimal);

  nlohmann::json bad = j;
  bad["schema"] = "stash.plan/0";
  EXPECT_THROW(plan_from_json(bad, p), input_error);
  bad = j;
  bad["layers"][1]["tensors"][2]["action"] = "evict";
  try {
    plan_from_json(bad, p);
    FAIL();
  } catch (const input_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("layers[1].tensors[2].action:", 0), 0u) << e.what();
  }
  bad = j;
  bad["layers"][0]["tensors"][0]["name"] = "renamed";
  EXPECT_THROW(plan_from_json(bad, p), input_error);
  bad = j;
  bad["layers"].erase(2);
  EXPECT_THROW(plan_from_json(bad, p), input_error);
}

// Note [One plan reader]: the profile-free reader the engine and the C API use.
TEST(PlanJson, ReadsWithoutAProfile) {
  const step_profile p = llama_like(3, 4);
  const std::uint64_t lo = min_feasible_budget(p);
  const step_plan plan = make_plan(p, lo + (keep_all_peak(p) - lo) / 2, with(solver_kind::exact));
  const nlohmann::json j = plan_to_json(plan);
  const step_plan back = read_plan(j);
  EXPECT_EQ(back.decisions(), plan.decisions());
  EXPECT_EQ(back.budget_bytes, plan.budget_bytes);
  EXPECT_EQ(back.layers[1].tensor_names, plan.layers[1].tensor_names);

  const auto message = [](const nlohmann::json& bad) {
    try {
      read_plan(bad);
    } catch (const input_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  nlohmann::json bad = j;
  bad["layers"][1]["tensors"][2]["action"] = "evict";
  EXPECT_EQ(message(bad).rfind("layers[1].tensors[2].action: unknown action \"evict\"", 0), 0u)
      << message(bad);
  bad = j;
  bad["layers"] = nlohmann::json::array();
  EXPECT_EQ(message(bad), "layers: must be a non-empty array");
  bad = j;
  bad["layers"][2]["index"] = 7;
  EXPECT_EQ(message(bad).rfind("layers[2].index: expected 2", 0), 0u) << message(bad);
  bad = j;
  bad["budget_bytes"] = -1;
  EXPECT_EQ(message(bad), "budget_bytes: must be a non-negative integer");
  // Without a profile names, budget and solver may be absent; with one they may not.
  bad = j;
  bad.erase("budget_bytes");
  bad["layers"][0]["tensors"][0].erase("name");
  EXPECT_EQ(read_plan(bad).layers[0].tensor_names[0], "");
  EXPECT_THROW(plan_from_json(bad, p), input_error);

  const std::string path = ::testing::TempDir() + "stash_read_plan_bad.json";
  bad = j;
  bad["layers"][0]["tensors"][1]["action"] = 3;
  std::ofstream(path) << bad.dump();
  try {
    read_plan_file(path);
    FAIL();
  } catch (const input_error& e) {
    EXPECT_EQ(std::string(e.what()), path + ": layers[0].tensors[1].action: must be a string");
  }
  try {
    load_plan(path, p);
    FAIL();
  } catch (const input_error& e) {
    EXPECT_EQ(std::string(e.what()), path + ": layers[0].tensors[1].action: must be a string");
  }
}

// Note [The optimizer's position]: a budget under it is infeasible whatever the decisions,
// and the smallest feasible budget names it; over it, the plan is that of the profile
// without it.
TEST(Planner, TheOptimizersPositionBoundsTheBudgetAndMovesNoDecision) {
  std::mt19937 rng(20261202);
  for (int k = 0; k < 20; ++k) {
    step_profile p = random_profile(rng, 3, 3);
    const std::uint64_t lo = min_feasible_budget(p);
    const std::uint64_t hi = keep_all_peak(p);
    const std::uint64_t budget = lo + (hi - lo) / 2;
    const step_plan plain = make_plan(p, budget, with(solver_kind::greedy));
    p.optimizer_bytes = budget - 1;  // under the budget: the same plan
    const step_plan under = make_plan(p, budget, with(solver_kind::greedy));
    ASSERT_EQ(under.layers.size(), plain.layers.size());
    for (std::size_t i = 0; i < plain.layers.size(); ++i)
      EXPECT_EQ(under.layers[i].actions, plain.layers[i].actions) << k;
    EXPECT_EQ(under.predicted.step_ms, plain.predicted.step_ms);
    p.optimizer_bytes = hi + 5;  // over every position: infeasible below it, its figure
    EXPECT_EQ(min_feasible_budget(p), hi + 5);
    try {
      make_plan(p, hi + 4, with(solver_kind::greedy));
      ADD_FAILURE() << "a budget under the optimizer's position was accepted";
    } catch (const infeasible_budget& e) {
      EXPECT_EQ(e.min_feasible_bytes(), hi + 5);
    }
    const step_plan at = make_plan(p, hi + 5, with(solver_kind::greedy));
    EXPECT_EQ(at.predicted.peak_bytes, hi + 5);
    EXPECT_EQ(at.predicted.peak_at, "optimizer");
  }
}
