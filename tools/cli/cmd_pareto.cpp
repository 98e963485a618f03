// `stash pareto`: sweeps budgets from the smallest feasible one to the keep-all peak (or
// --from/--to), bisecting where the plan's step time changes; prints the curve with its
// knee, writes CSV and an SVG plot (planner/solvers/pareto.h). Progress goes to stderr.
// Exit status: 0, 1 when --from is infeasible, 2 for bad input.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "command.h"
#include "core/bytes.h"
#include "core/json_file.h"
#include "planner/plots/pareto_svg.h"
#include "planner/solvers/pareto.h"
#include "planner/solvers/planner.h"

namespace stash::cli {
namespace {

struct pareto_args {
  std::string profile, from, to, solver = "greedy", csv, svg, title;
  int points = 64;
  double time_limit_s = 60;
  bool quiet = false;
};

void run_pareto(const pareto_args& a) {
  using namespace stash::planner;
  pareto_options opt;
  opt.plan.solver = solver_from_string(a.solver);
  opt.plan.time_limit_s = a.time_limit_s;
  check_plan_options(opt.plan);  // Note [One check of the plan options] in planner.h
  const step_profile p = load_profile(a.profile);
  if (!a.from.empty()) opt.from_bytes = parse_budget(a.from, p);
  if (!a.to.empty()) opt.to_bytes = parse_budget(a.to, p);
  opt.max_points = a.points;
  opt.initial_points = std::min(9, a.points);
  if (!a.quiet)
    opt.progress = [](int done, int max, std::uint64_t budget, double step_ms, double solve_ms) {
      std::fprintf(stderr, "pareto: [%2d/%d] budget %s: step %.3f ms (solved in %.0f ms)\n", done,
                   max, format_bytes(budget).c_str(), step_ms, solve_ms);
    };
  pareto_curve c;
  try {
    c = pareto_sweep(p, opt);
  } catch (const infeasible_budget& e) {
    std::fprintf(stderr, "stash pareto: %s\n", e.what());
    throw exit_status{1};
  }
  std::printf("pareto: %s, solver %s, %s .. %s, %zu points from %d solves", p.device_name.c_str(),
              c.solver.c_str(), format_bytes(c.from_bytes).c_str(),
              format_bytes(c.to_bytes).c_str(), c.points.size(), c.solver_calls);
  if (c.carried_forward) std::printf(" (%d carry a smaller budget's better plan)", c.carried_forward);
  std::printf("\n  keep-all      %.3f ms, peak %s\n  recompute-all %.3f ms, peak %s\n",
              c.keep_all.step_ms, format_bytes(c.keep_all.peak_bytes).c_str(),
              c.recompute_all.step_ms, format_bytes(c.recompute_all.peak_bytes).c_str());
  std::printf("  %12s %12s %12s %12s %12s\n", "budget", "step ms", "peak", "offloaded",
              "recompute ms");
  for (std::size_t i = 0; i < c.points.size(); ++i) {
    const pareto_point& pt = c.points[i];
    std::printf("  %12s %12.3f %12s %12s %12.3f%s\n", format_bytes(pt.budget_bytes).c_str(),
                pt.step_ms, format_bytes(pt.peak_bytes).c_str(),
                format_bytes(pt.offloaded_bytes).c_str(), pt.recompute_ms,
                i == c.knee ? "  <- knee" : "");
  }
  if (c.knee < c.points.size())
    std::printf("knee: %s at %.3f ms (%+.2f%% over keep-all)\n",
                format_bytes(c.points[c.knee].budget_bytes).c_str(), c.points[c.knee].step_ms,
                (c.points[c.knee].step_ms / c.keep_all.step_ms - 1) * 100);
  else
    std::printf("knee: none (the curve is flat or has no elbow)\n");
  if (!a.csv.empty()) {
    write_text_file(a.csv, pareto_csv(c));
    std::printf("wrote %s\n", a.csv.c_str());
  }
  if (!a.svg.empty()) {
    const std::string base = a.profile.substr(a.profile.find_last_of('/') + 1);
    const std::string title = a.title.empty() ? "Step time vs. memory budget: " + base : a.title;
    write_text_file(a.svg, pareto_svg(c, title));
    std::printf("wrote %s\n", a.svg.c_str());
  }
}

const subcommand_registrar reg(70, [](CLI::App& app) {
  auto args = std::make_shared<pareto_args>();
  CLI::App* cmd = app.add_subcommand(
      "pareto", "Sweep budgets: predicted step time against memory budget, with the knee");
  cmd->add_option("--profile", args->profile, "profile.json")->required();
  cmd->add_option("--from", args->from, "smallest budget (default: the smallest feasible)");
  cmd->add_option("--to", args->to, "largest budget (default: the keep-all peak)");
  cmd->add_option("--solver", args->solver, "greedy (default), ilp or exact");
  cmd->add_option("-o,--output", args->csv, "write the curve as CSV here");
  cmd->add_option("--svg", args->svg, "write an SVG plot here");
  cmd->add_option("--title", args->title, "the plot's title");
  cmd->add_option("--points", args->points, "solver calls in all (default 64)")
      ->check(CLI::Range(2, 100000));
  cmd->add_option("--time-limit", args->time_limit_s, "seconds per solve for ilp / exact");
  cmd->add_flag("-q,--quiet", args->quiet, "no progress on stderr");
  cmd->callback([args] { run_pareto(*args); });
});

}  // namespace
}  // namespace stash::cli
