// Round-trip integrity, the happens-before checker on a planted bug, the release-callback
// mode and fault injection.
#include <thread>

#include "engine_fixture.h"

namespace stash::test {
namespace {

constexpr size_t kLayers = 4, kPerLayer = 3;

// One odd size for all: freed blocks are then exact fits for the scribbler below.
size_t tensor_bytes(size_t, size_t) { return (size_t{1} << 16) + 13; }

class RoundTrip : public EngineTest {
 protected:
  // Forward of every layer: produce (fill) each tensor on the compute stream, offload it.
  void forward(uint32_t mb = 0) {
    ptr_.assign(kLayers, std::vector<void*>(kPerLayer));
    data_.assign(kLayers, std::vector<std::vector<uint8_t>>(kPerLayer));
    for (uint32_t l = 0; l < kLayers; ++l) {
      ASSERT_EQ(engine_->forward_begin(mb, l), status::ok) << last_error();
      for (uint32_t j = 0; j < kPerLayer; ++j) {
        data_[l][j] = random_bytes(tensor_bytes(l, j), 1000 * mb + 10 * l + j);
        ptr_[l][j] = dev_alloc(data_[l][j].size());
        allocs_.push_back({ptr_[l][j], data_[l][j].size(), l + 1 < kLayers});
        fill(ptr_[l][j], data_[l][j]);
        ASSERT_EQ(engine_->offload({mb, l, j}, ptr_[l][j], data_[l][j].size(), compute_),
                  status::ok)
            << last_error();
      }
      ASSERT_EQ(engine_->forward_end(mb, l), status::ok);
    }
  }
  // Backward: acquire, read back and compare, release.
  size_t backward(uint32_t mb = 0) {
    size_t bad = 0;
    for (uint32_t l = kLayers; l-- > 0;) {
      EXPECT_EQ(engine_->backward_begin(mb, l), status::ok) << last_error();
      for (uint32_t j = 0; j < kPerLayer; ++j) {
        void* p = nullptr;
        EXPECT_EQ(engine_->acquire({mb, l, j}, compute_, &p), status::ok) << last_error();
        if (!p) return ~size_t{0};
        bad += differing(read(p, data_[l][j].size()), data_[l][j]);
        EXPECT_EQ(engine_->release({mb, l, j}), status::ok) << last_error();
        // Keep tensors stay the caller's: give them back to the pool ourselves.
        if (l == kLayers - 1) pool_->deallocate(ptr_[l][j], nullptr, 0);
      }
      EXPECT_EQ(engine_->backward_end(mb, l), status::ok);
    }
    return bad;
  }
  // Reuses the memory the engine freed and scribbles over it. The pool may already have
  // handed an offloaded block to a later tensor of the forward (whose fill overwrote it):
  // that counts as reuse too.
  void overwrite_freed() {
    ASSERT_EQ(engine_->synchronize(), status::ok);
    std::vector<void*> junk;
    for (size_t l = 0; l + 1 < kLayers; ++l)
      for (size_t j = 0; j < kPerLayer; ++j) {
        void* p = dev_alloc(data_[l][j].size());
        junk.push_back(p);
        allocs_.push_back({p, data_[l][j].size(), false});
        ASSERT_EQ(cudaMemsetAsync(p, 0xA5, data_[l][j].size(), compute_), cudaSuccess);
      }
    size_t reused = 0;
    for (size_t a = 0; a < allocs_.size(); ++a)
      for (size_t b = a + 1; b < allocs_.size() && allocs_[a].offloaded; ++b) {
        const auto* pa = static_cast<const char*>(allocs_[a].p);
        const auto* pb = static_cast<const char*>(allocs_[b].p);
        reused += pa < pb + allocs_[b].n && pb < pa + allocs_[a].n;
      }
    EXPECT_GT(reused, 0u) << "the pool never handed an offloaded block out again";
    for (void* p : junk) pool_->deallocate(p, nullptr, 0);
  }

  // Layer 0 of a two-layer plan: three small tensors offloaded.
  void forward_small() {
    small_.clear();
    ASSERT_EQ(engine_->forward_begin(0, 0), status::ok);
    for (uint32_t j = 0; j < 3; ++j) {
      small_.push_back(random_bytes(20000 + 4096 * j, 50 + j));
      void* p = dev_alloc(small_[j].size());
      fill(p, small_[j]);
      ASSERT_EQ(engine_->offload({0, 0, j}, p, small_[j].size(), compute_), status::ok)
          << last_error();
    }
    ASSERT_EQ(engine_->forward_end(0, 0), status::ok);
  }

  std::vector<std::vector<void*>> ptr_;
  std::vector<std::vector<std::vector<uint8_t>>> data_;
  std::vector<std::vector<uint8_t>> small_;
  struct alloc_record {
    void* p;
    size_t n;
    bool offloaded;
  };
  std::vector<alloc_record> allocs_;
};

engine_plan all_but_last() { return plan_of({"ooo", "ooo", "ooo", "kkk"}); }

TEST_F(RoundTrip, EveryByteComesBackAndTheCheckerIsSilent) {
  make(config(), all_but_last());
  forward();
  overwrite_freed();
  EXPECT_EQ(backward(), 0u);
  const auto s = engine_->stats();
  EXPECT_EQ(s.offloaded_count, (kLayers - 1) * kPerLayer);
  EXPECT_EQ(s.prefetched_count, (kLayers - 1) * kPerLayer);
  EXPECT_EQ(s.keep_count, kPerLayer);
  EXPECT_EQ(s.released_count, kLayers * kPerLayer);
  EXPECT_EQ(s.failed_count, 0u);
  EXPECT_EQ(engine_->synchronize(), status::ok);
  EXPECT_EQ(engine_->stats().pinned.current_count, 0u);
  EXPECT_TRUE(violations().empty()) << violations().front();
}

TEST_F(RoundTrip, TwoStepsAndTwoMicroBatches) {
  make(config(), all_but_last());
  for (int step = 0; step < 2; ++step) {
    forward(0);
    auto keep_ptr = ptr_;
    auto keep_data = data_;
    forward(1);
    EXPECT_EQ(backward(1), 0u);
    ptr_ = keep_ptr;
    data_ = keep_data;
    EXPECT_EQ(backward(0), 0u);
  }
  EXPECT_EQ(engine_->stats().failed_count, 0u);
  EXPECT_TRUE(violations().empty()) << violations().front();
}

TEST_F(RoundTrip, ConsumerReadingWithoutAcquireIsCaught) {
  STASH_REQUIRE_DOUBLE();
  make(config(), plan_of({"o", "k"}));
  void* p = dev_alloc(1 << 16);
  fill(p, random_bytes(1 << 16, 7));
  ASSERT_EQ(engine_->forward_begin(0, 0), status::ok);
  ASSERT_EQ(engine_->offload({0, 0, 0}, p, 1 << 16, compute_), status::ok);
  ASSERT_EQ(engine_->backward_begin(0, 1), status::ok);  // prefetches layer 0
  engine::tensor_info info;
  ASSERT_EQ(engine_->info({0, 0, 0}, &info), status::ok);
  ASSERT_EQ(info.state, tensor_state::prefetching);
  ASSERT_NE(info.device, nullptr);
  // The planted bug: backward of layer 0 reads the tensor without acquire().
  const void* reads[] = {info.device};
  const size_t sizes[] = {size_t{1} << 16};
  ASSERT_EQ(double_api().enqueue_compute(compute_, 1.0, "bwd L0 without acquire", reads, sizes,
                                         1, nullptr, nullptr, 0),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(compute_), cudaSuccess);
  const auto v = violations();
  ASSERT_FALSE(v.empty()) << "the checker missed a read racing the prefetch";
  EXPECT_NE(v.front().find("without acquire"), std::string::npos) << v.front();
  // The same read after acquire is ordered.
  double_api().clear_violations();
  void* q = nullptr;
  ASSERT_EQ(engine_->acquire({0, 0, 0}, compute_, &q), status::ok);
  reads[0] = q;
  ASSERT_EQ(double_api().enqueue_compute(compute_, 1.0, "bwd L0", reads, sizes, 1, nullptr,
                                         nullptr, 0),
            cudaSuccess);
  ASSERT_EQ(engine_->release({0, 0, 0}), status::ok);
  ASSERT_EQ(engine_->synchronize(), status::ok);
  EXPECT_TRUE(violations().empty()) << violations().front();
}

// The caller's allocator: stream-ordered cudaMallocAsync / cudaFreeAsync.
struct caller_allocator {
  int allocs = 0, releases = 0;
  std::thread::id thread = std::this_thread::get_id();
  bool foreign_thread = false;
  static int alloc(void** out, size_t bytes, cudaStream_t s, void* user) {
    auto* self = static_cast<caller_allocator*>(user);
    ++self->allocs;
    return cudaMallocAsync(out, bytes, s) == cudaSuccess ? 0 : 1;
  }
  static void release(void* p, size_t, cudaStream_t s, void* user) {
    auto* self = static_cast<caller_allocator*>(user);
    ++self->releases;
    self->foreign_thread |= std::this_thread::get_id() != self->thread;
    cudaFreeAsync(p, s);
  }
};

TEST_F(RoundTrip, ReleaseCallbackRunsOnTheCallersThreadAfterTheCopy) {
  caller_allocator a;
  engine_config c = config();
  c.pool = nullptr;
  c.alloc = &caller_allocator::alloc;
  c.release = &caller_allocator::release;
  c.user = &a;
  make(c, plan_of({"oo", "k"}));
  std::vector<std::vector<uint8_t>> data;
  std::vector<void*> ptr;
  ASSERT_EQ(engine_->forward_begin(0, 0), status::ok);
  for (uint32_t j = 0; j < 2; ++j) {
    data.push_back(random_bytes(50000 + j, j));
    void* p = nullptr;
    ASSERT_EQ(cudaMallocAsync(&p, data[j].size(), compute_), cudaSuccess);
    fill(p, data[j]);
    ptr.push_back(p);
    ASSERT_EQ(engine_->offload({0, 0, j}, p, data[j].size(), compute_), status::ok);
  }
  EXPECT_EQ(a.releases + static_cast<int>(engine_->stats().in_flight_count), 2)
      << "a block was handed back before its copy completed";
  ASSERT_EQ(engine_->synchronize(), status::ok);  // retires the copies: callbacks run
  EXPECT_EQ(a.releases, 2);
  ASSERT_EQ(engine_->backward_begin(0, 1), status::ok);
  EXPECT_EQ(a.allocs, 2);
  for (uint32_t j = 0; j < 2; ++j) {
    void* p = nullptr;
    ASSERT_EQ(engine_->acquire({0, 0, j}, compute_, &p), status::ok);
    EXPECT_EQ(differing(read(p, data[j].size()), data[j]), 0u);
    ASSERT_EQ(engine_->release({0, 0, j}), status::ok);
  }
  EXPECT_EQ(a.releases, 4);
  EXPECT_FALSE(a.foreign_thread);
  ASSERT_EQ(engine_->synchronize(), status::ok);
  EXPECT_TRUE(violations().empty()) << violations().front();
}

TEST_F(RoundTrip, FailedD2HIsAnErrorOnThatTensorOnly) {
  STASH_REQUIRE_DOUBLE();
  make(config(), all_but_last());
  // Produce everything first, so that the only cudaMemcpyAsync calls left are the engine's.
  ptr_.assign(kLayers, std::vector<void*>(kPerLayer));
  data_.assign(kLayers, std::vector<std::vector<uint8_t>>(kPerLayer));
  for (uint32_t l = 0; l < kLayers; ++l)
    for (uint32_t j = 0; j < kPerLayer; ++j) {
      data_[l][j] = random_bytes(tensor_bytes(l, j), 10 * l + j);
      ptr_[l][j] = dev_alloc(data_[l][j].size());
      fill(ptr_[l][j], data_[l][j]);
    }
  double_api().inject_fault("cudaMemcpyAsync", 5, cudaErrorUnknown);  // layer 1, tensor 1
  for (uint32_t l = 0; l < kLayers; ++l) {
    ASSERT_EQ(engine_->forward_begin(0, l), status::ok);
    for (uint32_t j = 0; j < kPerLayer; ++j) {
      const status s = engine_->offload({0, l, j}, ptr_[l][j], data_[l][j].size(), compute_);
      if (l == 1 && j == 1) {
        EXPECT_EQ(s, status::cuda_error);
        EXPECT_NE(std::string(last_error()).find("cudaErrorUnknown"), std::string::npos)
            << last_error();
        EXPECT_NE(std::string(last_error()).find("cudaMemcpyAsync"), std::string::npos);
      } else {
        EXPECT_EQ(s, status::ok) << last_error();
      }
    }
    ASSERT_EQ(engine_->forward_end(0, l), status::ok);
  }
  engine::tensor_info info;
  ASSERT_EQ(engine_->info({0, 1, 1}, &info), status::ok);
  EXPECT_EQ(info.error, status::cuda_error);
  EXPECT_EQ(info.state, tensor_state::on_device);
  EXPECT_NE(std::string(info.message).find("cudaErrorUnknown"), std::string::npos);
  // Every other tensor round-trips; the failed one reports its error and is released.
  size_t bad = 0;
  for (uint32_t l = kLayers; l-- > 0;) {
    ASSERT_EQ(engine_->backward_begin(0, l), status::ok) << last_error();
    for (uint32_t j = 0; j < kPerLayer; ++j) {
      void* p = nullptr;
      const status s = engine_->acquire({0, l, j}, compute_, &p);
      if (l == 1 && j == 1) {
        EXPECT_EQ(s, engine::tensor_failed);
        EXPECT_NE(std::string(last_error()).find("cudaErrorUnknown"), std::string::npos);
        EXPECT_EQ(differing(read(ptr_[1][1], data_[1][1].size()), data_[1][1]), 0u)
            << "the failed tensor's device copy must stay intact";
      } else {
        ASSERT_EQ(s, status::ok) << last_error();
        bad += differing(read(p, data_[l][j].size()), data_[l][j]);
      }
      EXPECT_EQ(engine_->release({0, l, j}), status::ok);
      if (l == kLayers - 1) pool_->deallocate(ptr_[l][j], nullptr, 0);
    }
    ASSERT_EQ(engine_->backward_end(0, l), status::ok);
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(engine_->stats().failed_count, 1u);
  ASSERT_EQ(engine_->synchronize(), status::ok);
  EXPECT_TRUE(violations().empty()) << violations().front();
}

TEST_F(RoundTrip, FailedH2DIsAnErrorOnThatTensorOnly) {
  STASH_REQUIRE_DOUBLE();
  make(config(), plan_of({"ooo", "k"}));
  forward_small();
  double_api().inject_fault("cudaMemcpyAsync", 2, cudaErrorUnknown);  // tensor 1's H2D
  EXPECT_EQ(engine_->backward_begin(0, 1), status::cuda_error);
  EXPECT_NE(std::string(last_error()).find("H2D"), std::string::npos) << last_error();
  for (uint32_t j = 0; j < 3; ++j) {
    void* p = nullptr;
    const status s = engine_->acquire({0, 0, j}, compute_, &p);
    if (j == 1) {
      EXPECT_EQ(s, engine::tensor_failed);
    } else {
      ASSERT_EQ(s, status::ok) << last_error();
      EXPECT_EQ(differing(read(p, small_[j].size()), small_[j]), 0u);
    }
    EXPECT_EQ(engine_->release({0, 0, j}), status::ok);
  }
  ASSERT_EQ(engine_->synchronize(), status::ok);
  EXPECT_TRUE(violations().empty()) << violations().front();
}

}  // namespace
}  // namespace stash::test
