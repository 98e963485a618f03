// solve_bench.cpp: planner_solve_bench, the solve-time and plan-quality table.
//
//   planner_solve_bench [--reps N] [--exact-limit S] [--small N] [--fraction F]
//
// Synthetic llama-like profiles (tests/planner/plan_fixtures.h, seeded) at 32, 80 and 126
// layers of 20 tensors, budget a fraction F (default 0.5) of the way from the smallest
// feasible budget to the keep-all peak. Reports medians over N repetitions in one run;
// exact runs once per size with its time limit. Then small instances (2..4 llama layers,
// and random profiles) where exact proves optimality: greedy's and ilp's step time over
// exact's.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "planner/solvers/planner.h"
#include "core/stats.h"
#include "tests/planner/plan_fixtures.h"

using namespace stash::planner;
using stash::median;
using stash::planner::testing::llama_like;
using stash::planner::testing::random_profile;

namespace {

// Thread CPU time: the machine running the table may be shared, and wall time then
// measures the neighbours. Both are printed.
double cpu_ms() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::uint64_t budget_for(const step_profile& p, double f) {
  const std::uint64_t lo = min_feasible_budget(p);
  const std::uint64_t hi = evaluate(p, keep_all(p), UINT64_MAX).peak_bytes;
  return lo + static_cast<std::uint64_t>(static_cast<double>(hi - lo) * f);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 7, small = 200;
  double exact_limit = 10, fraction = 0.5;
  for (int k = 1; k + 1 < argc; k += 2) {
    if (!std::strcmp(argv[k], "--reps")) reps = std::atoi(argv[k + 1]);
    if (!std::strcmp(argv[k], "--exact-limit")) exact_limit = std::atof(argv[k + 1]);
    if (!std::strcmp(argv[k], "--small")) small = std::atoi(argv[k + 1]);
    if (!std::strcmp(argv[k], "--fraction")) fraction = std::atof(argv[k + 1]);
  }
  std::printf("planner_solve_bench: reps=%d exact-limit=%.0fs fraction=%.2f\n", reps,
              exact_limit, fraction);
  std::printf("%-7s %-7s %10s %10s %12s %12s %9s  %s\n", "layers", "solver", "wall_ms",
              "cpu_ms", "step_ms", "bound_ms", "gap", "note");
  for (std::size_t L : {32, 80, 126}) {
    const step_profile p = llama_like(L, 1234 + static_cast<std::uint32_t>(L));
    const std::uint64_t budget = budget_for(p, fraction);
    std::vector<double> lb_ms, lb_cpu;
    double lb = 0;
    for (int r = 0; r < reps; ++r) {
      const double t0 = now_ms(), c0 = cpu_ms();
      lb = lower_bound_ms(p, budget);
      lb_ms.push_back(now_ms() - t0);
      lb_cpu.push_back(cpu_ms() - c0);
    }
    std::printf("%-7zu %-7s %10.2f %10.2f %12s %12.4f %9s  LP relaxation alone\n", L, "bound",
                median(lb_ms), median(lb_cpu), "-", lb, "-");
    for (solver_kind s : {solver_kind::greedy, solver_kind::ilp, solver_kind::exact}) {
      plan_options opt;
      opt.solver = s;
      opt.time_limit_s = exact_limit;
      std::vector<double> ms, cpu;
      step_plan plan;
      const int n = s == solver_kind::exact ? 1 : reps;
      for (int r = 0; r < n; ++r) {
        const double c0 = cpu_ms();
        plan = make_plan(p, budget, opt);
        cpu.push_back(cpu_ms() - c0);
        ms.push_back(plan.solve_ms);
      }
      char note[96] = "";
      if (s == solver_kind::exact) {
        std::snprintf(note, sizeof note, "%s, mip gap %.4f%%",
                      plan.proved_optimal ? "proved optimal" : "time limit", plan.mip_gap * 100);
      }
      std::printf("%-7zu %-7s %10.2f %10.2f %12.4f %12.4f %8.4f%%  %s\n", L, to_string(s),
                  median(ms), median(cpu), plan.predicted.step_ms, plan.predicted.lower_bound_ms,
                  plan.predicted.gap * 100, note);
    }
    std::fflush(stdout);
  }

  // Small instances: ratio to exact where exact proves optimality.
  struct ratios {
    std::vector<double> g, i;
    int proved = 0, total = 0;
  };
  const auto run_small = [&](const char* label, auto make) {
    ratios r;
    for (int k = 0; k < small; ++k) {
      step_profile p;
      std::uint64_t budget;
      if (!make(k, p, budget)) continue;
      plan_options eo;
      eo.solver = solver_kind::exact;
      eo.time_limit_s = exact_limit;
      step_plan ex;
      try {
        ex = make_plan(p, budget, eo);
      } catch (const infeasible_budget&) {
        continue;
      }
      ++r.total;
      if (!ex.proved_optimal) continue;
      ++r.proved;
      plan_options go, io;
      io.solver = solver_kind::ilp;
      r.g.push_back(make_plan(p, budget, go).predicted.step_ms / ex.predicted.step_ms);
      r.i.push_back(make_plan(p, budget, io).predicted.step_ms / ex.predicted.step_ms);
    }
    const auto mx = [](const std::vector<double>& v) {
      return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
    };
    std::printf("%-26s proved %d/%d  greedy/exact median %.5f max %.5f  ilp/exact median %.5f "
                "max %.5f\n",
                label, r.proved, r.total, median(r.g), mx(r.g), median(r.i), mx(r.i));
  };
  run_small("llama-like, 2..4 layers", [&](int k, step_profile& p, std::uint64_t& b) {
    p = llama_like(2 + k % 3, 77 + k);
    b = budget_for(p, 0.1 + 0.8 * ((k * 37) % 100) / 100.0);
    return true;
  });
  std::mt19937 rng(4242);
  run_small("random, <=4x5 tensors", [&](int, step_profile& p, std::uint64_t& b) {
    p = random_profile(rng, 4, 5);
    const std::uint64_t lo = min_feasible_budget(p);
    const std::uint64_t hi = evaluate(p, keep_all(p), UINT64_MAX).peak_bytes;
    b = lo + static_cast<std::uint64_t>(static_cast<double>(hi - lo) *
                                        std::uniform_real_distribution<double>(0, 1)(rng));
    return true;
  });
  return 0;
}
