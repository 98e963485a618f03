// outer_lp.h: the planner's outer LP over per-layer keep/recompute/offload amounts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/model/profile.h"

namespace stash::planner {

// The LP's choice for one layer, in bytes (fractional: a relaxation).
struct layer_target {
  double keep_bytes = 0;
  double recompute_bytes = 0;
  double offload_bytes = 0;
  // Upper limit on the layer's offloaded bytes for the inner solver: the LP's own amount
  // where the host row binds (more would overflow pinned memory), unbounded otherwise.
  double offload_cap = 0;
};

struct outer_lp_result {
  bool feasible = false;
  // Step time of the LP optimum: compute + convex recompute cost + exposed copy time.
  // It equals the whole model's LP relaxation (Note [Outer LP]), so it is a lower bound on
  // the step time of every valid plan at this budget.
  double step_lower_bound_ms = 0;
  std::vector<layer_target> layers;
  std::vector<std::string> binding;  // named peak / window / host rows with non-zero duals
  // When infeasible: the smallest budget at which the LP relaxation is feasible (the budget
  // plus the optimal slack on the peak rows). A lower bound on the integer answer.
  std::uint64_t lp_min_budget = 0;
  double solve_ms = 0;
};

// A prefix profile is given chain_priced (Note [Recompute by prefix] in plan.h), as
// make_plan and lower_bound_ms do: each link's recompute_ms is then its replay's cost.
outer_lp_result solve_outer_lp(const step_profile& p, std::uint64_t budget_bytes);

}  // namespace stash::planner
