// The real CUPTI profiler and `stash profile` on a GPU (label gpu; skipped without one).
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/kernels/fill_checksum.h"
#include "planner/model/profile.h"
#include "runtime/measure/attribution.h"
#include "runtime/measure/cupti_profiler.h"
#include "stash.h"
#include "test_paths.h"

namespace stash::measure {
namespace {

constexpr size_t kBytes = size_t{256} << 20;

// The profiler of this binary (runtime/measure linked statically) with its own scope calls.
TEST(CuptiProfiler, AttributesKernelsToScopesByLaunch) {
  void* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, kBytes), cudaSuccess);
  cupti_profiler& p = cupti_profiler::process();
  const std::string why = p.start(profiler_options{});
  ASSERT_TRUE(why.empty()) << "profiling unavailable: " << why;
  int launched = 0;
  for (int step = 0; step < 3; ++step) {
    p.scope_push("stash:layer:0:fwd");
    p.scope_push("stash:tensor:h");
    ASSERT_EQ(kernels::fill_pattern(buf, kBytes, step, nullptr), cudaSuccess);
    ++launched;
    p.scope_pop();
    ASSERT_EQ(kernels::fill_pattern(buf, kBytes, step + 1, nullptr), cudaSuccess);
    ++launched;
    p.scope_pop();  // its kernels are still running: they must stay with layer 0's forward
    p.scope_push("stash:layer:0:bwd");
    ASSERT_EQ(kernels::fill_pattern(buf, kBytes, step + 2, nullptr), cudaSuccess);
    ++launched;
    p.scope_pop();
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const measurement m = attribute(p.stop());
  ASSERT_EQ(cudaFree(buf), cudaSuccess);
  EXPECT_EQ(m.dropped_records, 0u);
  EXPECT_GE(m.kernels, static_cast<std::uint64_t>(launched));
  EXPECT_GE(m.kernels_by_correlation, static_cast<std::uint64_t>(launched));
  ASSERT_EQ(m.layers.count(0), 1u);
  ASSERT_EQ(m.layers.at(0).fwd_ms.size(), 3u);
  ASSERT_EQ(m.layers.at(0).bwd_ms.size(), 3u);
  const double fwd = median(m.layers.at(0).fwd_ms), bwd = median(m.layers.at(0).bwd_ms);
  const double h = median(m.tensors.at({0, "h"}));
  EXPECT_GT(h, 0.0);
  EXPECT_GT(fwd, h);  // two fills against one
  EXPECT_GT(bwd, 0.0);
  std::printf("layer 0: fwd %.3f ms, bwd %.3f ms, tensor h %.3f ms\n", fwd, bwd, h);
}

// The C API end to end: libstash's profiler, its scopes, and the profile it writes.
TEST(CuptiProfiler, CApiWritesAProfileWithoutSkeleton) {
  void* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, kBytes), cudaSuccess);
  ASSERT_EQ(stash_profiler_start(), STASH_OK) << stash_last_error();
  for (int step = 0; step < 2; ++step) {
    for (int layer = 0; layer < 2; ++layer) {
      ASSERT_EQ(stash_profile_scope_begin(STASH_SCOPE_FORWARD, layer, nullptr), STASH_OK);
      ASSERT_EQ(kernels::fill_pattern(buf, kBytes, step, nullptr), cudaSuccess);
      ASSERT_EQ(stash_profile_scope_end(), STASH_OK);
    }
    for (int layer = 1; layer >= 0; --layer) {
      ASSERT_EQ(stash_profile_scope_begin(STASH_SCOPE_BACKWARD, layer, nullptr), STASH_OK);
      ASSERT_EQ(kernels::fill_pattern(buf, kBytes, step, nullptr), cudaSuccess);
      ASSERT_EQ(kernels::fill_pattern(buf, kBytes, step, nullptr), cudaSuccess);
      ASSERT_EQ(stash_profile_scope_end(), STASH_OK);
    }
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::string out = ::testing::TempDir() + "/capi_gpu_profile.json";
  ASSERT_EQ(stash_profiler_stop(nullptr, out.c_str()), STASH_OK) << stash_last_error();
  ASSERT_EQ(cudaFree(buf), cudaSuccess);
  nlohmann::json j;
  std::ifstream(out) >> j;
  EXPECT_EQ(j["plannable"], false);
  ASSERT_EQ(j["layers"].size(), 2u);
  for (const auto& l : j["layers"]) {
    EXPECT_GT(l["fwd_ms"].get<double>(), 0.0);
    EXPECT_GT(l["bwd_ms"].get<double>(), l["fwd_ms"].get<double>());
  }
  EXPECT_GE(j["measurement"]["kernels_by_correlation"].get<int>(), 12);
}

TEST(StashProfile, InjectsIntoAnyProgramAndFillsTheSkeleton) {
  const std::string dir = ::testing::TempDir();
  const std::string skeleton = dir + "/gpu_skeleton.json", out = dir + "/gpu_profile.json";
  nlohmann::json sk = {{"schema", "stash.profile/1"},
                       {"source", "analytic"},
                       {"device", {{"name", "gpu"}, {"memory_bytes", 80000000000ull}}},
                       {"link", {{"h2d_gbps", 1.0}, {"d2h_gbps", 1.0}, {"bidir_gbps", 1.0},
                                 {"local_ranks", 1u}}},
                       {"host", {{"pinnable_bytes", 100000000000ull}}},
                       {"fixed_bytes", 1000000000u},
                       {"layers", nlohmann::json::array()}};
  for (int i = 0; i < 2; ++i) {
    sk["layers"].push_back({{"name", "layers." + std::to_string(i)},
                            {"signature", "block"}, {"fwd_ms", 0}, {"bwd_ms", 0},
                            {"bwd_temp_bytes", 0u},
                            {"tensors", {{{"name", "h"}, {"bytes", 268435456u}, {"recompute_ms", 0},
                                          {"offloadable", true}, {"recomputable", true},
                                          {"must_keep", false}}}}});
  }
  std::ofstream(skeleton) << sk.dump();
  const std::string cmd = STASH_TEST_PATH(STASH_CLI) + " profile -o " + out + " --skeleton " +
                          skeleton + " -- " + STASH_TEST_PATH(STASH_WORKLOAD) + " 2>&1";
  FILE* f = ::popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string output;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f)) output += buf;
  const int st = ::pclose(f);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << output;
  std::printf("%s", output.c_str());
  const planner::step_profile p = planner::load_profile(out);
  EXPECT_EQ(p.source, planner::profile_source::measured);
  ASSERT_EQ(p.layers.size(), 2u);
  for (const planner::layer_profile& l : p.layers) {
    EXPECT_GT(l.fwd_ms, 0.0) << l.name;
    EXPECT_GT(l.bwd_ms, l.fwd_ms) << l.name;  // three fills against two
    EXPECT_GT(l.tensors[0].recompute_ms, 0.0) << l.name;
    EXPECT_LT(l.tensors[0].recompute_ms, l.fwd_ms) << l.name;
  }
}

}  // namespace
}  // namespace stash::measure
