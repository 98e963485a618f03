// The canonical cost model on hand-computed cases.
#include <gtest/gtest.h>

#include <algorithm>

#include "planner/model/plan.h"

using namespace stash::planner;
using stash::input_error;

namespace {

constexpr std::uint64_t MiB = 1048576;

tensor_profile tensor(const char* name, std::uint64_t bytes, double ms) {
  tensor_profile t;
  t.name = name;
  t.bytes = bytes;
  t.recompute_ms = ms;
  return t;
}

// Three layers of two tensors (a: 4 MiB, 0.5 ms; b: 2 MiB, 0.25 ms); D2H 1 GB/s = 1e6 B/ms,
// H2D 2 GB/s = 2e6 B/ms; fixed 100 MiB.
step_profile three_layers() {
  step_profile p;
  p.link = {2.0, 1.0, 3.0, 1};
  p.pinnable_bytes = 1ull << 40;
  p.fixed_bytes = 100 * MiB;
  const double fwd[] = {1, 2, 1}, bwd[] = {2, 3, 1};
  const std::uint64_t temp[] = {10 * MiB, 0, 5 * MiB};
  for (int i = 0; i < 3; ++i) {
    layer_profile l;
    l.name = "l" + std::to_string(i);
    l.signature = "s";
    l.fwd_ms = fwd[i];
    l.bwd_ms = bwd[i];
    l.bwd_temp_bytes = temp[i];
    l.tensors = {tensor("a", 4 * MiB, 0.5), tensor("b", 2 * MiB, 0.25)};
    p.layers.push_back(l);
  }
  return p;
}

const tensor_action K = tensor_action::keep, R = tensor_action::recompute,
                    O = tensor_action::offload;

bool has(const evaluation& e, const std::string& v) {
  return std::find(e.violations.begin(), e.violations.end(), v) != e.violations.end();
}

}  // namespace

TEST(Evaluate, HandComputedMixedPlan) {
  const step_profile p = three_layers();
  const decision_table d = {{O, R}, {K, R}, {K, K}};
  const evaluation e = evaluate(p, d, 116 * MiB);
  // compute 1+2+2+3+1+1 = 10; R = 0.25 + 0.25; layer 0 offloads 4 MiB = 4194304 B:
  // D2H 4.194304 ms against fwd_1 = 2 -> 2.194304 exposed; H2D 2.097152 ms < bwd_1 = 3.
  EXPECT_DOUBLE_EQ(e.compute_ms, 10.0);
  EXPECT_DOUBLE_EQ(e.recompute_ms, 0.5);
  EXPECT_NEAR(e.exposed_copy_ms, 2.194304, 1e-12);
  EXPECT_NEAR(e.step_ms, 12.694304, 1e-12);
  EXPECT_EQ(e.offloaded_bytes, 4 * MiB);
  EXPECT_EQ(e.recomputed_bytes, 4 * MiB);
  // forward_0 = 100+6 = 106, backward_0 = 116; forward_1 = 100 + K0(0) + O0(4) + 6 = 110,
  // backward_1 = 110; forward_2 = 100 + K0+K1(4) + O1(0) + 6 = 110, backward_2 = 115.
  EXPECT_EQ(e.peak_bytes, 116 * MiB);
  EXPECT_EQ(e.peak_at, "backward[0]");
  EXPECT_TRUE(e.valid);
  EXPECT_TRUE(e.violations.empty());

  const evaluation tight = evaluate(p, d, 115 * MiB);
  EXPECT_FALSE(tight.valid);
  EXPECT_EQ(tight.violations, std::vector<std::string>{"peak:backward[0]"});
  const evaluation tighter = evaluate(p, d, 110 * MiB - 1);
  EXPECT_TRUE(has(tighter, "peak:forward[1]"));
  EXPECT_TRUE(has(tighter, "peak:forward[2]"));
  EXPECT_TRUE(has(tighter, "peak:backward[2]"));
  EXPECT_FALSE(has(tighter, "peak:forward[0]"));  // 106 MiB fits
}

TEST(Evaluate, OffloadExposedOnBothDirections) {
  step_profile p = three_layers();
  p.link.h2d_gbps = 1.0;
  p.layers[1].bwd_ms = 1.0;
  // Layers 0 and 1 offload a and b (6 MiB = 6291456 B): D2H 6.291456 ms, H2D 6.291456 ms.
  const decision_table d = {{O, O}, {O, O}, {K, K}};
  const evaluation e = evaluate(p, d, 1ull << 40);
  // layer 0 faces fwd_1 = 2, bwd_1 = 1; layer 1 faces fwd_2 = 1, bwd_2 = 1.
  const double c = 6.291456;
  EXPECT_NEAR(e.exposed_copy_ms, (c - 2) + (c - 1) + (c - 1) + (c - 1), 1e-12);
  EXPECT_NEAR(e.step_ms, 1 + 2 + 2 + 1 + 1 + 1 + e.exposed_copy_ms, 1e-12);
  // backward_1 = 100 + K0(0) + O0(6) + 6 = 112; backward_2 = 100 + 0 + O1(6) + 6 + 5 = 117.
  EXPECT_EQ(e.peak_bytes, 117 * MiB);
  EXPECT_EQ(e.peak_at, "backward[2]");
}

// Note [Step overhead]: a constant added to the step time, nothing else.
TEST(Evaluate, StepOverheadAddsToTheStepOnly) {
  step_profile p = three_layers();
  const decision_table d = {{O, R}, {K, R}, {K, K}};
  const evaluation without = evaluate(p, d, 116 * MiB);
  EXPECT_EQ(without.layer_ms, without.step_ms);
  EXPECT_EQ(without.step_overhead_ms, 0.0);
  p.step_overhead_ms = 0.75;
  const evaluation with = evaluate(p, d, 116 * MiB);
  EXPECT_EQ(with.layer_ms, without.step_ms);  // bit for bit: what the solvers compare
  EXPECT_EQ(with.step_overhead_ms, 0.75);
  EXPECT_NEAR(with.step_ms, 12.694304 + 0.75, 1e-12);
  EXPECT_EQ(with.compute_ms, without.compute_ms);
  EXPECT_EQ(with.exposed_copy_ms, without.exposed_copy_ms);  // not a copy window
  EXPECT_EQ(with.peak_bytes, without.peak_bytes);
  EXPECT_EQ(with.valid, without.valid);
  EXPECT_DOUBLE_EQ(evaluate(p, keep_all(p), ~0ull).step_ms, 10.75);
}

TEST(Evaluate, KeepAllAndRecomputeAllBaselines) {
  const step_profile p = three_layers();
  const evaluation ka = evaluate(p, keep_all(p), 1ull << 40);
  EXPECT_DOUBLE_EQ(ka.step_ms, 10.0);
  // backward_2 = 100 + 12 + 6 + 5 = 123 MiB.
  EXPECT_EQ(ka.peak_bytes, 123 * MiB);
  EXPECT_EQ(ka.peak_at, "backward[2]");
  const evaluation ra = evaluate(p, recompute_all(p), 1ull << 40);
  EXPECT_DOUBLE_EQ(ra.step_ms, 10.0 + 3 * 0.75);
  EXPECT_EQ(ra.peak_bytes, 116 * MiB);  // backward_0 = 100 + 6 + 10
  // must_keep and non-recomputable tensors stay kept under recompute-all.
  step_profile q = p;
  q.layers[1].tensors[0].must_keep = true;
  q.layers[2].tensors[1].recomputable = false;
  const decision_table d = recompute_all(q);
  EXPECT_EQ(d[1][0], K);
  EXPECT_EQ(d[2][1], K);
  EXPECT_EQ(d[0][0], R);
}

TEST(Evaluate, RulesAreNamed) {
  step_profile p = three_layers();
  p.layers[0].tensors[0].must_keep = true;
  p.layers[0].tensors[1].offloadable = false;
  p.layers[1].tensors[0].recomputable = false;
  p.layers[1].tensors[1].bytes = MiB - 1;  // under the 1 MiB floor
  const decision_table d = {{R, O}, {R, O}, {O, K}};
  const evaluation e = evaluate(p, d, 1ull << 40);
  EXPECT_FALSE(e.valid);
  EXPECT_TRUE(has(e, "rule:layers[0].tensors[0]:must_keep"));
  EXPECT_TRUE(has(e, "rule:layers[0].tensors[1]:not_offloadable"));
  EXPECT_TRUE(has(e, "rule:layers[1].tensors[0]:not_recomputable"));
  EXPECT_TRUE(has(e, "rule:layers[1].tensors[1]:min_offload_bytes"));
  EXPECT_TRUE(has(e, "rule:layers[2].tensors[0]:last_layer"));
  EXPECT_EQ(e.violations.size(), 5u);
  EXPECT_TRUE(allowed(p, 1, 1, tensor_action::recompute));
  EXPECT_FALSE(allowed(p, 1, 1, tensor_action::offload));
  // Exactly 1 MiB may offload.
  p.layers[1].tensors[1].bytes = MiB;
  EXPECT_TRUE(allowed(p, 1, 1, tensor_action::offload));
}

TEST(Evaluate, HostCap) {
  step_profile p = three_layers();
  p.pinnable_bytes = 6 * MiB;
  const decision_table fits = {{O, O}, {K, K}, {K, K}};
  EXPECT_TRUE(evaluate(p, fits, 1ull << 40).valid);
  const decision_table over = {{O, O}, {O, K}, {K, K}};
  const evaluation e = evaluate(p, over, 1ull << 40);
  EXPECT_FALSE(e.valid);
  EXPECT_EQ(e.violations, std::vector<std::string>{"host"});
}

TEST(Evaluate, ShapeMismatchIsAnInputError) {
  const step_profile p = three_layers();
  EXPECT_THROW(evaluate(p, {{K, K}, {K, K}}, 0), input_error);
  EXPECT_THROW(evaluate(p, {{K, K}, {K}, {K, K}}, 0), input_error);
}

TEST(Evaluate, SingleLayerNeverOffloads) {
  step_profile p = three_layers();
  p.layers.resize(1);
  EXPECT_FALSE(allowed(p, 0, 0, tensor_action::offload));
  const evaluation e = evaluate(p, {{K, R}}, 1ull << 40);
  EXPECT_DOUBLE_EQ(e.step_ms, 3.25);
  EXPECT_EQ(e.peak_bytes, 116 * MiB);  // A_0 counts whole: recompute happens in backward
  EXPECT_EQ(e.exposed_copy_ms, 0.0);
}

// Note [The loss's position]: after the last forward, before any backward, every layer's
// kept bytes and none of the last layer's replayed ones. d keeps 0 + 4 + 6 MiB, so the loss
// holds 110 MiB + loss_bytes; backward[0] (116 MiB) is the peak without it.
TEST(Evaluate, TheLossPositionHoldsWhatEveryLayerKeeps) {
  step_profile p = three_layers();
  const decision_table d = {{O, R}, {K, R}, {K, K}};
  const evaluation without = evaluate(p, d, 116 * MiB);
  ASSERT_EQ(without.peak_bytes, 116 * MiB);
  ASSERT_EQ(without.peak_at, "backward[0]");
  p.loss_bytes = 5 * MiB;  // 115 MiB: below backward[0]
  const evaluation below = evaluate(p, d, 116 * MiB);
  EXPECT_EQ(below.peak_bytes, without.peak_bytes);
  EXPECT_EQ(below.peak_at, without.peak_at);
  EXPECT_TRUE(below.valid);
  p.loss_bytes = 6 * MiB;  // a tie: the loss comes first in time
  EXPECT_EQ(evaluate(p, d, 116 * MiB).peak_at, "loss");
  p.loss_bytes = 10 * MiB;
  const evaluation above = evaluate(p, d, 116 * MiB);
  EXPECT_EQ(above.peak_bytes, 120 * MiB);
  EXPECT_EQ(above.peak_at, "loss");
  EXPECT_EQ(above.violations, std::vector<std::string>{"peak:loss"});
  EXPECT_EQ(above.step_ms, without.step_ms);
  // Decisions move it: recompute layer 2's b and the loss holds 2 MiB less.
  const decision_table d2 = {{O, R}, {K, R}, {K, R}};
  EXPECT_EQ(evaluate(p, d2, 1ull << 40).peak_bytes, 118 * MiB);
}

// Note [The optimizer's position]: a position after the last backward that no decision
// moves. Below every other position it changes nothing; above them it is the peak.
TEST(Evaluate, TheOptimizersPositionIsAPeakNoDecisionMoves) {
  step_profile p = three_layers();
  const decision_table d = {{O, R}, {K, R}, {K, K}};
  const evaluation without = evaluate(p, d, 116 * MiB);
  p.optimizer_bytes = 110 * MiB;  // below backward[2]'s 117 MiB
  const evaluation below = evaluate(p, d, 116 * MiB);
  EXPECT_EQ(below.peak_bytes, without.peak_bytes);
  EXPECT_EQ(below.peak_at, without.peak_at);
  EXPECT_EQ(below.violations, without.violations);
  p.optimizer_bytes = 130 * MiB;
  const evaluation above = evaluate(p, d, 129 * MiB);
  EXPECT_EQ(above.peak_bytes, 130 * MiB);
  EXPECT_EQ(above.peak_at, "optimizer");
  EXPECT_FALSE(above.valid);
  EXPECT_EQ(above.violations, std::vector<std::string>{"peak:optimizer"});
  EXPECT_EQ(above.step_ms, without.step_ms);
  EXPECT_TRUE(evaluate(p, d, 130 * MiB).valid);
}
