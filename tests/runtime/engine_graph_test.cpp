// The engine under CUDA graphs through the C API (Note [Capturing a step] in
// runtime/engine/prefetch_engine.h): a step captured once and replayed equals the eager
// step bit for bit, with no race in the replays; a plan change refuses replay until the
// step is captured again; calls capture forbids are refused by name, and the CUDA capture
// stays valid. On the test double (its capture and graph replay: tests/cudart_double).
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "double_api.h"
#include "stash.h"

namespace {

constexpr std::size_t kN = 64 << 10;  // bytes per tensor
constexpr std::uint32_t kLayers = 3, kPer = 2;
constexpr std::size_t kTensors = kLayers * kPer;

class EngineGraph : public ::testing::Test {
 protected:
  void SetUp() override {
    STASH_REQUIRE_DOUBLE();
    stash::test::double_api().reset();
    stash::test::double_api().clear_violations();
    ASSERT_EQ(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(stash_device_pool_create(nullptr, &pool_), STASH_OK) << stash_last_error();
    ASSERT_EQ(cudaMallocHost(&in_, kTensors * kN), cudaSuccess);
    ASSERT_EQ(cudaMallocHost(&out_, kTensors * kN), cudaSuccess);
    stash_engine_config_init(&cfg_);
    cfg_.compute_stream = compute_;
    cfg_.device_pool = pool_;
    cfg_.pinned_cap_bytes = std::size_t{64} << 20;
  }
  void TearDown() override {
    stash_engine_destroy(engine_);
    stash_device_pool_destroy(pool_);
    if (in_) cudaFreeHost(in_);
    if (out_) cudaFreeHost(out_);
    if (compute_) cudaStreamDestroy(compute_);
  }

  void make(const std::vector<stash_action_t>& actions) {
    ASSERT_EQ(stash_engine_create(&cfg_, &engine_), STASH_OK) << stash_last_error();
    set_plan(actions);
  }
  stash_status_t set_plan(const std::vector<stash_action_t>& actions) {
    actions_ = actions;
    const std::vector<std::size_t> per(kLayers, kPer);
    return stash_engine_set_plan(engine_, kLayers, per.data(), actions.data());
  }
  void destroy() { stash_engine_destroy(std::exchange(engine_, nullptr)); }

  // Each step's input: a pattern of its own.
  void set_input(int step) {
    auto* p = static_cast<unsigned char*>(in_);
    for (std::size_t i = 0; i < kTensors * kN; ++i)
      p[i] = static_cast<unsigned char>((i * 131 + step * 17 + (i >> 12)) & 0xff);
  }

  // One step: every tensor is produced on the compute stream (a copy from the pinned
  // input), handed to the engine, and in backward read back into the pinned output.
  // Returns the first failing status.
  stash_status_t step() {
    auto* in = static_cast<unsigned char*>(in_);
    auto* out = static_cast<unsigned char*>(out_);
    void* kept[kTensors] = {};
    stash_status_t st = STASH_OK;
#define STEP_TRY(call) \
  if ((st = (call)) != STASH_OK) return st
    for (std::uint32_t l = 0; l < kLayers; ++l) {
      STEP_TRY(stash_engine_forward_begin(engine_, 0, l));
      for (std::uint32_t j = 0; j < kPer; ++j) {
        void* d = nullptr;
        STEP_TRY(stash_device_alloc(pool_, kN, compute_, &d));
        if (cudaMemcpyAsync(d, in + (l * kPer + j) * kN, kN, cudaMemcpyHostToDevice,
                            compute_) != cudaSuccess)
          return STASH_ERROR_CUDA;
        STEP_TRY(stash_engine_offload(engine_, {0, l, j}, d, kN, compute_));
        if (actions_[l * kPer + j] == STASH_ACTION_KEEP) kept[l * kPer + j] = d;
      }
      STEP_TRY(stash_engine_forward_end(engine_, 0, l));
    }
    for (std::uint32_t l = kLayers; l-- > 0;) {
      STEP_TRY(stash_engine_backward_begin(engine_, 0, l));
      for (std::uint32_t j = 0; j < kPer; ++j) {
        void* p = nullptr;
        STEP_TRY(stash_engine_acquire(engine_, {0, l, j}, compute_, &p));
        if (cudaMemcpyAsync(out + (l * kPer + j) * kN, p, kN, cudaMemcpyDeviceToHost,
                            compute_) != cudaSuccess)
          return STASH_ERROR_CUDA;
        STEP_TRY(stash_engine_release(engine_, {0, l, j}));
        if (void* d = kept[l * kPer + j]) STEP_TRY(stash_device_free(pool_, d, nullptr, 0));
      }
      STEP_TRY(stash_engine_backward_end(engine_, 0, l));
    }
#undef STEP_TRY
    return STASH_OK;
  }
  std::vector<unsigned char> output() {
    EXPECT_EQ(cudaStreamSynchronize(compute_), cudaSuccess);
    const auto* p = static_cast<const unsigned char*>(out_);
    return std::vector<unsigned char>(p, p + kTensors * kN);
  }
  stash_status_t capture() {
    stash_status_t st = stash_engine_capture_begin(engine_, 0);
    if (st != STASH_OK) return st;
    st = step();
    const stash_status_t end = stash_engine_capture_end(engine_);
    return st != STASH_OK ? st : end;
  }
  void expect_no_race() {
    EXPECT_EQ(stash::test::double_api().violation_count(), 0u);
    for (const std::string& v : stash::test::double_api().violations()) ADD_FAILURE() << v;
  }
  cudaStreamCaptureStatus capture_status() {
    cudaStreamCaptureStatus s = cudaStreamCaptureStatusNone;
    EXPECT_EQ(cudaStreamIsCapturing(compute_, &s), cudaSuccess);
    return s;
  }

  cudaStream_t compute_ = nullptr;
  stash_device_pool_t* pool_ = nullptr;
  stash_engine_config_t cfg_;
  stash_engine_t* engine_ = nullptr;
  void* in_ = nullptr;
  void* out_ = nullptr;
  std::vector<stash_action_t> actions_;
};

const std::vector<stash_action_t> kMixed = {STASH_ACTION_OFFLOAD, STASH_ACTION_KEEP,
                                            STASH_ACTION_OFFLOAD, STASH_ACTION_OFFLOAD,
                                            STASH_ACTION_KEEP,    STASH_ACTION_OFFLOAD};
const std::vector<stash_action_t> kAllOffload(kTensors, STASH_ACTION_OFFLOAD);

TEST_F(EngineGraph, ReplayEqualsTheEagerStepBitForBit) {
  constexpr int kSteps = 4;
  std::vector<std::vector<unsigned char>> eager;
  make(kMixed);
  for (int i = 0; i < kSteps; ++i) {
    set_input(i);
    ASSERT_EQ(step(), STASH_OK) << stash_last_error();
    eager.push_back(output());
    // The round trip itself: what backward read is what forward produced.
    ASSERT_EQ(std::memcmp(eager.back().data(), in_, kTensors * kN), 0) << "step " << i;
  }
  destroy();

  make(kMixed);
  set_input(0);
  ASSERT_EQ(step(), STASH_OK) << stash_last_error();  // eager: sizes the pools
  EXPECT_EQ(output(), eager[0]);
  std::memset(out_, 0xee, kTensors * kN);
  ASSERT_EQ(capture(), STASH_OK) << stash_last_error();
  const std::vector<unsigned char> untouched(kTensors * kN, 0xee);
  EXPECT_EQ(output(), untouched) << "a capture records the step; nothing of it may run";
  for (int i = 1; i < kSteps; ++i) {
    set_input(i);
    ASSERT_EQ(stash_engine_replay(engine_), STASH_OK) << stash_last_error();
    EXPECT_EQ(output(), eager[i]) << "replay of step " << i;
  }
  int ready = 0;
  std::uint64_t captures = 0, replays = 0;
  ASSERT_EQ(stash_engine_graph_state(engine_, nullptr, &ready, &captures, &replays), STASH_OK);
  EXPECT_EQ(ready, 1);
  EXPECT_EQ(captures, 1u);
  EXPECT_EQ(replays, std::uint64_t{kSteps - 1});
  // An eager step after the replays still works, on the same engine and pools.
  set_input(7);
  ASSERT_EQ(step(), STASH_OK) << stash_last_error();
  EXPECT_EQ(std::memcmp(output().data(), in_, kTensors * kN), 0);
  expect_no_race();
}

TEST_F(EngineGraph, APlanChangeRefusesReplayUntilTheStepIsCapturedAgain) {
  make(kMixed);
  set_input(0);
  ASSERT_EQ(step(), STASH_OK) << stash_last_error();
  EXPECT_EQ(stash_engine_replay(engine_), STASH_ERROR_CAPTURE);
  EXPECT_NE(std::string(stash_last_error()).find("no step has been captured"), std::string::npos);
  ASSERT_EQ(capture(), STASH_OK) << stash_last_error();
  ASSERT_EQ(stash_engine_replay(engine_), STASH_OK) << stash_last_error();
  output();

  ASSERT_EQ(set_plan(kAllOffload), STASH_OK) << stash_last_error();
  EXPECT_EQ(stash_engine_replay(engine_), STASH_ERROR_CAPTURE);
  EXPECT_NE(std::string(stash_last_error()).find("set_plan"), std::string::npos)
      << stash_last_error();
  int ready = 1;
  ASSERT_EQ(stash_engine_graph_state(engine_, nullptr, &ready, nullptr, nullptr), STASH_OK);
  EXPECT_EQ(ready, 0);

  ASSERT_EQ(step(), STASH_OK) << stash_last_error();  // the new plan, eagerly first
  ASSERT_EQ(capture(), STASH_OK) << stash_last_error();
  set_input(3);
  ASSERT_EQ(stash_engine_replay(engine_), STASH_OK) << stash_last_error();
  EXPECT_EQ(std::memcmp(output().data(), in_, kTensors * kN), 0);
  stash_engine_stats_t s;
  stash_engine_stats_init(&s);
  ASSERT_EQ(stash_engine_stats(engine_, &s), STASH_OK);
  // The eager steps and the captures: 4 + 4 (mixed), 6 + 6 (all offload).
  EXPECT_EQ(s.offloaded_count, 20u);
  expect_no_race();
}

// The in-flight cap would wait on the host for a copy (cudaEventSynchronize): under
// capture the offload is refused by name, the CUDA capture is still active (not
// invalidated), and end_capture discards the graph with that reason.
TEST_F(EngineGraph, CallsCaptureForbidsAreRefusedByNameWithoutInvalidating) {
  cfg_.max_in_flight_count = 1;
  make(kAllOffload);
  set_input(0);
  ASSERT_EQ(step(), STASH_OK) << stash_last_error();  // eagerly the cap just waits
  output();

  ASSERT_EQ(stash_engine_capture_begin(engine_, 0), STASH_OK) << stash_last_error();
  EXPECT_EQ(capture_status(), cudaStreamCaptureStatusActive);
  ASSERT_EQ(stash_engine_forward_begin(engine_, 0, 0), STASH_OK);
  void* d[2] = {};
  for (std::uint32_t j = 0; j < 2; ++j) {
    ASSERT_EQ(stash_device_alloc(pool_, kN, compute_, &d[j]), STASH_OK) << stash_last_error();
    ASSERT_EQ(cudaMemcpyAsync(d[j], in_, kN, cudaMemcpyHostToDevice, compute_), cudaSuccess);
  }
  ASSERT_EQ(stash_engine_offload(engine_, {0, 0, 0}, d[0], kN, compute_), STASH_OK)
      << stash_last_error();
  EXPECT_EQ(stash_engine_offload(engine_, {0, 0, 1}, d[1], kN, compute_), STASH_ERROR_CAPTURE);
  const std::string why = stash_last_error();
  EXPECT_NE(why.find("in-flight cap"), std::string::npos) << why;
  EXPECT_NE(why.find("cudaEventSynchronize"), std::string::npos) << why;
  EXPECT_EQ(capture_status(), cudaStreamCaptureStatusActive) << "the refusal must not invalidate";

  EXPECT_EQ(stash_engine_synchronize(engine_), STASH_ERROR_CAPTURE);
  EXPECT_NE(std::string(stash_last_error()).find("synchronize"), std::string::npos);
  EXPECT_EQ(set_plan(kMixed), STASH_ERROR_CAPTURE);
  EXPECT_NE(std::string(stash_last_error()).find("set_plan"), std::string::npos);
  EXPECT_EQ(stash_engine_replay(engine_), STASH_ERROR_CAPTURE);
  EXPECT_EQ(capture_status(), cudaStreamCaptureStatusActive);

  EXPECT_EQ(stash_engine_capture_end(engine_), STASH_ERROR_CAPTURE);
  EXPECT_NE(std::string(stash_last_error()).find("in-flight cap"), std::string::npos)
      << stash_last_error();
  EXPECT_EQ(capture_status(), cudaStreamCaptureStatusNone);
  int ready = 1;
  ASSERT_EQ(stash_engine_graph_state(engine_, nullptr, &ready, nullptr, nullptr), STASH_OK);
  EXPECT_EQ(ready, 0);
  EXPECT_EQ(stash_engine_replay(engine_), STASH_ERROR_CAPTURE);
}

// A graph must hold a whole step: ending the capture with a tensor still live refuses.
TEST_F(EngineGraph, APartialStepIsNotKept) {
  make(kMixed);
  set_input(0);
  ASSERT_EQ(step(), STASH_OK) << stash_last_error();
  output();
  ASSERT_EQ(stash_engine_capture_begin(engine_, 0), STASH_OK) << stash_last_error();
  ASSERT_EQ(stash_engine_forward_begin(engine_, 0, 0), STASH_OK);
  void* d = nullptr;
  ASSERT_EQ(stash_device_alloc(pool_, kN, compute_, &d), STASH_OK) << stash_last_error();
  ASSERT_EQ(cudaMemcpyAsync(d, in_, kN, cudaMemcpyHostToDevice, compute_), cudaSuccess);
  ASSERT_EQ(stash_engine_offload(engine_, {0, 0, 0}, d, kN, compute_), STASH_OK);
  EXPECT_EQ(stash_engine_capture_end(engine_), STASH_ERROR_CAPTURE);
  EXPECT_NE(std::string(stash_last_error()).find("still holds"), std::string::npos)
      << stash_last_error();
  EXPECT_EQ(stash_engine_capture_begin(engine_, 0), STASH_ERROR_ILLEGAL_TRANSITION);
}

}  // namespace
