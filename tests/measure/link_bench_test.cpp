// `stash bench link` logic. On the test double the virtual clock makes a copy take
// bytes / configured bandwidth, so the measured GB/s must equal what was configured; on a
// GPU (the .gpu variant) the figures must be plausible and self-consistent.
#include <algorithm>
#include <cstdlib>
#include <string>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "double_api.h"
#include "planner/model/profile.h"
#include "runtime/measure/link_bench.h"
#include "cuda_prim.h"
#include "stash.h"

namespace stash::measure {
namespace {

constexpr double kTol = 1e-3;  // cudaEventElapsedTime's float milliseconds

// Both directions at once under the double's link model (tests/cudart_double/src/
// link_model.h): the H2D copy, enqueued first, keeps its full speed (h); the D2H copy runs
// at min(d, bidir / 2) while it overlaps it, then at d. Per byte of each direction.
struct both_rates {
  double h2d, d2h, aggregate;
};
both_rates double_both(double h, double d, double bidir) {
  const double t_h = 1.0 / h;
  const double shared = std::min(d, bidir / 2);
  const double during = shared * t_h;
  const double t_d = during >= 1.0 ? 1.0 / shared : t_h + (1.0 - during) / d;
  return {1.0 / t_h, 1.0 / t_d, 2.0 / std::max(t_h, t_d)};
}

class LinkBench : public ::testing::Test {
 protected:
  void SetUp() override {
    ::unsetenv("LOCAL_WORLD_SIZE");
    if (test::on_double()) test::double_api().reset();
  }
  void TearDown() override {
    ::unsetenv("LOCAL_WORLD_SIZE");
    if (test::on_double()) {
      EXPECT_TRUE(test::double_api().violations().empty())
          << test::double_api().violations().front();
      test::double_api().reset();
    }
  }
  static link_bench_options small() {
    link_bench_options o;
    o.bytes = kMinLinkBytes;
    o.samples = 3;
    o.warmups = 1;
    return o;
  }
};

TEST(LinkBufferSize, ShrinksToFitAndRefusesBelowTheMinimum) {
  constexpr size_t GiB = size_t{1} << 30;
  EXPECT_EQ(link_buffer_bytes(kDefaultLinkBytes, 80 * GiB), kDefaultLinkBytes);
  // (1 GiB - 1/8) / 2 = 448 MiB.
  EXPECT_EQ(link_buffer_bytes(kDefaultLinkBytes, GiB), 448 * kMiB);
  // Rounded down to a MiB.
  EXPECT_EQ(link_buffer_bytes(kDefaultLinkBytes, 300 * kMiB + 12345), 131 * kMiB);
  EXPECT_EQ(link_buffer_bytes(kDefaultLinkBytes, 147 * kMiB), 64 * kMiB);
  EXPECT_EQ(link_buffer_bytes(kDefaultLinkBytes, 146 * kMiB), 0u);
  EXPECT_EQ(link_buffer_bytes(kDefaultLinkBytes, 0), 0u);
}

TEST_F(LinkBench, MeasuresWhatTheDoubleIsConfiguredWith) {
  STASH_REQUIRE_DOUBLE();
  test::double_api().set_bandwidth(25.0, 20.0, 30.0);
  const link_bench_result r = run_link_bench(small());
  EXPECT_EQ(r.buffer_bytes, kMinLinkBytes);
  EXPECT_NEAR(r.h2d.median_gbps, 25.0, kTol);
  EXPECT_NEAR(r.d2h.median_gbps, 20.0, kTol);
  const both_rates both = double_both(25.0, 20.0, 30.0);  // 25, 16.67, 33.33
  EXPECT_NEAR(r.both_h2d.median_gbps, both.h2d, kTol);
  EXPECT_NEAR(r.both_d2h.median_gbps, both.d2h, kTol);
  EXPECT_NEAR(r.both_sum.median_gbps, both.aggregate, kTol);
  EXPECT_LT(r.both_d2h.median_gbps, 20.0 - 1.0);  // the shared link slowed it
  EXPECT_NEAR(r.h2d.min_gbps, r.h2d.max_gbps, kTol);  // a virtual clock does not jitter
  ASSERT_TRUE(r.pageable);
  EXPECT_NEAR(r.pageable_h2d.median_gbps, 25.0, kTol);
  EXPECT_NEAR(r.pageable_d2h.median_gbps, 20.0, kTol);
  const planner::link_profile l = r.link();
  EXPECT_EQ(l.local_ranks, 1);
  EXPECT_NEAR(l.h2d_gbps, 25.0, kTol);
  EXPECT_NEAR(l.d2h_gbps, 20.0, kTol);
  EXPECT_NEAR(l.bidir_gbps, both.aggregate, kTol);
  const nlohmann::json j = link_bench_to_json(r);
  EXPECT_NEAR(j["link"]["h2d_gbps"].get<double>(), 25.0, kTol);
  EXPECT_EQ(j["link_bench"]["buffer_bytes"], kMinLinkBytes);
  const std::string table = format_link_table(r);
  EXPECT_NE(table.find("pinned H2D"), std::string::npos) << table;
  EXPECT_NE(table.find("25.00"), std::string::npos) << table;
}

TEST_F(LinkBench, PerRankShareWhenLocalRanksShareTheLink) {
  STASH_REQUIRE_DOUBLE();
  test::double_api().set_bandwidth(40.0, 32.0, 48.0);
  ::setenv("LOCAL_WORLD_SIZE", "4", 1);
  link_bench_options o = small();
  o.pageable = false;
  const link_bench_result r = run_link_bench(o);
  EXPECT_EQ(r.sharers, 4);
  EXPECT_EQ(r.local_ranks, 4);
  // The double's copy engines serialize one direction: four copies carry what one does.
  EXPECT_NEAR(r.shared_h2d.median_gbps, 40.0, kTol);
  EXPECT_NEAR(r.shared_d2h.median_gbps, 32.0, kTol);
  // k H2D chunks then k D2H chunks: the same shape as one copy per direction.
  const both_rates both = double_both(40.0, 32.0, 48.0);
  EXPECT_NEAR(r.shared_both.median_gbps, both.aggregate, kTol);
  const planner::link_profile l = r.link();  // Note [Per-rank link share]
  EXPECT_NEAR(l.h2d_gbps, 10.0, kTol);
  EXPECT_NEAR(l.d2h_gbps, 8.0, kTol);
  EXPECT_NEAR(l.bidir_gbps, both.aggregate / 4, kTol);
  EXPECT_EQ(l.local_ranks, 4);
  // --sharers overrides LOCAL_WORLD_SIZE (ranks with links of their own).
  o.sharers = 1;
  EXPECT_NEAR(run_link_bench(o).link().h2d_gbps, 40.0, kTol);
}

TEST_F(LinkBench, BothDirectionsAtFullSpeedWhenTheLinkHasRoom) {
  STASH_REQUIRE_DOUBLE();
  test::double_api().set_bandwidth(25.0, 20.0, 60.0);
  link_bench_options o = small();
  o.pageable = false;
  const link_bench_result r = run_link_bench(o);
  EXPECT_NEAR(r.both_h2d.median_gbps, 25.0, kTol);
  EXPECT_NEAR(r.both_d2h.median_gbps, 20.0, kTol);
  // Both buffers' bytes over the slower direction's time.
  EXPECT_NEAR(r.both_sum.median_gbps, 40.0, kTol);
}

TEST_F(LinkBench, BufferShrinksToFreeDeviceMemory) {
  STASH_REQUIRE_DOUBLE();
  test::double_api().set_device_memory(200 * kMiB);
  link_bench_options o = small();
  o.bytes = kDefaultLinkBytes;
  o.samples = 1;
  o.warmups = 0;
  o.pageable = false;
  const link_bench_result r = run_link_bench(o);
  EXPECT_EQ(r.free_bytes, 200 * kMiB);
  EXPECT_EQ(r.buffer_bytes, 87 * kMiB);  // (200 - 25) / 2, rounded down to a MiB
  EXPECT_NEAR(r.h2d.median_gbps, 50.0, kTol);  // the double's default bandwidth
}

TEST_F(LinkBench, RefusesTooLittleDeviceMemoryOrATooSmallBuffer) {
  STASH_REQUIRE_DOUBLE();
  test::double_api().set_device_memory(140 * kMiB);
  try {
    run_link_bench(small());
    FAIL() << "expected a refusal";
  } catch (const stash::input_error& e) {
    EXPECT_NE(std::string(e.what()).find("64 MiB minimum"), std::string::npos) << e.what();
  }
  test::double_api().reset();
  link_bench_options o = small();
  o.bytes = 32 * kMiB;
  EXPECT_THROW(run_link_bench(o), stash::input_error);
  o = small();
  o.samples = 0;
  EXPECT_THROW(run_link_bench(o), stash::input_error);
}

TEST_F(LinkBench, CudaErrorsNameTheCallAndTheError) {
  STASH_REQUIRE_DOUBLE();
  test::double_api().inject_fault("cudaMemcpyAsync", 2, cudaErrorLaunchFailure);
  try {
    run_link_bench(small());
    FAIL() << "expected the injected fault";
  } catch (const measure_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("link_bench.cpp:"), std::string::npos) << what;
    EXPECT_NE(what.find("cudaMemcpyAsync"), std::string::npos) << what;
    EXPECT_NE(what.find("cudaErrorLaunchFailure"), std::string::npos) << what;
  }
  test::double_api().clear_faults();
}

// On a real GPU (the .gpu variant): plausible, self-consistent figures.
TEST_F(LinkBench, RealLinkFiguresArePlausible) {
  if (test::on_double()) GTEST_SKIP() << "the double's figures are checked exactly above";
  link_bench_options o = small();
  o.bytes = 256 * kMiB;
  const link_bench_result r = run_link_bench(o);
  for (const stash::rate_summary* x : {&r.h2d, &r.d2h, &r.both_sum}) {
    EXPECT_GT(x->median_gbps, 1.0);
    EXPECT_LT(x->median_gbps, 2000.0);
    EXPECT_LE(x->min_gbps, x->median_gbps);
    EXPECT_LE(x->median_gbps, x->max_gbps);
  }
  // Both directions at once never carry less than the slower single direction alone.
  EXPECT_GT(r.both_sum.median_gbps, 0.9 * std::min(r.h2d.median_gbps, r.d2h.median_gbps));
  std::printf("%s", format_link_table(r).c_str());
}

}  // namespace
}  // namespace stash::measure

namespace stash::measure {
namespace {

// The same benchmark through the C API (stash_link_measure), as stash.torch.fit calls it.
TEST_F(LinkBench, CApiReportsThePerRankLinkSection) {
  STASH_REQUIRE_DOUBLE();
  test::double_api().set_bandwidth(25.0, 20.0, 30.0);
  stash_link_result_t r;
  stash_link_result_init(&r);
  ASSERT_EQ(stash_link_measure(0, kMinLinkBytes, 1, &r), STASH_OK) << stash_last_error();
  EXPECT_NEAR(r.h2d_gbps, 25.0, kTol);
  EXPECT_NEAR(r.d2h_gbps, 20.0, kTol);
  EXPECT_NEAR(r.bidir_gbps, double_both(25.0, 20.0, 30.0).aggregate, kTol);
  EXPECT_EQ(r.local_ranks, 1);
  EXPECT_EQ(r.sharers, 1);
  EXPECT_EQ(r.buffer_bytes, kMinLinkBytes);
  EXPECT_GT(std::string(r.device_name).size(), 0u);

  EXPECT_EQ(stash_link_measure(0, kMinLinkBytes, 1, nullptr), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stash_link_measure(-1, kMinLinkBytes, 1, &r), STASH_ERROR_INVALID_ARGUMENT);
  r.struct_size = 8;
  EXPECT_EQ(stash_link_measure(0, kMinLinkBytes, 1, &r), STASH_ERROR_VERSION_MISMATCH);
  stash_link_result_init(&r);
  EXPECT_EQ(stash_link_measure(0, kMinLinkBytes / 2, 1, &r), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stash_last_error()).find("stash_link_measure: "), std::string::npos)
      << stash_last_error();
}

}  // namespace
}  // namespace stash::measure
