// inner_solver.h: turns the outer LP's per-layer amounts into per-tensor actions.
#pragma once

#include <vector>

#include "planner/solvers/outer_lp.h"
#include "planner/model/plan.h"

namespace stash::planner {

enum class inner_method { greedy, ilp };

struct inner_options {
  inner_method method = inner_method::greedy;
  double time_limit_s = 2.0;  // per distinct (signature, target) problem, ilp only
  double mip_gap = 1e-6;
};

struct inner_stats {
  std::size_t problems = 0;  // distinct (signature, target) problems solved
  std::size_t stamped = 0;   // layers that reused another layer's answer
  std::size_t fallbacks = 0; // problems where the targets could not be met integrally
};

// One action per tensor of every layer. Per layer the inner problem is (greedy: fill by
// cost per byte, then single and pairwise exchanges; ilp: GLPK MIP, Note [Inner ILP])
//   min R_i + copy_cost_i(O_i)  s.t.  K_i <= keep_target,  R_bytes_i >= recompute_target,
//                                      O_i <= offload_cap,  every action allowed().
// The first two keep each peak row at or below the LP's value: forward/backward positions
// after layer i see K_i, and position i+1 sees K_i + O_i = A_i - R_bytes_i. The exception
// is layer i's own backward row where its recompute makes temporaries (Note [Backward
// temporaries of a recompute] in plan.h): rounding R_bytes_i up raises it, and repair,
// which may recompute less of that layer, takes it back where the budget is crossed. A cap
// on R_bytes_i from the row's slack would ignore the slack that the earlier layers'
// rounding up leaves in the same row and turn met targets into fallbacks; on llama-like
// profiles it made plans slower. If the targets cannot be met with whole tensors, the
// layer's best effort is returned and repair (repair.h) restores validity. Solved once per distinct (signature, tensors, window, target) and
// stamped onto every layer that shares it.
// A prefix profile is given chain_priced (Note [Recompute by prefix] in plan.h), as
// make_plan and lower_bound_ms do: each link's recompute_ms is then its replay's cost.
decision_table solve_inner(const step_profile& p, const outer_lp_result& lp,
                           const inner_options& opt, inner_stats* stats = nullptr);

}  // namespace stash::planner
