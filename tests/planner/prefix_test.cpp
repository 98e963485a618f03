// Note [Recompute by prefix] (planner/model/plan.h): a profile whose layers recompute by
// replaying their forward up to the last tensor they need.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include <nlohmann/json.hpp>

#include "plan_fixtures.h"
#include "planner/simulator/simulator.h"
#include "planner/solvers/exact_mip.h"
#include "planner/solvers/inner_solver.h"
#include "planner/solvers/outer_lp.h"
#include "planner/solvers/planner.h"

using namespace stash::planner;
using namespace stash::planner::testing;

namespace {

plan_options with(solver_kind s) {
  plan_options o;
  o.solver = s;
  o.time_limit_s = 20;
  return o;
}

// Whether every layer's recomputed tensors are a prefix of its chain.
bool prefix_plan(const step_profile& p, const decision_table& d) {
  for (std::size_t i = 0; i < d.size(); ++i) {
    bool open = false;
    for (std::size_t j : recompute_chain(p, i)) {
      const bool r = d[i][j] == tensor_action::recompute;
      if (r && open) return false;
      open = open || !r;
    }
  }
  return true;
}

// Layer 0 saves its input (kept: recompute starts from it), then a (30 MiB, 1 ms), b
// (10 MiB, 5 ms) and c (40 MiB, 0.1 ms); layer 1 saves 100 MiB nothing can move. Freeing
// 30 MiB of layer 0 is the question: c alone looks cheapest per tensor (0.1 ms), but its
// replay runs a and b first (6.1 ms); a alone costs 1 ms.
step_profile deep_cheap_tensor() {
  step_profile p = hand_profile({10, 10}, {20, 20});
  p.recompute = recompute_cost::prefix;
  add_tensor(p, 0, "input", 8 * kMiB, 0);
  p.layers[0].tensors[0].recomputable = false;
  add_tensor(p, 0, "a", 30 * kMiB, 1.0);
  add_tensor(p, 0, "b", 10 * kMiB, 5.0);
  add_tensor(p, 0, "c", 40 * kMiB, 0.1);
  add_tensor(p, 1, "big", 100 * kMiB, 0);
  p.layers[1].tensors[0].must_keep = true;
  for (auto& l : p.layers) {
    for (auto& t : l.tensors) t.offloadable = false;
  }
  return p;
}

}  // namespace

TEST(Prefix, EvaluatePaysTheReplayUpToTheLastRecomputedTensor) {
  step_profile p = deep_cheap_tensor();
  decision_table d = keep_all(p);
  d[0][3] = tensor_action::recompute;  // c alone
  EXPECT_DOUBLE_EQ(evaluate(p, d, UINT64_MAX).recompute_ms, 6.1);
  // The simulator runs the same replay.
  EXPECT_NEAR(simulate(p, d).recompute_ms, 6.1, 1e-9);
  p.recompute = recompute_cost::per_tensor;
  EXPECT_DOUBLE_EQ(evaluate(p, d, UINT64_MAX).recompute_ms, 0.1);
}

TEST(Prefix, ChainPricedLinksAddUpToTheReplay) {
  step_profile p = deep_cheap_tensor();
  p.layers[0].tensors[0].recompute_ms = 0.25;  // the input's segment joins the first link
  const step_profile q = chain_priced(p);
  EXPECT_EQ(recompute_chain(p, 0), (std::vector<std::size_t>{1, 2, 3}));
  EXPECT_TRUE(recompute_chain(p, 1).empty());  // must_keep: no link
  EXPECT_DOUBLE_EQ(q.layers[0].tensors[0].recompute_ms, 0);
  EXPECT_DOUBLE_EQ(q.layers[0].tensors[1].recompute_ms, 1.25);
  EXPECT_DOUBLE_EQ(q.layers[0].tensors[2].recompute_ms, 5.0);
  EXPECT_DOUBLE_EQ(q.layers[0].tensors[3].recompute_ms, 0.1);
  decision_table d = keep_all(p);
  d[0][1] = d[0][2] = tensor_action::recompute;
  EXPECT_DOUBLE_EQ(evaluate(q, d, UINT64_MAX).recompute_ms,
                   evaluate(p, d, UINT64_MAX).recompute_ms);
  // A per_tensor profile is its own chain-priced profile, with no chain.
  p.recompute = recompute_cost::per_tensor;
  EXPECT_DOUBLE_EQ(chain_priced(p).layers[0].tensors[0].recompute_ms, 0.25);
  EXPECT_TRUE(recompute_chain(p, 0).empty());
}

TEST(Prefix, CloseRecomputesWhatTheReplayMakesAnyway) {
  const step_profile p = deep_cheap_tensor();
  decision_table d = keep_all(p);
  d[0][3] = tensor_action::recompute;
  const std::uint64_t before = evaluate(p, d, UINT64_MAX).peak_bytes;
  EXPECT_EQ(close_prefixes(p, d), 2u);
  EXPECT_EQ(d[0][1], tensor_action::recompute);
  EXPECT_EQ(d[0][2], tensor_action::recompute);
  EXPECT_EQ(d[0][0], tensor_action::keep);  // not recomputable
  EXPECT_LE(evaluate(p, d, UINT64_MAX).peak_bytes, before);
  EXPECT_DOUBLE_EQ(evaluate(p, d, UINT64_MAX).recompute_ms, 6.1);
}

// The case issue 20 found on an H200: solving per tensor and closing afterwards pays 6.1
// ms where 1 ms frees what the budget needs.
TEST(Prefix, EverySolverRecomputesTheCheapPrefixNotTheCheapTensor) {
  const step_profile p = deep_cheap_tensor();
  const std::uint64_t budget = evaluate(p, keep_all(p), UINT64_MAX).peak_bytes - 30 * kMiB;
  for (solver_kind s : {solver_kind::greedy, solver_kind::ilp, solver_kind::exact}) {
    const step_plan plan = make_plan(p, budget, with(s));
    const decision_table d = plan.decisions();
    EXPECT_EQ(d[0][1], tensor_action::recompute) << to_string(s);
    EXPECT_EQ(d[0][2], tensor_action::keep) << to_string(s);
    EXPECT_EQ(d[0][3], tensor_action::keep) << to_string(s);
    EXPECT_DOUBLE_EQ(plan.predicted.recompute_ms, 1.0) << to_string(s);
    EXPECT_LE(plan.predicted.lower_bound_ms, plan.predicted.step_ms + 1e-9);
  }
  // What fit did before: the per-tensor plan, closed.
  step_profile each = p;
  each.recompute = recompute_cost::per_tensor;
  decision_table old = make_plan(each, budget, with(solver_kind::exact)).decisions();
  close_prefixes(p, old);
  EXPECT_DOUBLE_EQ(evaluate(p, old, budget).recompute_ms, 6.1);
}

// 3^n enumeration, priced by evaluate (which prices any plan, prefix or not): exact
// finds the optimum among all plans, and it is a prefix plan; greedy and ilp give valid
// prefix plans no better than it; the outer LP is the exact MIP's relaxation and a bound.
TEST(Prefix, ExactEqualsBruteForceAndEverySolverGivesPrefixPlans) {
  std::mt19937 rng(20261205);
  std::uniform_real_distribution<double> u(0, 1);
  int feasible = 0, deeper_cheaper = 0;
  for (int k = 0; k < 100; ++k) {
    step_profile p = random_profile(rng, 3, 3);
    p.recompute = recompute_cost::prefix;
    const std::uint64_t hi = evaluate(p, keep_all(p), UINT64_MAX).peak_bytes;
    const std::uint64_t lo = brute_force(p, UINT64_MAX).min_peak;
    const std::uint64_t budget = lo + static_cast<std::uint64_t>(u(rng) * (hi - lo));
    const brute_force_result bf = brute_force(p, budget);
    if (!bf.any_valid) continue;
    ++feasible;
    const step_plan plan = make_plan(p, budget, with(solver_kind::exact));
    EXPECT_NEAR(plan.predicted.step_ms, bf.best_step, 1e-9 * bf.best_step) << "case " << k;
    EXPECT_TRUE(prefix_plan(p, plan.decisions())) << "case " << k;
    EXPECT_LE(plan.predicted.lower_bound_ms, bf.best_step * (1 + 1e-9)) << "case " << k;
    for (solver_kind s : {solver_kind::greedy, solver_kind::ilp}) {
      const step_plan q = make_plan(p, budget, with(s));
      EXPECT_TRUE(evaluate(p, q.decisions(), budget).valid) << to_string(s) << " case " << k;
      EXPECT_TRUE(prefix_plan(p, q.decisions())) << to_string(s) << " case " << k;
      EXPECT_GE(q.predicted.step_ms, bf.best_step * (1 - 1e-9)) << to_string(s) << " " << k;
    }
    const step_profile q = chain_priced(p);
    exact_options eo;
    eo.relax = true;
    const exact_result rel = solve_exact(q, budget, eo);
    const outer_lp_result lp = solve_outer_lp(q, budget);
    ASSERT_TRUE(lp.feasible) << "case " << k;
    EXPECT_NEAR(lp.step_lower_bound_ms, rel.objective, 1e-7 * (1 + rel.objective)) << k;
    // Instances where a later link is cheaper per byte than an earlier one: where a
    // per-tensor solver would reach past the prefix.
    for (std::size_t i = 0; i < p.layers.size(); ++i) {
      const std::vector<std::size_t> c = recompute_chain(p, i);
      for (std::size_t m = 1; m < c.size(); ++m) {
        const auto& a = p.layers[i].tensors[c[m - 1]];
        const auto& b = p.layers[i].tensors[c[m]];
        if (b.recompute_ms / b.bytes < a.recompute_ms / a.bytes) {
          ++deeper_cheaper;
          break;
        }
      }
    }
  }
  EXPECT_GT(feasible, 60);
  EXPECT_GT(deeper_cheaper, 20);
}

TEST(Prefix, TheProfileSaysHowRecomputeIsPaid) {
  step_profile p = deep_cheap_tensor();
  nlohmann::json j = profile_to_json(p);
  EXPECT_EQ(j.at("recompute_cost"), "prefix");
  EXPECT_EQ(profile_from_json(j).recompute, recompute_cost::prefix);
  j["recompute_cost"] = "per_tensor";
  EXPECT_EQ(profile_from_json(j).recompute, recompute_cost::per_tensor);
  j.erase("recompute_cost");
  EXPECT_EQ(profile_from_json(j).recompute, recompute_cost::per_tensor);
  p.recompute = recompute_cost::per_tensor;
  EXPECT_FALSE(profile_to_json(p).contains("recompute_cost"));  // digests stay as they were
  j["recompute_cost"] = "replay";
  try {
    profile_from_json(j);
    ADD_FAILURE() << "an unknown recompute_cost was accepted";
  } catch (const stash::input_error& e) {
    EXPECT_NE(std::string(e.what()).find("recompute_cost"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("prefix"), std::string::npos) << e.what();
  }
}

// The inner solver alone (make_plan's multi-start would hide a wrong one on small models):
// it answers the LP's targets with a prefix.
TEST(Prefix, TheInnerSolverAnswersWithAPrefix) {
  const step_profile p = deep_cheap_tensor();
  const step_profile q = chain_priced(p);
  const std::uint64_t budget = evaluate(p, keep_all(p), UINT64_MAX).peak_bytes - 30 * kMiB;
  const outer_lp_result lp = solve_outer_lp(q, budget);
  ASSERT_TRUE(lp.feasible);
  EXPECT_NEAR(lp.step_lower_bound_ms, 10 + 10 + 20 + 20 + 1.0, 1e-9);
  for (inner_method m : {inner_method::greedy, inner_method::ilp}) {
    inner_options io;
    io.method = m;
    const decision_table d = solve_inner(q, lp, io);
    EXPECT_EQ(d[0][1], tensor_action::recompute);
    EXPECT_EQ(d[0][2], tensor_action::keep);
    EXPECT_EQ(d[0][3], tensor_action::keep);
  }
}

// At scale (a 32-layer Llama-like model: no multi-start), against what fit did before
// (solve per tensor, close each prefix): never slower, and faster where a per-tensor
// solver reaches past the cheap prefix.
TEST(Prefix, AtScaleNoSlowerThanClosingAPerTensorPlan) {
  step_profile p = llama_like(32, 7);
  p.recompute = recompute_cost::prefix;
  step_profile each = p;
  each.recompute = recompute_cost::per_tensor;
  const std::uint64_t hi = evaluate(p, keep_all(p), UINT64_MAX).peak_bytes;
  const std::uint64_t lo = min_feasible_budget(p);
  int faster = 0;
  for (double f : {0.1, 0.3, 0.5, 0.7, 0.9}) {
    const std::uint64_t budget = lo + static_cast<std::uint64_t>(f * static_cast<double>(hi - lo));
    for (solver_kind s : {solver_kind::greedy, solver_kind::ilp}) {
      const step_plan plan = make_plan(p, budget, with(s));
      ASSERT_TRUE(prefix_plan(p, plan.decisions())) << to_string(s) << " " << f;
      decision_table old = make_plan(each, budget, with(s)).decisions();
      close_prefixes(p, old);
      const evaluation before = evaluate(p, old, budget);
      ASSERT_TRUE(before.valid);
      EXPECT_LE(plan.predicted.step_ms, before.step_ms * (1 + 1e-9)) << to_string(s) << " " << f;
      faster += plan.predicted.step_ms < before.step_ms * (1 - 1e-3);
      std::printf("%s %.1f: prefix %.3f ms, closed per-tensor %.3f ms (bound %.3f)\n",
                  to_string(s), f, plan.predicted.step_ms, before.step_ms,
                  plan.predicted.lower_bound_ms);
    }
  }
  EXPECT_GT(faster, 0);
}
