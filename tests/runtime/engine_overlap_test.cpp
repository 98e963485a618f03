// Overlap on the double's virtual clock: the engine's measured step time and exposed copy
// time against the planner's simulator (`stash simulate`) for the same profile and plan.
//
// Every stream is paused while the step is enqueued, so no event completes (and nothing
// is observed by the host) until the whole step is queued: virtual times are then a pure
// function of the call order, and the comparison is exact on any machine.
#include <algorithm>
#include <cmath>

#include "engine_fixture.h"
#include "planner/simulator/simulator.h"

namespace stash::test {
namespace {

struct scenario {
  const char* name;
  std::vector<double> fwd, bwd;
  std::vector<std::string> actions;           // per layer, one letter per tensor (o/k/r)
  std::vector<std::vector<uint64_t>> bytes;   // per layer, per tensor
  double gbps = 0.05;                         // 5e4 bytes per virtual ms
  int lookahead = 1;
};

planner::step_profile profile_of(const scenario& s) {
  planner::step_profile p;
  p.device_name = "double";
  p.device_memory_bytes = uint64_t{80} << 30;
  p.link.d2h_gbps = p.link.h2d_gbps = s.gbps;
  p.link.bidir_gbps = 2 * s.gbps;
  p.pinnable_bytes = uint64_t{1} << 40;
  for (size_t i = 0; i < s.fwd.size(); ++i) {
    planner::layer_profile l;
    l.name = "layers." + std::to_string(i);
    l.signature = "block";
    l.fwd_ms = s.fwd[i];
    l.bwd_ms = s.bwd[i];
    for (size_t j = 0; j < s.actions[i].size(); ++j) {
      planner::tensor_profile t;
      t.name = "t" + std::to_string(j);
      t.bytes = s.bytes[i][j];
      t.recompute_ms = s.actions[i][j] == 'r' ? 2.5 : 0;
      l.tensors.push_back(t);
    }
    p.layers.push_back(l);
  }
  return p;
}

planner::decision_table decisions_of(const scenario& s) {
  planner::decision_table d;
  for (const std::string& l : s.actions) {
    d.emplace_back();
    for (char c : l)
      d.back().push_back(c == 'o'   ? tensor_action::offload
                         : c == 'r' ? tensor_action::recompute
                                    : tensor_action::keep);
  }
  return d;
}

struct measured {
  double step_ms = 0;
  planner::overlap_report report;
  planner::trace_writer trace;
};

class Overlap : public EngineTest {
 protected:
  // Every case compares virtual times, so every case needs the double; skipping here (not
  // in compare()) ends the test body too. (A skip inside compare() returned from compare
  // alone, and the bodies' own expectations then failed on the GPU machine.)
  void SetUp() override {
    EngineTest::SetUp();
    STASH_REQUIRE_DOUBLE();
  }
  measured run(const scenario& s, const planner::step_profile& p) {
    double_api().set_bandwidth(s.gbps, s.gbps, 2 * s.gbps);
    engine_config c = config();
    c.lookahead = s.lookahead;
    make(c, plan_of(s.actions));
    const uint32_t L = static_cast<uint32_t>(s.fwd.size());
    std::vector<std::vector<void*>> ptr(L);
    for (uint32_t i = 0; i < L; ++i)
      for (uint64_t b : s.bytes[i]) ptr[i].push_back(dev_alloc(b));
    cudaStream_t streams[] = {compute_, engine_->d2h_stream(), engine_->h2d_stream()};
    for (cudaStream_t st : streams) EXPECT_EQ(double_api().stream_pause(st), cudaSuccess);
    for (uint32_t i = 0; i < L; ++i) {
      EXPECT_EQ(engine_->forward_begin(0, i), status::ok) << last_error();
      std::vector<const void*> w(ptr[i].begin(), ptr[i].end());
      std::vector<size_t> ws(s.bytes[i].begin(), s.bytes[i].end());
      EXPECT_EQ(double_api().enqueue_compute(compute_, s.fwd[i], "fwd", nullptr, nullptr, 0,
                                             w.data(), ws.data(), w.size()),
                cudaSuccess);
      EXPECT_EQ(engine_->forward_end(0, i), status::ok);
      for (uint32_t j = 0; j < ptr[i].size(); ++j)
        EXPECT_EQ(engine_->offload({0, i, j}, ptr[i][j], s.bytes[i][j], compute_), status::ok)
            << last_error();
    }
    for (uint32_t i = L; i-- > 0;) {
      EXPECT_EQ(engine_->backward_begin(0, i), status::ok) << last_error();
      std::vector<const void*> r;
      for (uint32_t j = 0; j < ptr[i].size(); ++j) {
        void* q = nullptr;
        EXPECT_EQ(engine_->acquire({0, i, j}, compute_, &q), status::ok) << last_error();
        r.push_back(q);
      }
      const double rc = p.layers[i].tensors.empty() ? 0 : [&] {
        double t = 0;
        for (size_t j = 0; j < s.actions[i].size(); ++j)
          if (s.actions[i][j] == 'r') t += p.layers[i].tensors[j].recompute_ms;
        return t;
      }();
      if (rc > 0) {
        EXPECT_EQ(double_api().enqueue_compute(compute_, rc, "recompute", nullptr, nullptr, 0,
                                               nullptr, nullptr, 0),
                  cudaSuccess);
      }
      std::vector<size_t> rs(s.bytes[i].begin(), s.bytes[i].end());
      EXPECT_EQ(double_api().enqueue_compute(compute_, s.bwd[i], "bwd", r.data(), rs.data(),
                                             r.size(), nullptr, nullptr, 0),
                cudaSuccess);
      EXPECT_EQ(engine_->backward_end(0, i), status::ok);
      for (uint32_t j = 0; j < ptr[i].size(); ++j) {
        EXPECT_EQ(engine_->release({0, i, j}), status::ok);
        if (s.actions[i][j] != 'o') pool_->deallocate(ptr[i][j], nullptr, 0);
      }
    }
    for (cudaStream_t st : streams) EXPECT_EQ(double_api().stream_resume(st), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(compute_), cudaSuccess);
    EXPECT_EQ(engine_->synchronize(), status::ok);
    const planner::trace_writer t = engine_->trace();
    measured m;
    double lo = 1e300, hi = -1e300;
    for (const planner::trace_span& sp : t.spans())
      if (sp.track == planner::kComputeTrack) lo = std::min(lo, sp.start_ms), hi = std::max(hi, sp.end_ms());
    m.step_ms = hi - lo;
    m.report = planner::compute_overlap(t.spans());
    m.trace = t;
    EXPECT_TRUE(violations().empty()) << violations().front();
    return m;
  }

  void compare(const scenario& s) {
    const planner::step_profile p = profile_of(s);
    planner::sim_options o;
    o.lookahead = s.lookahead;
    o.prefetch_after_recompute = false;  // the engine issues at backward_begin
    const planner::sim_result sim = planner::simulate(p, decisions_of(s), o);
    const measured m = run(s, p);
    const planner::overlap_report want = planner::compute_overlap(sim.trace.spans());
    const double tol_step = 0.01 * sim.step_ms;
    EXPECT_NEAR(m.step_ms, sim.step_ms, tol_step) << s.name;
    EXPECT_NEAR(m.report.total.exposed_ms, sim.exposed_copy_ms,
                std::max(1e-3, 0.01 * sim.exposed_copy_ms))
        << s.name;
    EXPECT_NEAR(m.report.total.copy_ms, want.total.copy_ms, std::max(1e-3, 0.01 * want.total.copy_ms))
        << s.name;
    EXPECT_NEAR(m.report.total.hidden_ms, want.total.hidden_ms,
                std::max(1e-3, 0.01 * want.total.hidden_ms))
        << s.name;
    for (const planner::layer_overlap& w : want.layers) {
      double got = 0;
      for (const planner::layer_overlap& g : m.report.layers)
        if (g.layer == w.layer) got = g.exposed_ms;
      EXPECT_NEAR(got, w.exposed_ms, std::max(1e-3, 0.01 * w.exposed_ms))
          << s.name << " layer " << w.layer;
    }
    ::testing::Test::RecordProperty(std::string(s.name) + "_sim_step_ms", std::to_string(sim.step_ms));
    std::printf("[overlap] %-22s step sim %9.3f engine %9.3f (%+.4f%%)  exposed sim %8.3f engine %8.3f\n",
                s.name, sim.step_ms, m.step_ms, 100 * (m.step_ms / sim.step_ms - 1),
                sim.exposed_copy_ms, m.report.total.exposed_ms);
    last_sim_exposed_ = sim.exposed_copy_ms;
    last_exposed_ = m.report.total.exposed_ms;
  }
  double last_sim_exposed_ = 0, last_exposed_ = 0;
};

const uint64_t kHalfMB = 500000, kMB = 1000000;

scenario fits() {  // 1 MB per layer: 20 ms of copy under 30 ms fwd / 60 ms bwd
  return {"fits", {30, 30, 30, 30}, {60, 60, 60, 60}, {"oo", "oo", "oo", "kk"},
          {{kHalfMB, kHalfMB}, {kHalfMB, kHalfMB}, {kHalfMB, kHalfMB}, {kHalfMB, kHalfMB}}};
}

scenario overruns() {  // 3 MB per layer: 60 ms of copy over 30 ms fwd / 40 ms bwd
  return {"overruns", {30, 30, 30, 30}, {40, 40, 40, 40}, {"oo", "oo", "oo", "kk"},
          {{kMB, 2 * kMB}, {kMB, 2 * kMB}, {kMB, 2 * kMB}, {kMB, kMB}}};
}

scenario mixed() {  // keep / recompute / offload, uneven layers, one window overrun
  return {"mixed",
          {20, 35, 10, 25, 30},
          {45, 50, 30, 60, 40},
          {"ork", "oo", "rok", "oro", "kk"},
          {{kMB, kHalfMB, kHalfMB}, {kHalfMB, kHalfMB}, {kHalfMB, 2 * kMB, kHalfMB},
           {kMB, kHalfMB, kHalfMB}, {kHalfMB, kHalfMB}}};
}

TEST_F(Overlap, WindowsFitNothingExposed) {
  compare(fits());
  EXPECT_EQ(last_sim_exposed_, 0.0);
  EXPECT_NEAR(last_exposed_, 0.0, 1e-6);
}

TEST_F(Overlap, CopiesOverrunTheirWindows) {
  compare(overruns());
  EXPECT_GT(last_exposed_, 10.0);
}

TEST_F(Overlap, MixedPlan) { compare(mixed()); }

// Layer 1's 60 ms copy gets a 10 ms window at depth 1 (backward of layer 2) but runs
// under the 100 ms backward of layer 3 at depth 2.
scenario uneven() {
  return {"uneven", {30, 30, 30, 30}, {40, 40, 10, 100}, {"o", "oo", "o", "k"},
          {{kMB}, {kMB, 2 * kMB}, {kHalfMB}, {kHalfMB}}};
}

TEST_F(Overlap, LookaheadTwoHidesMoreThanOne) {
  scenario s = uneven();
  s.name = "uneven depth 1";
  compare(s);
  const double depth1 = last_exposed_;
  TearDown();  // a fresh engine, pool and stream on a reset double
  SetUp();
  s.lookahead = 2;
  s.name = "uneven depth 2";
  compare(s);
  EXPECT_LT(last_exposed_, depth1 - 10);
}

// Note [Measured device bytes]: within a layer, a temporary raises the pool's held bytes
// and is freed before the layer ends; the compute span starts at that highest level and
// ends at the level left (a parameter and the layer's activation).
TEST_F(Overlap, DeviceBytesCounterShowsTheLayersPeak) {
  make(config(), plan_of({"k"}));
  void* param = dev_alloc(kMB);
  const double level0 = static_cast<double>(pool_->held_bytes());
  ASSERT_EQ(engine_->forward_begin(0, 0), status::ok) << last_error();
  void* tmp = dev_alloc(4 * kMB);
  const double top = static_cast<double>(pool_->held_bytes());
  ASSERT_EQ(double_api().enqueue_compute(compute_, 10, "fwd", nullptr, nullptr, 0, nullptr,
                                         nullptr, 0),
            cudaSuccess);
  ASSERT_EQ(pool_->deallocate(tmp, nullptr, 0), status::ok);
  void* act = dev_alloc(kHalfMB);
  const double level1 = static_cast<double>(pool_->held_bytes());
  ASSERT_EQ(engine_->forward_end(0, 0), status::ok) << last_error();
  ASSERT_EQ(cudaStreamSynchronize(compute_), cudaSuccess);
  const planner::trace_writer t = engine_->trace();
  ASSERT_GT(top, level1);
  ASSERT_GT(level1, level0);
  std::vector<std::pair<double, double>> got;
  for (const planner::counter_sample& c : t.counters())
    if (c.name == planner::kDeviceBytesCounter) got.emplace_back(c.t_ms, c.value);
  ASSERT_EQ(t.spans().size(), 1u);
  const planner::trace_span& fwd = t.spans()[0];
  EXPECT_NEAR(fwd.dur_ms, 10, 1e-9);
  const std::vector<std::pair<double, double>> want = {{fwd.start_ms, top},
                                                       {fwd.end_ms(), level1}};
  EXPECT_EQ(got, want);
  pool_->deallocate(act, nullptr, 0);
  pool_->deallocate(param, nullptr, 0);
}

// Over a whole step (fits(): all eight tensors allocated before it, layer i's two
// offloaded blocks handed back at forward_begin(i+2) and the loss turn, two prefetched
// blocks per backward layer): the counter's maximum is the pool's peak, eight blocks, and
// the last backward layer ends holding its own two prefetched blocks.
TEST_F(Overlap, DeviceBytesCounterFollowsThePool) {
  const scenario s = fits();
  const measured m = run(s, profile_of(s));
  const double b = static_cast<double>(pool_->stats().peak_bytes) / 8;  // one rounded block
  ASSERT_GE(b, double(kHalfMB));
  double hi = 0, last_t = -1, last = -1;
  for (const planner::counter_sample& c : m.trace.counters()) {
    if (c.name != planner::kDeviceBytesCounter) continue;
    hi = std::max(hi, c.value);
    if (c.t_ms >= last_t) last_t = c.t_ms, last = c.value;
  }
  EXPECT_EQ(hi, 8 * b);
  EXPECT_EQ(last, 2 * b);
  // Each forward span's end level: 8, 8, then 6 and 4 as layers 0 and 1 go back.
  const std::vector<double> want = {8, 8, 6, 4};
  for (const planner::trace_span& sp : m.trace.spans()) {
    if (sp.kind != planner::span_kind::forward) continue;
    bool seen = false;
    for (const planner::counter_sample& c : m.trace.counters())
      if (c.name == planner::kDeviceBytesCounter && c.t_ms == sp.end_ms() &&
          c.value == want[sp.layer] * b)
        seen = true;
    EXPECT_TRUE(seen) << "no sample of " << want[sp.layer] << " blocks as forward of layer "
                      << sp.layer << " ends";
  }
}

TEST_F(Overlap, MixedPlanDepthTwo) {
  scenario s = mixed();
  s.lookahead = 2;
  s.name = "mixed depth 2";
  compare(s);
}

}  // namespace
}  // namespace stash::test
