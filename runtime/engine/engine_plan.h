// engine_plan.h: what the engine needs of a stash.plan/1 plan: one action per saved tensor,
// addressed by (layer, index), flattened for O(1) lookup on the hot path.
//
// A plan reaches the engine three ways: from a planner::step_plan in memory, from a plan.json
// file (read by the planner's profile-free reader, Note [One plan reader] in
// planner/model/plan.h: the engine needs only the actions and names, and the validation against
// the profile is `stash check`'s job), or built through the API from an array of actions.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "planner/model/plan.h"

namespace stash::engine {

using planner::tensor_action;

class engine_plan {
 public:
  engine_plan() = default;
  // From the planner's model.
  static engine_plan from_plan(const planner::step_plan& plan);
  // From a stash.plan/1 file; throws stash::error(bad_plan) with the reader's message
  // ("<path>: <json path>: <problem>").
  static engine_plan from_file(const std::string& path);
  // n_layers layers; layer i has per_layer[i] tensors; actions is the concatenation.
  // Throws stash::error(invalid_argument) for an empty plan.
  static engine_plan from_actions(size_t n_layers, const size_t* per_layer,
                                  const tensor_action* actions);

  size_t layers() const noexcept { return offsets_.empty() ? 0 : offsets_.size() - 1; }
  size_t tensors(size_t layer) const noexcept { return offsets_[layer + 1] - offsets_[layer]; }
  size_t total() const noexcept { return actions_.size(); }
  bool empty() const noexcept { return actions_.empty() && offsets_.size() <= 1; }
  // Flat position of (layer, index), or npos when the plan has no such tensor.
  static constexpr size_t npos = static_cast<size_t>(-1);
  size_t flat(size_t layer, size_t index) const noexcept {
    if (layer + 1 >= offsets_.size()) return npos;
    const size_t i = offsets_[layer] + index;
    return index < tensors(layer) ? i : npos;
  }
  size_t first(size_t layer) const noexcept { return offsets_[layer]; }
  tensor_action action(size_t flat) const noexcept { return actions_[flat]; }
  const std::string& name(size_t flat) const noexcept { return names_[flat]; }
  bool layer_offloads(size_t layer) const noexcept { return offloads_[layer] != 0; }

 private:
  void add_layer(std::vector<tensor_action> actions, std::vector<std::string> names);

  std::vector<size_t> offsets_{0};
  std::vector<tensor_action> actions_;
  std::vector<std::string> names_;
  std::vector<char> offloads_;
};

}  // namespace stash::engine
