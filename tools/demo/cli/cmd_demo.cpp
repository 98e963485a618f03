// `stash demo`: the main job end to end (docs/workload.md).
//
// With a GPU and the CUDA backend built: measure the link, profile the built-in workload
// (tools/demo/driver) in-process with CUPTI (CUDA events when CUPTI is unavailable),
// plan at the keep-all peak x 1.0, 0.85, 0.7, 0.55 and at the smallest feasible budget, run
// every plan with the prefetch engine, check its gradients against keep-all bit for bit,
// and print measured against predicted (planner/simulator/simulator.h). Without one: the same plans
// and predictions on a shipped profile, labelled "predicted (no GPU found)".
// `--backend host` runs the measured pipeline with the host backend on stash's CPU test
// double: how CI exercises the real path without a GPU; its times are the double's virtual
// clock.
//
// Exit status: 0; 1 when a plan's gradients differ from keep-all; 2 bad input; 3 a CUDA
// error or no usable GPU for --backend cuda.
//
// The command is split by concern; what the files share is declared in demo.h:
//   cmd_demo.cpp       options and registration, argument checks, the choice of path, and
//                      small helpers (progress, the output folder, the shipped profiles)
//   demo_plan.cpp      plans at the demo's budgets, their predictions, the table both paths
//                      print, the plans and Pareto files, and the no-GPU predicted path
//   demo_measured.cpp  the measured pipeline: link benchmark, sessions, profiling (CUPTI or
//                      CUDA events), the runs and their gradient check, and its report
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "demo.h"
#include "cuda_prim.h"
#include "tools/demo/driver/model.h"
#include "tools/demo/driver/test_double.h"

namespace stash::cli::demo {
namespace {

bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

void progress(const char* fmt, const std::string& a, const std::string& b) {
  std::fprintf(stderr, "demo: ");
  std::fprintf(stderr, fmt, a.c_str(), b.c_str());
  std::fprintf(stderr, "\n");
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
  dirs.push_back(std::string(STASH_SOURCE_DIR) + "/tools/demo/profiles");
  for (const std::string& d : dirs)
    if (is_file(d + "/" + name)) return d + "/" + name;
  std::string looked;
  for (const std::string& d : dirs) looked += "\n  " + d;
  throw input_error("cannot find the shipped profile " + name + "; looked in:" + looked +
                    "\n(give one with --profile)");
}

namespace {

// ---- mode ------------------------------------------------------------------------------

void run_demo(demo_args a) {
  if (a.backend == "host" && !a.size_given) {
    a.layers = host_size::layers, a.hidden = host_size::hidden, a.seq = host_size::seq;
    a.batch = host_size::batch, a.ffn_mult = host_size::ffn_mult;
    std::printf("stash demo: --backend host computes with plain C++ loops, so without size "
                "options it runs a small model: --layers %d --hidden %d --seq %d --batch %d "
                "--ffn-mult %d\n",
                a.layers, a.hidden, a.seq, a.batch, a.ffn_mult);
  }
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
  if (a.graphs && a.steps < 3)
    throw input_error("--graphs needs --steps of at least 3 (an eager warm-up, the capture "
                      "and its replay, one more replay timed)");
  if (!a.profile.empty() && !is_file(a.profile)) throw input_error(a.profile + ": no such profile");

  const bool on_double = workload::test_double::loaded();  // Note [The test double seam]
  const std::string no_gpu = prim::device_problem();  // "" when a device exists
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

const subcommand_registrar reg(90, [](CLI::App& app) {
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
                  "the double's virtual clock; without size options it runs a small model "
                  "(3 layers, hidden 64, seq 2048, batch 2, ffn-mult 1)")
      ->capture_default_str();
  cmd->add_flag("--graphs", a->graphs,
               "run every plan (and recompute-all) as a CUDA graph: one eager warm-up step, "
               "then the whole step captured once through the engine and replayed; gradients "
               "are checked against the uncaptured keep-all run, and the host time per step "
               "with graphs is compared with eager, interleaved");
  cmd->add_option("--pareto-points", a->pareto_points, "solver calls of the Pareto sweep")
      ->capture_default_str()
      ->check(CLI::Range(2, 100000));
  cmd->callback([a, cmd] {
    for (const char* o : {"--layers", "--hidden", "--seq", "--batch", "--ffn-mult"})
      if (cmd->count(o) > 0) a->size_given = true;
    run_demo(*a);
  });
});

}  // namespace
}  // namespace stash::cli::demo
