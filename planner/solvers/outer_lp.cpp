// outer_lp.cpp: builds and solves the outer LP (GLPK simplex through glpk_problem).
#include "planner/solvers/outer_lp.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "planner/solvers/glpk_problem.h"
#include "planner/solvers/layer_terms.h"

namespace stash::planner {

// Note [Outer LP]
// ~~~~~~~~~~~~~~~
// Units: bytes in MiB (kLpByteUnit), times in ms. Per layer i, with the tensors split by
// what the rules allow them to do (allowed()):
//   R-only  recompute allowed, offload not     RO  both allowed     O-only  offload only
// columns
//   r_ij in [0, b_j]   for every tensor j that may be recomputed, cost c_j / b_j per MiB.
//                      All r_ij of one class have identical constraint columns, so the LP
//                      fills them cheapest ms-per-byte first: together they are the convex
//                      piecewise-linear recompute cost of the layer's recomputed bytes.
//   oO_i in [0, |O-only|], oRO_i in [0, |RO|]   offloaded bytes drawn from each class;
//                                                off_i = oO_i + oRO_i
//   ed_i, eh_i >= 0, cost 1                      exposed D2H / H2D time (priced slack)
// rows (named as `stash check` names violations)
//   choice[i]          sum_{j in RO} r_ij + oRO_i <= |RO|   a tensor goes one way only
//   d2h_window[i]      off_i · unit/d2h - ed_i <= fwd_{i+1}
//   h2d_window[i]      off_i · unit/h2d - eh_i <= bwd_{i+1}
//   peak:backward[i]   fixed + sum_{l<=i} A_l + bwd_temp_i + t_i · sum_j r_ij
//                        - sum_{l<i} sum_j r_lj - sum_{l<i-1} off_l              <= budget
//                      (K_l = A_l - r_l - off_l for l < i, plus off_{i-1} still in flight;
//                      t_i = bwd_recompute_temp_i / S_i, Note [Backward temporaries of a
//                      recompute] in plan.h, a coefficient only where it is not 0)
//   peak:loss          the same form as position L (Note [The loss's position] in plan.h):
//                        fixed + sum_{l<L} A_l + loss_bytes - sum_{l<L} r_l
//                        - sum_{l<L-1} off_l                                    <= budget
//   host               sum off_i <= pinnable
//   prefix[i,k]        r_{i,k-1}/b_{k-1} - r_{i,k}/b_k >= 0, for prefix profiles only
//                      (Note [Recompute by prefix] in plan.h): the chain's links in order
// objective: sum r_ij·c_j/b_j + sum (ed_i + eh_i) (+ the constant compute time).
//
// peak:forward[i] has the left-hand side of peak:backward[i] less t_i · r_i >= 0 and a
// bound larger by bwd_temp_i >= 0, so it is implied and never added. The backward rows
// are generated lazily: the model starts with the row that is tightest under keep-all
// (where t_i · r_i is 0); after each solve every violated row is added (warm start: the
// old basis stays dual feasible) until the point satisfies all L rows. The result is the optimum of the full LP, with a few rows
// instead of L dense ones. At most L rounds; in practice two or three.
//
// Exactness: this is the projection of the per-tensor relaxation (0 <= x_r + x_o <= 1 per
// tensor) onto per-class aggregates. Given any LP point, the RO offload amount oRO_i fits in
// the RO capacity the recompute columns leave unused (row choice[i]), so it can be spread
// over those tensors; conversely every per-tensor point aggregates to an LP point of equal
// cost. Hence the LP optimum is the whole model's LP relaxation (the exact MIP's root, see
// Note [Exact MIP linearization]), the lower bound every plan carries. Because ed/eh are
// minimised, at the optimum ed_i = max(0, off_i/d2h - fwd_{i+1}): the LP objective is the
// canonical step time of its fractional point.
//
// Infeasible budgets: a slack column s, fixed at 0, sits in every peak row (row - s <=
// budget). If the LP is infeasible, phase 1 frees s and minimises it alone (row generation
// continues); budget + s* is the smallest budget at which the relaxation is feasible.

namespace {

struct layer_cols {
  std::vector<int> r;      // recompute columns
  double rtemp = 0;        // t_i: peak:backward[i]'s coefficient on them (Note [Outer LP])
  std::vector<bool> r_ro;  // whether the tensor behind r[k] is in RO
  std::vector<double> r_mib;  // its bytes in MiB
  int oO = -1, oRO = -1, ed = -1, eh = -1;
};

std::string idx(const char* base, std::size_t i) {
  return std::string(base) + "[" + std::to_string(i) + "]";
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

outer_lp_result solve_outer_lp(const step_profile& p, std::uint64_t budget_bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::size_t L = p.layers.size();
  const double unit = kLpByteUnit;
  glpk_problem lp("stash_outer_lp");
  std::vector<layer_cols> cols(L);
  const int slack = lp.add_col("budget_slack", 0, 0, 0);
  std::vector<std::pair<int, double>> host;

  for (std::size_t i = 0; i < L; ++i) {
    const layer_profile& layer = p.layers[i];
    layer_cols& c = cols[i];
    double o_only = 0, ro = 0;
    for (std::size_t j = 0; j < layer.tensors.size(); ++j) {
      const tensor_profile& t = layer.tensors[j];
      if (t.bytes == 0) continue;  // nothing to save by moving it
      const double mib = static_cast<double>(t.bytes) / unit;
      const bool rec = allowed(p, i, j, tensor_action::recompute);
      const bool off = allowed(p, i, j, tensor_action::offload);
      if (rec) {
        c.r.push_back(lp.add_col("r[" + std::to_string(i) + "," + std::to_string(j) + "]", 0,
                                 mib, t.recompute_ms / mib));
        c.r_ro.push_back(off);
        c.r_mib.push_back(mib);
      }
      if (off && rec) ro += mib;
      if (off && !rec) o_only += mib;
    }
    // Note [Backward temporaries of a recompute] in plan.h: bytes per byte, so per MiB too.
    if (layer.bwd_recompute_temp_bytes > 0 && !c.r.empty()) {
      c.rtemp = static_cast<double>(layer.bwd_recompute_temp_bytes) /
                static_cast<double>(recomputable_bytes(p, i));
    }
    if (p.recompute == recompute_cost::prefix) {
      // Note [Recompute by prefix]: the r columns are the layer's chain in save order; a
      // link is recomputed no more than the one before it (as fractions of their bytes).
      for (std::size_t k = 1; k < c.r.size(); ++k) {
        lp.add_row("prefix[" + std::to_string(i) + "," + std::to_string(k) + "]", 0, kInf,
                   {{c.r[k - 1], 1 / c.r_mib[k - 1]}, {c.r[k], -1 / c.r_mib[k]}});
      }
    }
    c.oO = lp.add_col(idx("off_only", i), 0, o_only, 0);
    c.oRO = lp.add_col(idx("off_ro", i), 0, ro, 0);
    host.push_back({c.oO, 1});
    host.push_back({c.oRO, 1});
    if (ro > 0) {
      std::vector<std::pair<int, double>> ch{{c.oRO, 1}};
      for (std::size_t k = 0; k < c.r.size(); ++k) {
        if (c.r_ro[k]) ch.push_back({c.r[k], 1});
      }
      lp.add_row(idx("choice", i), -kInf, ro, ch);
    }
    if (i + 1 < L && o_only + ro > 0) {
      c.ed = lp.add_col(idx("exposed_d2h", i), 0, kInf, 1);
      c.eh = lp.add_col(idx("exposed_h2d", i), 0, kInf, 1);
      const double d = unit / p.d2h_bytes_per_ms(), h = unit / p.h2d_bytes_per_ms();
      lp.add_row(idx("d2h_window", i), -kInf, p.layers[i + 1].fwd_ms,
                 {{c.oO, d}, {c.oRO, d}, {c.ed, -1}});
      lp.add_row(idx("h2d_window", i), -kInf, p.layers[i + 1].bwd_ms,
                 {{c.oO, h}, {c.oRO, h}, {c.eh, -1}});
    }
  }
  const int host_row = lp.add_row("host", -kInf, static_cast<double>(p.pinnable_bytes) / unit, host);

  // Bound of peak:backward[i] in MiB once its constants move to the right-hand side; row L
  // is peak:loss.
  std::vector<double> rhs(L + 1);
  double saved_through = static_cast<double>(p.fixed_bytes);
  for (std::size_t i = 0; i < L; ++i) {
    saved_through += static_cast<double>(p.layers[i].saved_bytes());
    rhs[i] = (static_cast<double>(budget_bytes) - saved_through -
              static_cast<double>(p.layers[i].bwd_temp_bytes)) / unit;
  }
  rhs[L] = (static_cast<double>(budget_bytes) - saved_through -
            static_cast<double>(p.loss_bytes)) / unit;
  // Left-hand sides of every peak:backward[i] at the current LP point, in one pass:
  // bytes freed by layers < i, less the previous layer's offload (still resident at i).
  const auto lhs_all = [&] {
    std::vector<double> v(L + 1);
    double freed_r = 0, freed_o = 0, prev_o = 0;
    const double s = lp.col_value(slack);
    for (std::size_t i = 0; i <= L; ++i) {
      v[i] = -s - freed_r - freed_o;
      if (i == L) break;
      double r = 0;
      for (int k : cols[i].r) r += lp.col_value(k);
      if (cols[i].rtemp > 0) v[i] += cols[i].rtemp * r;
      freed_r += r;
      freed_o += prev_o;  // layer i-1's offload counts as freed from position i+1 on
      prev_o = lp.col_value(cols[i].oO) + lp.col_value(cols[i].oRO);
    }
    return v;
  };
  std::vector<bool> in_model(L + 1, false);
  const auto add_peak_row = [&](std::size_t i) {
    std::vector<std::pair<int, double>> row{{slack, -1}};
    for (std::size_t l = 0; l < i; ++l) {
      for (int k : cols[l].r) row.push_back({k, -1});
      if (l + 1 < i) {
        row.push_back({cols[l].oO, -1});
        row.push_back({cols[l].oRO, -1});
      }
    }
    if (i < L && cols[i].rtemp > 0) {
      for (int k : cols[i].r) row.push_back({k, cols[i].rtemp});
    }
    lp.add_row(i == L ? std::string("peak:loss") : idx("peak:backward", i), -kInf, rhs[i], row);
    in_model[i] = true;
  };
  // Seed with the position that is worst when everything is kept: the row most likely
  // to bind. Others join only when the LP point violates them.
  std::size_t seed = 0;
  for (std::size_t i = 1; i <= L; ++i) {
    if (rhs[i] < rhs[seed]) seed = i;
  }
  add_peak_row(seed);

  outer_lp_result out;
  bool phase1 = false;
  for (std::size_t round = 0; round <= L; ++round) {
    solve_status st = lp.solve_lp();
    if (st == solve_status::infeasible && !phase1) {
      // Phase 1: only the slack is priced; rows and columns are unchanged.
      phase1 = true;
      for (int k = 0; k < lp.num_cols(); ++k) lp.set_cost(k, 0);
      lp.set_col_bounds(slack, 0, kInf);
      lp.set_cost(slack, 1);
      st = lp.solve_lp();
    }
    if (st != solve_status::optimal) {
      throw std::runtime_error(std::string("outer LP: ") + to_string(st));
    }
    // Add every violated peak row; stop when the point satisfies them all.
    bool added = false;
    const double tol = 1e-7 * (1.0 + std::fabs(static_cast<double>(budget_bytes)) / unit);
    const std::vector<double> lhs = lhs_all();
    for (std::size_t i = 0; i <= L; ++i) {
      if (!in_model[i] && lhs[i] > rhs[i] + tol) {
        add_peak_row(i);
        added = true;
      }
    }
    if (!added) break;
  }
  out.solve_ms = ms_since(t0);
  if (phase1) {
    const double s = lp.col_value(slack) * unit;
    out.lp_min_budget = budget_bytes + static_cast<std::uint64_t>(std::ceil(std::max(0.0, s)));
    return out;
  }

  out.feasible = true;
  double compute = 0;
  for (const auto& l : p.layers) compute += l.fwd_ms + l.bwd_ms;
  // The step overhead is a constant of every plan (Note [Step overhead] in plan.h).
  out.step_lower_bound_ms = compute + lp.objective() + p.step_overhead_ms;
  const bool host_binds = std::fabs(lp.row_dual(host_row)) > 1e-9;
  for (std::size_t i = 0; i < L; ++i) {
    const layer_cols& c = cols[i];
    layer_target t;
    for (int k : c.r) t.recompute_bytes += lp.col_value(k) * unit;
    t.offload_bytes = (lp.col_value(c.oO) + lp.col_value(c.oRO)) * unit;
    t.keep_bytes = std::max(
        0.0, static_cast<double>(p.layers[i].saved_bytes()) - t.recompute_bytes - t.offload_bytes);
    t.offload_cap = host_binds ? t.offload_bytes : kInf;
    out.layers.push_back(t);
  }
  for (const std::string& name : lp.binding_rows()) {
    if (name.rfind("choice", 0) != 0 && name.rfind("prefix", 0) != 0) out.binding.push_back(name);
  }
  return out;
}

}  // namespace stash::planner
