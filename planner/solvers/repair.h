// repair.h: makes a rounded plan valid under the canonical model, then improves it locally.
#pragma once

#include <cstdint>

#include "planner/model/plan.h"

namespace stash::planner {

// Changes single tensors until evaluate(p, d, budget).valid, choosing each time the
// change with the least step-time increase per byte it frees where the plan is over
// (the worst peak position, or the host cap). Rule-breaking actions are first reset to
// keep. Returns whether the result is valid; on false, `d` is the best effort.
bool repair(const step_profile& p, std::uint64_t budget_bytes, decision_table& d);

// Local search on a valid plan: applies single-tensor changes that lower the step time and
// keep the plan valid, until none is left (or `max_passes`). Never makes a plan invalid.
// Returns the number of changes applied.
std::size_t polish(const step_profile& p, std::uint64_t budget_bytes, decision_table& d,
                   int max_passes = 4);

// Pairwise moves (two tensors change action at once, e.g. keep one and recompute another
// that is cheaper per byte in a different layer) that lower the step time and keep the plan
// valid. O(tensors^2) per round: meant for small models, where one tensor is a large part
// of a layer and single moves get stuck. Returns the number of changes applied.
std::size_t polish_pairs(const step_profile& p, std::uint64_t budget_bytes, decision_table& d,
                         int max_rounds = 4);

// The decisions with the smallest peak when the host cap does not bind: recompute every
// tensor allowed to, offload every other tensor allowed to, keep the rest. Recompute frees
// a tensor at every later position, offload at all but the next, keep at none, so per
// tensor recompute >= offload >= keep for the peak. Not the least peak where a layer's
// recompute makes backward temporaries (Note [Backward temporaries of a recompute] in
// plan.h): there recompute also raises the layer's own backward.
decision_table min_peak_greedy(const step_profile& p);

}  // namespace stash::planner
