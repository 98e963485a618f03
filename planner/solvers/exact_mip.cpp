// exact_mip.cpp: the whole-model MIP (solver `exact`) and the minimum-peak MIP.
#include "planner/solvers/exact_mip.h"

#include <algorithm>
#include <cmath>

#include "planner/solvers/glpk_problem.h"
#include "planner/solvers/layer_terms.h"

namespace stash::planner {

// Note [Exact MIP linearization]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Variables, bytes in MiB: binaries xr_ij, xo_ij for each tensor and each action allowed()
// permits (a missing binary is a forbidden action; keep is 1 - xr - xo, row choice[i,j]).
//   off_i = sum_j b_ij xo_ij,  red_i = sum_j b_ij (xr_ij + xo_ij),  cum_i = cum_{i-1} + red_i
// are continuous and defined by equality rows, which keeps each peak row at three terms.
//
// Peak: the canonical peak is a max over positions; "max <= budget" is exactly the set of
// rows peak:forward[i], peak:loss and peak:backward[i] <= budget (same form as Note [Outer
// LP]). peak:backward[i] also carries layer i's recompute temporaries, b_ij ·
// bwd_recompute_temp_i / S_i on each xr_ij (Note [Backward temporaries of a recompute] in
// plan.h), where that is not 0. For
// the minimum-peak objective a free column P replaces the budget: row - P <= 0, min P.
//
// Exposed copy time: max(0, O_i/d2h - fwd_{i+1}) is convex, and it appears only in the
// objective, with coefficient +1. Its epigraph ed_i >= 0, ed_i >= off_i·unit/d2h - fwd_{i+1}
// with ed_i priced at 1 is exact: any optimum has ed_i equal to the max, since lowering it
// to the max keeps feasibility and lowers the objective. The same holds for eh_i. So the
// MIP's objective at its optimum is the canonical step time minus the constant compute
// time, with no big-M and no extra binaries.
//
// Host: sum_i off_i <= pinnable. Prefix profiles (Note [Recompute by prefix] in plan.h):
// xr of a chain link <= xr of the link before it. The LP relaxation of this MIP equals the
// outer LP.

namespace {

std::string idx(const char* base, std::size_t i) {
  return std::string(base) + "[" + std::to_string(i) + "]";
}

}  // namespace

exact_result solve_exact(const step_profile& p, std::uint64_t budget_bytes,
                         const exact_options& opt, const decision_table* start) {
  const std::size_t L = p.layers.size();
  const double unit = kLpByteUnit;
  const bool peak_mode = opt.objective == exact_objective::peak;
  const bool integer = !opt.relax;
  glpk_problem mip(peak_mode ? "stash_min_peak" : "stash_exact");
  std::vector<std::vector<int>> xr(L), xo(L);
  std::vector<int> off(L), red(L), cum(L), ed(L, -1), eh(L, -1);
  const int P = peak_mode ? mip.add_col("peak", -kInf, kInf, 1) : -1;

  for (std::size_t i = 0; i < L; ++i) {
    const layer_profile& layer = p.layers[i];
    xr[i].assign(layer.tensors.size(), -1);
    xo[i].assign(layer.tensors.size(), -1);
    std::vector<std::pair<int, double>> off_row, red_row;
    for (std::size_t j = 0; j < layer.tensors.size(); ++j) {
      const tensor_profile& t = layer.tensors[j];
      if (t.bytes == 0) continue;
      const double mib = static_cast<double>(t.bytes) / unit;
      const std::string tag = "[" + std::to_string(i) + "," + std::to_string(j) + "]";
      if (allowed(p, i, j, tensor_action::recompute)) {
        xr[i][j] = mip.add_col("xr" + tag, 0, 1, peak_mode ? 0 : t.recompute_ms, integer);
        red_row.push_back({xr[i][j], -mib});
      }
      if (allowed(p, i, j, tensor_action::offload)) {
        xo[i][j] = mip.add_col("xo" + tag, 0, 1, 0, integer);
        red_row.push_back({xo[i][j], -mib});
        off_row.push_back({xo[i][j], -mib});
      }
      if (xr[i][j] >= 0 && xo[i][j] >= 0) {
        mip.add_row("choice" + tag, -kInf, 1, {{xr[i][j], 1}, {xo[i][j], 1}});
      }
    }
    if (p.recompute == recompute_cost::prefix) {
      // Note [Recompute by prefix] in plan.h: a chain link only after the one before it.
      int prev = -1;
      for (std::size_t j = 0; j < layer.tensors.size(); ++j) {
        if (xr[i][j] < 0) continue;
        if (prev >= 0) {
          mip.add_row("prefix[" + std::to_string(i) + "," + std::to_string(j) + "]", 0, kInf,
                      {{prev, 1}, {xr[i][j], -1}});
        }
        prev = xr[i][j];
      }
    }
    off[i] = mip.add_col(idx("off", i), 0, kInf, 0);
    red[i] = mip.add_col(idx("reduced", i), 0, kInf, 0);
    cum[i] = mip.add_col(idx("cumulative", i), 0, kInf, 0);
    off_row.push_back({off[i], 1});
    mip.add_row(idx("offload", i), 0, 0, off_row);
    red_row.push_back({red[i], 1});
    mip.add_row(idx("reduced", i), 0, 0, red_row);
    std::vector<std::pair<int, double>> cum_row{{cum[i], 1}, {red[i], -1}};
    if (i > 0) cum_row.push_back({cum[i - 1], -1});
    mip.add_row(idx("cumulative", i), 0, 0, cum_row);
    if (i + 1 < L && !peak_mode) {
      ed[i] = mip.add_col(idx("exposed_d2h", i), 0, kInf, 1);
      eh[i] = mip.add_col(idx("exposed_h2d", i), 0, kInf, 1);
      mip.add_row(idx("d2h_window", i), -kInf, p.layers[i + 1].fwd_ms,
                  {{off[i], unit / p.d2h_bytes_per_ms()}, {ed[i], -1}});
      mip.add_row(idx("h2d_window", i), -kInf, p.layers[i + 1].bwd_ms,
                  {{off[i], unit / p.h2d_bytes_per_ms()}, {eh[i], -1}});
    }
  }
  double saved_through = static_cast<double>(p.fixed_bytes);
  const double b = peak_mode ? 0.0 : static_cast<double>(budget_bytes);
  for (std::size_t i = 0; i < L; ++i) {
    saved_through += static_cast<double>(p.layers[i].saved_bytes());
    std::vector<std::pair<int, double>> row;
    if (P >= 0) row.push_back({P, -1});
    if (i > 0) {
      row.push_back({cum[i - 1], -1});
      row.push_back({off[i - 1], 1});
    }
    const double temp = static_cast<double>(p.layers[i].bwd_temp_bytes);
    mip.add_row(idx("peak:forward", i), -kInf, (b - saved_through) / unit, row);
    const std::uint64_t rtemp = p.layers[i].bwd_recompute_temp_bytes;
    if (const std::uint64_t S = rtemp > 0 ? recomputable_bytes(p, i) : 0; S > 0) {
      const double per_byte = static_cast<double>(rtemp) / static_cast<double>(S);
      for (std::size_t j = 0; j < xr[i].size(); ++j) {
        if (xr[i][j] < 0) continue;
        const double mib = static_cast<double>(p.layers[i].tensors[j].bytes) / unit;
        row.push_back({xr[i][j], per_byte * mib});
      }
    }
    mip.add_row(idx("peak:backward", i), -kInf, (b - saved_through - temp) / unit, row);
  }
  {  // Note [The loss's position] in plan.h: every layer's kept bytes, the last's offload.
    std::vector<std::pair<int, double>> row{{cum[L - 1], -1}, {off[L - 1], 1}};
    if (P >= 0) row.push_back({P, -1});
    const double loss = static_cast<double>(p.loss_bytes);
    mip.add_row("peak:loss", -kInf, (b - saved_through - loss) / unit, row);
  }
  std::vector<std::pair<int, double>> host;
  for (std::size_t i = 0; i < L; ++i) host.push_back({off[i], 1});
  mip.add_row("host", -kInf, static_cast<double>(p.pinnable_bytes) / unit, host);

  // The step overhead is a constant like compute (Note [Step overhead] in plan.h).
  double compute = p.step_overhead_ms;
  for (const auto& l : p.layers) compute += l.fwd_ms + l.bwd_ms;
  // Objective values come back in MiB (peak) or ms without compute (step); convert.
  const auto to_user = [&](double v) { return peak_mode ? v * unit : v + compute; };

  exact_result out;
  if (opt.relax) {
    const solve_status st = mip.solve_lp();
    out.infeasible = st == solve_status::infeasible;
    if (st == solve_status::optimal) {
      out.lp_relaxation = out.best_bound = out.objective = to_user(mip.objective());
    }
    return out;
  }

  // A valid start becomes the first incumbent: set every column to the value it implies.
  std::vector<double> x0;
  if (start != nullptr) {
    x0.assign(mip.num_cols(), 0.0);
    double cumulative = 0, peak = 0;
    const evaluation ev = evaluate(p, *start, budget_bytes);
    for (std::size_t i = 0; i < L; ++i) {
      double o = 0, r = 0;
      for (std::size_t j = 0; j < p.layers[i].tensors.size(); ++j) {
        const double mib = static_cast<double>(p.layers[i].tensors[j].bytes) / unit;
        const tensor_action a = start->at(i).at(j);
        if (a == tensor_action::recompute && xr[i][j] >= 0) {
          x0[xr[i][j]] = 1;
          r += mib;
        } else if (a == tensor_action::offload && xo[i][j] >= 0) {
          x0[xo[i][j]] = 1;
          o += mib;
        }
      }
      cumulative += r + o;
      x0[off[i]] = o;
      x0[red[i]] = r + o;
      x0[cum[i]] = cumulative;
      if (ed[i] >= 0) {
        x0[ed[i]] = std::max(0.0, o * unit / p.d2h_bytes_per_ms() - p.layers[i + 1].fwd_ms);
        x0[eh[i]] = std::max(0.0, o * unit / p.h2d_bytes_per_ms() - p.layers[i + 1].bwd_ms);
      }
    }
    peak = static_cast<double>(ev.peak_bytes) / unit;
    if (P >= 0) x0[P] = peak;
    // Only valid plans may be offered; for the minimum peak, "valid" ignores the budget.
    const bool usable = peak_mode ? std::none_of(ev.violations.begin(), ev.violations.end(),
                                                 [](const std::string& v) {
                                                   return v.rfind("peak:", 0) != 0;
                                                 })
                                  : ev.valid;
    if (!usable) x0.clear();
  }

  const mip_outcome res = mip.solve_mip(opt.time_limit_s, opt.mip_gap, x0, opt.node_limit);
  out.lp_relaxation = to_user(res.lp_relaxation);
  if (res.status == solve_status::infeasible) {
    out.infeasible = true;
    return out;
  }
  if (res.status != solve_status::optimal && res.status != solve_status::feasible) return out;
  out.found = true;
  out.proved_optimal = res.proved_optimal;
  out.objective = to_user(res.objective);
  out.best_bound = to_user(res.best_bound);
  out.gap = res.gap;
  if (!peak_mode) {  // report the gap on the step time, not on the objective without compute
    out.gap = out.objective > 0 ? (out.objective - out.best_bound) / out.objective : 0;
  }
  out.decisions = keep_all(p);
  for (std::size_t i = 0; i < L; ++i) {
    for (std::size_t j = 0; j < xr[i].size(); ++j) {
      if (xr[i][j] >= 0 && mip.col_value(xr[i][j]) > 0.5)
        out.decisions[i][j] = tensor_action::recompute;
      if (xo[i][j] >= 0 && mip.col_value(xo[i][j]) > 0.5)
        out.decisions[i][j] = tensor_action::offload;
    }
  }
  return out;
}

}  // namespace stash::planner
