// The state machine's errors, the in-flight cap, both pinned-exhaustion policies and the
// lookahead depth.
#include "engine_fixture.h"

namespace stash::test {
namespace {

class EngineOptions : public EngineTest {
 protected:
  void* produce(size_t bytes, uint32_t seed) {
    void* p = dev_alloc(bytes);
    fill(p, random_bytes(bytes, seed));
    return p;
  }
  bool intact(const tensor_key& k, size_t bytes, uint32_t seed) {
    void* p = nullptr;
    if (engine_->acquire(k, compute_, &p) != status::ok) return false;
    return differing(read(p, bytes), random_bytes(bytes, seed)) == 0;
  }
};

TEST_F(EngineOptions, IllegalTransitionsAreClearErrors) {
  engine_ = std::make_unique<prefetch_engine>(config());
  void* out = nullptr;
  EXPECT_EQ(engine_->acquire({0, 0, 0}, compute_, &out), engine::no_plan);
  EXPECT_NE(std::string(last_error()).find("no plan"), std::string::npos);
  ASSERT_EQ(engine_->set_plan(plan_of({"ok", "k"})), status::ok);

  EXPECT_EQ(engine_->acquire({0, 0, 0}, compute_, &out), engine::illegal_transition);
  EXPECT_NE(std::string(last_error()).find("acquire before offload"), std::string::npos)
      << last_error();
  EXPECT_EQ(engine_->release({0, 0, 1}), engine::illegal_transition);
  EXPECT_NE(std::string(last_error()).find("release before offload"), std::string::npos);
  EXPECT_EQ(engine_->acquire({0, 5, 0}, compute_, &out), engine::unknown_tensor);
  EXPECT_NE(std::string(last_error()).find("unknown"), std::string::npos) << last_error();
  EXPECT_EQ(engine_->release({0, 1, 3}), engine::unknown_tensor);
  engine::tensor_action a;
  EXPECT_EQ(engine_->action(0, 1, &a), status::ok);
  EXPECT_EQ(a, tensor_action::keep);

  void* p = produce(8192, 1);
  void* k = produce(4096, 2);
  EXPECT_EQ(engine_->offload({0, 0, 0}, nullptr, 8192, compute_), status::invalid_argument);
  ASSERT_EQ(engine_->offload({0, 0, 0}, p, 8192, compute_), status::ok);
  EXPECT_EQ(engine_->offload({0, 0, 0}, p, 8192, compute_), engine::illegal_transition);
  EXPECT_NE(std::string(last_error()).find("offered twice"), std::string::npos);
  ASSERT_EQ(engine_->offload({0, 0, 1}, k, 4096, compute_), status::ok);  // keep: passes
  engine::tensor_info info;
  ASSERT_EQ(engine_->info({0, 0, 1}, &info), status::ok);
  EXPECT_EQ(info.state, tensor_state::on_device);
  EXPECT_EQ(info.action, tensor_action::keep);
  EXPECT_EQ(info.device, k);

  EXPECT_TRUE(intact({0, 0, 0}, 8192, 1));  // acquire issues the prefetch on demand
  ASSERT_EQ(engine_->info({0, 0, 0}, &info), status::ok);
  EXPECT_EQ(info.state, tensor_state::ready);
  ASSERT_EQ(engine_->acquire({0, 0, 1}, compute_, &out), status::ok);
  EXPECT_EQ(out, k);
  EXPECT_EQ(engine_->release({0, 0, 0}), status::ok);
  EXPECT_EQ(engine_->release({0, 0, 0}), engine::illegal_transition);
  EXPECT_NE(std::string(last_error()).find("double release"), std::string::npos);
  EXPECT_EQ(engine_->acquire({0, 0, 0}, compute_, &out), engine::illegal_transition);
  EXPECT_NE(std::string(last_error()).find("after release"), std::string::npos);
  EXPECT_EQ(engine_->set_plan(plan_of({"o"})), engine::illegal_transition)
      << "a plan cannot change under live tensors";
  EXPECT_EQ(engine_->release({0, 0, 1}), status::ok);
  pool_->deallocate(k, nullptr, 0);
  EXPECT_EQ(engine_->set_plan(plan_of({"o"})), status::ok);
}

TEST_F(EngineOptions, BadConfigsAreRejected) {
  engine_config c = config();
  c.lookahead = 0;
  EXPECT_THROW(prefetch_engine{c}, error);
  c = config();
  c.pool = nullptr;
  EXPECT_THROW(prefetch_engine{c}, error);
}

TEST_F(EngineOptions, InFlightCapBoundsCopiesInTransit) {
  STASH_REQUIRE_DOUBLE();
  double_api().set_bandwidth(1.0, 1.0, 2.0);  // 1 MB/ms: a 1 MB copy takes 1 ms
  engine_config c = config();
  c.max_in_flight_count = 1;
  make(c, plan_of({"oooo", "k"}));
  const size_t bytes = 1000000;
  std::vector<void*> p;
  for (uint32_t j = 0; j < 4; ++j) p.push_back(produce(bytes, j));
  const double t0 = double_api().host_now_ms();
  ASSERT_EQ(engine_->forward_begin(0, 0), status::ok);
  for (uint32_t j = 0; j < 4; ++j)
    ASSERT_EQ(engine_->offload({0, 0, j}, p[j], bytes, compute_), status::ok) << last_error();
  const auto s = engine_->stats();
  EXPECT_EQ(s.peak_in_flight_count, 1u);
  // Before submitting copy j the host saw copy j-1 finish: at least 3 copies of 1 ms.
  EXPECT_GE(double_api().host_now_ms() - t0, 3.0 - 1e-9);
  ASSERT_EQ(engine_->backward_begin(0, 1), status::ok);
  for (uint32_t j = 0; j < 4; ++j) {
    EXPECT_TRUE(intact({0, 0, j}, bytes, j));
    EXPECT_EQ(engine_->release({0, 0, j}), status::ok);
  }
  ASSERT_EQ(engine_->synchronize(), status::ok);
  EXPECT_TRUE(violations().empty()) << violations().front();
}

TEST_F(EngineOptions, InFlightByteCap) {
  engine_config c = config();
  c.max_in_flight_bytes = 150000;
  make(c, plan_of({"ooo", "k"}));
  std::vector<void*> p;
  for (uint32_t j = 0; j < 3; ++j) p.push_back(produce(100000, j));
  for (uint32_t j = 0; j < 3; ++j)
    ASSERT_EQ(engine_->offload({0, 0, j}, p[j], 100000, compute_), status::ok);
  EXPECT_LE(engine_->stats().peak_in_flight_bytes, 150000u);
  ASSERT_EQ(engine_->backward_begin(0, 1), status::ok);
  for (uint32_t j = 0; j < 3; ++j) {
    EXPECT_TRUE(intact({0, 0, j}, 100000, j));
    EXPECT_EQ(engine_->release({0, 0, j}), status::ok);
  }
}

engine_config tiny_pinned(engine_config c, size_t blocks) {
  c.pinned.cap_bytes = blocks << 20;
  c.pinned.slab_bytes = size_t{1} << 20;
  c.pinned.growth_bytes = size_t{1} << 20;
  c.pinned.alignment = 4096;
  return c;
}

TEST_F(EngineOptions, PinnedExhaustedKeepsTensorsOnDeviceAndCountsThem) {
  make(tiny_pinned(config(), 2), plan_of({"oooo", "k"}));
  const size_t bytes = (size_t{1} << 20) - 8192;
  std::vector<void*> p;
  for (uint32_t j = 0; j < 4; ++j) p.push_back(produce(bytes, j));
  for (uint32_t j = 0; j < 4; ++j)
    ASSERT_EQ(engine_->offload({0, 0, j}, p[j], bytes, compute_), status::ok) << last_error();
  const auto s = engine_->stats();
  EXPECT_EQ(s.offloaded_count, 2u);
  EXPECT_EQ(s.kept_on_device_count, 2u);
  EXPECT_EQ(s.kept_on_device_bytes, 2 * bytes);
  engine::tensor_info info;
  ASSERT_EQ(engine_->info({0, 0, 3}, &info), status::ok);
  EXPECT_EQ(info.state, tensor_state::on_device);
  EXPECT_EQ(info.device, p[3]);
  ASSERT_EQ(engine_->backward_begin(0, 1), status::ok);
  for (uint32_t j = 0; j < 4; ++j) {
    EXPECT_TRUE(intact({0, 0, j}, bytes, j)) << "tensor " << j;
    EXPECT_EQ(engine_->release({0, 0, j}), status::ok);
  }
  ASSERT_EQ(engine_->synchronize(), status::ok);
  EXPECT_TRUE(violations().empty()) << violations().front();
}

TEST_F(EngineOptions, PinnedExhaustedWaitPolicyWaitsThenReportsAndNeverLosesData) {
  STASH_REQUIRE_DOUBLE();
  engine_config c = tiny_pinned(config(), 1);
  c.on_pinned_exhausted = engine::pinned_exhausted::wait;
  c.pinned.wait_timeout_ms = 50;
  make(c, plan_of({"oo", "k"}));
  const size_t bytes = (size_t{1} << 20) - 8192;
  void* a = produce(bytes, 1);
  void* b = produce(bytes, 2);
  ASSERT_EQ(engine_->offload({0, 0, 0}, a, bytes, compute_), status::ok);
  // Nothing pending in the pool: waiting cannot help, so it says so at once.
  EXPECT_EQ(engine_->offload({0, 0, 1}, b, bytes, compute_), status::out_of_memory);
  EXPECT_NE(std::string(last_error()).find("stays on the device"), std::string::npos)
      << last_error();
  ASSERT_EQ(engine_->backward_begin(0, 1), status::ok);
  EXPECT_TRUE(intact({0, 0, 0}, bytes, 1));
  EXPECT_TRUE(intact({0, 0, 1}, bytes, 2));
  // Micro-batch 0's pinned block is freed while its H2D stream is held: pending.
  ASSERT_EQ(double_api().stream_pause(engine_->h2d_stream()), cudaSuccess);
  void* x = produce(bytes, 3);
  ASSERT_EQ(engine_->forward_begin(1, 0), status::ok);
  ASSERT_EQ(engine_->release({0, 0, 0}), status::ok);
  EXPECT_EQ(engine_->offload({1, 0, 0}, x, bytes, compute_), status::timeout);
  ASSERT_EQ(double_api().stream_resume(engine_->h2d_stream()), cudaSuccess);
  ASSERT_EQ(engine_->release({0, 0, 1}), status::ok);
  void* y = produce(bytes, 4);
  // Now the pending block completes: the pool waits for it and the offload goes through.
  EXPECT_EQ(engine_->offload({1, 0, 1}, y, bytes, compute_), status::ok) << last_error();
  const auto s = engine_->stats();
  EXPECT_EQ(s.kept_on_device_count, 2u);
  EXPECT_EQ(s.offloaded_count, 2u);
  ASSERT_EQ(engine_->backward_begin(1, 1), status::ok);
  EXPECT_TRUE(intact({1, 0, 0}, bytes, 3));
  EXPECT_TRUE(intact({1, 0, 1}, bytes, 4));
  EXPECT_EQ(engine_->release({1, 0, 0}), status::ok);
  EXPECT_EQ(engine_->release({1, 0, 1}), status::ok);
  ASSERT_EQ(engine_->synchronize(), status::ok);
  EXPECT_TRUE(violations().empty()) << violations().front();
}

class Lookahead : public EngineOptions, public ::testing::WithParamInterface<int> {};

TEST_P(Lookahead, PrefetchesExactlyDepthLayersAhead) {
  const int depth = GetParam();
  engine_config c = config();
  c.lookahead = depth;
  make(c, plan_of({"o", "o", "o", "o", "k"}));
  for (uint32_t l = 0; l < 4; ++l) {
    ASSERT_EQ(engine_->forward_begin(0, l), status::ok);
    ASSERT_EQ(engine_->offload({0, l, 0}, produce(4096, l), 4096, compute_), status::ok);
    ASSERT_EQ(engine_->forward_end(0, l), status::ok);
  }
  auto prefetched = [&] {
    int n = 0;
    for (uint32_t l = 0; l < 4; ++l) {
      engine::tensor_info info;
      EXPECT_EQ(engine_->info({0, l, 0}, &info), status::ok);
      n += info.state == tensor_state::prefetching || info.state == tensor_state::ready ||
           info.state == tensor_state::released;
    }
    return n;
  };
  for (uint32_t l = 5; l-- > 0;) {
    ASSERT_EQ(engine_->backward_begin(0, l), status::ok);
    // At backward of layer l, layers l-1 .. l-depth have been issued (and all above).
    EXPECT_EQ(prefetched(), std::min(4, 4 - static_cast<int>(l) + depth)) << "layer " << l;
    if (l < 4) {
      EXPECT_TRUE(intact({0, l, 0}, 4096, l));
      EXPECT_EQ(engine_->release({0, l, 0}), status::ok);
    }
    ASSERT_EQ(engine_->backward_end(0, l), status::ok);
  }
}

INSTANTIATE_TEST_SUITE_P(Depth, Lookahead, ::testing::Values(1, 2, 3));

}  // namespace
}  // namespace stash::test
