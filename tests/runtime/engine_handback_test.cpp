// Note [Handing offloaded blocks back] (prefetch_engine.h): an offloaded block is free for
// the compute stream right after the compute stream's wait for its copy is enqueued, with
// no host wait. The D2H stream is paused so that every copy is pending while the host
// goes on, exactly the situation of a host running ahead of a GPU.
#include <cstring>
#include <vector>

#include "engine_fixture.h"

namespace stash::test {
namespace {

constexpr size_t kBytes = size_t{1} << 20;

class HandbackTest : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    if (!on_double()) GTEST_SKIP() << "pausing a stream needs the double";
  }
  // Offers layer `l`'s one tensor: a pool block filled with `data`, produced on `producer`.
  void* offer(uint32_t l, const std::vector<uint8_t>& data, cudaStream_t producer) {
    EXPECT_EQ(engine_->forward_begin(0, l), status::ok) << last_error();
    void* p = nullptr;
    EXPECT_EQ(pool_->allocate(kBytes, producer, &p), status::ok) << last_error();
    // From pinned memory, so that the copy is truly asynchronous on the producer stream.
    void* pinned = nullptr;
    EXPECT_EQ(cudaHostAlloc(&pinned, kBytes, cudaHostAllocDefault), cudaSuccess);
    std::memcpy(pinned, data.data(), kBytes);
    EXPECT_EQ(cudaMemcpyAsync(p, pinned, kBytes, cudaMemcpyHostToDevice, producer), cudaSuccess);
    staging_.push_back(pinned);
    EXPECT_EQ(engine_->offload({0, l, 0}, p, kBytes, producer), status::ok) << last_error();
    EXPECT_EQ(engine_->forward_end(0, l), status::ok) << last_error();
    return p;
  }
  // Backward over layers `layers`-1 .. 0 (default: all); each tensor must come back as it
  // went.
  void backward_and_check(const std::vector<std::vector<uint8_t>>& data, size_t layers = 0) {
    for (uint32_t l = static_cast<uint32_t>(layers ? layers : data.size()); l-- > 0;) {
      ASSERT_EQ(engine_->backward_begin(0, l), status::ok) << last_error();
      void* p = nullptr;
      ASSERT_EQ(engine_->acquire({0, l, 0}, compute_, &p), status::ok) << last_error();
      EXPECT_EQ(differing(read(p, kBytes), data[l]), 0u) << "layer " << l;
      ASSERT_EQ(engine_->release({0, l, 0}), status::ok) << last_error();
      ASSERT_EQ(engine_->backward_end(0, l), status::ok) << last_error();
    }
  }
  void TearDown() override {
    if (engine_) engine_->synchronize();
    cudaDeviceSynchronize();
    for (void* p : staging_) cudaFreeHost(p);
    EngineTest::TearDown();
  }
  std::vector<void*> staging_;
};

TEST_F(HandbackTest, PoolReusesAnOffloadedBlockBeforeItsCopyIsSeenComplete) {
  make(config(), plan_of({"o", "o", "o", "o"}));
  ASSERT_EQ(double_api().stream_pause(engine_->d2h_stream()), cudaSuccess);
  std::vector<std::vector<uint8_t>> data;
  for (uint32_t l = 0; l < 4; ++l) data.push_back(random_bytes(kBytes, 100 + l));

  void* a = offer(0, data[0], compute_);
  offer(1, data[1], compute_);
  EXPECT_EQ(engine_->stats().ordered_handback_count, 0u);
  // forward_begin(2) enqueues the compute stream's wait for layer 0's (paused) copy and
  // hands layer 0's block back to the compute stream's free list: the next allocation of
  // that size on the compute stream gets it, while the copy has not even started.
  void* c = offer(2, data[2], compute_);
  EXPECT_EQ(c, a) << "the compute stream did not get layer 0's block back";
  const engine::engine_stats st = engine_->stats();
  EXPECT_EQ(st.ordered_handback_count, 1u);
  EXPECT_EQ(st.ordered_handback_bytes, kBytes);
  EXPECT_EQ(st.in_flight_count, 3u);  // nothing was observed complete

  offer(3, data[3], compute_);
  ASSERT_EQ(double_api().stream_resume(engine_->d2h_stream()), cudaSuccess);
  // Layer 2's data was written into layer 0's old block on the compute stream after the
  // wait: if the handback had not been ordered, layer 0's copy would read layer 2's bytes
  // (and the checker would report the write racing the copy's read).
  backward_and_check(data);
  EXPECT_TRUE(violations().empty()) << violations().front();
}

TEST_F(HandbackTest, ReleasedPrefetchIsTheComputeStreamsAtOnce) {
  // A prefetched block, once its consumer waited for its copy, goes back to the compute
  // stream with no event on the H2D stream (which runs ahead with later prefetches): the
  // next pass of gradient accumulation must be able to reuse it at once.
  make(config(), plan_of({"o", "o", "o"}));
  std::vector<std::vector<uint8_t>> data;
  for (uint32_t l = 0; l < 3; ++l) data.push_back(random_bytes(kBytes, 400 + l));
  for (uint32_t l = 0; l < 3; ++l) offer(l, data[l], compute_);
  ASSERT_EQ(engine_->synchronize(), status::ok);
  ASSERT_EQ(double_api().stream_pause(engine_->h2d_stream()), cudaSuccess);
  ASSERT_EQ(engine_->backward_begin(0, 2), status::ok) << last_error();  // prefetches layer 1
  void* p2 = nullptr;
  ASSERT_EQ(engine_->acquire({0, 2, 0}, compute_, &p2), status::ok) << last_error();
  ASSERT_EQ(engine_->release({0, 2, 0}), status::ok) << last_error();
  EXPECT_EQ(pool_->stats().pending_bytes, 0u) << "the released block waits for the H2D stream";
  void* again = nullptr;
  ASSERT_EQ(pool_->allocate(kBytes, compute_, &again), status::ok);
  EXPECT_EQ(again, p2);
  // Write it on the compute stream: ordered after the (paused) copy into it by the
  // acquire's wait, so the checker must stay quiet and layer 1 must come back intact.
  void* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, kBytes, cudaHostAllocDefault), cudaSuccess);
  staging_.push_back(pinned);
  ASSERT_EQ(cudaMemcpyAsync(again, pinned, kBytes, cudaMemcpyHostToDevice, compute_), cudaSuccess);
  ASSERT_EQ(engine_->backward_end(0, 2), status::ok);
  ASSERT_EQ(double_api().stream_resume(engine_->h2d_stream()), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(compute_), cudaSuccess);
  ASSERT_EQ(pool_->deallocate(again, nullptr, 0), status::ok);
  backward_and_check(data, 2);  // layers 1 and 0
  EXPECT_TRUE(violations().empty()) << violations().front();
}

struct callbacks {
  device_pool* pool = nullptr;
  cudaStream_t compute = nullptr;
  std::vector<std::pair<void*, cudaStream_t>> released;
  static int alloc(void** out, size_t bytes, cudaStream_t s, void* user) {
    auto* self = static_cast<callbacks*>(user);
    return self->pool->allocate(bytes, s, out) == status::ok ? 0 : 1;
  }
  static void release(void* p, size_t, cudaStream_t s, void* user) {
    auto* self = static_cast<callbacks*>(user);
    self->released.emplace_back(p, s);
    self->pool->deallocate(p, nullptr, 0);  // s's later work is ordered after the copy
  }
  // `c` with these callbacks in place of the engine's own pool.
  engine_config wired(engine_config c) {
    c.pool = nullptr;
    c.alloc = &callbacks::alloc;
    c.release = &callbacks::release;
    c.user = this;
    return c;
  }
};

TEST_F(HandbackTest, ReleaseCallbackRunsOnTheComputeStreamsOrder) {
  callbacks cb;
  cb.pool = pool_.get();
  cb.compute = compute_;
  make(cb.wired(config()), plan_of({"o", "o", "o", "o"}));  // layer 2 is not the last: no loss turn yet
  ASSERT_EQ(double_api().stream_pause(engine_->d2h_stream()), cudaSuccess);
  std::vector<std::vector<uint8_t>> data;
  for (uint32_t l = 0; l < 4; ++l) data.push_back(random_bytes(kBytes, 200 + l));
  void* a = offer(0, data[0], compute_);
  offer(1, data[1], compute_);
  EXPECT_TRUE(cb.released.empty());
  void* b2 = offer(2, data[2], compute_);
  ASSERT_EQ(cb.released.size(), 1u);
  EXPECT_EQ(cb.released[0].first, a);
  EXPECT_EQ(cb.released[0].second, compute_);  // free for work enqueued there from now on
  EXPECT_EQ(b2, a);
  offer(3, data[3], compute_);
  ASSERT_EQ(double_api().stream_resume(engine_->d2h_stream()), cudaSuccess);
  backward_and_check(data);
  EXPECT_TRUE(violations().empty()) << violations().front();
}

TEST_F(HandbackTest, TheLossRunsAfterTheTurnsWait) {
  // Note [The step's schedule]: the loss is position L, which holds no offload of layer
  // L-2. The last layer's forward_end enqueues the turn's wait and hands every source
  // back before the loss allocates, the copies still paused (a host ahead of the GPU).
  callbacks cb;
  cb.pool = pool_.get();
  cb.compute = compute_;
  make(cb.wired(config()), plan_of({"o", "o", "o"}));
  ASSERT_EQ(double_api().stream_pause(engine_->d2h_stream()), cudaSuccess);
  std::vector<std::vector<uint8_t>> data;
  for (uint32_t l = 0; l < 3; ++l) data.push_back(random_bytes(kBytes, 300 + l));
  std::vector<void*> blocks;
  for (uint32_t l = 0; l < 3; ++l) blocks.push_back(offer(l, data[l], compute_));
  ASSERT_EQ(cb.released.size(), 3u) << "layer 1's source lives through the loss";
  for (uint32_t l = 0; l < 3; ++l) {
    EXPECT_EQ(cb.released[l].first, blocks[l]);
    EXPECT_EQ(cb.released[l].second, compute_);
  }
  EXPECT_EQ(engine_->stats().in_flight_count, 3u);  // nothing was observed complete
  // The loss's work reuses a source's block, ordered after the turn's wait.
  void* loss = nullptr;
  ASSERT_EQ(pool_->allocate(kBytes, compute_, &loss), status::ok);
  void* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, kBytes, cudaHostAllocDefault), cudaSuccess);
  staging_.push_back(pinned);
  ASSERT_EQ(cudaMemcpyAsync(loss, pinned, kBytes, cudaMemcpyHostToDevice, compute_), cudaSuccess);
  ASSERT_EQ(double_api().stream_resume(engine_->d2h_stream()), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(compute_), cudaSuccess);
  ASSERT_EQ(pool_->deallocate(loss, nullptr, 0), status::ok);
  backward_and_check(data);  // the first backward_begin waits for nothing more
  EXPECT_TRUE(violations().empty()) << violations().front();
}

TEST_F(HandbackTest, BlocksOfAnotherStreamWaitForTheirCopy) {
  // Produced on a side stream: the compute stream's wait orders nothing on that stream,
  // so the block goes back only once its copy is seen complete.
  cudaStream_t side = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  make(config(), plan_of({"o", "o", "o", "o"}));  // layer 2 is not the last: no loss turn
  ASSERT_EQ(double_api().stream_pause(engine_->d2h_stream()), cudaSuccess);
  std::vector<std::vector<uint8_t>> data;
  for (uint32_t l = 0; l < 4; ++l) data.push_back(random_bytes(kBytes, 300 + l));
  offer(0, data[0], side);
  offer(1, data[1], side);
  ASSERT_EQ(cudaStreamSynchronize(side), cudaSuccess);
  offer(2, data[2], compute_);
  EXPECT_EQ(engine_->stats().ordered_handback_count, 0u);
  const size_t in_use = pool_->stats().current_bytes;
  ASSERT_EQ(double_api().stream_resume(engine_->d2h_stream()), cudaSuccess);
  ASSERT_EQ(engine_->synchronize(), status::ok);
  EXPECT_EQ(pool_->stats().current_bytes, in_use - 3 * kBytes);  // all copies seen complete
  offer(3, data[3], compute_);
  backward_and_check(data);
  EXPECT_TRUE(violations().empty()) << violations().front();
  cudaStreamDestroy(side);
}

}  // namespace
}  // namespace stash::test
