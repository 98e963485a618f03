// `stash check`: evaluates any plan with the canonical cost model.
// Exit status: 0 valid, 1 invalid (each violated constraint is named), 2 bad input.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "command.h"
#include "core/bytes.h"
#include "planner/model/plan.h"

namespace stash::cli {
namespace {

struct check_args {
  std::string profile, plan, budget;
};

void run_check(const check_args& a) {
  using namespace stash::planner;
  const step_profile p = load_profile(a.profile);
  const step_plan plan = load_plan(a.plan, p);
  const std::uint64_t budget = a.budget.empty() ? plan.budget_bytes : parse_bytes(a.budget);
  if (!plan.profile_sha256.empty() && plan.profile_sha256 != profile_sha256(p)) {
    std::fprintf(stderr,
                 "stash check: warning: the plan was made for a different profile "
                 "(sha256 %s); checking it against this one\n",
                 plan.profile_sha256.c_str());
  }
  const evaluation ev = evaluate(p, plan.decisions(), budget);
  std::printf("check: %s\n", ev.valid ? "valid" : "INVALID");
  std::printf("  peak        %s of %s budget (%llu / %llu bytes) at %s\n",
              format_bytes(ev.peak_bytes).c_str(), format_bytes(budget).c_str(),
              static_cast<unsigned long long>(ev.peak_bytes),
              static_cast<unsigned long long>(budget), ev.peak_at.c_str());
  std::printf("  host        %s offloaded of %s pinnable\n", format_bytes(ev.offloaded_bytes).c_str(),
              format_bytes(p.pinnable_bytes).c_str());
  std::printf("  step        %.3f ms (compute %.3f, recompute %.3f, exposed copy %.3f)\n",
              ev.step_ms, ev.compute_ms, ev.recompute_ms, ev.exposed_copy_ms);
  if (plan.predicted.step_ms > 0 && std::abs(plan.predicted.step_ms - ev.step_ms) >
                                        1e-6 * std::max(1.0, ev.step_ms)) {
    std::printf("  note        the plan predicted %.3f ms\n", plan.predicted.step_ms);
  }
  if (ev.valid) return;
  for (const std::string& v : ev.violations) std::fprintf(stderr, "violated: %s\n", v.c_str());
  throw exit_status{1};
}

const subcommand_registrar reg(50, [](CLI::App& app) {
  auto args = std::make_shared<check_args>();
  CLI::App* cmd = app.add_subcommand("check", "Check a plan against the canonical cost model");
  cmd->add_option("--profile", args->profile, "profile.json")->required();
  cmd->add_option("--plan", args->plan, "plan.json (schema stash.plan/1)")->required();
  cmd->add_option("--budget", args->budget, "check against this budget instead of the plan's");
  cmd->callback([args] { run_check(*args); });
});

}  // namespace
}  // namespace stash::cli
