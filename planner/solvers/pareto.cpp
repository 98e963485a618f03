// pareto.cpp: the budget sweep, the envelope, the knee and the CSV (pareto.h).
#include "planner/solvers/pareto.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "core/bytes.h"

namespace stash::planner {

namespace {

struct solved_budget {
  double step_ms = 0, recompute_ms = 0, exposed_copy_ms = 0;
  // The step time without the profile's constant overhead: what the sweep compares, so
  // the budgets it samples and the envelope do not depend on the overhead (Note [Step
  // overhead] in plan.h); step_ms, which includes it, is what is reported.
  double layer_ms = 0;
  std::uint64_t peak_bytes = 0, offloaded_bytes = 0;
  std::string solver;
};

bool changed(const solved_budget& a, const solved_budget& b, double tol) {
  return std::abs(a.layer_ms - b.layer_ms) > tol * std::max(a.layer_ms, b.layer_ms);
}

}  // namespace

pareto_curve pareto_sweep(const step_profile& p, const pareto_options& opt) {
  check_plan_options(opt.plan);  // before the sweep's first solve; Note [One check of the plan options]
  pareto_curve c;
  c.device = p.device_name;
  c.solver = to_string(opt.plan.solver);
  const evaluation ka = evaluate(p, keep_all(p), ~0ull);
  const evaluation ra = evaluate(p, recompute_all(p), ~0ull);
  c.keep_all = {ka.step_ms, ka.peak_bytes};
  c.recompute_all = {ra.step_ms, ra.peak_bytes};
  c.from_bytes = opt.from_bytes ? opt.from_bytes : min_feasible_budget(p);
  c.to_bytes = opt.to_bytes ? opt.to_bytes : ka.peak_bytes;
  if (c.from_bytes > c.to_bytes)
    throw input_error("pareto: --from " + format_bytes(c.from_bytes) + " exceeds --to " +
                      format_bytes(c.to_bytes));
  if (opt.initial_points < 2 || opt.max_points < opt.initial_points)
    throw input_error("pareto: need 2 <= initial points <= max points");
  const std::uint64_t span = c.to_bytes - c.from_bytes;
  const std::uint64_t resolution =
      opt.resolution_bytes ? opt.resolution_bytes : std::max<std::uint64_t>(span / 512, 1048576);

  std::map<std::uint64_t, solved_budget> solved;
  std::set<std::uint64_t> tried;  // infeasible answers leave no point but must not repeat
  auto solve = [&](std::uint64_t budget) {
    if (!tried.insert(budget).second) return;
    const auto t0 = std::chrono::steady_clock::now();
    solved_budget s;
    try {
      const step_plan plan = make_plan(p, budget, opt.plan);
      s = {plan.predicted.step_ms,
           plan.predicted.recompute_ms,
           plan.predicted.exposed_copy_ms,
           evaluate(p, plan.decisions(), budget).layer_ms,
           plan.predicted.peak_bytes,
           plan.predicted.offloaded_bytes,
           plan.solver};
    } catch (const infeasible_budget&) {
      // Only at `from` when it was given, or when the host-capped minimum was not proved.
      if (budget == c.from_bytes && opt.from_bytes) throw;
      ++c.solver_calls;
      return;
    }
    ++c.solver_calls;
    solved[budget] = s;
    if (opt.progress) {
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      opt.progress(c.solver_calls, opt.max_points, budget, s.step_ms, ms);
    }
  };

  const int n = span == 0 ? 1 : opt.initial_points;
  for (int k = 0; k < n; ++k)
    solve(k + 1 == n ? c.to_bytes
                     : c.from_bytes + static_cast<std::uint64_t>(
                                          static_cast<long double>(span) * k / (n - 1)));
  // Bisect where the answer changes, always the interval with the biggest change in step
  // time, until the calls run out or every changing interval is below the resolution.
  for (;;) {
    if (c.solver_calls >= opt.max_points) break;
    std::uint64_t split = 0;
    double biggest = -1;
    for (auto it = solved.begin(); it != solved.end() && std::next(it) != solved.end(); ++it) {
      const auto nx = std::next(it);
      const std::uint64_t mid = it->first + (nx->first - it->first) / 2;
      if (nx->first - it->first <= resolution || tried.count(mid) ||
          !changed(it->second, nx->second, opt.step_tolerance))
        continue;
      const double delta = std::abs(it->second.layer_ms - nx->second.layer_ms);
      if (delta > biggest) biggest = delta, split = mid;
    }
    if (biggest < 0) break;
    solve(split);
  }

  // Note [Pareto envelope]
  const solved_budget* best = nullptr;
  std::uint64_t best_budget = 0;
  for (const auto& [budget, s] : solved) {
    if (!best || s.layer_ms < best->layer_ms) best = &s, best_budget = budget;
    pareto_point pt;
    pt.budget_bytes = budget;
    pt.solved_step_ms = s.step_ms;
    pt.step_ms = best->step_ms;
    pt.peak_bytes = best->peak_bytes;
    pt.offloaded_bytes = best->offloaded_bytes;
    pt.recompute_ms = best->recompute_ms;
    pt.exposed_copy_ms = best->exposed_copy_ms;
    pt.solver = best->solver;
    pt.plan_budget_bytes = best_budget;
    c.carried_forward += best_budget != budget;
    c.points.push_back(pt);
  }
  c.knee = find_knee(c.points);
  return c;
}

std::size_t find_knee(const std::vector<pareto_point>& pts) {
  if (pts.size() < 3) return pareto_curve::npos;
  const pareto_point &lo = pts.front(), &hi = pts.back();
  const double dx = static_cast<double>(hi.budget_bytes - lo.budget_bytes);
  const double dy = lo.step_ms - hi.step_ms;
  if (dx <= 0 || dy <= 1e-4 * hi.step_ms) return pareto_curve::npos;  // flat: no elbow
  std::size_t knee = pareto_curve::npos;
  double best = 0.01;  // must lie at least 1% of the range below the chord
  for (std::size_t i = 1; i + 1 < pts.size(); ++i) {
    const double x = (pts[i].budget_bytes - lo.budget_bytes) / dx;
    const double y = (pts[i].step_ms - hi.step_ms) / dy;
    if (1 - x - y > best) best = 1 - x - y, knee = i;
  }
  return knee;
}

std::string pareto_csv(const pareto_curve& c) {
  std::string out =
      "budget_bytes,budget_gib,step_ms,peak_bytes,offloaded_bytes,recompute_ms,solver,knee,"
      "plan_budget_bytes,solved_step_ms\n";
  char line[320];
  for (std::size_t i = 0; i < c.points.size(); ++i) {
    const pareto_point& p = c.points[i];
    std::snprintf(line, sizeof line, "%llu,%.4f,%.6f,%llu,%llu,%.6f,%s,%d,%llu,%.6f\n",
                  static_cast<unsigned long long>(p.budget_bytes),
                  p.budget_bytes / 1073741824.0, p.step_ms,
                  static_cast<unsigned long long>(p.peak_bytes),
                  static_cast<unsigned long long>(p.offloaded_bytes), p.recompute_ms,
                  p.solver.c_str(), i == c.knee ? 1 : 0,
                  static_cast<unsigned long long>(p.plan_budget_bytes), p.solved_step_ms);
    out += line;
  }
  return out;
}

}  // namespace stash::planner
