// The engine's C API (stash.h): handles, configs, status codes, plans from files, stats,
// trace and overlap report. The engine's behaviour itself is covered by engine_tests.
#include <cstdio>
#include <fstream>
#include <string>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "double_api.h"
#include "planner/model/trace.h"
#include "stash.h"

namespace {

class EngineApi : public ::testing::Test {
 protected:
  void SetUp() override {
    if (stash::test::on_double()) stash::test::double_api().reset();
    ASSERT_EQ(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(stash_device_pool_create(nullptr, &pool_), STASH_OK) << stash_last_error();
    stash_engine_config_init(&cfg_);
    cfg_.compute_stream = compute_;
    cfg_.device_pool = pool_;
    cfg_.pinned_cap_bytes = size_t{64} << 20;
  }
  void TearDown() override {
    stash_engine_destroy(engine_);
    stash_device_pool_destroy(pool_);
    cudaStreamDestroy(compute_);
  }
  std::string temp(const char* name) {
    return ::testing::TempDir() + "stash_engine_api_" + name;
  }

  cudaStream_t compute_ = nullptr;
  stash_device_pool_t* pool_ = nullptr;
  stash_engine_config_t cfg_;
  stash_engine_t* engine_ = nullptr;
};

TEST_F(EngineApi, CreateValidatesItsConfig) {
  EXPECT_EQ(stash_engine_create(&cfg_, nullptr), STASH_ERROR_INVALID_ARGUMENT);
  stash_engine_config_t bad = cfg_;
  bad.struct_size = 8;
  EXPECT_EQ(stash_engine_create(&bad, &engine_), STASH_ERROR_VERSION_MISMATCH);
  EXPECT_EQ(engine_, nullptr);
  bad = cfg_;
  bad.device_pool = nullptr;  // neither a pool nor callbacks
  EXPECT_EQ(stash_engine_create(&bad, &engine_), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stash_last_error()).find("device pool"), std::string::npos);
  bad = cfg_;
  bad.lookahead = 0;
  EXPECT_EQ(stash_engine_create(&bad, &engine_), STASH_ERROR_INVALID_ARGUMENT);
  stash_engine_destroy(nullptr);  // a no-op
  ASSERT_EQ(stash_engine_create(&cfg_, &engine_), STASH_OK) << stash_last_error();
  stash_stream_t d2h = nullptr, h2d = nullptr;
  ASSERT_EQ(stash_engine_streams(engine_, &d2h, &h2d), STASH_OK);
  EXPECT_NE(d2h, nullptr);
  EXPECT_NE(h2d, d2h);
}

TEST_F(EngineApi, StatusCodesOfTheStateMachine) {
  ASSERT_EQ(stash_engine_create(&cfg_, &engine_), STASH_OK);
  stash_tensor_key_t k = {0, 0, 0};
  void* out = reinterpret_cast<void*>(1);
  EXPECT_EQ(stash_engine_acquire(engine_, k, compute_, &out), STASH_ERROR_NO_PLAN);
  EXPECT_EQ(out, nullptr);
  size_t per[] = {2, 1};
  stash_action_t act[] = {STASH_ACTION_OFFLOAD, STASH_ACTION_RECOMPUTE, STASH_ACTION_KEEP};
  ASSERT_EQ(stash_engine_set_plan(engine_, 2, per, act), STASH_OK) << stash_last_error();
  stash_action_t a;
  ASSERT_EQ(stash_engine_action(engine_, 0, 1, &a), STASH_OK);
  EXPECT_EQ(a, STASH_ACTION_RECOMPUTE);
  EXPECT_EQ(stash_engine_action(engine_, 1, 1, &a), STASH_ERROR_UNKNOWN_TENSOR);
  EXPECT_EQ(stash_engine_acquire(engine_, k, compute_, &out), STASH_ERROR_ILLEGAL_TRANSITION);
  EXPECT_NE(std::string(stash_last_error()).find("acquire before offload"), std::string::npos);
  stash_tensor_state_t st;
  stash_status_t err;
  ASSERT_EQ(stash_engine_tensor_state(engine_, k, &st, &err), STASH_OK);
  EXPECT_EQ(st, STASH_TENSOR_NOT_OFFERED);
  void* p = nullptr;
  ASSERT_EQ(stash_device_alloc(pool_, 4096, compute_, &p), STASH_OK);
  ASSERT_EQ(stash_engine_offload(engine_, k, p, 4096, compute_), STASH_OK) << stash_last_error();
  ASSERT_EQ(stash_engine_tensor_state(engine_, k, &st, &err), STASH_OK);
  EXPECT_TRUE(st == STASH_TENSOR_OFFLOADING || st == STASH_TENSOR_ON_HOST) << st;
  EXPECT_EQ(err, STASH_OK);
  ASSERT_EQ(stash_engine_acquire(engine_, k, compute_, &out), STASH_OK);
  EXPECT_NE(out, nullptr);
  EXPECT_EQ(stash_engine_release(engine_, k), STASH_OK);
  EXPECT_EQ(stash_engine_release(engine_, k), STASH_ERROR_ILLEGAL_TRANSITION);
  EXPECT_NE(std::string(stash_last_error()).find("double release"), std::string::npos);
  EXPECT_EQ(stash_engine_release(nullptr, k), STASH_ERROR_INVALID_ARGUMENT);
  stash_engine_stats_t s;
  stash_engine_stats_init(&s);
  ASSERT_EQ(stash_engine_stats(engine_, &s), STASH_OK);
  EXPECT_EQ(s.offloaded_count, 1u);
  EXPECT_EQ(s.prefetched_count, 1u);
  EXPECT_EQ(s.released_count, 1u);
  EXPECT_GT(s.pinned.total_count, 0u);
}

TEST_F(EngineApi, PlanFromFileAndBadPlans) {
  ASSERT_EQ(stash_engine_create(&cfg_, &engine_), STASH_OK);
  const std::string good = temp("plan.json"), bad = temp("bad.json");
  std::ofstream(good) << R"({"schema": "stash.plan/1", "layers": [
      {"index": 0, "name": "layers.0", "tensors": [{"name": "x", "action": "offload"},
                                                  {"name": "y", "action": "keep"}]},
      {"index": 1, "name": "layers.1", "tensors": [{"name": "x", "action": "recompute"}]}]})";
  ASSERT_EQ(stash_engine_load_plan(engine_, good.c_str()), STASH_OK) << stash_last_error();
  stash_action_t a;
  ASSERT_EQ(stash_engine_action(engine_, 1, 0, &a), STASH_OK);
  EXPECT_EQ(a, STASH_ACTION_RECOMPUTE);
  std::ofstream(bad) << R"({"schema": "stash.plan/1", "layers": [{"tensors": [{"action": "swap"}]}]})";
  EXPECT_EQ(stash_engine_load_plan(engine_, bad.c_str()), STASH_ERROR_BAD_PLAN);
  EXPECT_NE(std::string(stash_last_error()).find("layers[0].tensors[0].action"), std::string::npos)
      << stash_last_error();
  EXPECT_NE(std::string(stash_last_error())
                .find(bad + ": layers[0].tensors[0].action: unknown action"),
            std::string::npos)
      << stash_last_error();  // Note [One plan reader]: the file and the JSON path
  std::ofstream(bad) << R"({"schema": "stash.plan/9", "layers": []})";
  EXPECT_EQ(stash_engine_load_plan(engine_, bad.c_str()), STASH_ERROR_BAD_PLAN);
  EXPECT_NE(std::string(stash_last_error()).find("schema"), std::string::npos);
  EXPECT_EQ(stash_engine_load_plan(engine_, "/nonexistent/plan.json"), STASH_ERROR_BAD_PLAN);
  EXPECT_EQ(stash_engine_load_plan(engine_, nullptr), STASH_ERROR_INVALID_ARGUMENT);
}

TEST_F(EngineApi, TraceAndOverlapReport) {
  STASH_REQUIRE_DOUBLE();
  stash::test::double_api().set_bandwidth(1.0, 1.0, 2.0);  // 1e6 bytes per virtual ms
  ASSERT_EQ(stash_engine_create(&cfg_, &engine_), STASH_OK);
  // Every stream paused while the step is enqueued: no copy is seen complete by the host
  // before the engine enqueues its waits, so the virtual times depend on the call order
  // alone (a host that saw the D2H finish would rightly skip the turn's wait, and the
  // virtual clock would then show none: the test raced on that under ASan).
  stash_stream_t d2h_stream = nullptr, h2d_stream = nullptr;
  ASSERT_EQ(stash_engine_streams(engine_, &d2h_stream, &h2d_stream), STASH_OK);
  const cudaStream_t paused[] = {compute_, static_cast<cudaStream_t>(d2h_stream),
                                 static_cast<cudaStream_t>(h2d_stream)};
  for (cudaStream_t s : paused)
    ASSERT_EQ(stash::test::double_api().stream_pause(s), cudaSuccess);
  size_t per[] = {1, 0};
  stash_action_t act[] = {STASH_ACTION_OFFLOAD};
  ASSERT_EQ(stash_engine_set_plan(engine_, 2, per, act), STASH_OK);
  const stash_tensor_key_t k = {0, 0, 0};
  void* p = nullptr;
  ASSERT_EQ(stash_device_alloc(pool_, 2000000, compute_, &p), STASH_OK);
  ASSERT_EQ(stash_engine_forward_begin(engine_, 0, 0), STASH_OK);
  ASSERT_EQ(stash::test::double_api().enqueue_compute(compute_, 1.0, "fwd0", nullptr, nullptr, 0,
                                                      nullptr, nullptr, 0),
            cudaSuccess);
  ASSERT_EQ(stash_engine_forward_end(engine_, 0, 0), STASH_OK);
  ASSERT_EQ(stash_engine_offload(engine_, k, p, 2000000, compute_), STASH_OK);
  ASSERT_EQ(stash_engine_backward_begin(engine_, 0, 1), STASH_OK);  // waits 2 ms (turn)
  ASSERT_EQ(stash_engine_backward_end(engine_, 0, 1), STASH_OK);
  ASSERT_EQ(stash_engine_backward_begin(engine_, 0, 0), STASH_OK);
  void* q = nullptr;
  ASSERT_EQ(stash_engine_acquire(engine_, k, compute_, &q), STASH_OK);  // waits 2 ms (h2d)
  ASSERT_EQ(stash_engine_release(engine_, k), STASH_OK);
  ASSERT_EQ(stash_engine_backward_end(engine_, 0, 0), STASH_OK);
  for (cudaStream_t s : paused)
    ASSERT_EQ(stash::test::double_api().stream_resume(s), cudaSuccess);
  stash_overlap_t total, layers[4];
  size_t n = 0;
  ASSERT_EQ(stash_engine_overlap(engine_, &total, layers, 4, &n), STASH_OK) << stash_last_error();
  EXPECT_EQ(total.layer, -1);
  EXPECT_NEAR(total.copy_ms, 4.0, 1e-3);
  EXPECT_NEAR(total.exposed_ms, 4.0, 1e-3);
  EXPECT_NEAR(total.hidden_ms, 0.0, 1e-3);
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(layers[0].layer, 0);
  const std::string path = temp("trace.json");
  ASSERT_EQ(stash_engine_write_trace(engine_, path.c_str()), STASH_OK) << stash_last_error();
  nlohmann::json j;
  std::ifstream(path) >> j;
  const stash::planner::trace_writer t = stash::planner::trace_from_json(j);
  bool d2h = false, h2d = false, fwd = false;
  for (const auto& s : t.spans()) {
    d2h |= s.track == "stash d2h" && s.kind == stash::planner::span_kind::d2h;
    h2d |= s.track == "stash h2d" && s.kind == stash::planner::span_kind::h2d;
    fwd |= s.track == "compute" && s.kind == stash::planner::span_kind::forward;
  }
  EXPECT_TRUE(d2h && h2d && fwd) << j.dump().substr(0, 400);
  EXPECT_EQ(stash_engine_write_trace(engine_, "/nonexistent/dir/trace.json"),
            STASH_ERROR_INVALID_ARGUMENT);
}

int calls_alloc = 0, calls_release = 0;
int test_alloc(void** out, size_t bytes, stash_stream_t s, void*) {
  ++calls_alloc;
  return cudaMallocAsync(out, bytes, reinterpret_cast<cudaStream_t>(s)) == cudaSuccess ? 0 : 1;
}
void test_release(void* p, size_t, stash_stream_t s, void*) {
  ++calls_release;
  cudaFreeAsync(p, reinterpret_cast<cudaStream_t>(s));
}

TEST_F(EngineApi, CallerAllocatorCallbacks) {
  cfg_.device_pool = nullptr;
  cfg_.device_alloc = test_alloc;
  cfg_.device_release = test_release;
  ASSERT_EQ(stash_engine_create(&cfg_, &engine_), STASH_OK) << stash_last_error();
  size_t per[] = {1, 0};
  stash_action_t act[] = {STASH_ACTION_OFFLOAD};
  ASSERT_EQ(stash_engine_set_plan(engine_, 2, per, act), STASH_OK);
  void* p = nullptr;
  ASSERT_EQ(cudaMallocAsync(&p, 10000, compute_), cudaSuccess);
  const stash_tensor_key_t k = {0, 0, 0};
  ASSERT_EQ(stash_engine_offload(engine_, k, p, 10000, compute_), STASH_OK);
  ASSERT_EQ(stash_engine_synchronize(engine_), STASH_OK);
  EXPECT_EQ(calls_release, 1);
  void* q = nullptr;
  ASSERT_EQ(stash_engine_acquire(engine_, k, compute_, &q), STASH_OK);
  EXPECT_EQ(calls_alloc, 1);
  ASSERT_EQ(stash_engine_release(engine_, k), STASH_OK);
  EXPECT_EQ(calls_release, 2);
}

}  // namespace
