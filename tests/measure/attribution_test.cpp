// Attribution of synthetic activity records to layer and tensor scopes.
#include <gtest/gtest.h>

#include "log_builder.h"
#include "runtime/measure/attribution.h"
#include "runtime/measure/scope_name.h"

namespace stash::measure {
namespace {

using test::log_builder;

double fwd(const measurement& m, int layer) { return median(m.layers.at(layer).fwd_ms); }
double bwd(const measurement& m, int layer) { return median(m.layers.at(layer).bwd_ms); }

TEST(ScopeName, ParsesLayerAndTensorScopes) {
  auto f = parse_scope_name("stash:layer:12:fwd");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, scope_kind::layer_forward);
  EXPECT_EQ(f->layer, 12);
  auto b = parse_scope_name("stash:layer:0:bwd");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->kind, scope_kind::layer_backward);
  auto t = parse_scope_name("stash:tensor:attn.q:out");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->tensor, "attn.q:out");
  for (const char* bad : {"stash:layer:x:fwd", "stash:layer:-1:fwd", "stash:layer:1:fw",
                          "stash:layer::fwd", "stash:tensor:", "layer:1:fwd", "aten::mm", "",
                          "stash:layer:99999999999:fwd"}) {
    EXPECT_FALSE(parse_scope_name(bad)) << bad;
  }
  EXPECT_EQ(layer_scope_name(3, true), "stash:layer:3:bwd");
  EXPECT_EQ(tensor_scope_name("x"), "stash:tensor:x");
}

TEST(Attribution, ForwardAndBackwardOfOneLayer) {
  log_builder b;
  b.push(1, "stash:layer:0:fwd", 0);
  b.launch(1, 0.1, 1, 2);
  b.launch(1, 0.2, 2, 3);
  b.pop(1, 0.3);
  b.push(1, "stash:layer:0:bwd", 4);
  b.launch(1, 4.1, 5, 8);
  b.pop(1, 4.2);
  const measurement m = attribute(b.finish());
  EXPECT_DOUBLE_EQ(fwd(m, 0), 2.0);
  EXPECT_DOUBLE_EQ(bwd(m, 0), 3.0);
  EXPECT_EQ(m.kernels, 3u);
  EXPECT_EQ(m.kernels_by_correlation, 3u);
  EXPECT_EQ(m.kernels_outside_scopes, 0u);
  EXPECT_DOUBLE_EQ(m.kernel_ms, 5.0);
}

TEST(Attribution, NestedTensorAndForeignRanges) {
  log_builder b;
  b.push(1, "stash:layer:2:fwd", 0);
  b.push(1, "stash:tensor:attn_out", 0.1);
  b.launch(1, 0.2, 1, 2);  // producer of attn_out: counts for the tensor and the layer
  b.pop(1, 0.3);
  b.push(1, "aten::mm", 0.4);  // not a stash scope: its kernels stay with the layer
  b.launch(1, 0.5, 2, 2.5);
  b.pop(1, 0.6);
  b.launch(1, 0.7, 3, 5);
  b.pop(1, 0.8);
  const measurement m = attribute(b.finish());
  EXPECT_DOUBLE_EQ(fwd(m, 2), 3.5);
  ASSERT_EQ(m.tensors.count({2, "attn_out"}), 1u);
  EXPECT_DOUBLE_EQ(median(m.tensors.at({2, "attn_out"})), 1.0);
  EXPECT_EQ(m.layers.count(0), 0u);
}

TEST(Attribution, TensorScopeOutsideAnyLayerHasNoLayer) {
  log_builder b;
  b.push(1, "stash:tensor:embedding", 0);
  b.launch(1, 0.1, 1, 1.5);
  b.pop(1, 0.2);
  const measurement m = attribute(b.finish());
  ASSERT_EQ(m.tensors.count({-1, "embedding"}), 1u);
  EXPECT_DOUBLE_EQ(median(m.tensors.at({-1, "embedding"})), 0.5);
}

TEST(Attribution, OverlappingKernelsCountOnceAsBusyTime) {
  log_builder b;
  b.push(1, "stash:layer:0:fwd", 0);
  b.launch(1, 0.1, 1, 3, true, true, /*stream=*/1);
  b.launch(1, 0.2, 2, 4, true, true, /*stream=*/2);
  b.launch(1, 0.3, 6, 7, true, true, /*stream=*/1);  // a gap 4..6 where the GPU idles
  b.pop(1, 0.4);
  const measurement m = attribute(b.finish());
  EXPECT_DOUBLE_EQ(fwd(m, 0), 4.0);
}

// A layer's range closes on the host long before its kernels run; the next layer's range
// is open while they run. Launch, not completion, decides.
void late_kernels(bool external_records) {
  log_builder b;
  b.push(1, "stash:layer:0:fwd", 0);
  b.launch(1, 0.5, 5, 7, external_records);
  b.pop(1, 1);
  b.push(1, "stash:layer:1:fwd", 1);
  b.launch(1, 1.5, 7, 8, external_records);
  b.pop(1, 2);
  const measurement m = attribute(b.finish());
  EXPECT_DOUBLE_EQ(fwd(m, 0), 2.0);
  EXPECT_DOUBLE_EQ(fwd(m, 1), 1.0);
  EXPECT_EQ(m.kernels_outside_scopes, 0u);
  EXPECT_EQ(external_records ? m.kernels_by_correlation : m.kernels_by_launch_thread, 2u);
}
TEST(Attribution, LateFinishingKernelsByExternalCorrelation) { late_kernels(true); }
TEST(Attribution, LateFinishingKernelsByLaunchThread) { late_kernels(false); }

void two_threads(bool external_records) {
  // Thread 10 runs layer 0's forward while thread 20 runs layer 5's backward; their
  // launches interleave in time.
  log_builder b;
  b.push(10, "stash:layer:0:fwd", 0);
  b.push(20, "stash:layer:5:bwd", 0.05);
  b.launch(10, 0.1, 1, 2, external_records);
  b.launch(20, 0.15, 1.5, 4.5, external_records);
  b.launch(10, 0.2, 5, 6, external_records);
  b.pop(10, 0.3);
  b.launch(20, 0.35, 6, 7, external_records);
  b.pop(20, 0.4);
  const measurement m = attribute(b.finish());
  EXPECT_DOUBLE_EQ(fwd(m, 0), 2.0);
  EXPECT_DOUBLE_EQ(bwd(m, 5), 4.0);
  EXPECT_TRUE(m.layers.at(0).bwd_ms.empty());
  EXPECT_TRUE(m.layers.at(5).fwd_ms.empty());
}
TEST(Attribution, SeveralThreadsByExternalCorrelation) { two_threads(true); }
TEST(Attribution, SeveralThreadsByLaunchThread) { two_threads(false); }

TEST(Attribution, DroppedRecordsAreCountedAndFallBack) {
  log_builder b;
  b.push(1, "stash:layer:0:fwd", 0);
  b.launch(1, 0.1, 1, 2);                 // complete
  b.launch(1, 0.2, 2, 3, false, true);    // external record dropped: launch thread
  b.launch(1, 0.3, 3, 4, false, false);   // both dropped: cannot be placed
  b.pop(1, 0.4);
  activity_log log = b.finish();
  log.dropped_records = 2;
  const measurement m = attribute(log);
  EXPECT_EQ(m.dropped_records, 2u);
  EXPECT_EQ(m.kernels_by_correlation, 1u);
  EXPECT_EQ(m.kernels_by_launch_thread, 1u);
  EXPECT_EQ(m.kernels_outside_scopes, 1u);
  EXPECT_DOUBLE_EQ(m.outside_ms, 1.0);
  EXPECT_DOUBLE_EQ(fwd(m, 0), 2.0);
  ASSERT_FALSE(m.warnings.empty());
  EXPECT_NE(m.warnings[0].find("2 activity records were dropped"), std::string::npos);
}

TEST(Attribution, KernelsOutsideScopesAndUntimedKernels) {
  log_builder b;
  b.launch(1, 0.1, 1, 2);  // before any scope
  b.push(1, "stash:layer:0:fwd", 1);
  b.launch(1, 1.1, 0, 0);  // no timestamps collected
  b.pop(1, 1.2);
  const measurement m = attribute(b.finish());
  EXPECT_EQ(m.kernels, 2u);
  EXPECT_EQ(m.kernels_outside_scopes, 1u);
  EXPECT_EQ(m.kernels_untimed, 1u);
  EXPECT_DOUBLE_EQ(fwd(m, 0), 0.0);  // the scope ran, with no timed GPU work
}

TEST(Attribution, RecomputedForwardInsideBackwardCountsForTheBackward) {
  log_builder b;
  b.push(1, "stash:layer:1:fwd", 0);
  b.launch(1, 0.1, 1, 3);
  b.pop(1, 0.2);
  b.push(1, "stash:layer:1:bwd", 1);
  b.push(1, "stash:layer:1:fwd", 1.1);  // activation checkpointing reruns the forward
  b.launch(1, 1.2, 4, 6);
  b.pop(1, 1.3);
  b.launch(1, 1.4, 6, 10);
  b.pop(1, 1.5);
  const measurement m = attribute(b.finish());
  ASSERT_EQ(m.layers.at(1).fwd_ms.size(), 1u);
  EXPECT_DOUBLE_EQ(fwd(m, 1), 2.0);
  EXPECT_DOUBLE_EQ(bwd(m, 1), 6.0);
}

TEST(Attribution, MedianOverSteps) {
  log_builder b;
  const double durations[] = {5.0, 1.0, 1.2, 0.9};  // a slow first step
  double t = 0;
  for (double d : durations) {
    b.push(1, "stash:layer:0:fwd", t);
    b.launch(1, t + 0.1, t + 1, t + 1 + d);
    b.pop(1, t + 0.2);
    t += 10;
  }
  const measurement m = attribute(b.finish());
  ASSERT_EQ(m.layers.at(0).fwd_ms.size(), 4u);
  EXPECT_DOUBLE_EQ(fwd(m, 0), 1.1);
  EXPECT_DOUBLE_EQ(median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_DOUBLE_EQ(median({}), 0.0);
}

// Note [Time outside the layers]: per step (outermost forward of layer 0 to the next), the
// busy time of kernels that no layer scope encloses, by launch time.
TEST(Attribution, TimeOutsideTheLayersPerStep) {
  log_builder b;
  b.launch(1, 0.1, 0.5, 3.5);  // initialisation, before the first step: in no step
  double t = 10;
  const double loss[] = {2.0, 0.5, 0.5};  // a slow first step
  for (double l : loss) {
    b.push(1, "stash:layer:0:fwd", t);
    b.launch(1, t + 0.1, t + 1, t + 2);  // layer work
    b.pop(1, t + 0.2);
    b.launch(1, t + 0.3, t + 2, t + 2 + l);  // the loss, in no scope
    b.push(1, "stash:layer:0:bwd", t + 0.4);
    b.launch(1, t + 0.5, t + 3, t + 4);
    b.push(1, "stash:layer:0:fwd", t + 0.55);  // checkpointing rerun: not a new step
    b.launch(1, t + 0.56, t + 4, t + 4.5);
    b.pop(1, t + 0.57);
    b.pop(1, t + 0.6);
    b.push(1, "optimizer", t + 0.7);  // a foreign range outside the layers counts
    b.launch(1, t + 0.8, t + 5, t + 5.25);
    b.launch(1, t + 0.85, t + 5.1, t + 5.3);  // overlapping: busy time, counted once
    b.pop(1, t + 0.9);
    b.push(1, "stash:tensor:orphan", t + 0.92);  // a tensor scope in no layer counts too
    b.launch(1, t + 0.93, t + 6, t + 6.125);
    b.pop(1, t + 0.94);
    t += 10;
  }
  // Launched with no API record: its start places it (in the last step).
  b.launch(1, 0, t - 1, t - 0.75, false, false);
  const measurement m = attribute(b.finish());
  ASSERT_EQ(m.step_outside_ms.size(), 3u);
  EXPECT_NEAR(m.step_outside_ms[0], 2.0 + 0.3 + 0.125, 1e-9);
  EXPECT_NEAR(m.step_outside_ms[1], 0.5 + 0.3 + 0.125, 1e-9);
  EXPECT_NEAR(m.step_outside_ms[2], 0.5 + 0.3 + 0.125 + 0.25, 1e-9);
  EXPECT_NEAR(median(m.step_outside_ms), 1.175, 1e-9);  // the slow first step is ignored
  ASSERT_EQ(m.layers.at(0).fwd_ms.size(), 3u);  // the rerun yields no forward sample either

  log_builder none;  // no layer 0 forward: no steps, no samples
  none.push(1, "stash:layer:1:fwd", 0);
  none.launch(1, 0.1, 1, 2);
  none.pop(1, 0.2);
  none.launch(1, 0.3, 2, 3);
  EXPECT_TRUE(attribute(none.finish()).step_outside_ms.empty());
}

TEST(ScopeTracker, InterleavedDomainsKeepTheRightScope) {
  log_builder b;
  b.push(1, "stash:layer:0:fwd", 0, /*domain=*/100);
  b.push(1, "stash:tensor:x", 0.1, /*domain=*/0);
  b.pop(1, 0.2, /*domain=*/100);  // the layer closes first, in its own domain
  b.launch(1, 0.3, 1, 2);         // still inside the tensor scope, which opened in layer 0
  b.pop(1, 0.4, 0);
  b.launch(1, 0.5, 2, 3);         // inside nothing
  const measurement m = attribute(b.finish());
  EXPECT_DOUBLE_EQ(median(m.tensors.at({0, "x"})), 1.0);
  EXPECT_DOUBLE_EQ(fwd(m, 0), 1.0);
  EXPECT_EQ(m.kernels_outside_scopes, 1u);
}

TEST(ScopeTracker, UnmatchedPopsAndForeignRangesAreHarmless) {
  scope_tracker t;
  EXPECT_FALSE(t.pop(1, 0, 5).changed());  // opened before the profiler started
  auto c = t.push(1, 0, "aten::mm", 6);
  EXPECT_EQ(c.after, 0u);
  c = t.push(1, 0, "stash:layer:0:fwd", 7);
  EXPECT_EQ(c.before, 0u);
  EXPECT_EQ(c.after, 1u);
  c = t.pop(1, 0, 8);
  EXPECT_EQ(c.after, 0u);
  c = t.pop(1, 0, 9);  // pops aten::mm
  EXPECT_FALSE(c.changed());
  const auto scopes = t.scopes();
  ASSERT_EQ(scopes.size(), 1u);
  EXPECT_EQ(scopes[0].begin_ns, 7u);
  EXPECT_EQ(scopes[0].end_ns, 8u);
}

TEST(Attribution, ScopeLeftOpenAtExitStillCounts) {
  log_builder b;
  b.push(1, "stash:layer:3:bwd", 0);
  b.launch(1, 0.1, 1, 4, false, true);
  const measurement m = attribute(b.finish());
  EXPECT_DOUBLE_EQ(bwd(m, 3), 3.0);
}

}  // namespace
}  // namespace stash::measure
