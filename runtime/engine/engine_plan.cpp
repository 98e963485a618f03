#include "engine_plan.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine_status.h"

namespace stash::engine {

namespace {

[[noreturn]] void plan_error(const std::string& where, const std::string& what) {
  throw error(bad_plan, (where + ": " + what).c_str());
}

}  // namespace

void engine_plan::add_layer(std::vector<Action> actions, std::vector<std::string> names) {
  char offloads = 0;
  for (Action a : actions) offloads |= a == Action::offload;
  actions_.insert(actions_.end(), actions.begin(), actions.end());
  names_.insert(names_.end(), names.begin(), names.end());
  offsets_.push_back(actions_.size());
  offloads_.push_back(offloads);
}

engine_plan engine_plan::from_plan(const planner::Plan& plan) {
  if (plan.layers.empty()) throw error(status::invalid_argument, "plan has no layers");
  engine_plan p;
  for (const planner::LayerPlan& l : plan.layers) {
    std::vector<std::string> names = l.tensor_names;
    names.resize(l.actions.size());
    for (size_t j = 0; j < names.size(); ++j)
      if (names[j].empty()) names[j] = "t" + std::to_string(j);
    p.add_layer(l.actions, std::move(names));
  }
  return p;
}

engine_plan engine_plan::from_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) plan_error(path, "cannot open the plan file");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    plan_error(path, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object() || !j.contains("schema") || j["schema"] != planner::kPlanSchema) {
    plan_error(path, std::string("schema: expected \"") + planner::kPlanSchema + "\"");
  }
  if (!j.contains("layers") || !j["layers"].is_array() || j["layers"].empty())
    plan_error(path, "layers: must be a non-empty array");
  engine_plan p;
  const auto& layers = j["layers"];
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string lp = "layers[" + std::to_string(i) + "]";
    if (!layers[i].is_object() || !layers[i].contains("tensors") ||
        !layers[i]["tensors"].is_array())
      plan_error(path, lp + ".tensors: must be an array");
    std::vector<Action> actions;
    std::vector<std::string> names;
    const auto& ts = layers[i]["tensors"];
    for (size_t k = 0; k < ts.size(); ++k) {
      const std::string tp = lp + ".tensors[" + std::to_string(k) + "]";
      if (!ts[k].is_object() || !ts[k].contains("action") || !ts[k]["action"].is_string())
        plan_error(path, tp + ".action: missing or not a string");
      try {
        actions.push_back(planner::action_from_string(ts[k]["action"].get<std::string>()));
      } catch (const std::exception& e) {
        plan_error(path, tp + ".action: " + e.what());
      }
      names.push_back(ts[k].contains("name") && ts[k]["name"].is_string()
                          ? ts[k]["name"].get<std::string>()
                          : "t" + std::to_string(k));
    }
    p.add_layer(std::move(actions), std::move(names));
  }
  return p;
}

engine_plan engine_plan::from_actions(size_t n_layers, const size_t* per_layer,
                                      const Action* actions) {
  if (n_layers == 0 || !per_layer) throw error(status::invalid_argument, "a plan needs at least one layer");
  engine_plan p;
  size_t at = 0;
  for (size_t i = 0; i < n_layers; ++i) {
    if (per_layer[i] > 0 && !actions) throw error(status::invalid_argument, "actions is NULL");
    std::vector<Action> a;
    std::vector<std::string> names;
    for (size_t j = 0; j < per_layer[i]; ++j, ++at) {
      const int v = static_cast<int>(actions[at]);
      if (v < 0 || v > 2) {
        throw error(status::invalid_argument, ("action of layer " + std::to_string(i) + " tensor " +
                                       std::to_string(j) + " is not keep/recompute/offload")
                                          .c_str());
      }
      a.push_back(actions[at]);
      names.push_back("t" + std::to_string(j));
    }
    p.add_layer(std::move(a), std::move(names));
  }
  return p;
}

const char* status_text(status s) noexcept {
  switch (static_cast<int>(s)) {
    case 100: return "no plan loaded";
    case 101: return "malformed plan";
    case 102: return "unknown tensor";
    case 103: return "illegal tensor state transition";
    case 104: return "tensor failed";
    default: return status_name(s);
  }
}

}  // namespace stash::engine
