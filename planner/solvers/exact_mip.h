// exact_mip.h: one MIP over every tensor of the model under the canonical cost model.
#pragma once

#include <cstdint>

#include "planner/model/plan.h"

namespace stash::planner {

enum class exact_objective {
  step_time,  // minimise the canonical step time subject to the budget
  peak,       // minimise the peak (host cap still enforced); finds the smallest budget
};

struct exact_options {
  double time_limit_s = 60;
  double mip_gap = 0;  // relative; 0 asks for proved optimality
  exact_objective objective = exact_objective::step_time;
  bool relax = false;  // solve only the LP relaxation (no integrality)
  long node_limit = 0;  // > 0: stop after this many subproblems (deterministic)
};

struct exact_result {
  bool found = false;           // an integer-feasible answer exists in `decisions`
  bool infeasible = false;      // proved: no valid plan at this budget
  bool proved_optimal = false;  // within options.mip_gap
  double objective = 0;         // step ms (compute included) or peak bytes
  double best_bound = 0;        // same unit
  double gap = 0;               // (objective - best_bound) / objective
  double lp_relaxation = 0;     // root LP, same unit
  decision_table decisions;
};

// `start` (optional) must be a valid plan at the budget; it is offered as the first
// incumbent, so on a time limit the answer is never worse than it.
// A prefix profile is given chain_priced (Note [Recompute by prefix] in plan.h), as
// make_plan and lower_bound_ms do: each link's recompute_ms is then its replay's cost.
exact_result solve_exact(const step_profile& p, std::uint64_t budget_bytes,
                         const exact_options& opt, const decision_table* start = nullptr);

}  // namespace stash::planner
