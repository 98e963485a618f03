// pareto.h: the budget -> step time curve (`stash pareto`): a sweep that bisects where the
// planner's answer changes, the knee, and CSV / SVG output.
//
// Note [Pareto envelope]
// ~~~~~~~~~~~~~~~~~~~~~~
// A plan valid at budget b is valid at every larger budget (validity is peak <= budget),
// so the best step time achievable at b is the minimum over all plans solved at budgets
// <= b. The heuristic solvers are not monotone in the budget (greedy rounding can land a
// little worse at a larger budget), so each point reports that running minimum: where a
// smaller budget's plan is better it is carried forward (plan_budget_bytes says whose
// plan it is, solved_step_ms what the solver returned at this budget). The curve is thus
// non-increasing by construction, and every figure on it is a real, valid plan's.
//
// Note [Knee]
// ~~~~~~~~~~~
// With budget normalised to x in [0, 1] over [from, to] and step time to y in [0, 1] over
// [step(to), step(from)], the knee is the point farthest below the chord from (0, 1) to
// (1, 0), i.e. the largest 1 - x - y (the "Kneedle" rule): below it memory savings start to
// cost step time quickly, above it extra memory buys little. There is no knee when the curve
// is flat (step(from) within 0.01% of step(to)) or nowhere below the chord by more than 1%
// of the range (a straight or concave curve has no elbow worth naming). Step times here
// include the profile's step overhead: the normalised knee does not move with it, but the
// flatness test is relative to the whole step. The sweep's bisection and the envelope
// compare step times without it, so the budgets solved and the plans on the curve do not
// depend on it (Note [Step overhead] in plan.h).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "planner/solvers/planner.h"

namespace stash::planner {

struct pareto_options {
  std::uint64_t from_bytes = 0;  // 0: min_feasible_budget(p)
  std::uint64_t to_bytes = 0;    // 0: the keep-all peak
  plan_options plan;
  int initial_points = 9;  // evenly spaced over [from, to], ends included
  int max_points = 64;     // solver calls in all
  // Intervals narrower than this are not bisected; 0: (to - from) / 512, at least 1 MiB.
  std::uint64_t resolution_bytes = 0;
  // Relative step-time difference that counts as "the answer changed".
  double step_tolerance = 1e-6;
  // Called once per solved point, e.g. to print progress on stderr.
  std::function<void(int done, int max, std::uint64_t budget, double step_ms, double solve_ms)>
      progress;
};

struct pareto_point {
  std::uint64_t budget_bytes = 0;
  double step_ms = 0;  // the envelope's: best plan at any budget <= this one
  std::uint64_t peak_bytes = 0;
  std::uint64_t offloaded_bytes = 0;
  double recompute_ms = 0;
  double exposed_copy_ms = 0;
  std::string solver;
  std::uint64_t plan_budget_bytes = 0;  // the budget the reported plan was solved at
  double solved_step_ms = 0;            // what the solver returned at budget_bytes
};

struct pareto_curve {
  std::vector<pareto_point> points;  // ascending budget
  std::size_t knee = npos;          // index into points, or npos
  std::uint64_t from_bytes = 0, to_bytes = 0;
  baseline keep_all, recompute_all;
  std::string device, solver;
  int solver_calls = 0;
  int carried_forward = 0;  // points whose plan came from a smaller budget
  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();
};

// Throws input_error for from > to; infeasible_budget when `from` was given and no plan
// exists there, a from below fixed_bytes included (make_plan decides it, Note [A budget
// too small is an answer] in planner.cpp).
pareto_curve pareto_sweep(const step_profile& p, const pareto_options& opt = {});

// Note [Knee]; points ascending in budget with non-increasing step time.
std::size_t find_knee(const std::vector<pareto_point>& points);

// The curve as CSV, one row per point; its SVG plot is pareto_svg (planner/plots/pareto_svg.h).
std::string pareto_csv(const pareto_curve& c);

}  // namespace stash::planner
