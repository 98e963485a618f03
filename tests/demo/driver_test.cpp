// driver_test.cpp: the workload's training step over the engine (tools/demo/driver).
// On the test double the host backend runs stream-ordered against the real engine, pool and
// copies; on a GPU the same tests run the CUDA backend (skipped where it is not built).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "checked_backend.h"
#include "double_api.h"
#include "tools/demo/driver/session.h"
#include "tools/demo/driver/scope_timer.h"
#include "tools/demo/driver/skeleton.h"
#include "tools/demo/driver/test_double.h"
#include "tools/demo/driver/virtual_cost.h"
#include "planner/model/plan.h"
#include "planner/solvers/planner.h"
#include "planner/model/profile.h"


// Note [The test double seam] (tools/demo/driver/test_double.h) restates the double's call
// because tools/ may not include tests/; here the two are held together.
static_assert(std::is_same_v<stash::workload::test_double::enqueue_compute_fn,
                             decltype(&stashdbl_enqueue_compute)>);

namespace stash::test {
namespace {

using workload::backend_kind;
using workload::model_config;
using workload::session;

// Small enough that the host reference runs a step in milliseconds; T = 64 tokens keeps
// ln.stats at exactly one 512-byte pool block.
model_config small_config() {
  model_config c;
  c.layers = 3;
  c.hidden = 64;
  c.seq = 32;
  c.batch = 2;
  c.ffn_mult = 2;
  c.seed = 7;
  c.lr = 0.05f;
  return c;
}

// "kokrk" per layer: keep / offload / recompute, one letter per saved tensor.
std::vector<stash_action_t> plan_of(const std::vector<std::string>& layers) {
  std::vector<stash_action_t> v;
  for (const std::string& l : layers)
    for (char ch : l)
      v.push_back(ch == 'o'   ? STASH_ACTION_OFFLOAD
                  : ch == 'r' ? STASH_ACTION_RECOMPUTE
                              : STASH_ACTION_KEEP);
  return v;
}

planner::decision_table decisions_of(const std::vector<stash_action_t>& a, int layers) {
  planner::decision_table d(layers);
  for (int l = 0; l < layers; ++l)
    for (int j = 0; j < workload::kSavedPerBlock; ++j) {
      const stash_action_t x = a[std::size_t(l) * workload::kSavedPerBlock + j];
      d[l].push_back(x == STASH_ACTION_OFFLOAD     ? planner::tensor_action::offload
                     : x == STASH_ACTION_RECOMPUTE ? planner::tensor_action::recompute
                                                   : planner::tensor_action::keep);
    }
  return d;
}

struct run_result {
  std::vector<float> losses;  // per step
  std::vector<float> grads, params;
  workload::memory_peaks peaks;
  stash_engine_stats_t stats{};
  std::size_t violations = 0;
  std::uint64_t captures = 0, replays = 0;
};

class WorkloadDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (on_double()) {
      double_api().reset();
      kind_ = backend_kind::host;
    } else if (workload::cuda_backend_built()) {
      kind_ = backend_kind::cuda;
    } else {
      GTEST_SKIP() << "the CUDA backend is not built (STASH_BUILD_KERNELS=OFF)";
    }
  }

  using wrap_fn =
      std::function<std::unique_ptr<workload::backend>(std::unique_ptr<workload::backend>)>;

  // graphs: steps after the first are graph_step()s (Note [The step under CUDA graphs]).
  run_result run(const model_config& c, const std::vector<stash_action_t>& plan, int steps,
                 wrap_fn wrap = {}, bool graphs = false) {
    run_result r;
    workload::session_options o;
    o.pinned_cap_bytes = std::size_t{64} << 20;
    session s(c, kind_, o, std::move(wrap));
    s.set_plan(plan);
    s.workload().reset_peaks();
    for (int i = 0; i < steps; ++i) {
      if (graphs && i > 0)
        s.workload().graph_step();
      else
        s.workload().step();
      r.losses.push_back(s.workload().last_loss());
    }
    if (graphs) {
      EXPECT_EQ(stash_engine_graph_state(s.engine(), nullptr, nullptr, &r.captures, &r.replays),
                STASH_OK);
    }
    r.grads = s.workload().read_gradients();
    r.params = s.workload().read_params();
    r.peaks = s.workload().peaks();
    r.stats = s.engine_stats();
    if (on_double()) r.violations = double_api().violation_count();
    return r;
  }

  planner::step_profile skeleton(const model_config& c) {
    workload::skeleton_options o;
    o.device_name = "test";
    o.device_memory_bytes = std::uint64_t{80} << 30;
    o.pinnable_bytes = std::uint64_t{64} << 30;
    return workload::make_skeleton(c, kind_, o);
  }

  backend_kind kind_ = backend_kind::host;
};

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::size_t count(const std::vector<stash_action_t>& p, stash_action_t a) {
  std::size_t n = 0;
  for (stash_action_t x : p) n += x == a;
  return n;
}

TEST_F(WorkloadDriverTest, SkeletonListsTheBlockAndValidates) {
  const model_config c = small_config();
  const planner::step_profile p = skeleton(c);
  // Re-read through the validator from its JSON form, as `stash plan` would.
  const planner::step_profile q =
      planner::profile_from_json(workload::skeleton_json(p, c, kind_, /*link_measured=*/false));
  ASSERT_EQ(q.layers.size(), 3u);
  // T = 64, H = 64, F = 128, float32, blocks rounded to the pool's 512 B.
  const std::uint64_t X = 64 * 64 * 4, S = 512, Hh = 64 * 128 * 4;
  const char* names[] = {"input", "ln.stats", "ln.out", "fc1.out", "act.out"};
  const std::uint64_t bytes[] = {X, S, X, Hh, Hh};
  for (const planner::layer_profile& l : q.layers) {
    EXPECT_EQ(l.signature, q.layers[0].signature);
    EXPECT_EQ(l.fwd_ms, 0.0);
    EXPECT_EQ(l.bwd_temp_bytes, X + 2 * Hh);  // dout + da + dh
    ASSERT_EQ(l.tensors.size(), 5u);
    for (int j = 0; j < 5; ++j) {
      EXPECT_EQ(l.tensors[j].name, names[j]);
      EXPECT_EQ(l.tensors[j].bytes, bytes[j]) << names[j];
      EXPECT_EQ(l.tensors[j].recomputable, j != 0) << names[j];
      EXPECT_TRUE(l.tensors[j].offloadable);
      EXPECT_FALSE(l.tensors[j].must_keep);
    }
  }
  // Per layer W1 8192 + b1 128 + W2 8192 + b2, gamma, beta 64 each = 16704 floats; three
  // layers of parameters and of gradients, one loss value (one 512 B block).
  const std::uint64_t params = (3 * 16704 * 4 + 511) / 512 * 512;
  const std::uint64_t ws = kind_ == backend_kind::cuda ? workload::kCublasWorkspaceBytes : 0;
  EXPECT_EQ(q.fixed_bytes, 2 * params + 512 + ws);
  EXPECT_EQ(q.device_name, "test");
}

TEST_F(WorkloadDriverTest, PlansGiveGradientsBitwiseEqualToKeepAll) {
  const model_config c = small_config();
  const int steps = 2;
  const run_result ref = run(c, workload::uniform_plan(c.layers, STASH_ACTION_KEEP), steps);
  ASSERT_EQ(ref.losses.size(), 2u);
  EXPECT_TRUE(std::isfinite(ref.losses[0]) && ref.losses[0] > 0);
  EXPECT_NE(ref.losses[0], ref.losses[1]) << "the SGD update must change the loss";
  EXPECT_EQ(ref.stats.offloaded_count, 0u);

  const std::vector<std::vector<stash_action_t>> plans = {
      plan_of({"kokrk", "orrok", "krkkk"}),  // a mix, offloads in the last layer too
      plan_of({"oorro", "ooroo", "krrrr"}),
      workload::uniform_plan(c.layers, STASH_ACTION_OFFLOAD),
      workload::uniform_plan(c.layers, STASH_ACTION_RECOMPUTE),
  };
  for (std::size_t i = 0; i < plans.size(); ++i) {
    SCOPED_TRACE("plan " + std::to_string(i));
    const run_result r = run(c, plans[i], steps);
    for (int s = 0; s < steps; ++s)
      EXPECT_EQ(std::memcmp(&r.losses[s], &ref.losses[s], sizeof(float)), 0)
          << "step " << s << ": loss " << r.losses[s] << " vs keep-all " << ref.losses[s];
    EXPECT_TRUE(bitwise_equal(r.grads, ref.grads)) << "gradients differ from keep-all";
    EXPECT_TRUE(bitwise_equal(r.params, ref.params)) << "parameters differ from keep-all";
    // The offloads really went through the engine: out to pinned memory and back.
    const std::uint64_t offloads = count(plans[i], STASH_ACTION_OFFLOAD) * steps;
    EXPECT_EQ(r.stats.offloaded_count, offloads);
    EXPECT_EQ(r.stats.prefetched_count, offloads);
    EXPECT_EQ(r.stats.kept_on_device_count, 0u);
    EXPECT_EQ(r.stats.failed_count, 0u);
    EXPECT_EQ(r.stats.recompute_count, count(plans[i], STASH_ACTION_RECOMPUTE) * steps);
    EXPECT_EQ(r.stats.released_count, plans[i].size() * steps);
  }
}

// The pool's peak is the planner's canonical peak for the plan, evaluated on the skeleton:
// exactly where the canonical peak sits at a backward position (Note [Memory schedule of
// the step]), and never above it.
TEST_F(WorkloadDriverTest, PoolPeakIsTheCanonicalPeak) {
  const model_config c = small_config();
  const planner::step_profile prof = skeleton(c);
  const std::vector<std::vector<stash_action_t>> plans = {
      workload::uniform_plan(c.layers, STASH_ACTION_KEEP),
      workload::uniform_plan(c.layers, STASH_ACTION_RECOMPUTE),
      plan_of({"ooooo", "ooooo", "kkkkk"}),
      plan_of({"kokrk", "orrok", "krkkk"}),
  };
  std::uint64_t keep_all_measured = 0, keep_all_canonical = 0;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    SCOPED_TRACE("plan " + std::to_string(i));
    const planner::evaluation ev =
        planner::evaluate(prof, decisions_of(plans[i], c.layers), std::uint64_t{1} << 50);
    const run_result r = run(c, plans[i], 1);
    EXPECT_LE(r.peaks.in_use_bytes, ev.peak_bytes);
    EXPECT_GE(r.peaks.held_bytes, r.peaks.in_use_bytes);
    if (ev.peak_at.rfind("backward", 0) == 0) {
      EXPECT_EQ(r.peaks.in_use_bytes, ev.peak_bytes) << "canonical peak at " << ev.peak_at;
    }
    if (i == 0) {
      keep_all_measured = r.peaks.in_use_bytes;
      keep_all_canonical = ev.peak_bytes;
    } else {
      // The drop the plan promises is the drop the pool shows.
      EXPECT_LT(r.peaks.in_use_bytes, keep_all_measured);
      EXPECT_EQ(keep_all_measured - r.peaks.in_use_bytes, keep_all_canonical - ev.peak_bytes);
    }
  }
}

// A plan from the planner itself, with 80% of the keep-all activation memory (above the
// fixed bytes, which on a GPU include cuBLAS's 32 MiB workspace): the pool stays within the
// budget and at the predicted peak. (At these sizes the planner can only recompute: tensors
// under 1 MiB never offload.)
TEST_F(WorkloadDriverTest, PlannerPlanRunsWithinItsBudget) {
  const model_config c = small_config();
  const planner::step_profile prof = skeleton(c);
  const std::uint64_t keep_peak =
      planner::evaluate(prof, planner::keep_all(prof), ~0ull).peak_bytes;
  const std::uint64_t budget = prof.fixed_bytes + (keep_peak - prof.fixed_bytes) * 8 / 10;
  const planner::step_plan plan = planner::make_plan(prof, budget);
  std::vector<stash_action_t> actions;
  for (const planner::layer_plan& l : plan.layers)
    for (planner::tensor_action a : l.actions)
      actions.push_back(a == planner::tensor_action::offload     ? STASH_ACTION_OFFLOAD
                        : a == planner::tensor_action::recompute ? STASH_ACTION_RECOMPUTE
                                                                 : STASH_ACTION_KEEP);
  const run_result ref = run(c, workload::uniform_plan(c.layers, STASH_ACTION_KEEP), 1);
  const run_result r = run(c, actions, 1);
  EXPECT_LE(r.peaks.in_use_bytes, budget);
  EXPECT_EQ(r.peaks.in_use_bytes, plan.predicted.peak_bytes) << plan.predicted.peak_at;
  EXPECT_TRUE(bitwise_equal(r.grads, ref.grads));
}

TEST_F(WorkloadDriverTest, CheckerSeesNoRaceInTheStep) {
  STASH_REQUIRE_DOUBLE();
  const model_config c = small_config();
  auto wrap = [](std::unique_ptr<workload::backend> b) -> std::unique_ptr<workload::backend> {
    return std::make_unique<checked_backend>(std::move(b));
  };
  double_api().clear_violations();
  const run_result r = run(c, plan_of({"oorro", "kokrk", "krrrr"}), 2, wrap);
  EXPECT_EQ(r.violations, 0u);
  for (const std::string& v : double_api().violations()) ADD_FAILURE() << v;
  EXPECT_GT(r.stats.offloaded_count, 0u);
}

// `stash demo --graphs`' step: the whole step (forward, offloads, prefetches, recompute,
// backward, update) captured once and replayed gives the uncaptured run's losses and
// gradients bit for bit, and the checker sees no race in the replayed graphs (their host
// nodes and emulated compute carry checked_backend's declared accesses).
TEST_F(WorkloadDriverTest, GraphStepsEqualTheUncapturedRunAndDoNotRace) {
  STASH_REQUIRE_DOUBLE();
  model_config c = small_config();
  auto wrap = [](std::unique_ptr<workload::backend> b) -> std::unique_ptr<workload::backend> {
    return std::make_unique<checked_backend>(std::move(b));
  };
  for (int mb : {1, 2}) {
    c.micro_batches = mb;
    const std::vector<stash_action_t> plan = plan_of({"oorro", "kokrk", "korro"});
    const run_result eager = run(c, plan, 4, wrap);
    double_api().clear_violations();
    const run_result graphs = run(c, plan, 4, wrap, /*graphs=*/true);
    EXPECT_EQ(graphs.captures, 1u) << mb << " micro-batches";
    EXPECT_EQ(graphs.replays, 3u);
    EXPECT_GT(graphs.stats.offloaded_count, 0u);
    EXPECT_TRUE(bitwise_equal(eager.grads, graphs.grads)) << mb << " micro-batches";
    EXPECT_TRUE(bitwise_equal(eager.params, graphs.params));
    EXPECT_TRUE(bitwise_equal(eager.losses, graphs.losses));
    EXPECT_EQ(graphs.violations, 0u);
    for (const std::string& v : double_api().violations()) ADD_FAILURE() << v;
    // A replay does run the step: one step fewer gives other parameters.
    const run_result fewer = run(c, plan, 3, wrap);
    EXPECT_FALSE(bitwise_equal(fewer.params, graphs.params));
  }
}

// A captured plan is fixed: a new plan drops the graph and the next graph_step() captures
// the new step, which then matches the uncaptured run of the same plan sequence.
TEST_F(WorkloadDriverTest, GraphStepRecapturesAfterAPlanChange) {
  STASH_REQUIRE_DOUBLE();
  const model_config c = small_config();
  const std::vector<stash_action_t> a = plan_of({"oooko", "kokrk", "kkkkk"});
  const std::vector<stash_action_t> b = plan_of({"krrrr", "ooooo", "korro"});
  auto drive = [&](bool graphs, std::uint64_t* captures) {
    workload::session_options o;
    o.pinned_cap_bytes = std::size_t{64} << 20;
    session s(c, kind_, o);
    s.set_plan(a);
    s.workload().step();
    for (int i = 0; i < 2; ++i) graphs ? (void)s.workload().graph_step() : s.workload().step();
    s.set_plan(b);
    if (graphs) {
      EXPECT_EQ(stash_engine_replay(s.engine()), STASH_ERROR_CAPTURE);
      EXPECT_NE(std::string(stash_last_error()).find("set_plan"), std::string::npos)
          << stash_last_error();
      s.workload().step();  // the new plan's pools: an eager step first
      EXPECT_TRUE(s.workload().graph_step()) << "a plan change must re-capture";
      EXPECT_FALSE(s.workload().graph_step());
    } else {
      for (int i = 0; i < 3; ++i) s.workload().step();
    }
    if (captures)
      EXPECT_EQ(stash_engine_graph_state(s.engine(), nullptr, nullptr, captures, nullptr),
                STASH_OK);
    return s.workload().read_params();
  };
  std::uint64_t captures = 0;
  const std::vector<float> eager = drive(false, nullptr);
  const std::vector<float> graphs = drive(true, &captures);
  EXPECT_EQ(captures, 2u);
  EXPECT_TRUE(bitwise_equal(eager, graphs));
}

// The same check on a schedule broken on purpose: gelu runs on a side stream with no
// ordering, so the fc2 GEMM's read of a (and the engine's D2H of it) race its write.
TEST_F(WorkloadDriverTest, CheckerCatchesABrokenOrdering) {
  STASH_REQUIRE_DOUBLE();
  const model_config c = small_config();
  cudaStream_t side = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  auto wrap = [side](std::unique_ptr<workload::backend> b) -> std::unique_ptr<workload::backend> {
    return std::make_unique<checked_backend>(std::move(b), "gelu", side);
  };
  double_api().clear_violations();
  const run_result r = run(c, plan_of({"kkkko", "kkkko", "kkkkk"}), 1, wrap);
  EXPECT_GT(r.violations, 0u);
  bool names_gelu = false;
  for (const std::string& v : double_api().violations())
    names_gelu |= v.find("gelu") != std::string::npos;
  EXPECT_TRUE(names_gelu) << "violations should name the misrouted op";
  cudaStreamSynchronize(side);
  cudaStreamDestroy(side);
  double_api().clear_violations();
}

TEST_F(WorkloadDriverTest, MicroBatchesAccumulateLikeOneBatch) {
  model_config big = small_config();  // batch 2, one micro-batch
  model_config acc = big;
  acc.batch = 1;
  acc.micro_batches = 2;  // the same tokens, as two micro-batches
  const std::vector<stash_action_t> plan = plan_of({"oorro", "kokrk", "krkkk"});
  const run_result a1 = run(acc, plan, 1);
  const run_result a2 = run(acc, plan, 1);
  EXPECT_TRUE(bitwise_equal(a1.grads, a2.grads)) << "a step must be deterministic";
  EXPECT_EQ(a1.stats.offloaded_count, 2u * count(plan, STASH_ACTION_OFFLOAD));
  // Accumulated with the keep-all plan: bitwise the same as with offload/recompute.
  const run_result k = run(acc, workload::uniform_plan(acc.layers, STASH_ACTION_KEEP), 1);
  EXPECT_TRUE(bitwise_equal(a1.grads, k.grads));

  // Against one batch of the same tokens: the sum of the two micro-batch mean-loss
  // gradients is twice the big batch's mean-loss gradient, up to float reassociation; the
  // update uses lr / 2, so the parameters agree to rounding.
  const run_result b = run(big, plan, 1);
  ASSERT_EQ(a1.grads.size(), b.grads.size());
  double max_abs = 0, max_err = 0;
  for (std::size_t i = 0; i < b.grads.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(2.0 * b.grads[i]));
    max_err = std::max(max_err, std::fabs(double(a1.grads[i]) - 2.0 * b.grads[i]));
  }
  EXPECT_GT(max_abs, 0);
  EXPECT_LT(max_err, 1e-5 * max_abs);
  EXPECT_NEAR(a1.losses[0], b.losses[0], 1e-6 * std::fabs(b.losses[0]));
  for (std::size_t i = 0; i < b.params.size(); ++i)
    ASSERT_NEAR(a1.params[i], b.params[i], 1e-6) << "parameter " << i;
}

// The compute stream is the caller's when given: the model, the engine and the pool all
// use it, and the result is the same as on a stream the session creates.
TEST_F(WorkloadDriverTest, RunsOnTheCallersStream) {
  const model_config c = small_config();
  const std::vector<stash_action_t> plan = plan_of({"oorro", "kokrk", "krkkk"});
  const run_result ref = run(c, plan, 1);
  cudaStream_t mine = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking), cudaSuccess);
  {
    workload::session_options o;
    o.stream = mine;
    session s(c, kind_, o);
    EXPECT_EQ(s.stream(), mine);
    EXPECT_EQ(s.workload().stream(), mine);
    s.set_plan(plan);
    s.workload().step();
    EXPECT_TRUE(bitwise_equal(s.workload().read_gradients(), ref.grads));
  }
  EXPECT_EQ(cudaStreamQuery(mine), cudaSuccess)
      << "the session must not destroy the caller's stream";
  cudaStreamDestroy(mine);
}

// Note [Event timing of the step overhead] (scope_timer.h): per step, the events around it
// minus its layer scopes, per micro-batch. On the double's virtual clock the layers' medians
// plus that figure rebuild the measured step exactly; on a GPU launch gaps blur it.
TEST_F(WorkloadDriverTest, ScopeTimerMeasuresTheTimeOutsideTheLayers) {
  for (int micro : {1, 2}) {
    model_config c = small_config();
    c.micro_batches = micro;
    wrap_fn wrap;
    if (on_double())
      wrap = [](std::unique_ptr<workload::backend> b) {
        return workload::with_virtual_cost(std::move(b));
      };
    session s(c, kind_, {}, std::move(wrap));
    s.set_plan(plan_of({"kkkkk", "kkkkk", "kkkkk"}));
    workload::scope_timer timer(s.stream());
    s.workload().set_scope_timer(&timer);
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
    std::vector<float> step_ms;
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(cudaEventRecord(e0, s.stream()), cudaSuccess);
      s.workload().step();
      ASSERT_EQ(cudaEventRecord(e1, s.stream()), cudaSuccess);
      (void)s.workload().last_loss();
      float ms = 0;
      ASSERT_EQ(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess);
      step_ms.push_back(ms);
      timer.harvest();
    }
    s.workload().set_scope_timer(nullptr);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    EXPECT_EQ(timer.step_count(), 3u);
    EXPECT_EQ(timer.sample_count(STASH_SCOPE_FORWARD, 0, -1), std::size_t(3 * micro));
    const double overhead = timer.step_overhead_median_ms();
    EXPECT_GE(overhead, 0.0);
    if (!on_double()) continue;
    EXPECT_GT(overhead, 0.0) << "the loss, the update and the uploads take virtual time";
    double layers = 0;
    for (int l = 0; l < c.layers; ++l)
      layers += timer.median_ms(STASH_SCOPE_FORWARD, l, -1) +
                timer.median_ms(STASH_SCOPE_BACKWARD, l, -1);
    std::sort(step_ms.begin(), step_ms.end());
    EXPECT_NEAR(micro * (layers + overhead), step_ms[1], 1e-3 * step_ms[1])
        << micro << " micro-batch(es)";
  }
}

TEST_F(WorkloadDriverTest, RefusesPlansThatDoNotFit) {
  const model_config c = small_config();
  workload::session_options o;
  session s(c, kind_, o);
  std::vector<stash_action_t> p = workload::uniform_plan(c.layers, STASH_ACTION_KEEP);
  p[workload::kInput] = STASH_ACTION_RECOMPUTE;  // layer 0's input
  s.set_plan(p);
  try {
    s.workload().step();
    FAIL() << "a plan recomputing an input must be refused";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not recomputable"), std::string::npos) << e.what();
  }
  EXPECT_THROW(s.set_plan(workload::uniform_plan(c.layers + 1, STASH_ACTION_KEEP)),
               std::invalid_argument);
}

TEST_F(WorkloadDriverTest, RefusesBadConfigs) {
  model_config c = small_config();
  c.layers = 0;
  EXPECT_NE(c.problem().find("layers"), std::string::npos);
  EXPECT_THROW(session(c, kind_), std::invalid_argument);
  c = small_config();
  c.hidden = -4;
  EXPECT_NE(c.problem().find("hidden"), std::string::npos);
}

}  // namespace
}  // namespace stash::test
