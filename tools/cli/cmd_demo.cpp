// `stash demo`: the main job end to end (docs/workload.md).
//
// With a GPU and the CUDA backend built: measure the link, profile the built-in workload
// (kernels/workload/driver) in-process with CUPTI (CUDA events when CUPTI is unavailable),
// plan at the keep-all peak x 1.0, 0.85, 0.7, 0.55 and at the smallest feasible budget, run
// every plan with the prefetch engine, check its gradients against keep-all bit for bit,
// and print measured against predicted (planner/simulator.h). Without one: the same plans
// and predictions on a shipped profile, labelled "predicted (no GPU found)".
// `--backend host` runs the measured pipeline with the host backend on stash's CPU test
// double: how CI exercises the real path without a GPU; its times are the double's virtual
// clock.
//
// Exit status: 0; 1 when a plan's gradients differ from keep-all; 2 bad input; 3 a CUDA
// error or no usable GPU for --backend cuda.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "command.h"
#include "kernels/workload/driver/session.h"
#include "kernels/workload/driver/skeleton.h"
#include "kernels/workload/driver/virtual_cost.h"
#include "planner/json_file.h"
#include "planner/pareto.h"
#include "planner/planner.h"
#include "planner/simulator.h"
#include "runtime/measure/link_bench.h"
#include "runtime/measure/measure_prim.h"
#include "runtime/measure/profile_fill.h"

namespace stash::cli {
namespace {

using planner::format_bytes;
using planner::input_error;

constexpr const char* kDefaultProfile = "llama3-8b_h200_b4_s4096.json";

struct demo_args {
  int layers = 8, hidden = 2048, seq = 2048, batch = 4, ffn_mult = 4, micro_batches = 1;
  int steps = 5;
  std::uint64_t seed = 1;
  std::string out = "demo-out", solver = "greedy", profile, backend = "auto";
  int pareto_points = 32;
};

void progress(const char* fmt, const std::string& a = "", const std::string& b = "") {
  std::fprintf(stderr, "demo: ");
  std::fprintf(stderr, fmt, a.c_str(), b.c_str());
  std::fprintf(stderr, "\n");
}

bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void make_dir(const std::string& d) {
  std::string cur;
  for (std::size_t i = 0; i <= d.size(); ++i) {
    if (i == d.size() || d[i] == '/') {
      if (!cur.empty() && ::mkdir(cur.c_str(), 0777) != 0 && errno != EEXIST)
        throw input_error(d + ": cannot create the output folder: " + std::strerror(errno));
    }
    if (i < d.size()) cur += d[i];
  }
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  if (!f) throw input_error(path + ": cannot write");
}

// Note [Finding the shipped profiles]
// In order: $STASH_PROFILES_DIR; <exe dir>/profiles and <exe dir>/../share/stash/profiles
// (an installed prefix); the source tree this binary was built from (the build tree).
std::string find_shipped_profile(const std::string& name) {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("STASH_PROFILES_DIR"); env && *env) dirs.push_back(env);
  char exe[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = '\0';
    std::string dir(exe);
    dir.erase(dir.find_last_of('/'));
    dirs.push_back(dir + "/profiles");
    dirs.push_back(dir + "/../share/stash/profiles");
  }
  dirs.push_back(std::string(STASH_SOURCE_DIR) + "/tools/profiles");
  for (const std::string& d : dirs)
    if (is_file(d + "/" + name)) return d + "/" + name;
  std::string looked;
  for (const std::string& d : dirs) looked += "\n  " + d;
  throw input_error("cannot find the shipped profile " + name + "; looked in:" + looked +
                    "\n(give one with --profile)");
}

// ---- plans at the demo's budgets ------------------------------------------------------

struct row {
  std::string label;  // "100%", "85%", "70%", "55%", "min"
  std::string file;   // "100", "85", "70", "55", "min": plan-<file>.json, trace-<file>.json
  std::uint64_t budget = 0;
  bool feasible = false;
  std::string note;
  planner::Plan plan;
  double pred_step_ms = 0;
  std::uint64_t pred_peak = 0;
  // measured
  bool measured = false;
  double step_ms = 0, tokens_per_s = 0;
  std::uint64_t peak = 0, in_use_peak = 0;
  bool grads_equal = true;
};

struct baselines {
  double keep_ms = 0, recompute_ms = 0;  // predicted
  std::uint64_t keep_peak = 0, recompute_peak = 0;
};

planner::SimOptions sim_options(const planner::Profile& p) {
  planner::SimOptions o;
  o.pinned_bytes = p.pinnable_bytes;  // the runtime's pinned pool is capped there
  return o;
}

// `passes`: forward/backward passes per step (micro-batches). The profile and the simulator
// describe one pass (its layers, and the step overhead measured per pass); passes run one
// after another, so a step's predicted time is passes x the pass's, and its peak the pass's.
std::vector<row> plan_budgets(const planner::Profile& p, const std::string& solver,
                              baselines* base, int passes = 1) {
  const planner::SimResult keep = planner::simulate(p, planner::keep_all(p), sim_options(p));
  const planner::SimResult rec = planner::simulate(p, planner::recompute_all(p), sim_options(p));
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
  planner::PlanOptions opt;
  opt.solver = planner::solver_from_string(solver);
  for (row& r : rows) {
    progress("planning at %s (%s)", r.label, format_bytes(r.budget));
    try {
      r.plan = planner::make_plan(p, r.budget, opt);
      r.feasible = true;
      const planner::SimResult s = planner::simulate(p, r.plan.decisions(), sim_options(p));
      r.pred_step_ms = passes * s.step_ms;
      r.pred_peak = s.peak_bytes;
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

std::string pct_faster(double base_ms, double ms) {
  // Throughput relative to the baseline: base / this - 1.
  return ms > 0 && base_ms > 0 ? fmt("%+.2f%%", (base_ms / ms - 1) * 100) : "-";
}

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

void write_plans_and_pareto(const planner::Profile& p, std::vector<row>& rows, const demo_args& a,
                            const std::string& title) {
  for (const row& r : rows) {
    if (!r.feasible) continue;
    planner::write_json_file(a.out + "/plan-" + r.file + ".json", planner::plan_to_json(r.plan));
  }
  planner::ParetoOptions po;
  po.plan.solver = planner::solver_from_string(a.solver);
  po.max_points = a.pareto_points;
  po.initial_points = std::min(9, a.pareto_points);
  po.progress = [](int done, int max, std::uint64_t budget, double step_ms, double) {
    std::fprintf(stderr, "demo: pareto [%2d/%d] %s: %.3f ms\n", done, max,
                 format_bytes(budget).c_str(), step_ms);
  };
  const planner::ParetoCurve c = planner::pareto_sweep(p, po);
  write_text(a.out + "/pareto.csv", planner::pareto_csv(c));
  write_text(a.out + "/pareto.svg", planner::pareto_svg(c, title));
}

// ---- without a GPU: plan and simulate a shipped profile ------------------------------------

void run_predicted(const demo_args& a, const std::string& why) {
  const std::string path = a.profile.empty() ? find_shipped_profile(kDefaultProfile) : a.profile;
  const planner::Profile p = planner::load_profile(path);
  const std::string label = "predicted (" + why + ")";
  progress("%s: planning and simulating %s; nothing runs on a GPU", label, path);
  make_dir(a.out);
  baselines b;
  std::vector<row> rows = plan_budgets(p, a.solver, &b);
  for (const row& r : rows) {
    if (!r.feasible) continue;
    planner::SimResult s = planner::simulate(p, r.plan.decisions(), sim_options(p));
    s.trace.set_metadata("label", label);
    s.trace.write(a.out + "/trace-" + r.file + ".json");
  }
  planner::write_json_file(a.out + "/profile.json", planner::profile_to_json(p));
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
      "\nwrote %s/: profile.json, plan-*.json, trace-*.json (simulated), pareto.csv, "
      "pareto.svg; all predicted (no GPU found)\n",
      a.out.c_str());
}

// ---- with a device: measure, profile, plan, run ------------------------------------------

std::vector<stash_action_t> actions_of(const planner::Decisions& d) {
  std::vector<stash_action_t> v;
  for (const auto& layer : d)
    for (planner::Action x : layer)
      v.push_back(x == planner::Action::offload     ? STASH_ACTION_OFFLOAD
                  : x == planner::Action::recompute ? STASH_ACTION_RECOMPUTE
                                                    : STASH_ACTION_KEEP);
  return v;
}

// The host backend on the double gets nominal op durations on the virtual clock (Note
// [Virtual cost of host ops]), scaled with the hidden size: a block's GEMM time per saved
// byte grows with H, so rates of 20 TFLOP/s and 2 TB/s at H = 1024, proportionally less
// below, keep a small model's compute-versus-copy balance (at the double's 50 GB/s link)
// near that of the default configuration on an H200. The CUDA backend runs as it is.
workload::session make_session(const workload::model_config& c, workload::backend_kind kind) {
  if (kind != workload::backend_kind::host) return workload::session(c, kind);
  workload::virtual_rates r;
  r.gemm_tflops = 20.0 * c.hidden / 1024.0;
  r.memory_gbps = 2000.0 * c.hidden / 1024.0;
  return workload::session(c, kind, {}, [r](std::unique_ptr<workload::backend> b) {
    return workload::with_virtual_cost(std::move(b), r);
  });
}

struct run_outcome {
  double step_ms = 0;                       // median of the timed steps
  std::uint64_t peak = 0, in_use_peak = 0;  // model.h: memory_peaks held / in use
  std::vector<float> grads;
  std::vector<float> losses;
};

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e));
  }
}

// Step 0 warms up (allocator growth, cuBLAS heuristics, pinned slabs); the rest are timed
// with events on the compute stream, one step at a time.
run_outcome run_plan(const workload::model_config& c, workload::backend_kind kind,
                     const std::vector<stash_action_t>& plan, int steps,
                     const std::string& trace_path) {
  workload::session s = make_session(c, kind);
  s.set_plan(plan);
  workload::model& m = s.workload();
  m.reset_peaks();
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  check(cudaEventCreate(&e0), "cudaEventCreate");
  check(cudaEventCreate(&e1), "cudaEventCreate");
  run_outcome o;
  std::vector<double> times;
  try {
    for (int i = 0; i < steps; ++i) {
      check(cudaEventRecord(e0, s.stream()), "cudaEventRecord");
      m.step();
      check(cudaEventRecord(e1, s.stream()), "cudaEventRecord");
      o.losses.push_back(m.last_loss());  // synchronizes
      float ms = 0;
      check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
      if (i > 0) times.push_back(ms);
    }
  } catch (...) {
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    throw;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  o.step_ms = times[times.size() / 2];
  o.peak = m.peaks().held_bytes;
  o.in_use_peak = m.peaks().in_use_bytes;
  o.grads = m.read_gradients();
  if (!trace_path.empty()) {
    const stash_status_t st = stash_engine_write_trace(s.engine(), trace_path.c_str());
    if (st != STASH_OK)
      throw std::runtime_error(std::string("stash_engine_write_trace: ") + stash_last_error());
  }
  return o;
}

// Profiles a keep-all run: CUPTI through stash_profiler_start/stop with the skeleton, or,
// when profiling is unavailable, CUDA events around the same scopes (scope_timer.h).
planner::Profile profile_workload(const workload::model_config& c, workload::backend_kind kind,
                                  const planner::Profile& skeleton, const demo_args& a) {
  const std::string skel_path = a.out + "/skeleton.json", prof_path = a.out + "/profile.json";
  workload::session s = make_session(c, kind);
  s.set_plan(workload::uniform_plan(c.layers, STASH_ACTION_KEEP));
  stash_status_t st = stash_profiler_start();
  if (st == STASH_OK) {
    progress("profiling %s steps with CUPTI", std::to_string(a.steps));
    for (int i = 0; i < a.steps; ++i) {
      s.workload().step();
      (void)s.workload().last_loss();
    }
    st = stash_profiler_stop(skel_path.c_str(), prof_path.c_str());
    if (st != STASH_OK)
      throw std::runtime_error(std::string("stash_profiler_stop: ") + stash_last_error());
    return planner::load_profile(prof_path);
  }
  const std::string why = stash_last_error();
  std::fprintf(stderr, "demo: %s; timing blocks with CUDA events instead\n", why.c_str());
  workload::scope_timer timer(s.stream());
  s.workload().set_scope_timer(&timer);
  for (int i = 0; i < a.steps; ++i) {
    s.workload().step();
    (void)s.workload().last_loss();
    timer.harvest();
  }
  s.workload().set_scope_timer(nullptr);
  planner::Profile p = skeleton;
  for (int l = 0; l < c.layers; ++l) {
    planner::LayerProfile& lp = p.layers[l];
    lp.fwd_ms = std::max(0.0, timer.median_ms(STASH_SCOPE_FORWARD, l, -1));
    lp.bwd_ms = std::max(0.0, timer.median_ms(STASH_SCOPE_BACKWARD, l, -1));
    for (int j = 1; j < workload::kSavedPerBlock; ++j)
      lp.tensors[j].recompute_ms = std::max(0.0, timer.median_ms(STASH_SCOPE_TENSOR, l, j));
  }
  // The loss, the update and the uploads: the step minus its layer scopes, per forward
  // pass (Note [Event timing of the step overhead] in scope_timer.h).
  p.step_overhead_ms = std::max(0.0, timer.step_overhead_median_ms());
  nlohmann::json j = planner::profile_to_json(p);
  j["measurement"] = {{"method", "CUDA events around the workload's scopes"},
                      {"reason", why},
                      {"steps", a.steps},
                      {"statistic", "median"},
                      {"step_overhead",
                       "events around each step minus its layer scopes, per micro-batch"}};
  planner::write_json_file(prof_path, j);
  return p;
}

int run_measured(const demo_args& a, workload::backend_kind kind, bool on_double) {
  workload::model_config c;
  c.layers = a.layers, c.hidden = a.hidden, c.seq = a.seq, c.batch = a.batch;
  c.ffn_mult = a.ffn_mult, c.micro_batches = a.micro_batches, c.seed = a.seed;
  make_dir(a.out);
  if (!a.profile.empty())
    progress("note: --profile %s is for the no-GPU path; this run profiles the workload itself",
             a.profile);
  const std::string clock =
      on_double
          ? "virtual clock of stash's CPU test double: times are not a GPU's and not meaningful"
          : "CUDA events";
  std::string device;
  std::uint64_t memory = 0;
  workload::device_facts(&device, &memory);
  progress("measured run on %s, backend %s", device, workload::to_string(kind));

  // 1. The link, as offloads use it.
  workload::skeleton_options so;
  so.device_name = device;
  so.device_memory_bytes = memory;
  bool link_measured = false;
  try {
    measure::link_bench_options lo;
    lo.bytes = std::size_t{256} << 20;
    lo.samples = 5;
    lo.warmups = 1;
    lo.pageable = false;
    const measure::link_bench_result lr = measure::run_link_bench(lo);
    so.link = lr.link();
    link_measured = true;
    planner::write_json_file(a.out + "/link.json", measure::link_bench_to_json(lr));
    progress("link: %s GB/s h2d, %s GB/s d2h", fmt("%.1f", so.link->h2d_gbps),
             fmt("%.1f", so.link->d2h_gbps));
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "demo: link benchmark failed (%s); planning with an assumed PCIe Gen5 "
                 "link (55/55/100 GB/s)\n",
                 e.what());
  }
  const planner::Profile skeleton = workload::make_skeleton(c, kind, so);
  planner::write_json_file(a.out + "/skeleton.json",
                           workload::skeleton_json(skeleton, c, kind, link_measured));

  // 2. Profile, 3. plan.
  const planner::Profile p = profile_workload(c, kind, skeleton, a);
  baselines b;
  std::vector<row> rows = plan_budgets(p, a.solver, &b, c.micro_batches);

  // 4. Run: keep-all (the reference for gradients), recompute-all, then every plan.
  const int T = c.tokens() * c.micro_batches;
  progress("running keep-all (%s steps)", std::to_string(a.steps));
  const run_outcome keep = run_plan(c, kind, workload::uniform_plan(c.layers, STASH_ACTION_KEEP),
                                    a.steps, a.out + "/trace-keep-all.json");
  progress("running recompute-all (%s steps)", std::to_string(a.steps));
  const run_outcome rec =
      run_plan(c, kind, workload::uniform_plan(c.layers, STASH_ACTION_RECOMPUTE), a.steps,
               a.out + "/trace-recompute-all.json");
  auto same_bits = [&](const run_outcome& o) {
    return o.grads.size() == keep.grads.size() &&
           std::memcmp(o.grads.data(), keep.grads.data(), o.grads.size() * sizeof(float)) == 0 &&
           std::memcmp(o.losses.data(), keep.losses.data(), o.losses.size() * sizeof(float)) == 0;
  };
  bool all_equal = same_bits(rec);
  for (row& r : rows) {
    if (!r.feasible) continue;
    progress("running the %s plan (%s steps)", r.label, std::to_string(a.steps));
    const run_outcome o = run_plan(c, kind, actions_of(r.plan.decisions()), a.steps,
                                   a.out + "/trace-" + r.file + ".json");
    r.measured = true;
    r.step_ms = o.step_ms;
    r.tokens_per_s = o.step_ms > 0 ? T / (o.step_ms / 1000.0) : 0;
    r.peak = o.peak;
    r.in_use_peak = o.in_use_peak;
    r.grads_equal = same_bits(o);
    all_equal = all_equal && r.grads_equal;
  }
  write_plans_and_pareto(p, rows, a, "stash demo: built-in workload on " + device);

  // 5. Report.
  std::printf("stash demo: measured on %s (backend %s; times: %s)\n", device.c_str(),
              workload::to_string(kind), clock.c_str());
  std::printf(
      "workload: %d layers, hidden %d, seq %d, batch %d, ffn x%d, %d micro-batch(es), "
      "%d steps (first is warm-up; median of the rest)\n",
      c.layers, c.hidden, c.seq, c.batch, c.ffn_mult, c.micro_batches, a.steps);
  std::printf(
      "keep-all: %.3f ms, peak %s measured (predicted %.3f ms, %s); recompute-all: %.3f "
      "ms, peak %s measured (predicted %.3f ms, %s)\n\n",
      keep.step_ms, format_bytes(keep.peak).c_str(), b.keep_ms, format_bytes(b.keep_peak).c_str(),
      rec.step_ms, format_bytes(rec.peak).c_str(), b.recompute_ms,
      format_bytes(b.recompute_peak).c_str());
  print_table(rows, b, a.solver, true, keep.step_ms, rec.step_ms);
  std::printf("\n");
  if (all_equal) {
    std::printf("gradients: bitwise equal to keep-all for every plan (and recompute-all)\n");
  } else {
    if (!same_bits(rec)) std::printf("GRADIENT MISMATCH: recompute-all differs from keep-all\n");
    for (const row& r : rows)
      if (r.measured && !r.grads_equal)
        std::printf("GRADIENT MISMATCH: the %s plan's gradients or losses differ from keep-all\n",
                    r.label.c_str());
  }
  // Note [Measured peak]: the table's figure counts blocks the pool could not hand out yet
  // because the host had not seen their D2H finish; the pool's in-use peak is the quantity
  // the planner's model predicts. Both are shown so a gap between them is visible.
  std::printf(
      "measured peak: the device pool's bytes in use plus blocks freed but not yet "
      "reusable (their D2H not yet seen complete by the host), at their highest; the "
      "pool's in-use peak alone:");
  for (const row& r : rows)
    if (r.measured) std::printf(" %s %s;", r.label.c_str(), format_bytes(r.in_use_peak).c_str());
  std::printf("\n");
  std::printf(
      "wrote %s/: link.json, skeleton.json, profile.json, plan-*.json, trace-*.json "
      "(engine), pareto.csv, pareto.svg\n",
      a.out.c_str());
  return all_equal ? 0 : 1;
}

// ---- mode ------------------------------------------------------------------------------

void run_demo(const demo_args& a) {
  workload::model_config c;
  c.layers = a.layers, c.hidden = a.hidden, c.seq = a.seq, c.batch = a.batch;
  c.ffn_mult = a.ffn_mult, c.micro_batches = a.micro_batches, c.seed = a.seed;
  std::string problem = c.problem();
  if (!problem.empty()) {
    // The model names its fields as in code; the user typed options.
    for (const char* f : {"layers", "hidden", "seq", "batch", "micro_batches", "ffn_mult"}) {
      if (problem.rfind(f, 0) == 0) {
        std::string opt = f;
        std::replace(opt.begin(), opt.end(), '_', '-');
        problem = "--" + opt + problem.substr(std::strlen(f));
        break;
      }
    }
    throw input_error(problem);
  }
  if (a.solver != "greedy" && a.solver != "ilp")
    throw input_error("--solver must be greedy or ilp, got \"" + a.solver + "\"");
  if (a.backend != "auto" && a.backend != "cuda" && a.backend != "host")
    throw input_error("--backend must be auto, cuda or host, got \"" + a.backend + "\"");
  if (a.steps < 2) throw input_error("--steps must be at least 2 (one warm-up, one timed)");
  if (!a.profile.empty() && !is_file(a.profile)) throw input_error(a.profile + ": no such profile");

  const bool on_double = dlsym(RTLD_DEFAULT, "stashdbl_probe") != nullptr;
  const std::string no_gpu = measure::prim::device_problem();  // "" when a device exists
  const bool have_gpu = no_gpu.empty() && !on_double;
  int rc = 0;
  if (a.backend == "host") {
    if (!on_double)
      throw input_error(
          "--backend host needs stash's CPU test double of libcudart.so.13 "
          "(LD_LIBRARY_PATH=<build>/cudart_double); on a GPU use --backend cuda");
    rc = run_measured(a, workload::backend_kind::host, true);
  } else if (a.backend == "cuda") {
    if (!workload::cuda_backend_built())
      throw input_error("--backend cuda: this build has no CUDA backend (STASH_BUILD_KERNELS=OFF)");
    if (!have_gpu) {
      std::fprintf(stderr, "stash demo: no usable GPU: %s\n",
                   on_double ? "stash's CPU test double is loaded" : no_gpu.c_str());
      throw exit_status{3};
    }
    rc = run_measured(a, workload::backend_kind::cuda, false);
  } else if (have_gpu && workload::cuda_backend_built()) {
    rc = run_measured(a, workload::backend_kind::cuda, false);
  } else {
    std::string why = "no GPU found";
    if (on_double)
      why += ": stash's CPU test double is loaded; --backend host runs the measured path on it";
    else if (have_gpu)
      why = "GPU found, but this build has no CUDA backend (STASH_BUILD_KERNELS=OFF)";
    run_predicted(a, why);
  }
  if (rc != 0) throw exit_status{rc};
}

const CommandRegistrar reg(90, [](CLI::App& app) {
  auto a = std::make_shared<demo_args>();
  CLI::App* cmd = app.add_subcommand(
      "demo",
      "The main job: profile the built-in workload, plan at several budgets, run each plan "
      "with the engine and compare measured with predicted (no GPU: predicted only)");
  cmd->add_option("--layers", a->layers, "blocks")->capture_default_str();
  cmd->add_option("--hidden", a->hidden, "hidden size H")->capture_default_str();
  cmd->add_option("--seq", a->seq, "sequence length")->capture_default_str();
  cmd->add_option("--batch", a->batch, "sequences per micro-batch")->capture_default_str();
  cmd->add_option("--ffn-mult", a->ffn_mult, "MLP width F = ffn-mult x H")->capture_default_str();
  cmd->add_option("--micro-batches", a->micro_batches, "per step (gradient accumulation)")
      ->capture_default_str();
  cmd->add_option("--steps", a->steps, "steps per run; the first is warm-up")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "initialisation and data")->capture_default_str();
  cmd->add_option("--out", a->out, "output folder")->capture_default_str();
  cmd->add_option("--solver", a->solver, "greedy or ilp")->capture_default_str();
  cmd->add_option(
      "--profile", a->profile,
      std::string("profile for the no-GPU path (default: the shipped ") + kDefaultProfile + ")");
  cmd->add_option("--backend", a->backend,
                  "auto (CUDA with a GPU, else predicted only), cuda, or host: the host "
                  "reference backend on stash's CPU test double (LD_LIBRARY_PATH=<build>/"
                  "cudart_double), the measured pipeline without a GPU, for CI; its times are "
                  "the double's virtual clock")
      ->capture_default_str();
  cmd->add_option("--pareto-points", a->pareto_points, "solver calls of the Pareto sweep")
      ->capture_default_str()
      ->check(CLI::Range(2, 100000));
  cmd->callback([a] { run_demo(*a); });
});

}  // namespace
}  // namespace stash::cli
