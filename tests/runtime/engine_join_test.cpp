// A capture begun by the caller (Note [Capture begun by the caller] in
// runtime/engine/prefetch_engine.h), through the C API on the double: the caller begins
// and ends the capture and replays the graph itself; the engine joins it. The graph the
// caller gets replays the eager step bit for bit with no race; the engine's side streams
// end joined (the caller's end of capture succeeds); the pinned blocks stay held for the
// graph's life; refusals name the call and leave the caller's capture valid.
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

const std::vector<stash_action_t> kMixed = {STASH_ACTION_OFFLOAD, STASH_ACTION_KEEP,
                                            STASH_ACTION_OFFLOAD, STASH_ACTION_OFFLOAD,
                                            STASH_ACTION_KEEP,    STASH_ACTION_OFFLOAD};
constexpr std::size_t kOffloads = 4;  // in kMixed

// The caller's allocator as a framework's would be under capture: stream-ordered, so a
// block allocated while its stream captures is graph memory (the double's memory nodes).
int async_alloc(void** out, std::size_t bytes, stash_stream_t s, void*) {
  return cudaMallocAsync(out, bytes, reinterpret_cast<cudaStream_t>(s)) == cudaSuccess ? 0 : 1;
}
void async_release(void* p, std::size_t, stash_stream_t s, void*) {
  cudaFreeAsync(p, reinterpret_cast<cudaStream_t>(s));
}

class EngineJoin : public ::testing::Test {
 protected:
  void SetUp() override {
    STASH_REQUIRE_DOUBLE();
    stash::test::double_api().reset();
    stash::test::double_api().clear_violations();
    ASSERT_EQ(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(stash_device_pool_create(nullptr, &pool_), STASH_OK) << stash_last_error();
    ASSERT_EQ(cudaMallocHost(&in_, kTensors * kN), cudaSuccess);
    ASSERT_EQ(cudaMallocHost(&out_, kTensors * kN), cudaSuccess);
    ASSERT_EQ(cudaMallocHost(&out2_, kTensors * kN), cudaSuccess);
    stash_engine_config_init(&cfg_);
    cfg_.compute_stream = compute_;
    cfg_.device_pool = pool_;
    cfg_.pinned_cap_bytes = std::size_t{64} << 20;
  }
  void TearDown() override {
    if (graph_) cudaGraphExecDestroy(graph_);
    stash_engine_destroy(engine_);
    stash_device_pool_destroy(pool_);
    if (in_) cudaFreeHost(in_);
    if (out_) cudaFreeHost(out_);
    if (out2_) cudaFreeHost(out2_);
    if (side_) cudaStreamDestroy(side_);
    if (compute_) cudaStreamDestroy(compute_);
  }

  // The engine with the caller's stream-ordered allocator instead of stash's pool.
  void use_async_allocator() {
    cfg_.device_pool = nullptr;
    cfg_.device_alloc = async_alloc;
    cfg_.device_release = async_release;
    async_ = true;
  }
  void make() {
    ASSERT_EQ(stash_engine_create(&cfg_, &engine_), STASH_OK) << stash_last_error();
    const std::vector<std::size_t> per(kLayers, kPer);
    ASSERT_EQ(stash_engine_set_plan(engine_, kLayers, per.data(), kMixed.data()), STASH_OK)
        << stash_last_error();
  }

  void set_input(int step) {
    auto* p = static_cast<unsigned char*>(in_);
    for (std::size_t i = 0; i < kTensors * kN; ++i)
      p[i] = static_cast<unsigned char>((i * 131 + step * 17 + (i >> 12)) & 0xff);
  }

  stash_status_t alloc(cudaStream_t s, void** d) {
    if (async_) return cudaMallocAsync(d, kN, s) == cudaSuccess ? STASH_OK : STASH_ERROR_CUDA;
    return stash_device_alloc(pool_, kN, s, d);
  }
  stash_status_t free_kept(cudaStream_t s, void* d) {
    if (async_) return cudaFreeAsync(d, s) == cudaSuccess ? STASH_OK : STASH_ERROR_CUDA;
    return stash_device_free(pool_, d, nullptr, 0);
  }

  // One step with every tensor produced and consumed on `s` (a copy from the pinned input,
  // in backward a copy into the pinned output). Returns the first failing status.
  stash_status_t step(cudaStream_t s, void* into = nullptr) {
    auto* in = static_cast<unsigned char*>(in_);
    auto* out = static_cast<unsigned char*>(into ? into : out_);
    void* kept[kTensors] = {};
    stash_status_t st = STASH_OK;
#define STEP_TRY(call) \
  if ((st = (call)) != STASH_OK) return st
    for (std::uint32_t l = 0; l < kLayers; ++l) {
      STEP_TRY(stash_engine_forward_begin(engine_, 0, l));
      for (std::uint32_t j = 0; j < kPer; ++j) {
        void* d = nullptr;
        STEP_TRY(alloc(s, &d));
        if (cudaMemcpyAsync(d, in + (l * kPer + j) * kN, kN, cudaMemcpyHostToDevice, s) !=
            cudaSuccess)
          return STASH_ERROR_CUDA;
        STEP_TRY(stash_engine_offload(engine_, {0, l, j}, d, kN, s));
        if (kMixed[l * kPer + j] == STASH_ACTION_KEEP) kept[l * kPer + j] = d;
      }
      STEP_TRY(stash_engine_forward_end(engine_, 0, l));
    }
    for (std::uint32_t l = kLayers; l-- > 0;) {
      STEP_TRY(stash_engine_backward_begin(engine_, 0, l));
      for (std::uint32_t j = 0; j < kPer; ++j) {
        void* p = nullptr;
        STEP_TRY(stash_engine_acquire(engine_, {0, l, j}, s, &p));
        if (cudaMemcpyAsync(out + (l * kPer + j) * kN, p, kN, cudaMemcpyDeviceToHost, s) !=
            cudaSuccess)
          return STASH_ERROR_CUDA;
        STEP_TRY(stash_engine_release(engine_, {0, l, j}));
        if (void* d = kept[l * kPer + j]) STEP_TRY(free_kept(s, d));
      }
      STEP_TRY(stash_engine_backward_end(engine_, 0, l));
    }
#undef STEP_TRY
    return STASH_OK;
  }
  bool output_is_input(cudaStream_t s, const void* out = nullptr) {
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    return std::memcmp(out ? out : out_, in_, kTensors * kN) == 0;
  }
  cudaStreamCaptureStatus capture_status(cudaStream_t s) {
    cudaStreamCaptureStatus c = cudaStreamCaptureStatusNone;
    EXPECT_EQ(cudaStreamIsCapturing(s, &c), cudaSuccess);
    return c;
  }
  // The caller's end of capture and instantiation; the engine is not told.
  cudaError_t end_and_instantiate(cudaStream_t s) {
    cudaGraph_t g = nullptr;
    cudaError_t err = cudaStreamEndCapture(s, &g);
    if (err != cudaSuccess) return err;
    err = cudaGraphInstantiate(&graph_, g, 0);
    cudaGraphDestroy(g);
    return err;
  }
  stash_pool_stats_t pinned() {
    stash_engine_stats_t s;
    stash_engine_stats_init(&s);
    EXPECT_EQ(stash_engine_stats(engine_, &s), STASH_OK);
    return s.pinned;
  }
  void expect_no_race() {
    EXPECT_EQ(stash::test::double_api().violation_count(), 0u);
    for (const std::string& v : stash::test::double_api().violations()) ADD_FAILURE() << v;
  }

  cudaStream_t compute_ = nullptr, side_ = nullptr;
  stash_device_pool_t* pool_ = nullptr;
  stash_engine_config_t cfg_;
  stash_engine_t* engine_ = nullptr;
  cudaGraphExec_t graph_ = nullptr;
  void* in_ = nullptr;
  void* out_ = nullptr;
  void* out2_ = nullptr;  // an eager step's output beside a replay's
  bool async_ = false;
};

// torch's shape: the caller captures a side stream of its own, with its own stream-ordered
// memory, and replays the graph itself. The engine joins that stream.
TEST_F(EngineJoin, TheCallersGraphOnASideStreamReplaysTheStepBitForBit) {
  use_async_allocator();
  make();
  set_input(0);
  ASSERT_EQ(step(compute_), STASH_OK) << stash_last_error();  // eager: sizes the pinned pool
  ASSERT_TRUE(output_is_input(compute_));

  ASSERT_EQ(cudaStreamBeginCapture(side_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(stash_engine_capture_join(engine_, side_), STASH_OK) << stash_last_error();
  int capturing = 0;
  ASSERT_EQ(stash_engine_graph_state(engine_, &capturing, nullptr, nullptr, nullptr), STASH_OK);
  EXPECT_EQ(capturing, 1);
  std::memset(out_, 0xee, kTensors * kN);
  ASSERT_EQ(step(side_), STASH_OK) << stash_last_error();
  EXPECT_EQ(capture_status(side_), cudaStreamCaptureStatusActive) << "nothing may invalidate";
  EXPECT_EQ(stash_engine_capture_settle(engine_), STASH_ERROR_CAPTURE);
  EXPECT_NE(std::string(stash_last_error()).find("still capturing"), std::string::npos)
      << stash_last_error();
  // Unjoined forks (the engine's copy streams) would fail this.
  ASSERT_EQ(end_and_instantiate(side_), cudaSuccess);
  ASSERT_EQ(stash_engine_capture_settle(engine_), STASH_OK) << stash_last_error();
  const std::vector<unsigned char> untouched(kTensors * kN, 0xee);
  ASSERT_EQ(cudaStreamSynchronize(side_), cudaSuccess);
  EXPECT_EQ(std::memcmp(out_, untouched.data(), kTensors * kN), 0)
      << "a capture records the step; nothing of it may run";

  for (int i = 1; i <= 3; ++i) {
    set_input(i);
    std::memset(out_, 0, kTensors * kN);
    ASSERT_EQ(cudaGraphLaunch(graph_, side_), cudaSuccess);
    EXPECT_TRUE(output_is_input(side_)) << "replay " << i;
  }
  std::uint64_t captures = 0, replays = 0;
  ASSERT_EQ(stash_engine_graph_state(engine_, &capturing, nullptr, &captures, &replays),
            STASH_OK);
  EXPECT_EQ(capturing, 0);
  EXPECT_EQ(captures, 1u);
  EXPECT_EQ(replays, 0u) << "the caller's replays are not the engine's";
  // An eager step on the engine's own stream after the replays.
  set_input(9);
  ASSERT_EQ(step(compute_), STASH_OK) << stash_last_error();
  EXPECT_TRUE(output_is_input(compute_));
  expect_no_race();
}

// The pinned blocks the caller's graph copies into are held for its life: an eager step
// running beside a replay (unordered with it) uses other slots, and capture_release
// gives them back. Released, the same interleaving races: the checker sees it.
TEST_F(EngineJoin, PinnedBlocksStayHeldForTheGraphsLife) {
  use_async_allocator();
  make();
  set_input(0);
  ASSERT_EQ(step(compute_), STASH_OK) << stash_last_error();
  ASSERT_TRUE(output_is_input(compute_));
  EXPECT_EQ(pinned().current_bytes, 0u);

  ASSERT_EQ(cudaStreamBeginCapture(side_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(stash_engine_capture_join(engine_, side_), STASH_OK) << stash_last_error();
  ASSERT_EQ(step(side_), STASH_OK) << stash_last_error();
  ASSERT_EQ(end_and_instantiate(side_), cudaSuccess);
  ASSERT_EQ(stash_engine_capture_settle(engine_), STASH_OK) << stash_last_error();
  const std::uint64_t held = pinned().current_bytes;
  EXPECT_EQ(held, kOffloads * kN) << "the graph's pinned slots are still allocated";

  // A replay and an eager step at once, one input, two outputs: a shared pinned slot
  // would be written by both unordered.
  for (int i = 1; i <= 2; ++i) {
    set_input(i);
    ASSERT_EQ(cudaGraphLaunch(graph_, side_), cudaSuccess);
    ASSERT_EQ(step(compute_, out2_), STASH_OK) << stash_last_error();
    EXPECT_TRUE(output_is_input(side_)) << "replay " << i;
    EXPECT_TRUE(output_is_input(compute_, out2_)) << "eager step " << i;
  }
  EXPECT_EQ(pinned().current_bytes, held);
  expect_no_race();

  std::size_t released = 0;
  ASSERT_EQ(stash_engine_capture_release(engine_, &released), STASH_OK) << stash_last_error();
  EXPECT_EQ(released, kOffloads * kN);
  EXPECT_EQ(pinned().current_bytes, 0u);
  ASSERT_EQ(cudaStreamSynchronize(compute_), cudaSuccess);
  // The planted bug: the graph replayed after its slots were given back.
  set_input(3);
  ASSERT_EQ(cudaGraphLaunch(graph_, side_), cudaSuccess);
  ASSERT_EQ(step(compute_, out2_), STASH_OK) << stash_last_error();
  ASSERT_EQ(cudaStreamSynchronize(side_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(compute_), cudaSuccess);
  EXPECT_GT(stash::test::double_api().violation_count(), 0u)
      << "a slot shared by a replay and an eager step must show as a race";
}

// A C caller that captures the engine's configured compute stream need not join: the
// step's first forward_begin does, and the next engine call after the capture settles.
TEST_F(EngineJoin, ForwardBeginJoinsACaptureOfTheComputeStream) {
  make();
  set_input(0);
  ASSERT_EQ(step(compute_), STASH_OK) << stash_last_error();
  ASSERT_TRUE(output_is_input(compute_));
  ASSERT_EQ(cudaStreamBeginCapture(compute_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(step(compute_), STASH_OK) << stash_last_error();
  int capturing = 0;
  ASSERT_EQ(stash_engine_graph_state(engine_, &capturing, nullptr, nullptr, nullptr), STASH_OK);
  EXPECT_EQ(capturing, 1);
  ASSERT_EQ(end_and_instantiate(compute_), cudaSuccess);
  for (int i = 1; i <= 2; ++i) {
    set_input(i);
    ASSERT_EQ(cudaGraphLaunch(graph_, compute_), cudaSuccess);
    EXPECT_TRUE(output_is_input(compute_)) << "replay " << i;
  }
  std::size_t released = 0;  // settles the ended capture by itself
  ASSERT_EQ(stash_engine_capture_release(engine_, &released), STASH_OK) << stash_last_error();
  EXPECT_EQ(released, kOffloads * kN);
  std::uint64_t captures = 0;
  ASSERT_EQ(stash_engine_graph_state(engine_, &capturing, nullptr, &captures, nullptr),
            STASH_OK);
  EXPECT_EQ(capturing, 0);
  EXPECT_EQ(captures, 1u);
  set_input(5);
  ASSERT_EQ(step(compute_), STASH_OK) << stash_last_error();
  EXPECT_TRUE(output_is_input(compute_));
  expect_no_race();
}

TEST_F(EngineJoin, RefusalsNameTheCallAndLeaveTheCallersCaptureValid) {
  cfg_.max_in_flight_count = 1;
  use_async_allocator();
  make();
  set_input(0);
  ASSERT_EQ(step(compute_), STASH_OK) << stash_last_error();
  ASSERT_TRUE(output_is_input(compute_));

  // Nothing to join.
  EXPECT_EQ(stash_engine_capture_join(engine_, side_), STASH_ERROR_CAPTURE);
  EXPECT_NE(std::string(stash_last_error()).find("not capturing"), std::string::npos)
      << stash_last_error();
  EXPECT_EQ(stash_engine_capture_settle(engine_), STASH_ERROR_CAPTURE);

  ASSERT_EQ(cudaStreamBeginCapture(side_, cudaStreamCaptureModeGlobal), cudaSuccess);
  // An offload from the capturing stream before the join: refused by name, not captured.
  ASSERT_EQ(stash_engine_forward_begin(engine_, 0, 0), STASH_OK);
  void* d = nullptr;
  ASSERT_EQ(cudaMallocAsync(&d, kN, side_), cudaSuccess);
  EXPECT_EQ(stash_engine_offload(engine_, {0, 0, 0}, d, kN, side_), STASH_ERROR_CAPTURE);
  EXPECT_NE(std::string(stash_last_error()).find("capture_join"), std::string::npos)
      << stash_last_error();
  EXPECT_EQ(capture_status(side_), cudaStreamCaptureStatusActive);

  ASSERT_EQ(stash_engine_capture_join(engine_, side_), STASH_OK) << stash_last_error();
  EXPECT_EQ(stash_engine_capture_begin(engine_, 0), STASH_ERROR_CAPTURE);
  EXPECT_EQ(stash_engine_capture_end(engine_), STASH_ERROR_CAPTURE);
  EXPECT_NE(std::string(stash_last_error()).find("caller"), std::string::npos)
      << stash_last_error();
  EXPECT_EQ(stash_engine_capture_join(engine_, side_), STASH_ERROR_CAPTURE);
  // The in-flight cap would make the host wait for a captured copy.
  ASSERT_EQ(stash_engine_forward_begin(engine_, 0, 0), STASH_OK);
  void* e = nullptr;
  ASSERT_EQ(cudaMallocAsync(&e, kN, side_), cudaSuccess);
  ASSERT_EQ(stash_engine_offload(engine_, {0, 0, 0}, d, kN, side_), STASH_OK)
      << stash_last_error();
  ASSERT_EQ(stash_engine_offload(engine_, {0, 0, 1}, e, kN, side_), STASH_OK);  // a keep
  ASSERT_EQ(stash_engine_forward_end(engine_, 0, 0), STASH_OK);
  ASSERT_EQ(stash_engine_forward_begin(engine_, 0, 1), STASH_OK);
  void* f = nullptr;
  ASSERT_EQ(cudaMallocAsync(&f, kN, side_), cudaSuccess);
  EXPECT_EQ(stash_engine_offload(engine_, {0, 1, 0}, f, kN, side_), STASH_ERROR_CAPTURE);
  EXPECT_NE(std::string(stash_last_error()).find("in-flight cap"), std::string::npos)
      << stash_last_error();
  EXPECT_EQ(stash_engine_synchronize(engine_), STASH_ERROR_CAPTURE);
  EXPECT_EQ(capture_status(side_), cudaStreamCaptureStatusActive)
      << "the refusals must not invalidate the caller's capture";

  // The caller gives up on the step: the engine's tensors go back, the caller frees its
  // own, and its capture ends cleanly.
  ASSERT_EQ(stash_engine_backward_begin(engine_, 0, 1), STASH_OK);
  ASSERT_EQ(stash_engine_release(engine_, {0, 1, 0}), STASH_OK);
  ASSERT_EQ(stash_engine_backward_end(engine_, 0, 1), STASH_OK);
  ASSERT_EQ(stash_engine_backward_begin(engine_, 0, 0), STASH_OK);
  ASSERT_EQ(stash_engine_release(engine_, {0, 0, 0}), STASH_OK);
  ASSERT_EQ(stash_engine_release(engine_, {0, 0, 1}), STASH_OK);
  ASSERT_EQ(stash_engine_backward_end(engine_, 0, 0), STASH_OK);
  ASSERT_EQ(cudaFreeAsync(e, side_), cudaSuccess);
  ASSERT_EQ(end_and_instantiate(side_), cudaSuccess);
  EXPECT_EQ(stash_engine_capture_settle(engine_), STASH_ERROR_CAPTURE);
  EXPECT_NE(std::string(stash_last_error()).find("in-flight cap"), std::string::npos)
      << "the verdict is the first refusal: " << stash_last_error();
  std::uint64_t captures = 0;
  ASSERT_EQ(stash_engine_graph_state(engine_, nullptr, nullptr, &captures, nullptr), STASH_OK);
  EXPECT_EQ(captures, 0u);
  // Settled: eager steps work again.
  set_input(4);
  ASSERT_EQ(step(compute_), STASH_OK) << stash_last_error();
  EXPECT_TRUE(output_is_input(compute_));
}

}  // namespace
