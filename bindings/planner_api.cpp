// The planner behind the C API (stash.h, "Planner"): the same calls `stash plan` makes
// (tools/cli/cmd_plan.cpp), with the CLI's messages, as statuses.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api_boundary.h"
#include "planner/solvers/planner.h"
#include "struct_version.h"

using namespace stash;
using stash::api::api_call;
namespace pl = stash::planner;

namespace {

static_assert(static_cast<int>(pl::tensor_action::keep) == STASH_ACTION_KEEP);
static_assert(static_cast<int>(pl::tensor_action::recompute) == STASH_ACTION_RECOMPUTE);
static_assert(static_cast<int>(pl::tensor_action::offload) == STASH_ACTION_OFFLOAD);
static_assert(static_cast<int>(pl::solver_kind::greedy) == STASH_SOLVER_GREEDY);
static_assert(static_cast<int>(pl::solver_kind::ilp) == STASH_SOLVER_ILP);
static_assert(static_cast<int>(pl::solver_kind::exact) == STASH_SOLVER_EXACT);

// The profile text as every planner call here reads it: STASH_OK, or bad_profile with the
// message naming the field or where the text stops being JSON.
status read_profile(const char* fn, const char* text, pl::step_profile* p) {
  try {
    *p = pl::profile_from_json(nlohmann::json::parse(text));
  } catch (const nlohmann::json::parse_error& e) {
    return fail(status::bad_profile, "%s: the profile is not JSON: %s", fn, e.what());
  } catch (const stash::input_error& e) {
    return fail(status::bad_profile, "%s: %s", fn, e.what());
  }
  return status::ok;
}

// The figures, as far as the caller's struct goes (result may be NULL).
void deliver_result(const stash_plan_result_t& r, stash_plan_result_t* result) noexcept {
  if (result) api::write_as_far_as(r, result);
}

}  // namespace

extern "C" {

STASH_API void stash_plan_options_init(stash_plan_options_t* o) {
  if (!o) return;
  *o = stash_plan_options_t{};
  o->struct_size = sizeof *o;
  o->version = STASH_PLAN_OPTIONS_VERSION;
  o->solver = STASH_SOLVER_GREEDY;
  o->time_limit_s = 60;
  o->mip_gap = 0;
  o->polish = 1;
}

STASH_API void stash_plan_result_init(stash_plan_result_t* r) {
  if (!r) return;
  *r = stash_plan_result_t{};
  r->struct_size = sizeof *r;
}

STASH_API void stash_free(void* ptr) { std::free(ptr); }

STASH_API stash_status_t stash_plan_make(const char* profile_json, const char* budget,
                                         const stash_plan_options_t* options,
                                         char** plan_json, stash_plan_result_t* result) {
  static const char* fn = "stash_plan_make";
  return api_call(fn, [&]() -> status {
    if (plan_json) *plan_json = nullptr;
    if (!profile_json || !budget || !plan_json) {
      return fail(status::invalid_argument, "%s: %s is NULL", fn,
                  !profile_json ? "profile_json" : !budget ? "budget" : "plan_json");
    }
    if (result) {
      if (const status s = api::check_size(fn, "result", *result); s != status::ok) return s;
    }
    stash_plan_options_t o;  // newer fields than the caller's keep their defaults
    if (const status s = api::read_config(fn, "options", options, &o); s != status::ok) return s;
    pl::plan_options opt;
    opt.solver = static_cast<pl::solver_kind>(static_cast<int>(o.solver));
    opt.time_limit_s = o.time_limit_s;
    opt.mip_gap = o.mip_gap;
    opt.polish = o.polish != 0;
    try {
      pl::check_plan_options(opt);  // Note [One check of the plan options] in planner.h
    } catch (const stash::input_error& e) {
      return fail(status::invalid_argument, "%s: options: %s", fn, e.what());
    }

    stash_plan_result_t r;
    stash_plan_result_init(&r);
    auto deliver = [&] { deliver_result(r, result); };
    pl::step_profile p;
    std::uint64_t bytes = 0;
    try {
      nlohmann::json j = nlohmann::json::parse(profile_json);
      p = pl::profile_from_json(j);
      bytes = pl::parse_budget(budget, p);
    } catch (const nlohmann::json::parse_error& e) {
      return fail(status::bad_profile, "%s: the profile is not JSON: %s", fn, e.what());
    } catch (const stash::input_error& e) {
      return fail(status::bad_profile, "%s: %s", fn, e.what());
    }
    r.budget_bytes = bytes;
    r.keep_all_peak_bytes = pl::evaluate(p, pl::keep_all(p), UINT64_MAX).peak_bytes;
    pl::step_plan plan;
    try {
      plan = pl::make_plan(p, bytes, opt);
    } catch (const pl::infeasible_budget& e) {  // below the fixed bytes too: one meaning
      r.min_feasible_bytes = e.min_feasible_bytes();
      r.min_feasible_proved = e.min_proved() ? 1 : 0;
      deliver();
      return fail(status::infeasible_budget, "%s: %s", fn, e.what());
    } catch (const stash::input_error& e) {
      deliver();
      return fail(status::bad_profile, "%s: %s", fn, e.what());
    }
    r.predicted_peak_bytes = plan.predicted.peak_bytes;
    r.predicted_step_ms = plan.predicted.step_ms;
    const std::string text = pl::plan_to_json(plan).dump(1);
    char* out = static_cast<char*>(std::malloc(text.size() + 1));
    if (!out) return fail(status::internal, "%s: out of host memory", fn);
    std::memcpy(out, text.c_str(), text.size() + 1);
    *plan_json = out;
    deliver();
    return status::ok;
  });
}

STASH_API stash_status_t stash_profile_validate(const char* profile_json) {
  static const char* fn = "stash_profile_validate";
  return api_call(fn, [&]() -> status {
    if (!profile_json) return fail(status::invalid_argument, "%s: profile_json is NULL", fn);
    pl::step_profile p;
    return read_profile(fn, profile_json, &p);
  });
}

STASH_API stash_status_t stash_plan_min_feasible(const char* profile_json,
                                                 uint64_t* min_feasible_bytes, int* proved) {
  static const char* fn = "stash_plan_min_feasible";
  return api_call(fn, [&]() -> status {
    if (!profile_json || !min_feasible_bytes) {
      return fail(status::invalid_argument, "%s: %s is NULL", fn,
                  !profile_json ? "profile_json" : "min_feasible_bytes");
    }
    pl::step_profile p;
    if (const status s = read_profile(fn, profile_json, &p); s != status::ok) return s;
    bool exact = true;  // the same call make_plan's refusals make (planner.h)
    *min_feasible_bytes = pl::min_feasible_budget(p, &exact);
    if (proved) *proved = exact ? 1 : 0;
    return status::ok;
  });
}

STASH_API stash_status_t stash_plan_evaluate(const char* profile_json, const char* plan_json,
                                             uint64_t budget_bytes, stash_plan_result_t* result) {
  static const char* fn = "stash_plan_evaluate";
  return api_call(fn, [&]() -> status {
    if (!profile_json || !plan_json) {
      return fail(status::invalid_argument, "%s: %s is NULL", fn,
                  !profile_json ? "profile_json" : "plan_json");
    }
    if (result) {
      if (const status s = api::check_size(fn, "result", *result); s != status::ok) return s;
    }
    pl::step_profile p;
    pl::step_plan plan;
    try {
      p = pl::profile_from_json(nlohmann::json::parse(profile_json));
    } catch (const nlohmann::json::parse_error& e) {
      return fail(status::bad_profile, "%s: the profile is not JSON: %s", fn, e.what());
    } catch (const stash::input_error& e) {
      return fail(status::bad_profile, "%s: profile: %s", fn, e.what());
    }
    try {
      plan = pl::plan_from_json(nlohmann::json::parse(plan_json), p);
    } catch (const nlohmann::json::parse_error& e) {
      return fail(status::bad_plan, "%s: the plan is not JSON: %s", fn, e.what());
    } catch (const stash::input_error& e) {
      return fail(status::bad_plan, "%s: plan: %s", fn, e.what());
    }
    const std::uint64_t budget = budget_bytes ? budget_bytes : plan.budget_bytes;
    const pl::evaluation ev = pl::evaluate(p, plan.decisions(), budget);
    stash_plan_result_t r;
    stash_plan_result_init(&r);
    r.budget_bytes = budget;
    r.keep_all_peak_bytes = pl::evaluate(p, pl::keep_all(p), UINT64_MAX).peak_bytes;
    r.predicted_peak_bytes = ev.peak_bytes;
    r.predicted_step_ms = ev.step_ms;
    deliver_result(r, result);
    if (!ev.valid) {
      std::string names;
      for (const std::string& v : ev.violations) names += (names.empty() ? "" : ", ") + v;
      return fail(status::infeasible_budget,
                  "%s: the plan is not valid under a budget of %llu bytes: %s", fn,
                  static_cast<unsigned long long>(budget), names.c_str());
    }
    return status::ok;
  });
}

STASH_API const char* stash_action_name(stash_action_t action) {
  // Switching on the int: a caller may pass any number, which need not be a valid
  // stash_action_t value (loading one as the enum would be undefined).
  int value;
  std::memcpy(&value, &action, sizeof value);
  switch (value) {
    case STASH_ACTION_KEEP: return pl::to_string(pl::tensor_action::keep);
    case STASH_ACTION_RECOMPUTE: return pl::to_string(pl::tensor_action::recompute);
    case STASH_ACTION_OFFLOAD: return pl::to_string(pl::tensor_action::offload);
    default: return nullptr;
  }
}

STASH_API stash_status_t stash_plan_read_actions(const char* plan_json, size_t* n_layers,
                                                 size_t* tensors_per_layer,
                                                 size_t layer_capacity, size_t* n_actions,
                                                 stash_action_t* actions,
                                                 size_t action_capacity) {
  static const char* fn = "stash_plan_read_actions";
  return api_call(fn, [&]() -> status {
    if (!plan_json) return fail(status::invalid_argument, "%s: plan_json is NULL", fn);
    if ((!tensors_per_layer && layer_capacity) || (!actions && action_capacity)) {
      return fail(status::invalid_argument, "%s: %s is NULL with a capacity of %zu", fn,
                  !tensors_per_layer && layer_capacity ? "tensors_per_layer" : "actions",
                  !tensors_per_layer && layer_capacity ? layer_capacity : action_capacity);
    }
    pl::step_plan plan;  // Note [One plan reader] (planner/model/plan.h): the engine's reader
    try {
      plan = pl::read_plan(nlohmann::json::parse(plan_json));
    } catch (const nlohmann::json::parse_error& e) {
      return fail(status::bad_plan, "%s: the plan is not JSON: %s", fn, e.what());
    } catch (const stash::input_error& e) {
      return fail(status::bad_plan, "%s: plan: %s", fn, e.what());
    }
    std::size_t at = 0;
    for (std::size_t i = 0; i < plan.layers.size(); ++i) {
      const std::vector<pl::tensor_action>& a = plan.layers[i].actions;
      if (i < layer_capacity) tensors_per_layer[i] = a.size();
      for (std::size_t j = 0; j < a.size(); ++j, ++at) {
        if (at < action_capacity) actions[at] = static_cast<stash_action_t>(a[j]);
      }
    }
    if (n_layers) *n_layers = plan.layers.size();
    if (n_actions) *n_actions = at;
    return status::ok;
  });
}

}  // extern "C"
