// Simulator: hand-computed replays, and the property that holds it to the canonical model
// (Note [Simulator vs canonical model] in planner/simulator/simulator.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <random>

#include <nlohmann/json.hpp>

#include "plan_fixtures.h"
#include "planner/model/plan.h"
#include "planner/simulator/simulator.h"

namespace stash::planner {
namespace {

constexpr std::uint64_t MiB = 1048576;
using testing::add_tensor;
using testing::hand_profile;
using testing::kMiBPerMsGbps;

double waits(const sim_result& r, const std::string& name) {
  double sum = 0;
  for (const trace_span& s : r.trace.spans())
    if (s.kind == span_kind::wait && s.name == name) sum += s.dur_ms;
  return sum;
}

// Layer 0 offloads 3 MiB (3 ms of D2H) under a 1 ms fwd_1: forward of layer 2 waits 2 ms
// for it (the i+2 rule), and its 3 ms prefetch under a 2 ms bwd_1 exposes 1 ms more.
TEST(Simulator, OverrunCostsTimeUnderTheIPlus2Rule) {
  step_profile p = hand_profile({1, 1, 1}, {2, 2, 2});
  for (int i = 0; i < 3; ++i) add_tensor(p, i, "x", 2 * MiB);
  add_tensor(p, 0, "big", 3 * MiB);
  decision_table d = keep_all(p);
  d[0][1] = tensor_action::offload;
  const sim_result r = simulate(p, d);
  EXPECT_NEAR(r.step_ms, 3 + 6 + 2 + 1, 1e-12);
  EXPECT_NEAR(waits(r, "wait d2h L0"), 2, 1e-12);
  EXPECT_NEAR(waits(r, "wait h2d L0"), 1, 1e-12);
  EXPECT_NEAR(r.exposed_copy_ms, 3, 1e-12);
  // The overrun costs no memory: fwd 2 starts only once the 3 MiB have left the device.
  // forward[1] = x0 + big(in flight) + x1 = 7 MiB; forward[2] = x0 + x1 + x2 = 6 MiB;
  // backward[1] = x0 + x1 + big (prefetch) = 7 MiB.
  EXPECT_EQ(r.peak_bytes, 7 * MiB);
  EXPECT_EQ(r.peak_at, "forward[1]");
  const evaluation ev = evaluate(p, d, 1ull << 40);
  EXPECT_NEAR(r.step_ms, ev.step_ms, 1e-12);
  EXPECT_EQ(r.peak_bytes, ev.peak_bytes);
  // fwd L2 begins after the wait, at 1 + 1 + 2 = 4 ms.
  for (const trace_span& s : r.trace.spans())
    if (s.name == "fwd L2") {
      EXPECT_NEAR(s.start_ms, 4, 1e-12);
    }
}

// The step overhead (Note [Step overhead] in plan.h) is one compute span at the turn, after
// the barrier. Layer 1 (= L-2) offloads 3 MiB under fwd_2 = 1 ms: the turn waits 3..5, the
// overhead runs 5..5.5, bwd 2 5.5..7.5 issues the 3 ms prefetch (to 8.5), bwd 1 8.5..10.5,
// bwd 0 10.5..12.5: the canonical 9 + (3 - 1) + (3 - 2) + 0.5.
TEST(Simulator, StepOverheadIsOneComputeSpanAtTheTurn) {
  step_profile p = hand_profile({1, 1, 1}, {2, 2, 2});
  for (int i = 0; i < 3; ++i) add_tensor(p, i, "x", 2 * MiB);
  add_tensor(p, 1, "big", 3 * MiB);
  decision_table d = keep_all(p);
  d[1][1] = tensor_action::offload;
  const sim_result none = simulate(p, d);
  for (const trace_span& s : none.trace.spans()) EXPECT_NE(s.kind, span_kind::step_overhead);
  p.step_overhead_ms = 0.5;
  const sim_result r = simulate(p, d);
  EXPECT_NEAR(r.step_ms, 12.5, 1e-12);
  EXPECT_NEAR(r.step_ms, none.step_ms + 0.5, 1e-12);
  EXPECT_NEAR(r.step_overhead_ms, 0.5, 1e-12);
  EXPECT_NEAR(r.compute_ms, 9, 1e-12);  // fwd + bwd only
  EXPECT_NEAR(waits(r, "wait d2h L1"), 2, 1e-12);
  EXPECT_NEAR(waits(r, "wait h2d L1"), 1, 1e-12);
  EXPECT_EQ(r.peak_bytes, none.peak_bytes);
  EXPECT_EQ(r.peak_at, none.peak_at);
  int spans = 0;
  for (const trace_span& s : r.trace.spans()) {
    if (s.kind != span_kind::step_overhead) continue;
    ++spans;
    EXPECT_EQ(s.name, "step overhead (loss, optimizer)");
    EXPECT_EQ(s.track, kComputeTrack);
    EXPECT_EQ(s.layer, -1);
    EXPECT_NEAR(s.start_ms, 5, 1e-12);
    EXPECT_NEAR(s.dur_ms, 0.5, 1e-12);
  }
  EXPECT_EQ(spans, 1);
  const evaluation ev = evaluate(p, d, 1ull << 40);
  EXPECT_NEAR(r.step_ms, ev.step_ms, 1e-12);
  EXPECT_NEAR(r.exposed_copy_ms, ev.exposed_copy_ms, 1e-12);
  // The trace reads back with its category.
  const trace_writer back = trace_from_json(r.trace.to_json());
  bool found = false;
  for (const trace_span& s : back.spans()) found |= s.kind == span_kind::step_overhead;
  EXPECT_TRUE(found);
  // Without the barrier the overhead runs 3..3.5 under the D2H (2..5), which the overlap
  // report counts as hidden; backward 2 follows at once and the prefetch runs 5..8.
  sim_options free_turn;
  free_turn.turn_barrier = false;
  const sim_result f = simulate(p, d, free_turn);
  EXPECT_NEAR(f.step_ms, 12, 1e-12);
  // Hidden: all 3 ms of D2H (under fwd 2, the overhead and bwd 2) and 0.5 ms of H2D.
  EXPECT_NEAR(compute_overlap(f.trace.spans()).total.hidden_ms, 3 + 0.5, 1e-12);
}

// Note [The optimizer's position] in plan.h: after the last backward the step holds
// optimizer_bytes; the simulator's peak is the canonical model's, there as everywhere.
TEST(Simulator, TheOptimizersPositionComesAfterTheLastBackward) {
  step_profile p = hand_profile({1, 1, 1}, {2, 2, 2});
  for (int i = 0; i < 3; ++i) add_tensor(p, i, "x", 2 * MiB);
  const decision_table d = keep_all(p);
  const sim_result none = simulate(p, d);
  p.optimizer_bytes = none.peak_bytes - 1;
  EXPECT_EQ(simulate(p, d).peak_bytes, none.peak_bytes);
  EXPECT_EQ(simulate(p, d).peak_at, none.peak_at);
  p.optimizer_bytes = none.peak_bytes + MiB;
  const sim_result r = simulate(p, d);
  EXPECT_EQ(r.peak_bytes, none.peak_bytes + MiB);
  EXPECT_EQ(r.peak_at, "optimizer");
  EXPECT_NEAR(r.peak_time_ms, r.step_ms, 1e-12);
  EXPECT_NEAR(r.step_ms, none.step_ms, 1e-12);
  const evaluation ev = evaluate(p, d, 1ull << 40);
  EXPECT_EQ(r.peak_bytes, ev.peak_bytes);
  EXPECT_EQ(r.peak_at, ev.peak_at);
}

// Layer 1 (= L-2) offloads a and b (2 MiB each, 2 ms alone). Without the turn barrier the
// prefetch of a (its D2H done at 4 ms) overlaps the D2H of b from 4 ms on. Sharing a
// 1 MiB/ms bidir link halves both: b and a end at 8, b's prefetch runs alone 8..10, so
// backward of layer 1 starts at 10 (step 12 ms). Without sharing: 4..6, 6..8, step 10 ms.
TEST(Simulator, BidirSharingSlowsOverlappedCopies) {
  step_profile p = hand_profile({1, 1, 1}, {1, 1, 1});
  p.link.bidir_gbps = kMiBPerMsGbps;
  for (int i = 0; i < 3; ++i) add_tensor(p, i, "x", 2 * MiB);
  add_tensor(p, 1, "a", 2 * MiB);
  add_tensor(p, 1, "b", 2 * MiB);
  decision_table d = keep_all(p);
  d[1][1] = d[1][2] = tensor_action::offload;
  sim_options opt;
  opt.turn_barrier = false;
  const sim_result shared = simulate(p, d, opt);
  EXPECT_NEAR(shared.step_ms, 12, 1e-9);
  EXPECT_NEAR(shared.link_shared_ms, 4, 1e-9);
  opt.share_link = false;
  const sim_result independent = simulate(p, d, opt);
  EXPECT_NEAR(independent.step_ms, 10, 1e-9);
  EXPECT_NEAR(independent.link_shared_ms, 2, 1e-9);
  // A link whose bidir covers both directions does not bind.
  p.link.bidir_gbps = 2 * kMiBPerMsGbps;
  opt.share_link = true;
  EXPECT_NEAR(simulate(p, d, opt).step_ms, 10, 1e-9);
  // With the turn barrier (the default) backward starts once b is out (6 ms); the copies
  // never overlap, and the result is the canonical one: 3 + 3 + 3 + 3 (exposed).
  const sim_result barrier = simulate(p, d);
  EXPECT_NEAR(barrier.step_ms, 12, 1e-9);
  EXPECT_EQ(barrier.link_shared_ms, 0);
  EXPECT_NEAR(barrier.step_ms, evaluate(p, d, 1ull << 40).step_ms, 1e-9);
}

// Layer 1 recomputes for 2 ms at the start of its backward. Layer 0's 4 ms prefetch is
// issued after that recompute (the canonical window is bwd_1 = 2 ms: 2 ms exposed, step
// 30 + 6 + 2 + 2 = 40 ms); issued when the recompute starts, it hides under R_1 + bwd_1.
TEST(Simulator, PrefetchIsIssuedAfterTheRecomputeOfTheLayerAbove) {
  step_profile p = hand_profile({10, 10, 10}, {2, 2, 2});
  add_tensor(p, 0, "x", 4 * MiB);
  add_tensor(p, 1, "input", MiB);
  add_tensor(p, 1, "h", 2 * MiB, 2.0);
  add_tensor(p, 2, "x", MiB);
  decision_table d = keep_all(p);
  d[0][0] = tensor_action::offload;
  d[1][1] = tensor_action::recompute;
  const sim_result after = simulate(p, d);
  EXPECT_NEAR(after.step_ms, 40, 1e-12);
  EXPECT_NEAR(after.h2d_wait_ms, 2, 1e-12);
  EXPECT_NEAR(after.recompute_ms, 2, 1e-12);
  EXPECT_NEAR(after.step_ms, evaluate(p, d, ~0ull).step_ms, 1e-12);
  for (const trace_span& s : after.trace.spans())
    if (s.kind == span_kind::h2d) {
      EXPECT_NEAR(s.start_ms, 34, 1e-12);  // bwd L2 [30, 32], recompute L1 [32, 34]
    }
  sim_options opt;
  opt.prefetch_after_recompute = false;
  EXPECT_NEAR(simulate(p, d, opt).step_ms, 38, 1e-12);
}

// Layer 0 offloads 4 MiB (4 ms of H2D); backward of each layer takes 2 ms. At depth 1 its
// prefetch starts with bwd 1 and exposes 2 ms; at depth 2 it starts with bwd 2 and hides,
// at the cost of holding it during backward of layer 2 (whose temporaries are 8 MiB).
TEST(Simulator, LookaheadDepthTwoHidesMoreAndHoldsMore) {
  step_profile p = hand_profile({5, 5, 5, 5}, {2, 2, 2, 2});
  for (int i = 0; i < 4; ++i) add_tensor(p, i, "x", 4 * MiB);
  p.layers[2].bwd_temp_bytes = 8 * MiB;
  decision_table d = keep_all(p);
  d[0][0] = tensor_action::offload;
  sim_options opt;
  const sim_result one = simulate(p, d, opt);
  EXPECT_NEAR(one.step_ms, 30, 1e-12);
  EXPECT_NEAR(one.h2d_wait_ms, 2, 1e-12);
  EXPECT_EQ(one.peak_bytes, 16 * MiB);  // backward[2]: x1 + x2 + temp
  EXPECT_EQ(one.peak_at, "backward[2]");
  opt.lookahead = 2;
  const sim_result two = simulate(p, d, opt);
  EXPECT_NEAR(two.step_ms, 28, 1e-12);
  EXPECT_EQ(two.exposed_copy_ms, 0);
  EXPECT_EQ(two.peak_bytes, 20 * MiB);  // plus layer 0's prefetched 4 MiB
  opt.lookahead = 0;
  EXPECT_THROW(simulate(p, d, opt), input_error);
}

// A pinned pool of 6 MiB holds one of layer 0's two 4 MiB offloads; the other stays on the
// device as if kept (Note [Pinned capacity]): time is unchanged, the peak rises by 4 MiB.
TEST(Simulator, PinnedCapacityKeepsTheOverflowOnDevice) {
  step_profile p = hand_profile({10, 10, 10}, {20, 20, 20});
  add_tensor(p, 0, "a", 4 * MiB);
  add_tensor(p, 0, "b", 4 * MiB);
  add_tensor(p, 1, "x", 4 * MiB);
  add_tensor(p, 2, "x", 8 * MiB);
  decision_table d = keep_all(p);
  d[0][0] = d[0][1] = tensor_action::offload;
  sim_options opt;
  const sim_result free_pool = simulate(p, d, opt);
  opt.pinned_bytes = 6 * MiB;
  const sim_result capped = simulate(p, d, opt);
  EXPECT_EQ(free_pool.pinned_fallback_tensors, 0u);
  EXPECT_EQ(capped.pinned_fallback_tensors, 1u);
  EXPECT_EQ(capped.pinned_fallback_bytes, 4 * MiB);
  EXPECT_EQ(capped.offloaded_bytes, 4 * MiB);
  EXPECT_EQ(capped.pinned_peak_bytes, 4 * MiB);
  EXPECT_EQ(free_pool.pinned_peak_bytes, 8 * MiB);
  EXPECT_NEAR(capped.step_ms, free_pool.step_ms, 1e-12);
  // Unlimited: forward[1] = a + b (in flight) + x1 = 12 MiB = forward[2] = x1 + x2.
  // Capped: forward[2] also holds b: 16 MiB.
  EXPECT_EQ(free_pool.peak_bytes, 12 * MiB);
  EXPECT_EQ(capped.peak_bytes, 16 * MiB);
  EXPECT_EQ(capped.peak_at, "forward[2]");
  opt.pinned_bytes = 0;
  EXPECT_EQ(simulate(p, d, opt).peak_bytes, evaluate(p, keep_all(p), 1ull << 40).peak_bytes);
}

TEST(Simulator, RejectsMismatchedDecisions) {
  step_profile p = hand_profile({1, 1}, {1, 1});
  add_tensor(p, 0, "x", MiB);
  add_tensor(p, 1, "x", MiB);
  decision_table d = keep_all(p);
  d[1].push_back(tensor_action::keep);
  EXPECT_THROW(simulate(p, d), input_error);
  d.pop_back();
  EXPECT_THROW(simulate(p, d), input_error);
}

// ---- property: the replay computes the canonical model ----------------------------------

step_profile random_profile(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> layers(1, 12), tensors(1, 8), coin(0, 3);
  std::uniform_real_distribution<double> ms(0.05, 5.0), gbps(2.0, 60.0), share(0.3, 1.2);
  std::uniform_int_distribution<std::uint64_t> bytes(MiB / 4, 48 * MiB);
  step_profile p;
  p.device_name = "random";
  p.device_memory_bytes = 1ull << 40;
  p.link.d2h_gbps = gbps(rng);
  p.link.h2d_gbps = gbps(rng);
  // Often below d2h + h2d, so sharing would bind if the directions ever overlapped.
  p.link.bidir_gbps = (p.link.d2h_gbps + p.link.h2d_gbps) * share(rng);
  p.pinnable_bytes = 1ull << 40;
  p.fixed_bytes = bytes(rng) * 16;
  const int L = layers(rng);
  for (int i = 0; i < L; ++i) {
    layer_profile l;
    l.name = "layers." + std::to_string(i);
    l.signature = "s" + std::to_string(coin(rng));
    l.fwd_ms = ms(rng);
    l.bwd_ms = 2 * ms(rng);
    l.bwd_temp_bytes = coin(rng) ? bytes(rng) : 0;
    const int T = tensors(rng);
    for (int j = 0; j < T; ++j) {
      tensor_profile t;
      t.name = "t" + std::to_string(j);
      t.bytes = bytes(rng);
      t.recompute_ms = ms(rng) / 4;
      t.recomputable = j != 0;  // the layer input
      t.offloadable = coin(rng) != 0;
      t.must_keep = coin(rng) == 0 && coin(rng) == 0;
      l.tensors.push_back(t);
    }
    p.layers.push_back(l);
  }
  // Note [The loss's position] in plan.h: the replay holds it at the turn.
  if (coin(rng) == 0) p.loss_bytes = bytes(rng) * 2;
  return p;
}

decision_table random_decisions(const step_profile& p, std::mt19937_64& rng) {
  decision_table d = keep_all(p);
  std::uniform_int_distribution<int> pick(0, 2);
  for (std::size_t i = 0; i < p.layers.size(); ++i)
    for (std::size_t j = 0; j < p.layers[i].tensors.size(); ++j) {
      const tensor_action a = static_cast<tensor_action>(pick(rng));
      if (allowed(p, i, j, a)) d[i][j] = a;
    }
  return d;
}

TEST(SimulatorProperty, AgreesWithCanonicalModelAtDepthOne) {
  std::mt19937_64 rng(20261129), overhead_rng(5);
  std::uniform_real_distribution<double> overhead(0.01, 20.0);
  int with_exposed = 0, with_recompute = 0;
  for (int trial = 0; trial < 600; ++trial) {
    step_profile p = random_profile(rng);
    const decision_table d = random_decisions(p, rng);
    // Two trials in three carry a step overhead, drawn from a generator of its own so the
    // profiles and decisions are the ones this test has always used.
    if (trial % 3 != 0) p.step_overhead_ms = overhead(overhead_rng);
    const evaluation ev = evaluate(p, d, ~0ull);
    ASSERT_TRUE(ev.valid) << "trial " << trial << ": generator produced a rule break";
    sim_options opt;
    opt.record_trace = trial % 2 == 0;  // both paths of the replay
    const sim_result r = simulate(p, d, opt);
    const double tol = 1e-9 * ev.step_ms;
    ASSERT_NEAR(r.step_ms, ev.step_ms, tol) << "trial " << trial;
    ASSERT_NEAR(r.exposed_copy_ms, ev.exposed_copy_ms, tol) << "trial " << trial;
    ASSERT_NEAR(r.recompute_ms, ev.recompute_ms, tol) << "trial " << trial;
    ASSERT_NEAR(r.compute_ms, ev.compute_ms, tol) << "trial " << trial;
    ASSERT_NEAR(r.step_overhead_ms, ev.step_overhead_ms, tol) << "trial " << trial;
    ASSERT_EQ(r.peak_bytes, ev.peak_bytes) << "trial " << trial;
    ASSERT_EQ(r.peak_at, ev.peak_at) << "trial " << trial;
    ASSERT_EQ(r.offloaded_bytes, ev.offloaded_bytes) << "trial " << trial;
    ASSERT_EQ(r.link_shared_ms, 0) << "trial " << trial;
    with_exposed += ev.exposed_copy_ms > 0;
    with_recompute += ev.recompute_ms > 0;
  }
  // The generator must exercise overruns and recompute, or the property proves little.
  EXPECT_GT(with_exposed, 100);
  EXPECT_GT(with_recompute, 300);
}

// Leaving the canonical assumptions moves the replay in the expected direction only.
TEST(SimulatorProperty, RelaxationsNeverSlowAndDepthTradesMemoryForTime) {
  std::mt19937_64 rng(7), overhead_rng(11);
  std::uniform_real_distribution<double> overhead(0.01, 20.0);
  for (int trial = 0; trial < 300; ++trial) {
    step_profile p = random_profile(rng);
    const decision_table d = random_decisions(p, rng);
    if (trial % 2) p.step_overhead_ms = overhead(overhead_rng);
    sim_options opt;
    opt.record_trace = false;
    const sim_result base = simulate(p, d, opt);
    const double tol = 1e-9 * base.step_ms;
    sim_options early = opt;  // prefetch at the recompute, not after it
    early.prefetch_after_recompute = false;
    EXPECT_LE(simulate(p, d, early).step_ms, base.step_ms + tol) << trial;
    sim_options no_barrier = opt;  // with independent directions, dropping the barrier helps
    no_barrier.turn_barrier = false;
    no_barrier.share_link = false;
    EXPECT_LE(simulate(p, d, no_barrier).step_ms, base.step_ms + tol) << trial;
    sim_options deep = opt;
    deep.lookahead = 2;
    const sim_result two = simulate(p, d, deep);
    EXPECT_LE(two.step_ms, base.step_ms + tol) << trial;
    EXPECT_GE(two.peak_bytes, base.peak_bytes) << trial;
  }
}

}  // namespace
}  // namespace stash::planner
