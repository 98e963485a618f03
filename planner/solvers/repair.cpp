// repair.cpp: repair, polish and the minimum-peak decisions (see repair.h).
//
// Both loops work on per-layer aggregates (K_i, O_i in bytes) so that trying a change costs
// O(L), not a full evaluate(); the caller still re-evaluates the result with evaluate(),
// which stays the only arbiter of validity.
#include "planner/solvers/repair.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "planner/solvers/layer_terms.h"

namespace stash::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct aggregates {
  const step_profile& p;
  std::uint64_t budget;
  // R: recomputed bytes that may be recomputed, S: all that may (recomputable_bytes); kept
  // only for the backward's recompute temporaries (Note [Backward temporaries of a
  // recompute] in plan.h).
  std::vector<std::uint64_t> K, O, A, R, S;
  std::uint64_t total_O = 0;

  aggregates(const step_profile& prof, std::uint64_t b, const decision_table& d)
      : p(prof), budget(b) {
    const std::size_t L = p.layers.size();
    K.assign(L, 0);
    O.assign(L, 0);
    A.assign(L, 0);
    R.assign(L, 0);
    S.assign(L, 0);
    for (std::size_t i = 0; i < L; ++i) {
      S[i] = recomputable_bytes(p, i);
      for (std::size_t j = 0; j < d[i].size(); ++j) {
        const std::uint64_t bytes = p.layers[i].tensors[j].bytes;
        A[i] += bytes;
        if (d[i][j] == tensor_action::keep) K[i] += bytes;
        if (d[i][j] == tensor_action::offload) O[i] += bytes;
        if (d[i][j] == tensor_action::recompute && counts_as_recomputed(i, j)) R[i] += bytes;
      }
      total_O += O[i];
    }
  }

  bool counts_as_recomputed(std::size_t i, std::size_t j) const {
    return allowed(p, i, j, tensor_action::recompute);
  }

  // Moves tensor j of layer i from `from` to `to`.
  void apply(std::size_t i, std::size_t j, tensor_action from, tensor_action to) {
    const std::uint64_t bytes = p.layers[i].tensors[j].bytes;
    if (from == tensor_action::keep) K[i] -= bytes;
    if (from == tensor_action::offload) {
      O[i] -= bytes;
      total_O -= bytes;
    }
    if (from == tensor_action::recompute && counts_as_recomputed(i, j)) R[i] -= bytes;
    if (to == tensor_action::keep) K[i] += bytes;
    if (to == tensor_action::offload) {
      O[i] += bytes;
      total_O += bytes;
    }
    if (to == tensor_action::recompute && counts_as_recomputed(i, j)) R[i] += bytes;
  }

  // Layer i's backward temporaries under the current decisions.
  std::uint64_t temp(std::size_t i) const {
    return p.layers[i].bwd_temp_bytes + recompute_temp_bytes(p.layers[i], R[i], S[i]);
  }

  // The worst position: value and layer (L: the loss's position); kind 0 forward, 1
  // backward. Backward dominates
  // forward at the same layer (temporaries are non-negative), so only backward is scanned,
  // then reported as forward when the temporaries are zero (the earlier position in time).
  std::uint64_t worst(std::size_t* layer) const {
    std::uint64_t best = 0, kept = 0;
    *layer = 0;
    for (std::size_t i = 0; i < K.size(); ++i) {
      const std::uint64_t v = p.fixed_bytes + kept + (i > 0 ? O[i - 1] : 0) + A[i] + temp(i);
      if (v > best) {
        best = v;
        *layer = i;
      }
      kept += K[i];
    }
    // Note [The loss's position] in plan.h, as position L: every layer's tensors can help.
    const std::size_t L = K.size();
    const std::uint64_t loss = p.fixed_bytes + kept + (L > 0 ? O[L - 1] : 0) + p.loss_bytes;
    if (loss > best) {
      best = loss;
      *layer = L;
    }
    return best;
  }
  bool peak_ok() const {
    std::size_t at;
    return worst(&at) <= budget;
  }
  bool host_ok() const { return total_O <= p.pinnable_bytes; }
};

// Step-time change of moving one tensor of layer i from `from` to `to` (layer-separable).
double delta_ms(const aggregates& g, std::size_t i, const tensor_profile& t, tensor_action from,
                tensor_action to) {
  const copy_window w = window_of(g.p, i);
  double o_after = static_cast<double>(g.O[i]);
  if (from == tensor_action::offload) o_after -= static_cast<double>(t.bytes);
  if (to == tensor_action::offload) o_after += static_cast<double>(t.bytes);
  double d = w.cost(o_after) - w.cost(static_cast<double>(g.O[i]));
  if (from == tensor_action::recompute) d -= t.recompute_ms;
  if (to == tensor_action::recompute) d += t.recompute_ms;
  return d;
}

// Note [Recompute by prefix] in plan.h: in a prefix profile a move may change a chain
// tensor's recompute only at the end of its layer's recomputed prefix, so every plan these
// loops visit stays a prefix plan (they start from one) and each move's delta_ms, on the
// chain-priced profile, is what the replay's cost changes by.
class prefix_guard {
 public:
  explicit prefix_guard(const step_profile& p) : on_(p.recompute == recompute_cost::prefix) {
    if (!on_) return;
    for (std::size_t i = 0; i < p.layers.size(); ++i) {
      link_.emplace_back(p.layers[i].tensors.size(), -1);
      const std::vector<std::size_t> chain = recompute_chain(p, i);
      for (std::size_t m = 0; m < chain.size(); ++m) link_[i][chain[m]] = static_cast<int>(m);
      chains_.push_back(chain);
    }
  }
  // Whether tensor j of layer i may go from `from` to `to` in plan d.
  bool may(const decision_table& d, std::size_t i, std::size_t j, tensor_action from,
           tensor_action to) const {
    if (!on_ || (from != tensor_action::recompute && to != tensor_action::recompute)) return true;
    const int m = link_[i][j];
    if (m < 0) return to != tensor_action::recompute;  // not a link: never recomputed
    const std::vector<std::size_t>& chain = chains_[i];
    const bool before = m == 0 || d[i][chain[m - 1]] == tensor_action::recompute;
    const bool after = static_cast<std::size_t>(m) + 1 == chain.size() ||
                       d[i][chain[m + 1]] != tensor_action::recompute;
    return to == tensor_action::recompute ? before : after;
  }
  // Whether layer i's recomputed links are a prefix of its chain.
  bool closed(const decision_table& d, std::size_t i) const {
    if (!on_) return true;
    bool open = false;
    for (std::size_t j : chains_[i]) {
      const bool r = d[i][j] == tensor_action::recompute;
      if (r && open) return false;
      open = open || !r;
    }
    return true;
  }

 private:
  bool on_;
  std::vector<std::vector<int>> link_;  // [i][j]: position in the chain, or -1
  std::vector<std::vector<std::size_t>> chains_;
};

}  // namespace

decision_table min_peak_greedy(const step_profile& p) {
  decision_table d = keep_all(p);
  for (std::size_t i = 0; i < p.layers.size(); ++i) {
    for (std::size_t j = 0; j < d[i].size(); ++j) {
      if (p.layers[i].tensors[j].bytes == 0) continue;  // frees nothing: keep it
      if (allowed(p, i, j, tensor_action::recompute)) {
        d[i][j] = tensor_action::recompute;
      } else if (allowed(p, i, j, tensor_action::offload)) {
        d[i][j] = tensor_action::offload;
      }
    }
  }
  return d;
}

bool repair(const step_profile& p, std::uint64_t budget, decision_table& d) {
  for (std::size_t i = 0; i < d.size(); ++i) {
    for (std::size_t j = 0; j < d[i].size(); ++j) {
      if (!allowed(p, i, j, d[i][j])) d[i][j] = tensor_action::keep;
    }
  }
  aggregates g(p, budget, d);
  const prefix_guard guard(p);
  std::size_t tensors = 0;
  for (const auto& l : p.layers) tensors += l.tensors.size();
  // Each step strictly lowers the worst position or the host total, or, for a host fix,
  // moves a tensor off the host for good; 4·tensors bounds any sensible sequence.
  for (std::size_t iter = 0; iter < 4 * tensors + 4; ++iter) {
    const bool host_ok = g.host_ok();
    std::size_t at = 0;
    const std::uint64_t worst = g.worst(&at);
    if (host_ok && worst <= budget) return true;
    double best = kInf;
    std::size_t bi = 0, bj = 0;
    tensor_action bto = tensor_action::keep;
    // Note [Backward temporaries of a recompute] in plan.h: a move that changes what a
    // layer with recompute temporaries recomputes moves that layer's own backward too, so
    // while the host fits it is taken only if no position ends above the current worst.
    const auto raises_worst = [&](std::size_t i, std::size_t j, tensor_action to) {
      const tensor_action from = d[i][j];
      if (!host_ok || p.layers[i].bwd_recompute_temp_bytes == 0 ||
          (from != tensor_action::recompute && to != tensor_action::recompute)) {
        return false;
      }
      g.apply(i, j, from, to);
      std::size_t where;
      const bool worse = g.worst(&where) > worst;
      g.apply(i, j, to, from);
      return worse;
    };
    const auto consider = [&](std::size_t i, std::size_t j, tensor_action to, double freed) {
      if (!allowed(p, i, j, to) || freed <= 0 || !guard.may(d, i, j, d[i][j], to)) return;
      if (raises_worst(i, j, to)) return;
      const double score = delta_ms(g, i, p.layers[i].tensors[j], d[i][j], to) / freed;
      if (score < best) {
        best = score;
        bi = i;
        bj = j;
        bto = to;
      }
    };
    for (std::size_t i = 0; i < d.size(); ++i) {
      for (std::size_t j = 0; j < d[i].size(); ++j) {
        const double b = static_cast<double>(p.layers[i].tensors[j].bytes);
        const tensor_action a = d[i][j];
        if (!host_ok) {
          // Off the host: recompute frees memory too; keep only where recompute is barred.
          if (a != tensor_action::offload) continue;
          consider(i, j, tensor_action::recompute, b);
          if (!allowed(p, i, j, tensor_action::recompute)) consider(i, j, tensor_action::keep, b);
          continue;
        }
        // Over budget at backward[at] with recompute temporaries there: recomputing less
        // of layer `at` lowers them by its share.
        if (i == at && at < d.size() && a == tensor_action::recompute &&
            p.layers[at].bwd_recompute_temp_bytes > 0 && g.S[at] > 0) {
          const double freed = b * static_cast<double>(p.layers[at].bwd_recompute_temp_bytes) /
                               static_cast<double>(g.S[at]);
          consider(i, j, tensor_action::keep, freed);
          if (g.total_O + p.layers[i].tensors[j].bytes <= p.pinnable_bytes) {
            consider(i, j, tensor_action::offload, freed);
          }
        }
        // Over budget at layer `at`: only tensors of earlier layers can help.
        if (i >= at) continue;
        if (a == tensor_action::keep) {
          consider(i, j, tensor_action::recompute, b);
          if (i + 1 < at && g.total_O + p.layers[i].tensors[j].bytes <= p.pinnable_bytes) {
            consider(i, j, tensor_action::offload, b);
          }
        } else if (a == tensor_action::offload && i + 1 == at) {
          consider(i, j, tensor_action::recompute, b);
        }
      }
    }
    if (best == kInf) return false;
    g.apply(bi, bj, d[bi][bj], bto);
    d[bi][bj] = bto;
  }
  return g.host_ok() && g.peak_ok();
}

std::size_t polish(const step_profile& p, std::uint64_t budget, decision_table& d, int max_passes) {
  aggregates g(p, budget, d);
  if (!g.host_ok() || !g.peak_ok()) return 0;
  const prefix_guard guard(p);
  // Most expensive moves first: they are the ones worth undoing.
  std::vector<std::pair<std::size_t, std::size_t>> order;
  for (std::size_t i = 0; i < d.size(); ++i) {
    for (std::size_t j = 0; j < d[i].size(); ++j) order.push_back({i, j});
  }
  std::stable_sort(order.begin(), order.end(), [&](const auto& x, const auto& y) {
    return p.layers[x.first].tensors[x.second].recompute_ms >
           p.layers[y.first].tensors[y.second].recompute_ms;
  });
  std::size_t changes = 0;
  for (int pass = 0; pass < max_passes; ++pass) {
    std::size_t before = changes;
    for (const auto& [i, j] : order) {
      if (d[i][j] == tensor_action::keep) continue;
      const tensor_profile& t = p.layers[i].tensors[j];
      tensor_action best_to = d[i][j];
      double best = -1e-12;  // strict improvement only, so the loop terminates
      for (tensor_action to :
           {tensor_action::keep, tensor_action::offload, tensor_action::recompute}) {
        if (to == d[i][j] || !allowed(p, i, j, to) || !guard.may(d, i, j, d[i][j], to)) continue;
        const double delta = delta_ms(g, i, t, d[i][j], to);
        if (delta >= best) continue;
        const tensor_action from = d[i][j];
        g.apply(i, j, from, to);
        const bool ok = g.host_ok() && g.peak_ok();
        g.apply(i, j, to, from);
        if (ok) {
          best = delta;
          best_to = to;
        }
      }
      if (best_to != d[i][j]) {
        g.apply(i, j, d[i][j], best_to);
        d[i][j] = best_to;
        ++changes;
      }
    }
    if (changes == before) break;
  }
  return changes;
}

namespace {

double layer_cost(const aggregates& g, const decision_table& d, std::size_t i) {
  double ms = 0;
  for (std::size_t j = 0; j < d[i].size(); ++j) {
    if (d[i][j] == tensor_action::recompute) ms += g.p.layers[i].tensors[j].recompute_ms;
  }
  return ms + window_of(g.p, i).cost(static_cast<double>(g.O[i]));
}

}  // namespace

std::size_t polish_pairs(const step_profile& p, std::uint64_t budget, decision_table& d,
                         int max_rounds) {
  aggregates g(p, budget, d);
  if (!g.host_ok() || !g.peak_ok()) return 0;
  const prefix_guard guard(p);
  std::vector<std::pair<std::size_t, std::size_t>> slots;
  for (std::size_t i = 0; i < d.size(); ++i) {
    for (std::size_t j = 0; j < d[i].size(); ++j) slots.push_back({i, j});
  }
  const tensor_action kActs[] = {tensor_action::keep, tensor_action::recompute,
                                 tensor_action::offload};
  std::size_t changes = 0;
  for (int round = 0; round < max_rounds; ++round) {
    bool improved = false;
    for (std::size_t x = 0; x < slots.size(); ++x) {
      for (std::size_t y = x + 1; y < slots.size(); ++y) {
        const auto [i1, j1] = slots[x];
        const auto [i2, j2] = slots[y];
        for (tensor_action a1 : kActs) {
          for (tensor_action a2 : kActs) {
            const tensor_action o1 = d[i1][j1], o2 = d[i2][j2];
            if (a1 == o1 || a2 == o2) continue;  // single moves are polish()'s job
            if (!allowed(p, i1, j1, a1) || !allowed(p, i2, j2, a2)) continue;
            const double before = layer_cost(g, d, i1) + (i2 != i1 ? layer_cost(g, d, i2) : 0);
            g.apply(i1, j1, o1, a1);
            g.apply(i2, j2, o2, a2);
            d[i1][j1] = a1;
            d[i2][j2] = a2;
            const double after = layer_cost(g, d, i1) + (i2 != i1 ? layer_cost(g, d, i2) : 0);
            if (after < before - 1e-12 && g.host_ok() && g.peak_ok() &&
                guard.closed(d, i1) && guard.closed(d, i2)) {
              ++changes;
              improved = true;
              continue;
            }
            g.apply(i1, j1, a1, o1);
            g.apply(i2, j2, a2, o2);
            d[i1][j1] = o1;
            d[i2][j2] = o2;
          }
        }
      }
    }
    if (!improved) break;
  }
  return changes;
}

}  // namespace stash::planner
