// planner.h: the planner's entry point: profile + budget -> a valid plan, or the smallest
// budget at which one exists.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "planner/model/plan.h"

namespace stash::planner {

// The numbers are the C API's STASH_SOLVER_* (static_asserts in bindings/planner_api.cpp).
enum class solver_kind : int { greedy = 0, ilp = 1, exact = 2 };
const char* to_string(solver_kind s);
solver_kind solver_from_string(const std::string& s);  // throws input_error

struct plan_options {
  solver_kind solver = solver_kind::greedy;
  // exact: the whole MIP's limit; ilp: the limit of each distinct per-layer problem.
  double time_limit_s = 60;
  double mip_gap = 0;      // relative gap at which exact (and ilp) may stop
  bool polish = true;      // local improvement after rounding (repair.h)
};

// Note [One check of the plan options]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The options' rules and their wording live here and nowhere else: a solver that is one
// of the three (a solver_kind made from a caller's int may be any number), a time limit
// that is a positive number of seconds, a gap that is not negative (NaN fails both).
// `stash plan`, `stash pareto` and stash_plan_make call this on the options they built and
// report its message as it is (CLI exit 2, STASH_ERROR_INVALID_ARGUMENT); make_plan calls
// it too, so no caller plans with options it did not check. The message names each option
// by both its spellings (`--time-limit`, time_limit_s), since one text serves both.
// Throws input_error naming the first bad option and its value.
void check_plan_options(const plan_options& opt);

// No valid plan exists at the requested budget. Not an input_error: the input is fine and
// the answer is "no" (CLI exit 1), with the smallest budget that has a valid plan. `why`,
// when given, is appended to the message (a budget below what no decision moves).
// Note [A budget too small is an answer] in planner.cpp.
class infeasible_budget : public error {  // status::infeasible_budget
 public:
  infeasible_budget(std::uint64_t budget, std::uint64_t min_feasible, bool min_proved,
                    const std::string& why = "");
  std::uint64_t budget() const { return budget_; }
  std::uint64_t min_feasible_bytes() const { return min_; }
  // False only when the host cap binds and the minimum-peak MIP hit its time limit: then
  // min_feasible_bytes is a budget that works, possibly not the smallest.
  bool min_proved() const { return proved_; }

 private:
  std::uint64_t budget_, min_;
  bool proved_;
};

// A budget as a user writes it (the syntax: parse_budget_spec in core/budget.h): a byte
// count ("80GiB", "85.9GB", "123456"), or a share of the profile's keep-all peak ("70%").
// Throws input_error naming the text.
std::uint64_t parse_budget(const std::string& text, const step_profile& p);

// Throws infeasible_budget when no valid plan exists, a budget below the profile's
// fixed_bytes included (Note [A budget too small is an answer] in planner.cpp). The
// returned plan is valid under evaluate() (checked before returning) and carries
// lower_bound_ms (the whole model's LP relaxation) and gap.
step_plan make_plan(const step_profile& p, std::uint64_t budget_bytes,
                    const plan_options& opt = {});

// The step time of the whole model's LP relaxation at this budget; throws
// infeasible_budget when even the relaxation has no point under the budget.
double lower_bound_ms(const step_profile& p, std::uint64_t budget_bytes);

// The smallest budget with a valid plan. Exact when the host cap does not bind on the
// minimum-peak decisions and no layer's recompute makes backward temporaries; otherwise a
// minimum-peak MIP (time-limited; *proved says whether it finished; Note [The least peak
// with recompute temporaries] in planner.cpp).
std::uint64_t min_feasible_budget(const step_profile& p, bool* proved = nullptr,
                                  double time_limit_s = 30);

}  // namespace stash::planner
