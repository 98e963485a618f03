// demo_plan.cpp: `stash demo` at the demo's budgets: plan at the keep-all peak x 1.0, 0.85,
// 0.7, 0.55 and at the smallest feasible budget, predict each plan with the simulator, and
// print the table (both paths); write the plans and the Pareto sweep; and the whole no-GPU
// path, which plans and simulates a shipped profile. See cmd_demo.cpp for the command.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "demo.h"
#include "core/json_file.h"
#include "planner/plots/memory_svg.h"
#include "planner/plots/pareto_svg.h"
#include "planner/solvers/pareto.h"
#include "planner/solvers/planner.h"
#include "planner/simulator/simulator.h"

namespace stash::cli::demo {


// ---- plans at the demo's budgets ------------------------------------------------------

planner::sim_options demo_sim_options(const planner::step_profile& p) {
  planner::sim_options o;
  o.pinned_bytes = p.pinnable_bytes;  // the runtime's pinned pool is capped there
  return o;
}

// `passes`: forward/backward passes per step (micro-batches). The profile and the simulator
// describe one pass (its layers, and the step overhead measured per pass); passes run one
// after another, so a step's predicted time is passes x the pass's, and its peak the pass's.
std::vector<row> plan_budgets(const planner::step_profile& p, const std::string& solver,
                              baselines* base, int passes) {
  const planner::sim_result keep = planner::simulate(p, planner::keep_all(p), demo_sim_options(p));
  const planner::sim_result rec =
      planner::simulate(p, planner::recompute_all(p), demo_sim_options(p));
  *base = {passes * keep.step_ms, passes * rec.step_ms, keep.peak_bytes, rec.peak_bytes};
  std::vector<row> rows;
  for (int pct : {100, 85, 70, 55}) {
    row r;
    r.label = std::to_string(pct) + "%";
    r.file = std::to_string(pct);
    r.budget = static_cast<std::uint64_t>(std::floor(double(keep.peak_bytes) * pct / 100.0));
    rows.push_back(r);
  }
  row m;
  m.label = "min";
  m.file = "min";
  m.budget = planner::min_feasible_budget(p);
  rows.push_back(m);
  planner::plan_options opt;
  opt.solver = planner::solver_from_string(solver);
  for (row& r : rows) {
    progress("planning at %s (%s)", r.label, format_bytes(r.budget));
    try {
      r.plan = planner::make_plan(p, r.budget, opt);
      r.feasible = true;
      const planner::sim_result s = planner::simulate(p, r.plan.decisions(), demo_sim_options(p));
      r.pred_step_ms = passes * s.step_ms;
      r.pred_peak = s.peak_bytes;
      r.pred_exposed_ms = passes * s.exposed_copy_ms;
    } catch (const planner::infeasible_budget& e) {
      r.note =
          "infeasible: the smallest feasible budget is " + format_bytes(e.min_feasible_bytes());
    }
  }
  return rows;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

namespace {

std::string pct_faster(double base_ms, double ms) {
  // Throughput relative to the baseline: base / this - 1.
  return ms > 0 && base_ms > 0 ? fmt("%+.2f%%", (base_ms / ms - 1) * 100) : "-";
}

}  // namespace

void print_table(const std::vector<row>& rows, const baselines& b, const std::string& solver,
                 bool measured, double keep_meas_ms, double rec_meas_ms) {
  std::printf(
      "| budget | solver | measured step ms | throughput | measured peak | predicted step ms "
      "| predicted peak | vs recompute-all | vs keep-all |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const row& r : rows) {
    const std::string budget = r.label + " (" + format_bytes(r.budget) + ")";
    if (!r.feasible) {
      std::printf("| %s | %s | - | - | - | - | - | - | - |  %s\n", budget.c_str(), solver.c_str(),
                  r.note.c_str());
      continue;
    }
    const bool m = measured && r.measured;
    // "vs" columns: measured against measured baselines where runs exist, else predicted.
    const double ms = m ? r.step_ms : r.pred_step_ms;
    const double keep = m ? keep_meas_ms : b.keep_ms, rec = m ? rec_meas_ms : b.recompute_ms;
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |%s\n", budget.c_str(),
                solver.c_str(), m ? fmt("%.3f", r.step_ms).c_str() : "-",
                m ? fmt("%.0f tok/s", r.tokens_per_s).c_str() : "-",
                m ? format_bytes(r.peak).c_str() : "-", fmt("%.3f", r.pred_step_ms).c_str(),
                format_bytes(r.pred_peak).c_str(), pct_faster(rec, ms).c_str(),
                pct_faster(keep, ms).c_str(),
                m && r.peak > r.budget ? "  measured peak over budget" : "");
  }
}

void write_plans_and_pareto(const planner::step_profile& p, std::vector<row>& rows,
                            const demo_args& a, const std::string& title) {
  for (const row& r : rows) {
    if (!r.feasible) continue;
    stash::write_json_file(a.out + "/plan-" + r.file + ".json", planner::plan_to_json(r.plan));
  }
  planner::pareto_options po;
  po.plan.solver = planner::solver_from_string(a.solver);
  po.max_points = a.pareto_points;
  po.initial_points = std::min(9, a.pareto_points);
  po.progress = [](int done, int max, std::uint64_t budget, double step_ms, double) {
    std::fprintf(stderr, "demo: pareto [%2d/%d] %s: %.3f ms\n", done, max,
                 format_bytes(budget).c_str(), step_ms);
  };
  const planner::pareto_curve c = planner::pareto_sweep(p, po);
  stash::write_text_file(a.out + "/pareto.csv", planner::pareto_csv(c));
  stash::write_text_file(a.out + "/pareto.svg", planner::pareto_svg(c, title));
}

// ---- without a GPU: plan and simulate a shipped profile ------------------------------------

void run_predicted(const demo_args& a, const std::string& why) {
  const std::string path = a.profile.empty() ? find_shipped_profile(kDefaultProfile) : a.profile;
  const planner::step_profile p = planner::load_profile(path);
  const std::string label = "predicted (" + why + ")";
  progress("%s: planning and simulating %s; nothing runs on a GPU", label, path);
  make_dir(a.out);
  baselines b;
  std::vector<row> rows = plan_budgets(p, a.solver, &b);
  for (const row& r : rows) {
    if (!r.feasible) continue;
    planner::sim_result s = planner::simulate(p, r.plan.decisions(), demo_sim_options(p));
    s.trace.set_metadata("label", label);
    s.trace.write(a.out + "/trace-" + r.file + ".json");
    const std::vector<planner::memory_series> series = {
        {"predicted (stash simulate; no GPU found)", "#1f5fbf", planner::step_memory(s)}};
    const std::string title =
        "stash demo: device memory at " + r.label + " of the keep-all peak (predicted)";
    stash::write_text_file(a.out + "/memory-" + r.file + ".svg",
                             planner::memory_svg(series, r.budget, title, p.device_name));
  }
  stash::write_json_file(a.out + "/profile.json", planner::profile_to_json(p));
  write_plans_and_pareto(p, rows, a, "stash demo, " + label + ": " + p.device_name);
  std::printf("stash demo: %s\n", label.c_str());
  std::printf(
      "profile: %s (%s, %zu layers); every figure below is PREDICTED by the planner's "
      "simulator; measured columns are '-' (no GPU found)\n",
      path.c_str(), p.device_name.c_str(), p.layers.size());
  std::printf("keep-all: %.3f ms, peak %s; recompute-all: %.3f ms, peak %s (predicted)\n\n",
              b.keep_ms, format_bytes(b.keep_peak).c_str(), b.recompute_ms,
              format_bytes(b.recompute_peak).c_str());
  print_table(rows, b, a.solver, false, 0, 0);
  std::printf(
      "\nwrote %s/: profile.json, plan-*.json, trace-*.json (simulated), memory-*.svg, "
      "pareto.csv, pareto.svg; all predicted (no GPU found)\n",
      a.out.c_str());
}

}  // namespace stash::cli::demo
