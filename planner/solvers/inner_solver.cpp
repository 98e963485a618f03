// inner_solver.cpp: per-layer greedy and ILP choice of tensors (see inner_solver.h).
#include "planner/solvers/inner_solver.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>

#include "planner/solvers/glpk_problem.h"
#include "planner/solvers/layer_terms.h"

namespace stash::planner {
namespace {

struct item {
  double bytes = 0;
  double cost = 0;  // recompute_ms
  bool can_r = false, can_o = false;
};

// One layer's inner problem with integral byte targets.
struct layer_problem {
  std::vector<item> items;
  copy_window window;
  double saved = 0;     // A_i
  double keep_max = 0;  // K_i <= keep_max
  double rec_min = 0;   // recomputed bytes >= rec_min
  double off_cap = kInf;
  bool prefix = false;  // Note [Recompute by prefix]: recompute a prefix of the can_r items
};

struct layer_answer {
  std::vector<tensor_action> actions;
  bool meets_targets = false;
};

double cost_of(const layer_problem& lp, const std::vector<tensor_action>& a, double* K, double* R,
               double* O) {
  double k = 0, r = 0, o = 0, ms = 0;
  for (std::size_t j = 0; j < a.size(); ++j) {
    switch (a[j]) {
      case tensor_action::keep: k += lp.items[j].bytes; break;
      case tensor_action::recompute:
        r += lp.items[j].bytes;
        ms += lp.items[j].cost;
        break;
      case tensor_action::offload: o += lp.items[j].bytes; break;
    }
  }
  if (K) *K = k;
  if (R) *R = r;
  if (O) *O = o;
  return ms + lp.window.cost(o);
}

bool meets(const layer_problem& lp, const std::vector<tensor_action>& a) {
  double K, R, O;
  cost_of(lp, a, &K, &R, &O);
  return K <= lp.keep_max && R >= lp.rec_min && O <= lp.off_cap;
}

// Local search after the greedy fill: the best single or pairwise change of actions that
// lowers the layer's cost and keeps every target, repeated until none is left. Rounding to
// whole tensors is where greedy loses against the LP; swapping, say, an offload that
// overshoots the copy window for a recompute of similar size recovers most of it. Totals
// are updated in O(1) per candidate (byte sums are exact integers in a double).
void exchange(const layer_problem& lp, std::vector<tensor_action>& a) {
  const std::size_t n = a.size();
  double K, R, O;
  const double start = cost_of(lp, a, &K, &R, &O);
  double ms = start - lp.window.cost(O);  // recompute milliseconds alone
  double cost = start;
  const auto options = [&](std::size_t j) {
    std::vector<tensor_action> v{tensor_action::keep};
    if (lp.items[j].can_r) v.push_back(tensor_action::recompute);
    if (lp.items[j].can_o) v.push_back(tensor_action::offload);
    return v;
  };
  std::vector<std::vector<tensor_action>> opts(n);
  for (std::size_t j = 0; j < n; ++j) opts[j] = options(j);
  // Adds (sign +1) or removes (-1) item j taking action x from the running totals.
  const auto shift = [&](std::size_t j, tensor_action x, double sign, double& k, double& r,
                         double& o, double& m) {
    const double b = sign * lp.items[j].bytes;
    switch (x) {
      case tensor_action::keep: k += b; break;
      case tensor_action::recompute:
        r += b;
        m += sign * lp.items[j].cost;
        break;
      case tensor_action::offload: o += b; break;
    }
  };
  for (std::size_t iter = 0; iter < 4 * n + 4; ++iter) {
    double best = cost - 1e-12;
    std::size_t bj = n, bk = n;
    tensor_action baj = tensor_action::keep, bak = tensor_action::keep;
    for (std::size_t j = 0; j < n; ++j) {
      for (std::size_t k = j; k < n; ++k) {
        for (tensor_action aj : opts[j]) {
          for (tensor_action ak : (k == j ? std::vector<tensor_action>{a[j]} : opts[k])) {
            if (aj == a[j] && ak == a[k]) continue;
            double k2 = K, r2 = R, o2 = O, m2 = ms;
            shift(j, a[j], -1, k2, r2, o2, m2);
            shift(j, aj, +1, k2, r2, o2, m2);
            if (k != j) {
              shift(k, a[k], -1, k2, r2, o2, m2);
              shift(k, ak, +1, k2, r2, o2, m2);
            }
            if (k2 > lp.keep_max || r2 < lp.rec_min || o2 > lp.off_cap) continue;
            const double c = m2 + lp.window.cost(o2);
            if (c < best) {
              best = c;
              bj = j;
              bk = k;
              baj = aj;
              bak = k == j ? aj : ak;
            }
          }
        }
      }
    }
    if (bj == n) return;
    shift(bj, a[bj], -1, K, R, O, ms);
    shift(bj, baj, +1, K, R, O, ms);
    a[bj] = baj;
    if (bk != bj) {
      shift(bk, a[bk], -1, K, R, O, ms);
      shift(bk, bak, +1, K, R, O, ms);
      a[bk] = bak;
    }
    cost = ms + lp.window.cost(O);
  }
}

// Greedy by cost per byte: first the recompute bytes the LP asked for, cheapest ms/byte
// first (the LP's own order); then the remaining keep reduction from whichever of
// recompute or offload is cheaper per byte at the current offload level; then exchange()
// gives back what the rounding overshot.
layer_answer solve_greedy(const layer_problem& lp) {
  const std::size_t n = lp.items.size();
  std::vector<tensor_action> a(n, tensor_action::keep);
  double K = lp.saved, R = 0, O = 0;
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const auto per_byte = [&](std::size_t j) {
    return lp.items[j].bytes > 0 ? lp.items[j].cost / lp.items[j].bytes : kInf;
  };
  std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    return per_byte(x) < per_byte(y);
  });
  for (std::size_t j : order) {
    if (R >= lp.rec_min) break;
    if (!lp.items[j].can_r || lp.items[j].bytes <= 0) continue;
    a[j] = tensor_action::recompute;
    R += lp.items[j].bytes;
    K -= lp.items[j].bytes;
  }
  while (K > lp.keep_max) {
    double best = kInf;
    std::size_t bj = n;
    tensor_action ba = tensor_action::keep;
    for (std::size_t j = 0; j < n; ++j) {
      const item& it = lp.items[j];
      if (a[j] != tensor_action::keep || it.bytes <= 0) continue;
      if (it.can_r && it.cost / it.bytes < best) {
        best = it.cost / it.bytes;
        bj = j;
        ba = tensor_action::recompute;
      }
      if (it.can_o && O + it.bytes <= lp.off_cap) {
        const double d = (lp.window.cost(O + it.bytes) - lp.window.cost(O)) / it.bytes;
        if (d < best) {
          best = d;
          bj = j;
          ba = tensor_action::offload;
        }
      }
    }
    if (bj == n) break;
    a[bj] = ba;
    K -= lp.items[bj].bytes;
    (ba == tensor_action::recompute ? R : O) += lp.items[bj].bytes;
  }
  if (meets(lp, a)) exchange(lp, a);
  return {a, meets(lp, a)};
}

// Note [Recompute by prefix] in plan.h, for the greedy: one problem per prefix length k
// of the layer's chain (the can_r items in order). The first k are recomputed, the rest
// may only be kept or offloaded, and solve_greedy answers that smaller problem exactly as
// it would any other; the cheapest k that meets the targets wins (none meets them: the
// one closest to the keep target, for repair). Chain items cost their extension of the
// replay (chain_priced), so the sum over the prefix is the replay's cost.
layer_answer solve_prefix_greedy(const layer_problem& lp) {
  const std::size_t n = lp.items.size();
  std::vector<std::size_t> chain;
  for (std::size_t j = 0; j < n; ++j) {
    if (lp.items[j].can_r) chain.push_back(j);
  }
  layer_answer best;
  double best_cost = kInf, best_excess = kInf;
  for (std::size_t k = 0; k <= chain.size(); ++k) {
    layer_problem sub = lp;
    sub.prefix = false;
    sub.items.clear();
    sub.saved = 0;
    std::vector<std::size_t> rest;  // sub item -> lp item
    std::vector<bool> forced(n, false);
    double forced_bytes = 0;
    for (std::size_t m = 0; m < k; ++m) {
      forced[chain[m]] = true;
      forced_bytes += lp.items[chain[m]].bytes;
    }
    for (std::size_t j = 0; j < n; ++j) {
      if (forced[j]) continue;
      item it = lp.items[j];
      it.can_r = false;
      sub.items.push_back(it);
      sub.saved += it.bytes;
      rest.push_back(j);
    }
    sub.rec_min = std::max(0.0, lp.rec_min - forced_bytes);
    const layer_answer part = solve_greedy(sub);
    layer_answer whole;
    whole.actions.assign(n, tensor_action::recompute);
    for (std::size_t m = 0; m < rest.size(); ++m) whole.actions[rest[m]] = part.actions[m];
    whole.meets_targets = meets(lp, whole.actions);
    double K, R, O;
    const double cost = cost_of(lp, whole.actions, &K, &R, &O);
    const double excess = std::max(0.0, K - lp.keep_max) + std::max(0.0, lp.rec_min - R);
    const bool better = whole.meets_targets
                            ? (!best.meets_targets || cost < best_cost)
                            : (!best.meets_targets && excess < best_excess);
    if (best.actions.empty() || better) {
      best = std::move(whole);
      best_cost = cost;
      best_excess = excess;
    }
  }
  return best;
}

layer_answer solve_any_greedy(const layer_problem& lp) {
  return lp.prefix ? solve_prefix_greedy(lp) : solve_greedy(lp);
}

// Note [Inner ILP]
// Binary x_r, x_o per allowed tensor (x_r + x_o <= 1), exposed-time columns ed, eh >= 0
// with ed >= O/d2h - fwd_{i+1}, eh >= O/h2d - bwd_{i+1} (exact: they are minimised), and
// the three target rows of inner_solver.h. The greedy answer, when it meets the targets,
// is offered as the first incumbent.
layer_answer solve_ilp(const layer_problem& lp, const inner_options& opt) {
  layer_answer greedy = solve_any_greedy(lp);
  const std::size_t n = lp.items.size();
  const double unit = kLpByteUnit;
  glpk_problem mip("stash_inner_ilp");
  std::vector<int> xr(n, -1), xo(n, -1);
  std::vector<std::pair<int, double>> reduce, rec, off;
  for (std::size_t j = 0; j < n; ++j) {
    const item& it = lp.items[j];
    if (it.bytes <= 0) continue;
    const double mib = it.bytes / unit;
    if (it.can_r) {
      xr[j] = mip.add_col("xr" + std::to_string(j), 0, 1, it.cost, true);
      reduce.push_back({xr[j], mib});
      rec.push_back({xr[j], mib});
    }
    if (it.can_o) {
      xo[j] = mip.add_col("xo" + std::to_string(j), 0, 1, 0, true);
      reduce.push_back({xo[j], mib});
      off.push_back({xo[j], mib});
    }
    if (xr[j] >= 0 && xo[j] >= 0) mip.add_row("choice" + std::to_string(j), -kInf, 1, {{xr[j], 1}, {xo[j], 1}});
  }
  if (lp.prefix) {  // Note [Recompute by prefix] in plan.h: a link only after the one before
    int prev = -1;
    for (std::size_t j = 0; j < n; ++j) {
      if (xr[j] < 0) continue;
      if (prev >= 0) {
        mip.add_row("prefix" + std::to_string(j), 0, kInf, {{prev, 1}, {xr[j], -1}});
      }
      prev = xr[j];
    }
  }
  int ed = -1, eh = -1;
  if (!lp.window.last && !off.empty()) {
    ed = mip.add_col("exposed_d2h", 0, kInf, 1);
    eh = mip.add_col("exposed_h2d", 0, kInf, 1);
    auto d = off, h = off;
    for (auto& [c, v] : d) v *= unit / lp.window.d2h_bytes_per_ms;
    for (auto& [c, v] : h) v *= unit / lp.window.h2d_bytes_per_ms;
    d.push_back({ed, -1});
    h.push_back({eh, -1});
    mip.add_row("d2h_window", -kInf, lp.window.fwd_ms, d);
    mip.add_row("h2d_window", -kInf, lp.window.bwd_ms, h);
  }
  mip.add_row("keep_target", (lp.saved - lp.keep_max) / unit, kInf, reduce);
  if (lp.rec_min > 0) mip.add_row("recompute_target", lp.rec_min / unit, kInf, rec);
  if (std::isfinite(lp.off_cap)) mip.add_row("offload_cap", -kInf, lp.off_cap / unit, off);

  std::vector<double> start;
  if (greedy.meets_targets) {
    start.assign(mip.num_cols(), 0.0);
    double O = 0;
    for (std::size_t j = 0; j < n; ++j) {
      if (greedy.actions[j] == tensor_action::recompute && xr[j] >= 0) start[xr[j]] = 1;
      if (greedy.actions[j] == tensor_action::offload && xo[j] >= 0) {
        start[xo[j]] = 1;
        O += lp.items[j].bytes;
      }
    }
    if (ed >= 0) {
      start[ed] = std::max(0.0, O / lp.window.d2h_bytes_per_ms - lp.window.fwd_ms);
      start[eh] = std::max(0.0, O / lp.window.h2d_bytes_per_ms - lp.window.bwd_ms);
    }
  }
  const mip_outcome res = mip.solve_mip(opt.time_limit_s, opt.mip_gap, start);
  if (res.status != solve_status::optimal && res.status != solve_status::feasible) return greedy;
  layer_answer ans;
  ans.actions.assign(n, tensor_action::keep);
  for (std::size_t j = 0; j < n; ++j) {
    if (xr[j] >= 0 && mip.col_value(xr[j]) > 0.5) ans.actions[j] = tensor_action::recompute;
    if (xo[j] >= 0 && mip.col_value(xo[j]) > 0.5) ans.actions[j] = tensor_action::offload;
  }
  ans.meets_targets = meets(lp, ans.actions);
  // Row tolerances can let a MIP answer miss a target by a few bytes; the greedy answer
  // is exact arithmetic, so prefer it unless the MIP's is both valid and cheaper.
  if (greedy.meets_targets &&
      (!ans.meets_targets || cost_of(lp, greedy.actions, nullptr, nullptr, nullptr) <=
                                 cost_of(lp, ans.actions, nullptr, nullptr, nullptr))) {
    return greedy;
  }
  return ans;
}

// Bit-exact key of everything a layer problem depends on.
std::string key_of(const std::string& signature, const layer_problem& lp) {
  std::string k = signature;
  k.push_back('\0');
  const auto put = [&](double v) { k.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(lp.keep_max);
  put(lp.rec_min);
  put(lp.off_cap);
  put(lp.window.fwd_ms);
  put(lp.window.bwd_ms);
  put(lp.window.last ? 1.0 : 0.0);
  for (const item& it : lp.items) {
    put(it.bytes);
    put(it.cost);
    put((it.can_r ? 1.0 : 0.0) + (it.can_o ? 2.0 : 0.0));
  }
  return k;
}

}  // namespace

decision_table solve_inner(const step_profile& p, const outer_lp_result& lp,
                           const inner_options& opt, inner_stats* stats) {
  const std::size_t L = p.layers.size();
  decision_table d(L);
  std::map<std::string, std::vector<tensor_action>> solved;
  inner_stats st;
  for (std::size_t i = 0; i < L; ++i) {
    const layer_profile& layer = p.layers[i];
    const layer_target& t = lp.layers.at(i);
    layer_problem prob;
    prob.window = window_of(p, i);
    prob.prefix = p.recompute == recompute_cost::prefix;
    for (std::size_t j = 0; j < layer.tensors.size(); ++j) {
      item it;
      it.bytes = static_cast<double>(layer.tensors[j].bytes);
      it.cost = layer.tensors[j].recompute_ms;
      it.can_r = allowed(p, i, j, tensor_action::recompute) && it.bytes > 0;
      it.can_o = allowed(p, i, j, tensor_action::offload) && it.bytes > 0;
      prob.items.push_back(it);
      prob.saved += it.bytes;
    }
    // LP values are in MiB with ~1e-9 relative error: round to whole bytes so that
    // layers with the same answer share a key, and let repair absorb the last byte.
    prob.keep_max = std::round(t.keep_bytes);
    prob.rec_min = std::round(t.recompute_bytes);
    prob.off_cap = std::isfinite(t.offload_cap) ? std::round(t.offload_cap) : kInf;
    const std::string key = key_of(layer.signature, prob);
    auto it = solved.find(key);
    if (it != solved.end()) {
      d[i] = it->second;
      ++st.stamped;
      continue;
    }
    layer_answer ans =
        opt.method == inner_method::ilp ? solve_ilp(prob, opt) : solve_any_greedy(prob);
    if (!ans.meets_targets) ++st.fallbacks;
    ++st.problems;
    d[i] = ans.actions;
    solved.emplace(key, std::move(ans.actions));
  }
  if (stats) *stats = st;
  return d;
}

}  // namespace stash::planner
