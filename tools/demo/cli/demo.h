// demo.h: what the files of `stash demo` share (private to tools/demo/cli/; see the file-top
// comment in cmd_demo.cpp for which file holds what).
//
// Everything here lives in stash::cli::demo; each file keeps the rest in an unnamed
// namespace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/bytes.h"
#include "tools/demo/driver/model.h"
#include "planner/solvers/planner.h"
#include "planner/simulator/simulator.h"

namespace stash::cli::demo {

using stash::format_bytes;
using stash::input_error;

constexpr const char* kDefaultProfile = "llama3-8b_h200_b4_s4096.json";

struct demo_args {
  int layers = 8, hidden = 2048, seq = 2048, batch = 4, ffn_mult = 4, micro_batches = 1;
  int steps = 5;
  std::uint64_t seed = 1;
  std::string out = "demo-out", solver = "greedy", profile, backend = "auto";
  int pareto_points = 32;
  bool size_given = false;  // any of --layers --hidden --seq --batch --ffn-mult on the line
  bool graphs = false;      // --graphs: plans run as captured, replayed steps
};

// --backend host computes with plain C++ loops: without size options it runs this model
// (seconds), not the GPU-sized default above (hours).
struct host_size {
  static constexpr int layers = 3, hidden = 64, seq = 2048, batch = 2, ffn_mult = 1;
};

// ---- helpers (cmd_demo.cpp) ------------------------------------------------------------

void progress(const char* fmt, const std::string& a = "", const std::string& b = "");
void make_dir(const std::string& d);
// Note [Finding the shipped profiles] in cmd_demo.cpp.
std::string find_shipped_profile(const std::string& name);

// ---- plans at the demo's budgets (demo_plan.cpp) -----------------------------------------

struct row {
  std::string label;  // "100%", "85%", "70%", "55%", "min"
  std::string file;   // "100", "85", "70", "55", "min": plan-<file>.json, trace-<file>.json
  std::uint64_t budget = 0;
  bool feasible = false;
  std::string note;
  planner::step_plan plan;
  double pred_step_ms = 0;
  std::uint64_t pred_peak = 0;
  double pred_exposed_ms = 0;  // per step: compute-stream waits for copies (simulator)
  // measured
  bool measured = false;
  double step_ms = 0, tokens_per_s = 0;
  std::uint64_t peak = 0, in_use_peak = 0;
  bool grads_equal = true;
  double exposed_share = 0;  // the engine's exposed copy time / the run's time, all steps
};

struct baselines {
  double keep_ms = 0, recompute_ms = 0;  // predicted
  std::uint64_t keep_peak = 0, recompute_peak = 0;
};

std::vector<row> plan_budgets(const planner::step_profile& p, const std::string& solver,
                              baselines* base, int passes = 1);
// The simulator's options for the demo's plans (the pinned pool capped at the profile's).
planner::sim_options demo_sim_options(const planner::step_profile& p);
std::string fmt(const char* f, double v);
void print_table(const std::vector<row>& rows, const baselines& b, const std::string& solver,
                 bool measured, double keep_meas_ms, double rec_meas_ms);
void write_plans_and_pareto(const planner::step_profile& p, std::vector<row>& rows,
                            const demo_args& a, const std::string& title);

// ---- the two paths ------------------------------------------------------------------------

// Without a GPU: plan and simulate a shipped profile (demo_plan.cpp).
void run_predicted(const demo_args& a, const std::string& why);
// With a device (or the host backend on the test double): measure, profile, plan, run
// (demo_measured.cpp). Returns the exit status: 0, or 1 when gradients differ.
int run_measured(const demo_args& a, workload::backend_kind kind, bool on_double);

}  // namespace stash::cli::demo
