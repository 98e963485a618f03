#include "engine_plan.h"

#include "engine_status.h"

namespace stash::engine {

void engine_plan::add_layer(std::vector<tensor_action> actions, std::vector<std::string> names) {
  char offloads = 0;
  for (tensor_action a : actions) offloads |= a == tensor_action::offload;
  actions_.insert(actions_.end(), actions.begin(), actions.end());
  names_.insert(names_.end(), names.begin(), names.end());
  offsets_.push_back(actions_.size());
  offloads_.push_back(offloads);
}

engine_plan engine_plan::from_plan(const planner::step_plan& plan) {
  if (plan.layers.empty()) throw error(status::invalid_argument, "plan has no layers");
  engine_plan p;
  for (const planner::layer_plan& l : plan.layers) {
    std::vector<std::string> names = l.tensor_names;
    names.resize(l.actions.size());
    for (size_t j = 0; j < names.size(); ++j)
      if (names[j].empty()) names[j] = "t" + std::to_string(j);
    p.add_layer(l.actions, std::move(names));
  }
  return p;
}

// Note [One plan reader] (planner/model/plan.h): the planner's profile-free reader; its
// input_error ("<path>: <json path>: <problem>") becomes bad_plan with the same text.
engine_plan engine_plan::from_file(const std::string& path) {
  planner::step_plan plan;
  try {
    plan = planner::read_plan_file(path);
  } catch (const stash::input_error& e) {
    throw error(bad_plan, e.what());
  }
  return from_plan(plan);
}

engine_plan engine_plan::from_actions(size_t n_layers, const size_t* per_layer,
                                      const tensor_action* actions) {
  if (n_layers == 0 || !per_layer) throw error(status::invalid_argument, "a plan needs at least one layer");
  engine_plan p;
  size_t at = 0;
  for (size_t i = 0; i < n_layers; ++i) {
    if (per_layer[i] > 0 && !actions) throw error(status::invalid_argument, "actions is NULL");
    std::vector<tensor_action> a;
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

}  // namespace stash::engine
