// A layer's recompute temporaries in backward (Note [Backward temporaries of a recompute]
// in plan.h): the canonical model on hand-computed cases, every solver against it, the
// simulator against it.
#include <chrono>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "plan_fixtures.h"
#include "planner/simulator/simulator.h"
#include "planner/solvers/exact_mip.h"
#include "planner/solvers/outer_lp.h"
#include "planner/solvers/planner.h"

using namespace stash::planner;
using namespace stash::planner::testing;

namespace {

constexpr std::uint64_t MiB = kMiB;
const tensor_action K = tensor_action::keep, R = tensor_action::recompute;

// Three layers, each: "in" 4 MiB (its input: not recomputable), "a" 6 MiB, "b" 2 MiB, so
// A_i = 12 MiB and S_i = 8 MiB; bwd_temp 1 MiB; fixed 10 MiB. Recompute temporaries:
// 3 MiB for layers 0 and 1, 3 MiB + 1 byte for layer 2 (so that its shares round).
step_profile three_layers() {
  step_profile p = hand_profile({1, 1, 1}, {2, 2, 2});
  p.fixed_bytes = 10 * MiB;
  for (std::size_t i = 0; i < 3; ++i) {
    add_tensor(p, i, "in", 4 * MiB);
    p.layers[i].tensors.back().recomputable = false;
    add_tensor(p, i, "a", 6 * MiB);
    add_tensor(p, i, "b", 2 * MiB);
    p.layers[i].bwd_temp_bytes = MiB;
    p.layers[i].bwd_recompute_temp_bytes = 3 * MiB;
  }
  p.layers[2].bwd_recompute_temp_bytes = 3 * MiB + 1;
  return p;
}

plan_options with(solver_kind s) {
  plan_options o;
  o.solver = s;
  o.time_limit_s = 20;
  return o;
}

bool has(const evaluation& e, const std::string& v) {
  return std::find(e.violations.begin(), e.violations.end(), v) != e.violations.end();
}

// Whether every layer recomputes a prefix of its chain (Note [Recompute by prefix]).
bool prefix_plan(const step_profile& p, const decision_table& d) {
  for (std::size_t i = 0; i < p.layers.size(); ++i) {
    bool open = false;
    for (std::size_t j : recompute_chain(p, i)) {
      const bool r = d[i][j] == tensor_action::recompute;
      if (r && open) return false;
      open = open || !r;
    }
  }
  return true;
}

// brute_force (plan_fixtures.h) over the plans the solvers search: in a prefix profile,
// prefix plans only. With recompute temporaries a plan that recomputes a deep link alone
// can have a smaller term than the prefix through it, which the model allows and the
// replay does not do.
brute_force_result searched_brute_force(const step_profile& p, std::uint64_t budget) {
  std::vector<std::pair<std::size_t, std::size_t>> slots;
  for (std::size_t i = 0; i < p.layers.size(); ++i)
    for (std::size_t j = 0; j < p.layers[i].tensors.size(); ++j) slots.push_back({i, j});
  static const tensor_action kActs[] = {tensor_action::keep, tensor_action::recompute,
                                        tensor_action::offload};
  decision_table d = keep_all(p);
  brute_force_result out;
  bool any_host = false;
  std::vector<int> digit(slots.size(), 0);
  for (;;) {
    bool ok = true;
    for (std::size_t k = 0; k < slots.size(); ++k) {
      d[slots[k].first][slots[k].second] = kActs[digit[k]];
      ok = ok && allowed(p, slots[k].first, slots[k].second, kActs[digit[k]]);
    }
    if (ok && prefix_plan(p, d)) {
      const evaluation ev = evaluate(p, d, budget);
      if (ev.offloaded_bytes <= p.pinnable_bytes) {
        if (!any_host || ev.peak_bytes < out.min_peak) out.min_peak = ev.peak_bytes;
        any_host = true;
      }
      if (ev.valid && (!out.any_valid || ev.step_ms < out.best_step)) {
        out.best_step = ev.step_ms;
        out.any_valid = true;
      }
    }
    std::size_t k = 0;
    while (k < digit.size() && ++digit[k] == 3) digit[k++] = 0;
    if (k == digit.size()) break;
  }
  return out;
}

step_profile without_terms(step_profile p) {
  for (layer_profile& l : p.layers) l.bwd_recompute_temp_bytes = 0;
  return p;
}

// Layer 0: a0 8 MiB at 0.1 ms, recompute temporaries 10 MiB; layer 1: a1 8 MiB at 0.5 ms;
// layer 2: a2 8 MiB, not recomputable; nothing offloads. Keep-all: backward_i = 8, 16, 24
// MiB. At 16 MiB position 2 needs K_0 + K_1 <= 8 MiB, so a0 or a1 is recomputed. Without
// the term a0 is the cheaper; with it backward_0 = 8 + 10 = 18 MiB > 16 MiB, so a1.
step_profile choice_profile() {
  step_profile p = hand_profile({1, 1, 1}, {2, 2, 2});
  add_tensor(p, 0, "a0", 8 * MiB, 0.1);
  add_tensor(p, 1, "a1", 8 * MiB, 0.5);
  add_tensor(p, 2, "a2", 8 * MiB);
  p.layers[2].tensors[0].recomputable = false;
  for (layer_profile& l : p.layers) l.tensors[0].offloadable = false;
  p.layers[0].bwd_recompute_temp_bytes = 10 * MiB;
  return p;
}

}  // namespace

TEST(RecomputeTemp, EvaluateKeepAllPaysNothing) {
  const step_profile p = three_layers();
  // forward_i = 10 + 12·i + 12, backward_i = forward_i + 1 (nothing recomputed): 23, 35, 47.
  const evaluation e = evaluate(p, keep_all(p), ~0ull);
  EXPECT_EQ(e.peak_bytes, 47 * MiB);
  EXPECT_EQ(e.peak_at, "backward[2]");
  EXPECT_EQ(e.peak_bytes, evaluate(without_terms(p), keep_all(p), ~0ull).peak_bytes);
}

// S_i is what the rules let recompute: a must_keep tensor is kept even by recompute_all,
// so it is no part of the share.
TEST(RecomputeTemp, TheShareIsOfTheBytesAllowedToRecompute) {
  step_profile p = three_layers();
  EXPECT_EQ(recomputable_bytes(p, 0), 8 * MiB);
  add_tensor(p, 0, "pinned", 8 * MiB);
  p.layers[0].tensors.back().must_keep = true;
  EXPECT_EQ(recomputable_bytes(p, 0), 8 * MiB);
  EXPECT_EQ(recompute_temp_bytes(p, 0, {K, R, R, K}), 3 * MiB);
  EXPECT_EQ(recompute_temp_bytes(p, 0, {K, K, R, K}), 3 * MiB / 4);
  EXPECT_EQ(recompute_temp_bytes(p, 0, {K, K, K, R}), 0u);  // a rule break pays nothing here
  EXPECT_EQ(recompute_temp_bytes(p.layers[0], 0, 0), 0u);
}

TEST(RecomputeTemp, EvaluateAllRecomputePaysTheWholeTerm) {
  const step_profile p = three_layers();
  // K_i = 4 MiB. backward_0 = 10 + 12 + 1 + 3 = 26 MiB, backward_1 = 10 + 4 + 12 + 1 + 3
  // = 30 MiB, backward_2 = 10 + 8 + 12 + 1 + (3 MiB + 1) = 34 MiB + 1. Without the term
  // backward_2 would be 31 MiB.
  const decision_table d = recompute_all(p);
  EXPECT_EQ(d[2], (std::vector<tensor_action>{K, R, R}));
  const evaluation e = evaluate(p, d, ~0ull);
  EXPECT_EQ(e.peak_bytes, 34 * MiB + 1);
  EXPECT_EQ(e.peak_at, "backward[2]");
  EXPECT_EQ(evaluate(without_terms(p), d, ~0ull).peak_bytes, 31 * MiB);
  EXPECT_FALSE(evaluate(p, d, 34 * MiB).valid);
  EXPECT_EQ(evaluate(p, d, 34 * MiB).violations, std::vector<std::string>{"peak:backward[2]"});
  EXPECT_TRUE(evaluate(p, d, 34 * MiB + 1).valid);
}

TEST(RecomputeTemp, EvaluatePartialRecomputePaysItsShareRoundedUp) {
  const step_profile p = three_layers();
  // Layers 0 and 1 kept; layer 2 recomputes b (2 of its 8 MiB): forward_2 = 10 + 24 + 12 =
  // 46 MiB, backward_2 = 47 MiB + ceil((3 MiB + 1) · 2/8) = 47 MiB + ceil(786432.25).
  decision_table d = keep_all(p);
  d[2] = {K, K, R};
  evaluation e = evaluate(p, d, ~0ull);
  EXPECT_EQ(e.peak_bytes, 47 * MiB + 786433);
  EXPECT_EQ(e.peak_at, "backward[2]");
  EXPECT_EQ(evaluate(p, d, 47 * MiB + 786432).violations,
            std::vector<std::string>{"peak:backward[2]"});
  EXPECT_TRUE(evaluate(p, d, 47 * MiB + 786433).valid);
  // a instead (6 of 8 MiB): (3 MiB + 1) · 6/8 = 2359296.75, rounded up.
  d[2] = {K, R, K};
  EXPECT_EQ(evaluate(p, d, ~0ull).peak_bytes, 47 * MiB + 2359297);
  // Layer 1 recomputes b alone: backward_1 = 35 MiB + 3 MiB · 2/8 = 35.75 MiB, under
  // backward_2 = 10 + 12 + 10 + 12 + 1 = 45 MiB, which it lowers by the 2 MiB it frees.
  d = keep_all(p);
  d[1] = {K, K, R};
  e = evaluate(p, d, ~0ull);
  EXPECT_EQ(e.peak_bytes, 45 * MiB);
  EXPECT_FALSE(has(evaluate(p, d, 35 * MiB + 3 * MiB / 4), "peak:backward[1]"));
  EXPECT_TRUE(has(evaluate(p, d, 35 * MiB + 3 * MiB / 4 - 1), "peak:backward[1]"));
  // The forward makes none of it: forward_1 = 10 + 12 + 12 = 34 MiB either way.
  EXPECT_FALSE(has(evaluate(p, d, 34 * MiB), "peak:forward[1]"));
}

TEST(RecomputeTemp, EverySolverMovesTheRecomputeToTheLayerWithoutTemporaries) {
  const step_profile p = choice_profile();
  const std::uint64_t budget = 16 * MiB;
  for (solver_kind s : {solver_kind::greedy, solver_kind::ilp, solver_kind::exact}) {
    SCOPED_TRACE(to_string(s));
    const step_plan old = make_plan(without_terms(p), budget, with(s));
    EXPECT_EQ(old.decisions(), (decision_table{{R}, {K}, {K}}));
    // What the model without the term picks breaks the budget at backward[0].
    EXPECT_EQ(evaluate(p, old.decisions(), budget).violations,
              std::vector<std::string>{"peak:backward[0]"});
    const step_plan plan = make_plan(p, budget, with(s));
    EXPECT_EQ(plan.decisions(), (decision_table{{K}, {R}, {K}}));
    const evaluation e = evaluate(p, plan.decisions(), budget);
    EXPECT_TRUE(e.valid);
    EXPECT_EQ(plan.predicted.peak_bytes, e.peak_bytes);
    EXPECT_LE(e.peak_bytes, budget);
    EXPECT_NEAR(plan.predicted.recompute_ms, 0.5, 1e-12);
    // The LP pays for its fractions too: a0 recomputed only as far as backward_0 allows
    // (6.4 MiB), the rest from a1: 0.1 · 0.8 + 0.5 · 0.2 = 0.18 ms above compute (9 ms).
    EXPECT_NEAR(plan.predicted.lower_bound_ms, 9.18, 1e-9);
  }
}

// The least peak: recomputing a0 costs layer 0's backward 10 MiB, more than the 8 MiB it
// frees later, so the least peak keeps it: 16 MiB (forward_1 = a0 + a1), where the greedy
// least-peak decisions (everything recomputed) peak at backward_0 = 18 MiB.
TEST(RecomputeTemp, TheSmallestBudgetKeepsWhatRecomputeWouldRaise) {
  const step_profile p = choice_profile();
  EXPECT_EQ(evaluate(p, recompute_all(p), ~0ull).peak_bytes, 18 * MiB);
  EXPECT_EQ(min_feasible_budget(without_terms(p)), 8 * MiB);
  bool proved = false;
  EXPECT_EQ(min_feasible_budget(p, &proved), 16 * MiB);
  EXPECT_TRUE(proved);
  try {
    make_plan(p, 16 * MiB - 1);
    ADD_FAILURE() << "planned under the least peak";
  } catch (const infeasible_budget& e) {
    EXPECT_EQ(e.min_feasible_bytes(), 16 * MiB);
  }
}

// Small random profiles with the term on most layers, half of them prefix profiles: exact
// equals brute force (which goes through evaluate()), the smallest budget is brute
// force's least peak, greedy and ilp are valid, and the LP is the exact MIP's relaxation
// and a bound.
TEST(RecomputeTemp, EqualsBruteForceOnRandomProfiles) {
  std::mt19937 rng(2026021);
  std::uniform_real_distribution<double> u(0, 1);
  int feasible = 0, term_decides = 0;
  for (int k = 0; k < 200; ++k) {
    step_profile p = random_profile(rng, 3, 3);
    if (k % 2) p.recompute = recompute_cost::prefix;
    for (layer_profile& l : p.layers) {
      if (u(rng) < 0.8) l.bwd_recompute_temp_bytes = static_cast<std::uint64_t>(u(rng) * 128 * MiB);
    }
    const std::uint64_t hi = evaluate(p, keep_all(p), ~0ull).peak_bytes;
    const std::uint64_t lo = searched_brute_force(p, ~0ull).min_peak;
    bool proved = false;
    EXPECT_EQ(min_feasible_budget(p, &proved), lo) << "case " << k;
    EXPECT_TRUE(proved) << "case " << k;
    const std::uint64_t budget = lo + static_cast<std::uint64_t>(u(rng) * (hi - lo));
    const brute_force_result bf = searched_brute_force(p, budget);
    if (!bf.any_valid) {  // host cap: no decision fits
      EXPECT_THROW(make_plan(p, budget, with(solver_kind::exact)), infeasible_budget);
      continue;
    }
    ++feasible;
    const step_plan plan = make_plan(p, budget, with(solver_kind::exact));
    EXPECT_NEAR(plan.predicted.step_ms, bf.best_step, 1e-9 * bf.best_step) << "case " << k;
    EXPECT_LE(plan.predicted.lower_bound_ms, bf.best_step * (1 + 1e-9)) << "case " << k;
    EXPECT_TRUE(prefix_plan(p, plan.decisions())) << "case " << k;
    for (solver_kind s : {solver_kind::greedy, solver_kind::ilp}) {
      const step_plan q = make_plan(p, budget, with(s));
      EXPECT_TRUE(evaluate(p, q.decisions(), budget).valid) << to_string(s) << " case " << k;
      EXPECT_TRUE(prefix_plan(p, q.decisions())) << to_string(s) << " case " << k;
    }
    try {  // the plan the model without the term makes here
      term_decides +=
          make_plan(without_terms(p), budget, with(solver_kind::exact)).decisions() !=
          plan.decisions();
    } catch (const infeasible_budget&) {  // the term can only raise the least peak
      ADD_FAILURE() << "case " << k;
    }
    exact_options eo;
    eo.relax = true;
    const step_profile priced = chain_priced(p);
    const exact_result rel = solve_exact(priced, budget, eo);
    const outer_lp_result lp = solve_outer_lp(priced, budget);
    ASSERT_TRUE(lp.feasible) << "case " << k;
    EXPECT_NEAR(lp.step_lower_bound_ms, rel.objective, 1e-7 * rel.objective) << "case " << k;
  }
  EXPECT_GT(feasible, 150);
  EXPECT_GT(term_decides, 10);  // the instances do exercise the term
}

// Larger profiles, where the inner solvers round the LP and repair finishes: every plan
// is valid under the model with the term.
TEST(RecomputeTemp, LlamaLikePlansAreValid) {
  step_profile p = llama_like(12, 3);
  for (std::size_t i = 0; i < p.layers.size(); ++i)
    p.layers[i].bwd_recompute_temp_bytes = (i % 3 + 1) * 256 * MiB;
  const std::uint64_t hi = evaluate(p, keep_all(p), ~0ull).peak_bytes;
  const std::uint64_t lo = min_feasible_budget(p);
  for (int f = 0; f <= 4; ++f) {
    const std::uint64_t budget = lo + (hi - lo) * f / 4;
    for (solver_kind s : {solver_kind::greedy, solver_kind::ilp}) {
      const step_plan plan = make_plan(p, budget, with(s));
      const evaluation e = evaluate(p, plan.decisions(), budget);
      EXPECT_TRUE(e.valid) << to_string(s) << " at " << f;
      EXPECT_LE(e.peak_bytes, budget);
      EXPECT_GE(plan.predicted.step_ms, plan.predicted.lower_bound_ms * (1 - 1e-9));
    }
  }
}

TEST(RecomputeTemp, SimulatorHoldsThePlansShare) {
  const step_profile p = three_layers();
  decision_table d = keep_all(p);
  d[2] = {K, K, R};
  const sim_result r = simulate(p, d);
  EXPECT_EQ(r.peak_bytes, 47 * MiB + 786433);
  EXPECT_EQ(r.peak_at, "backward[2]");
  const evaluation all = evaluate(p, recompute_all(p), ~0ull);
  const sim_result ra = simulate(p, recompute_all(p));
  EXPECT_EQ(ra.peak_bytes, all.peak_bytes);
  EXPECT_EQ(ra.peak_at, all.peak_at);
}

// Note [Simulator vs canonical model] in simulator.h, with the term: random decisions on
// random profiles peak where evaluate() says, by the byte.
TEST(RecomputeTemp, SimulatorAgreesWithTheModelOnRandomDecisions) {
  std::mt19937 rng(77);
  std::uniform_real_distribution<double> u(0, 1);
  int binds = 0;
  for (int trial = 0; trial < 300; ++trial) {
    step_profile p = random_profile(rng, 6, 6);
    for (layer_profile& l : p.layers)
      l.bwd_recompute_temp_bytes = static_cast<std::uint64_t>(u(rng) * 64 * MiB);
    decision_table d = keep_all(p);
    for (std::size_t i = 0; i < p.layers.size(); ++i)
      for (std::size_t j = 0; j < d[i].size(); ++j) {
        const tensor_action a = static_cast<tensor_action>(static_cast<int>(u(rng) * 3));
        if (allowed(p, i, j, a)) d[i][j] = a;
      }
    const evaluation ev = evaluate(p, d, ~0ull);
    const sim_result r = simulate(p, d);
    ASSERT_EQ(r.peak_bytes, ev.peak_bytes) << "trial " << trial;
    ASSERT_EQ(r.peak_at, ev.peak_at) << "trial " << trial;
    binds += ev.peak_bytes != evaluate(without_terms(p), d, ~0ull).peak_bytes;
  }
  EXPECT_GT(binds, 30);
}

// Note [A search that ends the same way] in planner.cpp: the smallest feasible budget is
// the same on a busy machine as on an idle one, and make_plan plans at it. With the MIP
// bounded by the clock, threads burning every core twice over made it stop sooner and name a
// higher budget, and make_plan, searching again, could refuse the one it was told.
TEST(RecomputeTemp, TheLeastPeakDoesNotDependOnTheClock) {
  step_profile p = llama_like(12, 3);
  for (std::size_t i = 0; i < p.layers.size(); ++i)
    p.layers[i].bwd_recompute_temp_bytes = (i % 3 + 1) * 256 * MiB;
  const std::uint64_t idle = min_feasible_budget(p);
  std::atomic<bool> stop{false};
  std::vector<std::thread> burners;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned t = 0; t < 2 * cores; ++t) {
    burners.emplace_back([&stop] {
      volatile std::uint64_t x = 0;
      while (!stop.load(std::memory_order_relaxed)) x = x * 6364136223846793005ull + 1;
    });
  }
  const std::uint64_t busy = min_feasible_budget(p);
  stop = true;
  for (std::thread& t : burners) t.join();
  EXPECT_EQ(busy, idle);
  for (solver_kind s : {solver_kind::greedy, solver_kind::ilp}) {
    const step_plan plan = make_plan(p, idle, with(s));
    EXPECT_LE(evaluate(p, plan.decisions(), idle).peak_bytes, idle) << to_string(s);
  }
}
