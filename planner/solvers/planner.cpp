// planner.cpp: make_plan, the lower bound and the smallest feasible budget.
#include "planner/solvers/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <limits>

#include "core/budget.h"
#include "core/bytes.h"
#include "planner/solvers/exact_mip.h"
#include "planner/solvers/inner_solver.h"
#include "planner/solvers/outer_lp.h"
#include "planner/solvers/repair.h"

namespace stash::planner {

const char* to_string(solver_kind s) {
  switch (s) {
    case solver_kind::greedy: return "greedy";
    case solver_kind::ilp: return "ilp";
    case solver_kind::exact: return "exact";
  }
  return "greedy";
}

namespace {

// Note [One check of the plan options]: a solver by name or by number, one wording.
[[noreturn]] void throw_unknown_solver(const std::string& what) {
  throw input_error("unknown solver " + what + " (expected greedy, ilp or exact)");
}

}  // namespace

solver_kind solver_from_string(const std::string& s) {
  if (s == "greedy") return solver_kind::greedy;
  if (s == "ilp") return solver_kind::ilp;
  if (s == "exact") return solver_kind::exact;
  throw_unknown_solver("\"" + s + "\"");
}

void check_plan_options(const plan_options& opt) {
  switch (opt.solver) {
    case solver_kind::greedy:
    case solver_kind::ilp:
    case solver_kind::exact: break;
    default: throw_unknown_solver(std::to_string(static_cast<int>(opt.solver)));
  }
  char got[64];
  if (!(opt.time_limit_s > 0)) {
    std::snprintf(got, sizeof got, "%g", opt.time_limit_s);
    throw input_error(std::string("the time limit (--time-limit, time_limit_s) must be a "
                                  "positive number of seconds, got ") + got);
  }
  if (!(opt.mip_gap >= 0)) {
    std::snprintf(got, sizeof got, "%g", opt.mip_gap);
    throw input_error(std::string("the MIP gap (--mip-gap, mip_gap) must be a non-negative "
                                  "fraction, got ") + got);
  }
}

namespace {

// Models up to this many tensors also try other starting points (see make_plan).
constexpr std::size_t kMultiStartTensors = 400;
// ... and this many also get pairwise moves (polish_pairs is quadratic in tensors).
constexpr std::size_t kPairPolishTensors = 64;

// GiB rounded up, so that the printed figure is itself a feasible budget.
std::string gib_up(std::uint64_t bytes) {
  char buf[64];
  const double gib = std::ceil(static_cast<double>(bytes) / 1073741824.0 * 1000.0) / 1000.0;
  std::snprintf(buf, sizeof buf, "%.3f GiB", gib);
  return buf;
}

std::string infeasible_message(std::uint64_t budget, std::uint64_t min, bool proved,
                               const std::string& why) {
  return "budget " + std::to_string(budget) + " bytes (" + format_bytes(budget) +
         ") is infeasible: the smallest " + (proved ? "" : "known ") + "feasible budget is " +
         std::to_string(min) + " bytes (" + gib_up(min) + ")" + (why.empty() ? "" : "; " + why);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

[[noreturn]] void throw_infeasible(const step_profile& p, std::uint64_t budget,
                                   const std::string& why = "") {
  bool proved = true;
  const std::uint64_t min = min_feasible_budget(p, &proved);
  throw infeasible_budget(budget, std::max(min, budget + 1), proved, why);
}

// Note [A budget too small is an answer]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every position holds the profile's fixed_bytes, and the optimizer's holds its
// optimizer_bytes (Note [The optimizer's position] in plan.h); no decision moves either. A
// budget below them has no plan, like any budget below the least achievable peak, and it
// means the same: the profile and the budget text were well formed and the answer is "no",
// with the smallest budget that has a plan (infeasible_budget: `stash plan` exit 1,
// STASH_ERROR_INFEASIBLE_BUDGET, Python's refusal). It is not malformed input: a caller
// that measured its own fixed bytes (stash.torch.fit) asks exactly this question and needs
// the smallest budget back. It is decided here, once, for make_plan and lower_bound_ms
// (and pareto_sweep through them); callers pass the budget through and report what these
// throw, with no check of their own. The message says which figure the budget is below.
void check_budget(const step_profile& p, std::uint64_t budget) {
  if (budget < p.fixed_bytes) {
    throw_infeasible(p, budget,
                     "it is below the profile's fixed_bytes " + std::to_string(p.fixed_bytes) +
                         " (" + format_bytes(p.fixed_bytes) +
                         "): parameters, gradients and optimizer state alone do not fit");
  }
  if (budget < p.optimizer_bytes) {
    throw_infeasible(p, budget,
                     "it is below the profile's optimizer_bytes " +
                         std::to_string(p.optimizer_bytes) + " (" +
                         format_bytes(p.optimizer_bytes) + "), held at the optimizer step");
  }
}

}  // namespace

infeasible_budget::infeasible_budget(std::uint64_t budget, std::uint64_t min_feasible,
                                     bool min_proved, const std::string& why)
    : error(status::infeasible_budget, infeasible_message(budget, min_feasible, min_proved, why)),
      budget_(budget),
      min_(min_feasible),
      proved_(min_proved) {}

namespace {

bool has_recompute_temps(const step_profile& p) {
  for (const auto& l : p.layers) {
    if (l.bwd_recompute_temp_bytes > 0) return true;
  }
  return false;
}

// Note [The least peak with recompute temporaries]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// min_peak_greedy's decisions put every position at its own least value, each tensor
// doing what frees it earliest, except backward_i where layer i's recompute makes
// temporaries (Note [Backward temporaries of a recompute] in plan.h): that position is
// least with layer i recomputing nothing, at forward_i's least + bwd_temp_i. The larger of
// these least values is a lower bound on every plan's peak; when the greedy decisions
// reach it they are the least peak, with no MIP. Otherwise the bound is the floor of a
// bisection in which repair, asked for a budget under the current peak, recomputes less
// where the term binds; the best decisions it reaches start the minimum-peak MIP. The
// bisection lands within a few parts in 10^4 of the MIP's LP bound on llama-like profiles,
// and GLPK closes that last gap slowly (not in 30 s at 240 tensors), so the MIP gets a
// bounded search here (Note [A search that ends the same way]): small profiles are
// proved, large ones get a budget that works, marked as not proved. Without the term the
// greedy always reaches the bound, and this is the search as it was.
constexpr double kLeastPeakMipSeconds = 10;

// Note [A search that ends the same way]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// min_feasible_budget tells a user (and fit) the smallest budget that plans; make_plan at
// that budget must then plan. Both run find_least_peak on the same (chain-priced) profile,
// so they agree only if the search ends the same way each time. A wall-clock limit does
// not: under load the MIP of a llama-like profile stopped at other nodes, min_feasible
// budget named 23,092,605,370 B and make_plan, searching again, reached only 23,098,639,572
// and refused the budget it had been told (CI, session 23). The search is bounded by
// subproblems instead, which GLPK visits in the same order every time: about
// kLeastPeakNodeWork / tensors^2 of them (a node's LP grows with the tensors; 240 tensors
// get 1,500 nodes, about 0.6 s here, 640 get 210). The clock stays as a
// guard that a normal search never reaches.
constexpr double kLeastPeakNodeWork = 8.64e7;
constexpr long kLeastPeakMinNodes = 64;

long least_peak_nodes(const step_profile& p) {
  double tensors = 0;
  for (const auto& l : p.layers) tensors += static_cast<double>(l.tensors.size());
  const double n = kLeastPeakNodeWork / std::max(1.0, tensors * tensors);
  return std::max(kLeastPeakMinNodes, static_cast<long>(std::min(n, 1e6)));
}

std::uint64_t peak_floor(const step_profile& p, const decision_table& greedy) {
  std::uint64_t floor = p.optimizer_bytes, kept = 0, prev_off = 0;
  for (std::size_t i = 0; i < p.layers.size(); ++i) {
    std::uint64_t k = 0, o = 0;
    for (std::size_t j = 0; j < greedy[i].size(); ++j) {
      const std::uint64_t b = p.layers[i].tensors[j].bytes;
      if (greedy[i][j] == tensor_action::keep) k += b;
      if (greedy[i][j] == tensor_action::offload) o += b;
    }
    const std::uint64_t fwd = p.fixed_bytes + kept + prev_off + p.layers[i].saved_bytes();
    floor = std::max(floor, fwd + p.layers[i].bwd_temp_bytes);
    kept += k;
    prev_off = o;
  }
  return std::max(floor, p.fixed_bytes + kept + prev_off + p.loss_bytes);
}

struct least_peak {
  std::uint64_t bytes = 0;
  decision_table decisions;
  bool proved = true;
};

least_peak find_least_peak(const step_profile& p, double time_limit_s) {
  least_peak out;
  const decision_table greedy = min_peak_greedy(p);
  const evaluation ev = evaluate(p, greedy, UINT64_MAX);
  decision_table start = greedy;
  if (ev.valid) {  // host fits
    out.bytes = ev.peak_bytes;
    out.decisions = greedy;
    if (!has_recompute_temps(p)) return out;  // per tensor this is the least peak
    // Note [The least peak with recompute temporaries].
    const std::uint64_t floor = peak_floor(p, greedy);
    std::uint64_t lo = floor;
    if (out.bytes <= lo) return out;
    while (lo < out.bytes) {
      const std::uint64_t mid = lo + (out.bytes - lo) / 2;
      decision_table next = out.decisions;
      const bool fits = repair(p, mid, next);
      const evaluation e = evaluate(p, next, UINT64_MAX);
      if (fits && e.valid && e.peak_bytes < out.bytes) {
        out.bytes = e.peak_bytes;
        out.decisions = std::move(next);
      } else {
        lo = mid + 1;
      }
    }
    if (out.bytes <= floor) return out;
    start = out.decisions;
    time_limit_s = std::min(time_limit_s, kLeastPeakMipSeconds);
  } else {
    // The host cap binds: which tensors stay on the host is a knapsack-like choice. Start
    // from "no offload at all", which always fits the host, and let the MIP improve on it.
    for (auto& layer : start) {
      for (auto& a : layer) {
        if (a == tensor_action::offload) a = tensor_action::keep;
      }
    }
    out.bytes = evaluate(p, start, UINT64_MAX).peak_bytes;
    out.decisions = start;
  }
  exact_options opt;
  opt.objective = exact_objective::peak;
  opt.time_limit_s = time_limit_s;
  opt.node_limit = least_peak_nodes(p);
  exact_result r = solve_exact(p, 0, opt, &start);
  if (r.found) {
    const evaluation e = evaluate(p, r.decisions, UINT64_MAX);
    if (e.valid && e.peak_bytes < out.bytes) {
      out.bytes = e.peak_bytes;
      out.decisions = std::move(r.decisions);
    }
  }
  out.proved = r.found && r.proved_optimal;
  return out;
}

}  // namespace

std::uint64_t min_feasible_budget(const step_profile& p, bool* proved, double time_limit_s) {
  // The profile make_plan searches (Note [A search that ends the same way]).
  const least_peak least = find_least_peak(chain_priced(p), time_limit_s);
  if (proved) *proved = least.proved;
  return least.bytes;
}

double lower_bound_ms(const step_profile& p, std::uint64_t budget) {
  check_budget(p, budget);
  const outer_lp_result lp = solve_outer_lp(chain_priced(p), budget);
  if (!lp.feasible) throw_infeasible(p, budget);
  return lp.step_lower_bound_ms;
}

step_plan make_plan(const step_profile& given, std::uint64_t budget, const plan_options& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  check_plan_options(opt);  // Note [One check of the plan options] in planner.h
  check_budget(given, budget);
  // Note [Recompute by prefix] in plan.h: the solvers see each chain link at the cost of
  // extending the replay to it; the plan's figures are the given profile's.
  const step_profile p = chain_priced(given);
  const outer_lp_result lp = solve_outer_lp(p, budget);
  if (!lp.feasible) throw_infeasible(p, budget);

  step_plan plan;
  plan.solver = to_string(opt.solver);
  inner_options io;
  io.method = opt.solver == solver_kind::ilp ? inner_method::ilp : inner_method::greedy;
  io.time_limit_s = std::min(opt.time_limit_s, 5.0);
  io.mip_gap = std::max(opt.mip_gap, 1e-6);
  decision_table d = solve_inner(p, lp, io);
  bool valid = evaluate(p, d, budget).valid || repair(p, budget, d);
  if (!valid) {
    // Rounding and repair failed (host cap binding hard): start over from the least peak.
    d = min_peak_greedy(p);
    valid = repair(p, budget, d);
  }
  if (!valid) {
    least_peak least = find_least_peak(p, 30);
    if (least.bytes > budget) throw infeasible_budget(budget, least.bytes, least.proved);
    if (has_recompute_temps(p)) {
      // Its decisions are within the budget (Note [The least peak with recompute
      // temporaries]); solving again would only repeat that search.
      d = std::move(least.decisions);
    } else {
      // The minimum-peak MIP found decisions within the budget; use them.
      exact_options mp;
      mp.objective = exact_objective::peak;
      d = solve_exact(p, 0, mp).decisions;
    }
    valid = evaluate(p, d, budget).valid;
  }
  if (valid && opt.polish) polish(p, budget, d);
  // Multi-start where it is cheap. With few tensors per layer, rounding the LP can be
  // coarse (one tensor is half a layer), and repair from keep-all or polish from the
  // least-peak plan reach a different local optimum. Both cost O(tensors^2), so only
  // small models get them; large ones round finely and do not need them.
  std::size_t tensors = 0;
  for (const auto& l : p.layers) tensors += l.tensors.size();
  if (valid && opt.polish && tensors <= kMultiStartTensors) {
    if (tensors <= kPairPolishTensors) polish_pairs(p, budget, d);
    // Solvers compare layer_ms, not step_ms (Note [Step overhead] in plan.h).
    double best = evaluate(p, d, budget).layer_ms;
    for (decision_table alt : {keep_all(p), min_peak_greedy(p)}) {
      if (!repair(p, budget, alt)) continue;
      polish(p, budget, alt);
      if (tensors <= kPairPolishTensors) polish_pairs(p, budget, alt);
      const evaluation e = evaluate(p, alt, budget);
      if (e.valid && e.layer_ms < best) {
        best = e.layer_ms;
        d = std::move(alt);
      }
    }
  }

  if (opt.solver == solver_kind::exact) {
    // The MIP starts from the better of the greedy and ilp roundings: at scale GLPK rarely
    // improves on its start within the time limit, so exact is never worse than either.
    if (valid) {
      inner_options ilp = io;
      ilp.method = inner_method::ilp;
      decision_table alt = solve_inner(p, lp, ilp);
      if (evaluate(p, alt, budget).valid || repair(p, budget, alt)) {
        if (opt.polish) polish(p, budget, alt);
        if (evaluate(p, alt, budget).layer_ms < evaluate(p, d, budget).layer_ms) d = std::move(alt);
      }
    }
    exact_options eo;
    eo.time_limit_s = opt.time_limit_s;
    eo.mip_gap = opt.mip_gap;
    const exact_result r = solve_exact(p, budget, eo, valid ? &d : nullptr);
    if (r.found && evaluate(p, r.decisions, budget).valid) {
      const double before =
          valid ? evaluate(p, d, budget).layer_ms : std::numeric_limits<double>::infinity();
      if (evaluate(p, r.decisions, budget).layer_ms <= before) d = r.decisions;
      valid = true;
    }
    plan.proved_optimal = r.proved_optimal;
    plan.mip_gap = r.found ? r.gap : 1.0;
  }
  close_prefixes(given, d);  // a guard: every solver keeps prefix plans prefixes
  const evaluation ev = evaluate(given, d, budget);
  if (!ev.valid) {
    // Never emit an invalid plan; reaching this is a planner bug, not a user error.
    throw std::logic_error("planner produced an invalid plan (" + ev.violations.front() + ")");
  }

  plan.budget_bytes = budget;
  plan.profile_sha256 = profile_sha256(given);
  for (std::size_t i = 0; i < p.layers.size(); ++i) {
    const layer_profile& layer = p.layers[i];
    layer_plan lp_out;
    lp_out.index = i;
    lp_out.name = layer.name;
    double k = 0, r = 0, o = 0;
    for (std::size_t j = 0; j < layer.tensors.size(); ++j) {
      lp_out.tensor_names.push_back(layer.tensors[j].name);
      lp_out.actions.push_back(d[i][j]);
      const double b = static_cast<double>(layer.tensors[j].bytes);
      (d[i][j] == tensor_action::keep ? k : d[i][j] == tensor_action::recompute ? r : o) += b;
    }
    const double a = k + r + o;
    if (a > 0) lp_out.fractions = {k / a, r / a, o / a};
    plan.layers.push_back(std::move(lp_out));
  }
  plan.predicted.step_ms = ev.step_ms;
  plan.predicted.peak_bytes = ev.peak_bytes;
  plan.predicted.peak_at = ev.peak_at;
  plan.predicted.exposed_copy_ms = ev.exposed_copy_ms;
  plan.predicted.recompute_ms = ev.recompute_ms;
  plan.predicted.offloaded_bytes = ev.offloaded_bytes;
  plan.predicted.lower_bound_ms = lp.step_lower_bound_ms;
  plan.predicted.gap =
      lp.step_lower_bound_ms > 0 ? ev.step_ms / lp.step_lower_bound_ms - 1.0 : 0.0;
  const evaluation ka = evaluate(given, keep_all(given), budget);
  const evaluation ra = evaluate(given, recompute_all(given), budget);
  plan.keep_all = {ka.step_ms, ka.peak_bytes};
  plan.recompute_all = {ra.step_ms, ra.peak_bytes};
  plan.binding_constraints = lp.binding;
  plan.solve_ms = ms_since(t0);
  return plan;
}

std::uint64_t parse_budget(const std::string& text, const step_profile& p) {
  const budget_spec b = parse_budget_spec(text);
  if (!b.is_share) return b.bytes;
  const std::uint64_t peak = evaluate(p, keep_all(p), UINT64_MAX).peak_bytes;
  return static_cast<std::uint64_t>(static_cast<long double>(peak) * b.percent / 100.0L);
}

}  // namespace stash::planner
