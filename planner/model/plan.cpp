// plan.cpp: the canonical cost model, the action rules, the baselines and plan JSON.
//
// evaluate() is the single arbiter of validity: the solvers, `stash check`, the property
// tests and the simulator's agreement test all go through it, so it follows the issue's
// formula literally and does no clever incremental bookkeeping.
#include "planner/model/plan.h"
#include "core/json_file.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

namespace stash::planner {

using nlohmann::json;

const char* to_string(tensor_action a) {
  switch (a) {
    case tensor_action::keep: return "keep";
    case tensor_action::recompute: return "recompute";
    case tensor_action::offload: return "offload";
  }
  return "keep";
}

tensor_action action_from_string(const std::string& s) {
  if (s == "keep") return tensor_action::keep;
  if (s == "recompute") return tensor_action::recompute;
  if (s == "offload") return tensor_action::offload;
  throw input_error("unknown action \"" + s + "\" (expected keep, recompute or offload)");
}

namespace {

// The rule a decision breaks, or nullptr. Order matters only for which name is reported
// when several apply; must_keep is the strongest statement, so it comes first.
const char* broken_rule(const step_profile& p, std::size_t i, std::size_t j, tensor_action a) {
  const tensor_profile& t = p.layers[i].tensors[j];
  if (a == tensor_action::keep) return nullptr;
  if (t.must_keep) return "must_keep";
  if (a == tensor_action::recompute) return t.recomputable ? nullptr : "not_recomputable";
  if (!t.offloadable) return "not_offloadable";
  if (t.bytes < kMinOffloadBytes) return "min_offload_bytes";
  if (i + 1 == p.layers.size()) return "last_layer";
  return nullptr;
}

}  // namespace

bool allowed(const step_profile& p, std::size_t layer, std::size_t tensor, tensor_action a) {
  return broken_rule(p, layer, tensor, a) == nullptr;
}

evaluation evaluate(const step_profile& p, const decision_table& d, std::uint64_t budget_bytes) {
  const std::size_t L = p.layers.size();
  if (d.size() != L) {
    throw input_error("plan has " + std::to_string(d.size()) + " layers, profile has " +
                      std::to_string(L));
  }
  evaluation ev;
  std::vector<std::uint64_t> K(L, 0), O(L, 0), A(L, 0);
  for (std::size_t i = 0; i < L; ++i) {
    const layer_profile& lp = p.layers[i];
    if (d[i].size() != lp.tensors.size()) {
      throw input_error("layers[" + std::to_string(i) + "]: plan has " +
                        std::to_string(d[i].size()) + " tensors, profile has " +
                        std::to_string(lp.tensors.size()));
    }
    const double R = layer_recompute_ms(p, i, d[i]);
    for (std::size_t j = 0; j < lp.tensors.size(); ++j) {
      const tensor_profile& t = lp.tensors[j];
      A[i] += t.bytes;
      if (const char* rule = broken_rule(p, i, j, d[i][j])) {
        ev.violations.push_back("rule:layers[" + std::to_string(i) + "].tensors[" +
                                std::to_string(j) + "]:" + rule);
      }
      switch (d[i][j]) {
        case tensor_action::keep: K[i] += t.bytes; break;
        case tensor_action::recompute: ev.recomputed_bytes += t.bytes; break;
        case tensor_action::offload: O[i] += t.bytes; break;
      }
    }
    ev.compute_ms += lp.fwd_ms + lp.bwd_ms;
    ev.recompute_ms += R;
    ev.offloaded_bytes += O[i];
  }
  const double d2h = p.d2h_bytes_per_ms(), h2d = p.h2d_bytes_per_ms();
  for (std::size_t i = 0; i + 1 < L; ++i) {
    const double o = static_cast<double>(O[i]);
    ev.exposed_copy_ms += std::max(0.0, o / d2h - p.layers[i + 1].fwd_ms) +
                          std::max(0.0, o / h2d - p.layers[i + 1].bwd_ms);
  }
  // Note [Step overhead]: layer_ms is the quantity the solvers compare; the overhead is
  // added on top, never mixed into it.
  ev.layer_ms = ev.compute_ms + ev.recompute_ms + ev.exposed_copy_ms;
  ev.step_overhead_ms = p.step_overhead_ms;
  ev.step_ms = ev.layer_ms + ev.step_overhead_ms;

  // Positions in time order: forward 0..L-1, the loss, then backward L-1..0 and the
  // optimizer. The first position
  // that reaches the maximum is reported as peak_at.
  std::vector<std::uint64_t> fwd(L), bwd(L);
  std::uint64_t kept_before = 0;
  for (std::size_t i = 0; i < L; ++i) {
    const std::uint64_t prev_off = i > 0 ? O[i - 1] : 0;
    fwd[i] = p.fixed_bytes + kept_before + prev_off + A[i];
    // Note [Backward temporaries of a recompute] in plan.h.
    bwd[i] = fwd[i] + p.layers[i].bwd_temp_bytes + recompute_temp_bytes(p, i, d[i]);
    kept_before += K[i];
  }
  const auto visit = [&](std::uint64_t v, const char* kind, std::size_t i) {
    if (v > ev.peak_bytes || ev.peak_at.empty()) {
      ev.peak_bytes = v;
      ev.peak_at = std::string(kind) + "[" + std::to_string(i) + "]";
    }
    if (v > budget_bytes) {
      ev.violations.push_back(std::string("peak:") + kind + "[" + std::to_string(i) + "]");
    }
  };
  for (std::size_t i = 0; i < L; ++i) visit(fwd[i], "forward", i);
  // Note [The loss's position] in plan.h: after the last forward, before any backward.
  const std::uint64_t loss = p.fixed_bytes + kept_before + (L > 0 ? O[L - 1] : 0) + p.loss_bytes;
  if (loss > ev.peak_bytes) {
    ev.peak_bytes = loss;
    ev.peak_at = "loss";
  }
  if (loss > budget_bytes) ev.violations.push_back("peak:loss");
  for (std::size_t i = L; i-- > 0;) visit(bwd[i], "backward", i);
  // Note [The optimizer's position] in plan.h.
  if (p.optimizer_bytes > ev.peak_bytes) {
    ev.peak_bytes = p.optimizer_bytes;
    ev.peak_at = "optimizer";
  }
  if (p.optimizer_bytes > budget_bytes) ev.violations.push_back("peak:optimizer");
  if (ev.offloaded_bytes > p.pinnable_bytes) ev.violations.push_back("host");
  ev.valid = ev.violations.empty();
  return ev;
}

double layer_recompute_ms(const step_profile& p, std::size_t layer,
                          const std::vector<tensor_action>& actions) {
  const std::vector<tensor_profile>& ts = p.layers[layer].tensors;
  double ms = 0;
  if (p.recompute == recompute_cost::per_tensor) {
    for (std::size_t j = 0; j < ts.size(); ++j) {
      if (actions[j] == tensor_action::recompute) ms += ts[j].recompute_ms;
    }
    return ms;
  }
  std::size_t end = 0;  // one past the last recomputed tensor
  for (std::size_t j = 0; j < ts.size(); ++j) {
    if (actions[j] == tensor_action::recompute) end = j + 1;
  }
  for (std::size_t j = 0; j < end; ++j) ms += ts[j].recompute_ms;
  return ms;
}

std::vector<std::size_t> recompute_chain(const step_profile& p, std::size_t layer) {
  std::vector<std::size_t> chain;
  if (p.recompute != recompute_cost::prefix) return chain;
  const std::vector<tensor_profile>& ts = p.layers[layer].tensors;
  for (std::size_t j = 0; j < ts.size(); ++j) {
    if (ts[j].bytes > 0 && allowed(p, layer, j, tensor_action::recompute)) chain.push_back(j);
  }
  return chain;
}

step_profile chain_priced(const step_profile& p) {
  step_profile q = p;
  if (p.recompute != recompute_cost::prefix) return q;
  for (std::size_t i = 0; i < q.layers.size(); ++i) {
    const std::vector<std::size_t> chain = recompute_chain(p, i);
    std::vector<tensor_profile>& ts = q.layers[i].tensors;
    std::vector<double> cost(ts.size(), 0.0);
    std::size_t from = 0;
    for (std::size_t j : chain) {
      for (std::size_t k = from; k <= j; ++k) cost[j] += ts[k].recompute_ms;
      from = j + 1;
    }
    for (std::size_t j = 0; j < ts.size(); ++j) ts[j].recompute_ms = cost[j];
  }
  return q;
}

std::size_t close_prefixes(const step_profile& p, decision_table& d) {
  if (p.recompute != recompute_cost::prefix) return 0;
  std::size_t changed = 0;
  for (std::size_t i = 0; i < d.size(); ++i) {
    std::size_t end = 0;
    for (std::size_t j = 0; j < d[i].size(); ++j) {
      if (d[i][j] == tensor_action::recompute) end = j + 1;
    }
    for (std::size_t j = 0; j + 1 < end; ++j) {
      if (d[i][j] != tensor_action::recompute && allowed(p, i, j, tensor_action::recompute)) {
        d[i][j] = tensor_action::recompute;
        ++changed;
      }
    }
  }
  return changed;
}

std::uint64_t recomputable_bytes(const step_profile& p, std::size_t layer) {
  std::uint64_t s = 0;
  const std::vector<tensor_profile>& ts = p.layers[layer].tensors;
  for (std::size_t j = 0; j < ts.size(); ++j) {
    if (allowed(p, layer, j, tensor_action::recompute)) s += ts[j].bytes;
  }
  return s;
}

std::uint64_t recompute_temp_bytes(const layer_profile& l, std::uint64_t recomputed_bytes,
                                   std::uint64_t recomputable) {
  if (l.bwd_recompute_temp_bytes == 0 || recomputable == 0 || recomputed_bytes == 0) return 0;
  // Sizes are below 2^53 (profile_from_json), so the product fits in 106 bits.
  const unsigned __int128 num =
      static_cast<unsigned __int128>(l.bwd_recompute_temp_bytes) * recomputed_bytes;
  return static_cast<std::uint64_t>((num + recomputable - 1) / recomputable);
}

std::uint64_t recompute_temp_bytes(const step_profile& p, std::size_t layer,
                                   const std::vector<tensor_action>& actions) {
  const layer_profile& l = p.layers[layer];
  if (l.bwd_recompute_temp_bytes == 0) return 0;
  std::uint64_t r = 0;
  for (std::size_t j = 0; j < l.tensors.size(); ++j) {
    if (actions[j] == tensor_action::recompute && allowed(p, layer, j, tensor_action::recompute))
      r += l.tensors[j].bytes;
  }
  return recompute_temp_bytes(l, r, recomputable_bytes(p, layer));
}

decision_table keep_all(const step_profile& p) {
  decision_table d(p.layers.size());
  for (std::size_t i = 0; i < p.layers.size(); ++i) {
    d[i].assign(p.layers[i].tensors.size(), tensor_action::keep);
  }
  return d;
}

decision_table recompute_all(const step_profile& p) {
  decision_table d = keep_all(p);
  for (std::size_t i = 0; i < p.layers.size(); ++i) {
    for (std::size_t j = 0; j < d[i].size(); ++j) {
      if (allowed(p, i, j, tensor_action::recompute)) d[i][j] = tensor_action::recompute;
    }
  }
  return d;
}

decision_table step_plan::decisions() const {
  decision_table d;
  d.reserve(layers.size());
  for (const auto& l : layers) d.push_back(l.actions);
  return d;
}

json plan_to_json(const step_plan& plan) {
  json layers = json::array();
  for (const auto& l : plan.layers) {
    json ts = json::array();
    for (std::size_t j = 0; j < l.actions.size(); ++j) {
      ts.push_back({{"name", l.tensor_names.at(j)}, {"action", to_string(l.actions[j])}});
    }
    layers.push_back({{"index", l.index},
                      {"name", l.name},
                      {"fractions",
                       {{"keep", l.fractions.keep},
                        {"recompute", l.fractions.recompute},
                        {"offload", l.fractions.offload}}},
                      {"tensors", std::move(ts)}});
  }
  const prediction& pr = plan.predicted;
  json j = {{"schema", kPlanSchema},
            {"budget_bytes", plan.budget_bytes},
            {"solver", plan.solver},
            {"solve_ms", plan.solve_ms},
            {"profile_sha256", plan.profile_sha256},
            {"layers", std::move(layers)},
            {"predicted",
             {{"step_ms", pr.step_ms},
              {"peak_bytes", pr.peak_bytes},
              {"peak_at", pr.peak_at},
              {"exposed_copy_ms", pr.exposed_copy_ms},
              {"recompute_ms", pr.recompute_ms},
              {"offloaded_bytes", pr.offloaded_bytes},
              {"lower_bound_ms", pr.lower_bound_ms},
              {"gap", pr.gap}}},
            {"baselines",
             {{"keep_all",
               {{"step_ms", plan.keep_all.step_ms}, {"peak_bytes", plan.keep_all.peak_bytes}}},
              {"recompute_all",
               {{"step_ms", plan.recompute_all.step_ms},
                {"peak_bytes", plan.recompute_all.peak_bytes}}}}},
            {"binding_constraints", plan.binding_constraints}};
  if (plan.solver == "exact") {
    j["exact"] = {{"proved_optimal", plan.proved_optimal}, {"mip_gap", plan.mip_gap}};
  }
  return j;
}

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw input_error(path + ": " + what);
}

const json& member(const json& o, const std::string& path, const char* key) {
  if (!o.is_object()) fail(path.empty() ? "<root>" : path, "expected an object");
  auto it = o.find(key);
  if (it == o.end()) fail(path.empty() ? key : path + "." + key, "missing required field");
  return *it;
}

double number_or(const json& o, const char* key, double dflt) {
  auto it = o.find(key);
  return it != o.end() && it->is_number() ? it->get<double>() : dflt;
}

std::uint64_t size_or(const json& o, const char* key, std::uint64_t dflt) {
  auto it = o.find(key);
  return it != o.end() && it->is_number_unsigned() ? it->get<std::uint64_t>() : dflt;
}

// Note [One plan reader]: the one parser of stash.plan/1 documents, with and without a
// profile. Checks run in document order, so the first problem named is the first in the
// file. Only the structure and the decisions are trusted: the predicted figures and
// baselines are read back for display, but `stash check` recomputes everything with
// evaluate().
step_plan parse_plan(const json& j, const step_profile* p) {
  if (!j.is_object()) fail("<root>", "a plan must be a JSON object");
  const json& schema = member(j, "", "schema");
  if (!schema.is_string() || schema.get<std::string>() != kPlanSchema) {
    fail("schema", "unsupported plan schema " + schema.dump() + ", expected \"" + kPlanSchema +
                       "\"");
  }
  step_plan plan;
  // The planner's header: required against a profile, optional (but typed) without one.
  if (p || j.contains("budget_bytes")) {
    const json& budget = member(j, "", "budget_bytes");
    if (!budget.is_number_unsigned()) fail("budget_bytes", "must be a non-negative integer");
    plan.budget_bytes = budget.get<std::uint64_t>();
  }
  if (p || j.contains("solver")) {
    const json& solver = member(j, "", "solver");
    if (!solver.is_string()) fail("solver", "must be a string");
    plan.solver = solver.get<std::string>();
  }
  plan.solve_ms = number_or(j, "solve_ms", 0);
  if (auto it = j.find("profile_sha256"); it != j.end() && it->is_string()) {
    plan.profile_sha256 = it->get<std::string>();
  }
  const json& layers = member(j, "", "layers");
  if (!layers.is_array()) fail("layers", p ? "must be an array" : "must be a non-empty array");
  if (p && layers.size() != p->layers.size()) {
    fail("layers", "plan has " + std::to_string(layers.size()) + " layers, profile has " +
                       std::to_string(p->layers.size()));
  }
  if (layers.empty()) fail("layers", "must be a non-empty array");
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const std::string lp = "layers[" + std::to_string(i) + "]";
    const layer_profile* prof = p ? &p->layers[i] : nullptr;
    if (!layers[i].is_object()) fail(lp, "expected an object");
    layer_plan l;
    l.index = i;
    if (auto ix = layers[i].find("index"); ix != layers[i].end()) {
      if (!ix->is_number_unsigned() || ix->get<std::uint64_t>() != i) {
        fail(lp + ".index", "expected " + std::to_string(i) + " (the layer's position), got " +
                                ix->dump());
      }
    }
    if (prof) {
      const json& name = member(layers[i], lp, "name");
      if (!name.is_string() || name.get<std::string>() != prof->name) {
        fail(lp + ".name",
             "expected \"" + prof->name + "\" as in the profile, got " + name.dump());
      }
      l.name = prof->name;
    } else if (auto name = layers[i].find("name"); name != layers[i].end()) {
      if (!name->is_string()) fail(lp + ".name", "must be a string");
      l.name = name->get<std::string>();
    }
    if (auto f = layers[i].find("fractions"); f != layers[i].end() && f->is_object()) {
      l.fractions.keep = number_or(*f, "keep", 1);
      l.fractions.recompute = number_or(*f, "recompute", 0);
      l.fractions.offload = number_or(*f, "offload", 0);
    }
    const json& ts = member(layers[i], lp, "tensors");
    if (prof && (!ts.is_array() || ts.size() != prof->tensors.size())) {
      fail(lp + ".tensors", "must list the profile's " + std::to_string(prof->tensors.size()) +
                                " tensors in order");
    }
    if (!ts.is_array()) fail(lp + ".tensors", "must be an array");
    for (std::size_t k = 0; k < ts.size(); ++k) {
      const std::string tp = lp + ".tensors[" + std::to_string(k) + "]";
      std::string tensor_name;  // "" when a profile-free plan leaves it out
      if (prof) {
        const json& tn = member(ts[k], tp, "name");
        if (!tn.is_string() || tn.get<std::string>() != prof->tensors[k].name) {
          fail(tp + ".name",
               "expected \"" + prof->tensors[k].name + "\" as in the profile, got " + tn.dump());
        }
        tensor_name = prof->tensors[k].name;
      } else {
        if (!ts[k].is_object()) fail(tp, "expected an object");
        if (auto tn = ts[k].find("name"); tn != ts[k].end()) {
          if (!tn->is_string()) fail(tp + ".name", "must be a string");
          tensor_name = tn->get<std::string>();
        }
      }
      const json& act = member(ts[k], tp, "action");
      if (!act.is_string()) fail(tp + ".action", "must be a string");
      try {
        l.actions.push_back(action_from_string(act.get<std::string>()));
      } catch (const input_error& e) {
        fail(tp + ".action", e.what());
      }
      l.tensor_names.push_back(std::move(tensor_name));
    }
    plan.layers.push_back(std::move(l));
  }
  if (auto pr = j.find("predicted"); pr != j.end() && pr->is_object()) {
    plan.predicted.step_ms = number_or(*pr, "step_ms", 0);
    plan.predicted.peak_bytes = size_or(*pr, "peak_bytes", 0);
    if (auto at = pr->find("peak_at"); at != pr->end() && at->is_string()) {
      plan.predicted.peak_at = at->get<std::string>();
    }
    plan.predicted.exposed_copy_ms = number_or(*pr, "exposed_copy_ms", 0);
    plan.predicted.recompute_ms = number_or(*pr, "recompute_ms", 0);
    plan.predicted.offloaded_bytes = size_or(*pr, "offloaded_bytes", 0);
    plan.predicted.lower_bound_ms = number_or(*pr, "lower_bound_ms", 0);
    plan.predicted.gap = number_or(*pr, "gap", 0);
  }
  if (auto b = j.find("baselines"); b != j.end() && b->is_object()) {
    for (auto [key, dst] : {std::pair{"keep_all", &plan.keep_all},
                            std::pair{"recompute_all", &plan.recompute_all}}) {
      if (auto e = b->find(key); e != b->end() && e->is_object()) {
        dst->step_ms = number_or(*e, "step_ms", 0);
        dst->peak_bytes = size_or(*e, "peak_bytes", 0);
      }
    }
  }
  if (auto bc = j.find("binding_constraints"); bc != j.end() && bc->is_array()) {
    for (const auto& s : *bc) {
      if (s.is_string()) plan.binding_constraints.push_back(s.get<std::string>());
    }
  }
  if (auto ex = j.find("exact"); ex != j.end() && ex->is_object()) {
    if (auto po = ex->find("proved_optimal"); po != ex->end() && po->is_boolean()) {
      plan.proved_optimal = po->get<bool>();
    }
    plan.mip_gap = number_or(*ex, "mip_gap", 0);
  }
  return plan;
}

// The file's JSON through `parse`, every error prefixed with the path.
template <class Parse>
step_plan parse_plan_file(const std::string& path, Parse parse) {
  const json j = read_json_file(path);  // its errors name the path already
  try {
    return parse(j);
  } catch (const input_error& e) {
    throw input_error(path + ": " + e.what());
  }
}

}  // namespace

step_plan read_plan(const json& j) { return parse_plan(j, nullptr); }

step_plan plan_from_json(const json& j, const step_profile& p) { return parse_plan(j, &p); }

step_plan read_plan_file(const std::string& path) {
  return parse_plan_file(path, [](const json& j) { return read_plan(j); });
}

step_plan load_plan(const std::string& path, const step_profile& p) {
  return parse_plan_file(path, [&p](const json& j) { return plan_from_json(j, p); });
}

}  // namespace stash::planner
