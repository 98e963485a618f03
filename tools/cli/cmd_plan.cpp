// `stash plan`: profile + budget -> plan.json, with a short summary on stdout.
// Exit status: 0 a valid plan, 1 the budget is infeasible (the message states the smallest
// feasible budget), 2 bad input.
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "command.h"
#include "core/bytes.h"
#include "core/json_file.h"
#include "planner/solvers/planner.h"

namespace stash::cli {
namespace {

struct plan_args {
  std::string profile, budget, solver = "greedy", out;
  double time_limit_s = 60, mip_gap = 0;
  bool no_polish = false;
};

std::string pct(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%+.2f%%", x * 100.0);
  return b;
}

void run_plan(const plan_args& a) {
  using namespace stash::planner;
  plan_options opt;
  opt.solver = solver_from_string(a.solver);
  opt.time_limit_s = a.time_limit_s;
  opt.mip_gap = a.mip_gap;
  opt.polish = !a.no_polish;
  check_plan_options(opt);  // Note [One check of the plan options] in planner.h
  const step_profile p = load_profile(a.profile);
  const std::uint64_t budget = parse_budget(a.budget, p);
  step_plan plan;
  try {
    plan = make_plan(p, budget, opt);
  } catch (const infeasible_budget& e) {
    std::fprintf(stderr, "stash plan: %s\n", e.what());
    throw exit_status{1};
  }
  const prediction& pr = plan.predicted;
  std::uint64_t recomputed = 0;
  for (std::size_t i = 0; i < plan.layers.size(); ++i) {
    for (std::size_t j = 0; j < plan.layers[i].actions.size(); ++j) {
      if (plan.layers[i].actions[j] == tensor_action::recompute)
        recomputed += p.layers[i].tensors[j].bytes;
    }
  }
  std::printf("plan: %zu layers, solver %s, solved in %.1f ms\n", plan.layers.size(),
              plan.solver.c_str(), plan.solve_ms);
  std::printf("  peak        %s of %s budget (%llu / %llu bytes) at %s\n",
              format_bytes(pr.peak_bytes).c_str(), format_bytes(budget).c_str(),
              static_cast<unsigned long long>(pr.peak_bytes),
              static_cast<unsigned long long>(budget), pr.peak_at.c_str());
  std::printf("  step        %.3f ms  (keep-all %.3f ms %s, peak %s; recompute-all %.3f ms %s)\n",
              pr.step_ms, plan.keep_all.step_ms, pct(pr.step_ms / plan.keep_all.step_ms - 1).c_str(),
              format_bytes(plan.keep_all.peak_bytes).c_str(), plan.recompute_all.step_ms,
              pct(pr.step_ms / plan.recompute_all.step_ms - 1).c_str());
  std::printf("  offloaded   %s (exposed copy %.3f ms)\n", format_bytes(pr.offloaded_bytes).c_str(),
              pr.exposed_copy_ms);
  std::printf("  recomputed  %s (%.3f ms)\n", format_bytes(recomputed).c_str(), pr.recompute_ms);
  std::printf("  bound       lower_bound %.3f ms, gap %.4f%%\n", pr.lower_bound_ms, pr.gap * 100);
  if (plan.solver == "exact") {
    std::printf("  exact       %s (mip gap %.4f%%)\n",
                plan.proved_optimal ? "proved optimal" : "time limit reached", plan.mip_gap * 100);
  }
  std::string binding;
  for (std::size_t k = 0; k < plan.binding_constraints.size() && k < 8; ++k) {
    binding += (k ? ", " : "") + plan.binding_constraints[k];
  }
  if (plan.binding_constraints.size() > 8) {
    binding += ", ... (" + std::to_string(plan.binding_constraints.size()) + " in all)";
  }
  std::printf("  binding     %s\n", binding.empty() ? "none (budget not binding)" : binding.c_str());
  if (!a.out.empty()) {
    write_json_file(a.out, plan_to_json(plan));
    std::printf("wrote %s\n", a.out.c_str());
  }
}

const subcommand_registrar reg(40, [](CLI::App& app) {
  auto args = std::make_shared<plan_args>();
  CLI::App* cmd = app.add_subcommand("plan", "Plan keep/recompute/offload under a memory budget");
  cmd->add_option("--profile", args->profile, "profile.json (schema stash.profile/1)")->required();
  cmd->add_option("--budget", args->budget, "device memory budget: bytes, 80GiB, 85.9GB, ... or 70% (of the keep-all peak)")
      ->required();
  cmd->add_option("--solver", args->solver, "greedy (default), ilp or exact");
  cmd->add_option("-o,--output", args->out, "write plan.json here");
  cmd->add_option("--time-limit", args->time_limit_s,
                  "seconds: exact's whole MIP, ilp's per-layer problems (default 60)");
  cmd->add_option("--mip-gap", args->mip_gap, "relative gap at which exact may stop (default 0)");
  cmd->add_flag("--no-polish", args->no_polish, "skip the local improvement after rounding");
  cmd->callback([args] { run_plan(*args); });
});

}  // namespace
}  // namespace stash::cli
