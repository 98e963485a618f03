// Pareto sweep: envelope, bisection, knee, CSV and SVG (planner/solvers/pareto.h).
// `stash pareto` itself is tested in tests/cli.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include "planner/model/analytic.h"
#include "planner/plots/pareto_svg.h"
#include "planner/solvers/pareto.h"
#include "plan_fixtures.h"
#include "xml_check.h"

namespace stash::planner {
namespace {

using test::well_formed_xml;

constexpr std::uint64_t MiB = 1048576;

using testing::small_llama;

void expect_curve_invariants(const step_profile& p, const pareto_curve& c, int max_points) {
  ASSERT_GE(c.points.size(), c.from_bytes < c.to_bytes ? 2u : 1u);
  EXPECT_LE(c.solver_calls, max_points);
  EXPECT_EQ(c.points.front().budget_bytes, c.from_bytes);
  EXPECT_EQ(c.points.back().budget_bytes, c.to_bytes);
  double best = c.points.front().solved_step_ms;
  for (std::size_t i = 0; i < c.points.size(); ++i) {
    const pareto_point& pt = c.points[i];
    if (i > 0) {
      EXPECT_GT(pt.budget_bytes, c.points[i - 1].budget_bytes);
      EXPECT_LE(pt.step_ms, c.points[i - 1].step_ms) << "step time rose at point " << i;
    }
    // Note [Pareto envelope]: the running minimum of what the solver returned.
    best = std::min(best, pt.solved_step_ms);
    EXPECT_DOUBLE_EQ(pt.step_ms, best) << i;
    EXPECT_LE(pt.plan_budget_bytes, pt.budget_bytes);
    EXPECT_LE(pt.peak_bytes, pt.plan_budget_bytes) << i;
    EXPECT_GE(pt.step_ms, c.keep_all.step_ms * (1 - 1e-9));
    EXPECT_GE(pt.peak_bytes, p.fixed_bytes);
  }
}

TEST(Pareto, SweepIsMonotoneValidAndSpansTheDefaults) {
  const step_profile p = small_llama();
  pareto_options opt;
  opt.max_points = 40;
  int progress_calls = 0;
  opt.progress = [&](int done, int max, std::uint64_t, double step_ms, double) {
    ++progress_calls;
    EXPECT_LE(done, max);
    EXPECT_GT(step_ms, 0);
  };
  const pareto_curve c = pareto_sweep(p, opt);
  EXPECT_EQ(c.from_bytes, min_feasible_budget(p));
  EXPECT_EQ(c.to_bytes, evaluate(p, keep_all(p), ~0ull).peak_bytes);
  EXPECT_EQ(progress_calls, static_cast<int>(c.points.size()));
  expect_curve_invariants(p, c, 40);
  // At the keep-all peak nothing needs saving.
  EXPECT_NEAR(c.points.back().step_ms, c.keep_all.step_ms, 1e-6 * c.keep_all.step_ms);
  // Memory is not free here: the smallest budget costs step time.
  EXPECT_GT(c.points.front().step_ms, c.keep_all.step_ms * 1.001);
  ASSERT_NE(c.knee, pareto_curve::npos) << "a recompute/offload curve has an elbow";
  EXPECT_GT(c.knee, 0u);
  EXPECT_LT(c.knee, c.points.size() - 1);
}

// Note [Step overhead]: the same budgets are solved and the same plans land on the curve;
// every step time moves by the overhead, and the knee stays where it was.
TEST(Pareto, StepOverheadShiftsTheCurveAndSamplesTheSameBudgets) {
  const step_profile p = small_llama();
  step_profile q = p;
  q.step_overhead_ms = 7.5;
  pareto_options opt;
  opt.max_points = 24;
  const pareto_curve a = pareto_sweep(p, opt), b = pareto_sweep(q, opt);
  expect_curve_invariants(q, b, 24);
  ASSERT_EQ(a.points.size(), b.points.size());
  EXPECT_EQ(a.solver_calls, b.solver_calls);
  EXPECT_NEAR(b.keep_all.step_ms, a.keep_all.step_ms + 7.5, 1e-9);
  EXPECT_NEAR(b.recompute_all.step_ms, a.recompute_all.step_ms + 7.5, 1e-9);
  for (std::size_t i = 0; i < a.points.size(); ++i) {
    EXPECT_EQ(b.points[i].budget_bytes, a.points[i].budget_bytes) << i;
    EXPECT_EQ(b.points[i].plan_budget_bytes, a.points[i].plan_budget_bytes) << i;
    EXPECT_EQ(b.points[i].peak_bytes, a.points[i].peak_bytes) << i;
    EXPECT_NEAR(b.points[i].step_ms, a.points[i].step_ms + 7.5, 1e-9 * b.points[i].step_ms);
    EXPECT_NEAR(b.points[i].solved_step_ms, a.points[i].solved_step_ms + 7.5,
                1e-9 * b.points[i].step_ms);
  }
  EXPECT_EQ(b.knee, a.knee);
}

TEST(Pareto, BisectsEveryChangeDownToTheResolution) {
  const step_profile p = testing::llama_like(6, 3);
  pareto_options opt;
  opt.max_points = 1000;
  opt.initial_points = 3;
  const std::uint64_t from = min_feasible_budget(p);
  const std::uint64_t to = evaluate(p, keep_all(p), ~0ull).peak_bytes;
  opt.resolution_bytes = (to - from) / 40;
  const pareto_curve c = pareto_sweep(p, opt);
  EXPECT_LT(c.solver_calls, 1000);  // it stopped because it was done, not out of calls
  expect_curve_invariants(p, c, 1000);
  int changes = 0;
  for (std::size_t i = 1; i < c.points.size(); ++i) {
    const pareto_point &a = c.points[i - 1], &b = c.points[i];
    if (std::abs(a.solved_step_ms - b.solved_step_ms) <= 1e-6 * a.solved_step_ms) continue;
    ++changes;
    EXPECT_LE(b.budget_bytes - a.budget_bytes, opt.resolution_bytes) << "unrefined change at " << i;
  }
  EXPECT_GT(changes, 5);
}

TEST(Pareto, MonotoneOnRandomProfilesAndRejectsBadRanges) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 6; ++trial) {
    const step_profile p = testing::random_profile(rng, 5, 6);
    pareto_options opt;
    opt.max_points = 20;
    const pareto_curve c = pareto_sweep(p, opt);
    expect_curve_invariants(p, c, 20);
  }
  const step_profile p = testing::llama_like(4, 1);
  pareto_options bad;
  bad.from_bytes = p.fixed_bytes + 100 * MiB;
  bad.to_bytes = p.fixed_bytes + 10 * MiB;
  EXPECT_THROW(pareto_sweep(p, bad), input_error);
  pareto_options infeasible;  // an explicit --from below the smallest feasible budget
  infeasible.from_bytes = p.fixed_bytes + 1;
  EXPECT_THROW(pareto_sweep(p, infeasible), infeasible_budget);
  // Below the fixed bytes it means the same, with the smallest budget named (Note [A
  // budget too small is an answer] in planner.cpp).
  infeasible.from_bytes = p.fixed_bytes / 2;
  try {
    pareto_sweep(p, infeasible);
    ADD_FAILURE() << "a from below fixed_bytes was swept";
  } catch (const infeasible_budget& e) {
    EXPECT_EQ(e.min_feasible_bytes(), min_feasible_budget(p));
    EXPECT_NE(std::string(e.what()).find("below the profile's fixed_bytes"), std::string::npos)
        << e.what();
  }
}

std::vector<pareto_point> points(const std::vector<std::pair<double, double>>& xy) {
  std::vector<pareto_point> v;
  for (const auto& [gib, ms] : xy) {
    pareto_point p;
    p.budget_bytes = static_cast<std::uint64_t>(gib * 1073741824.0);
    p.step_ms = ms;
    v.push_back(p);
  }
  return v;
}

TEST(Pareto, KneeIsTheElbowAndAbsentOnFlatOrStraightCurves) {
  // Steep fall to 20 GiB, then nearly flat: the elbow is at 20.
  EXPECT_EQ(find_knee(points({{10, 200}, {15, 140}, {20, 104}, {30, 102}, {40, 101}, {50, 100}})), 2u);
  EXPECT_EQ(find_knee(points({{10, 200}, {20, 150}, {30, 100}})), pareto_curve::npos);  // straight
  EXPECT_EQ(find_knee(points({{10, 100}, {20, 100}, {30, 100}})), pareto_curve::npos);  // flat
  EXPECT_EQ(find_knee(points({{10, 200}, {20, 199}, {30, 100}})), pareto_curve::npos);  // concave
  EXPECT_EQ(find_knee(points({{10, 200}, {30, 100}})), pareto_curve::npos);
}

pareto_curve hand_curve() {
  pareto_curve c;
  c.points = points({{10, 200}, {15, 140}, {20, 104}, {30, 102}, {50, 100}});
  for (auto& p : c.points) p.solver = "greedy", p.peak_bytes = p.budget_bytes, p.plan_budget_bytes = p.budget_bytes;
  c.knee = find_knee(c.points);
  c.from_bytes = c.points.front().budget_bytes;
  c.to_bytes = c.points.back().budget_bytes;
  c.keep_all = {100, c.to_bytes};
  c.recompute_all = {230, 12ull << 30};
  c.device = "NVIDIA H200";
  c.solver = "greedy";
  return c;
}

TEST(Pareto, CsvHasTheHeaderOneRowPerPointAndOneKnee) {
  const std::string csv = pareto_csv(hand_curve());
  std::istringstream in(csv);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line.rfind("budget_bytes,budget_gib,step_ms,peak_bytes,offloaded_bytes,recompute_ms,solver", 0), 0u);
  int rows = 0, knees = 0;
  while (std::getline(in, line)) {
    ++rows;
    EXPECT_EQ(std::count(line.begin(), line.end(), ','), 9) << line;
    if (line.find(",greedy,1,") != std::string::npos) ++knees;
  }
  EXPECT_EQ(rows, 5);
  EXPECT_EQ(knees, 1);
  EXPECT_NE(csv.find("21474836480,20.0000,104.000000"), std::string::npos);
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (std::size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

TEST(Pareto, SvgIsAWellFormedPlotWithAxesCurveKneeAndReferences) {
  const std::string svg = pareto_svg(hand_curve(), "A & B <test>");
  std::string why;
  EXPECT_TRUE(well_formed_xml(svg, &why)) << why;
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_NE(svg.find("A &amp; B &lt;test&gt;"), std::string::npos);  // title, escaped
  EXPECT_NE(svg.find("device memory budget (GiB)"), std::string::npos);
  EXPECT_NE(svg.find("predicted step time (ms)"), std::string::npos);
  EXPECT_NE(svg.find("id=\"curve\""), std::string::npos);
  EXPECT_NE(svg.find("id=\"knee\""), std::string::npos);
  EXPECT_NE(svg.find("knee: 20.00 GiB, 104.0 ms"), std::string::npos);
  EXPECT_EQ(count(svg, "class=\"reference\""), 2);
  EXPECT_NE(svg.find("keep-all: 100.0 ms"), std::string::npos);
  EXPECT_NE(svg.find("recompute-all: 230.0 ms"), std::string::npos);
  EXPECT_EQ(count(svg, "class=\"sample\""), 5);
  // Ticks: the x axis spans 10..50 GiB, the y axis 100..230 ms.
  const auto x_axis = svg.substr(svg.find("id=\"x-axis\""), svg.find("id=\"y-axis\"") - svg.find("id=\"x-axis\""));
  EXPECT_GE(count(x_axis, "<text"), 4);
  EXPECT_NE(x_axis.find(">20</text>"), std::string::npos);
  const auto y_axis = svg.substr(svg.find("id=\"y-axis\""));
  EXPECT_GE(count(y_axis.substr(0, y_axis.find("</g>")), "<text"), 4);
  // No knee, no marker.
  pareto_curve flat = hand_curve();
  flat.knee = pareto_curve::npos;
  EXPECT_EQ(pareto_svg(flat, "t").find("id=\"knee\""), std::string::npos);
}

}  // namespace
}  // namespace stash::planner
