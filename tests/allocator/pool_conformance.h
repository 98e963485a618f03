// pool_conformance.h: the one conformance suite every stash pool passes.
//
// A typed, parameterized gtest suite (TYPED_TEST_SUITE_P). It is instantiated for the C++
// pinned and device pools (tests/allocator/pool_conformance_test.cpp) and again for both
// pools through the C API (tests/bindings/c_api_conformance_test.cpp). A pool adapter
// provides:
//
//   static constexpr const char* fault_api;     // the runtime call that gets memory
//   static constexpr bool has_wait_policy;      // exhaustion policy "wait" exists
//   static constexpr bool host_accessible;      // the host may touch the blocks
//   explicit Adapter(const conformance_config&);  // throws on failure
//   int alloc(size_t bytes, cudaStream_t stream, void** out);
//   int free(void* p, const cudaStream_t* streams, size_t n);
//   stash::pool_stats stats();
//   void reset_peak();
//   const char* error();                          // this thread's last error text
//
// Statuses are the numbers of stash_status_t (== stash::status). Tests that need the
// CPU test double (paused streams, fault injection, the happens-before checker) skip on a
// real GPU; the rest run on both.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "double_api.h"
#include "pool_stats.h"

namespace stash::test {

constexpr size_t KiB = 1024;
constexpr size_t MiB = 1024 * KiB;

enum : int {
  st_ok = 0,
  st_invalid = 1,
  st_oom = 2,
  st_cuda = 3,
  st_timeout = 4,
  st_unknown_pointer = 5,
};

struct conformance_config {
  size_t limit = 1 * MiB;  // pinned cap / device budget
  size_t slab = 1 * MiB;   // slab size (pinned: largest pin and growth; device: growth)
  size_t alignment = 4096;
  bool wait_when_exhausted = false;  // pinned only
  uint32_t wait_timeout_ms = 50;
};

// A non-blocking stream owned by a test.
class test_stream {
 public:
  test_stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), cudaSuccess); }
  ~test_stream() {
    cudaStreamSynchronize(s_);
    cudaStreamDestroy(s_);
  }
  operator cudaStream_t() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

inline size_t round_to(size_t n, size_t a) { return (n + a - 1) / a * a; }

template <class Pool>
class PoolConformance : public ::testing::Test {
 protected:
  void SetUp() override {
    if (on_double()) {
      double_api().reset();
      double_api().clear_violations();
    }
  }
  void TearDown() override {
    if (on_double()) {
      double_api().clear_faults();
      const auto v = double_api().violations();
      EXPECT_TRUE(v.empty()) << "happens-before violation: " << (v.empty() ? "" : v[0]);
    }
  }
  static conformance_config config(size_t limit = 1 * MiB, size_t slab = 1 * MiB) {
    conformance_config c;
    c.limit = limit;
    c.slab = slab;
    c.alignment = Pool::default_alignment;
    return c;
  }
};

TYPED_TEST_SUITE_P(PoolConformance);

TYPED_TEST_P(PoolConformance, BlocksAreAlignedAndSizedByAlignmentOnly) {
  TypeParam pool(this->config(64 * MiB, 16 * MiB));
  const size_t a = TypeParam::default_alignment;
  size_t expect_bytes = 0, expect_requested = 0;
  std::vector<void*> blocks;
  for (size_t n : {size_t{1}, size_t{255}, a + 1, size_t{100000}, 3 * MiB + 1, size_t{129'500}}) {
    void* p = nullptr;
    ASSERT_EQ(pool.alloc(n, nullptr, &p), st_ok) << pool.error();
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % a, 0u) << n;
    expect_bytes += round_to(n, a);
    expect_requested += n;
    blocks.push_back(p);
  }
  const pool_stats s = pool.stats();
  EXPECT_EQ(s.current_bytes, expect_bytes);  // no power-of-two rounding
  EXPECT_EQ(s.requested_bytes, expect_requested);
  for (void* p : blocks) EXPECT_EQ(pool.free(p, nullptr, 0), st_ok);
}

TYPED_TEST_P(PoolConformance, SplitsAndCoalescesInsideOneSlab) {
  TypeParam pool(this->config(1 * MiB, 1 * MiB));
  void* b[4];
  for (void*& p : b) ASSERT_EQ(pool.alloc(256 * KiB, nullptr, &p), st_ok) << pool.error();
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(static_cast<char*>(b[i]), static_cast<char*>(b[0]) + i * 256 * KiB);
  }
  EXPECT_EQ(pool.stats().slab_count, 1u);
  void* extra = nullptr;
  EXPECT_EQ(pool.alloc(1, nullptr, &extra), st_oom);
  EXPECT_EQ(extra, nullptr);
  ASSERT_EQ(pool.free(b[1], nullptr, 0), st_ok);
  ASSERT_EQ(pool.free(b[2], nullptr, 0), st_ok);
  EXPECT_EQ(pool.stats().largest_free_bytes, 512 * KiB);  // coalesced
  void* big = nullptr;
  ASSERT_EQ(pool.alloc(512 * KiB, nullptr, &big), st_ok) << pool.error();
  EXPECT_EQ(big, b[1]);
  EXPECT_EQ(pool.stats().reserved_bytes, 1 * MiB);
  for (void* p : {b[0], big, b[3]}) EXPECT_EQ(pool.free(p, nullptr, 0), st_ok);
  EXPECT_EQ(pool.stats().largest_free_bytes, 1 * MiB);
}

TYPED_TEST_P(PoolConformance, EnforcesTheCapWithAReport) {
  TypeParam pool(this->config(1 * MiB, 1 * MiB));
  void* all = nullptr;
  ASSERT_EQ(pool.alloc(1 * MiB, nullptr, &all), st_ok) << pool.error();
  void* more = nullptr;
  ASSERT_EQ(pool.alloc(4096, nullptr, &more), st_oom);
  const std::string msg = pool.error();
  EXPECT_NE(msg.find("4096"), std::string::npos) << msg;       // requested
  EXPECT_NE(msg.find("in use 1048576"), std::string::npos) << msg;
  EXPECT_NE(msg.find("reserved 1048576"), std::string::npos) << msg;
  EXPECT_NE(msg.find("peak 1048576"), std::string::npos) << msg;
  EXPECT_NE(msg.find("largest free block 0"), std::string::npos) << msg;
  void* huge = nullptr;
  EXPECT_NE(pool.alloc(2 * MiB, nullptr, &huge), st_ok);
  EXPECT_EQ(huge, nullptr);
  pool_stats s = pool.stats();
  EXPECT_EQ(s.failed_count, 2u);
  EXPECT_EQ(s.reserved_bytes, 1 * MiB);
  EXPECT_EQ(s.limit_bytes, 1 * MiB);
  // Intact afterwards.
  ASSERT_EQ(pool.free(all, nullptr, 0), st_ok);
  ASSERT_EQ(pool.alloc(1 * MiB, nullptr, &all), st_ok);
  EXPECT_EQ(pool.free(all, nullptr, 0), st_ok);
}

TYPED_TEST_P(PoolConformance, KeepsExactStatistics) {
  TypeParam pool(this->config(16 * MiB, 16 * MiB));
  const size_t a = TypeParam::default_alignment;
  void *x, *y, *z;
  ASSERT_EQ(pool.alloc(1000, nullptr, &x), st_ok);
  ASSERT_EQ(pool.alloc(5000, nullptr, &y), st_ok);
  ASSERT_EQ(pool.alloc(70000, nullptr, &z), st_ok);
  const uint64_t bx = round_to(1000, a), by = round_to(5000, a), bz = round_to(70000, a);
  pool_stats s = pool.stats();
  EXPECT_EQ(s.current_count, 3u);
  EXPECT_EQ(s.peak_count, 3u);
  EXPECT_EQ(s.total_count, 3u);
  EXPECT_EQ(s.current_bytes, bx + by + bz);
  EXPECT_EQ(s.peak_bytes, bx + by + bz);
  EXPECT_EQ(s.total_bytes, bx + by + bz);
  EXPECT_EQ(s.requested_bytes, 76000u);
  EXPECT_EQ(s.reserved_bytes, 16 * MiB);
  EXPECT_EQ(s.slab_count, 1u);
  EXPECT_EQ(s.largest_free_bytes, 16 * MiB - (bx + by + bz));
  ASSERT_EQ(pool.free(y, nullptr, 0), st_ok);
  s = pool.stats();
  EXPECT_EQ(s.current_count, 2u);
  EXPECT_EQ(s.current_bytes, bx + bz);
  EXPECT_EQ(s.peak_bytes, bx + by + bz);
  pool.reset_peak();
  s = pool.stats();
  EXPECT_EQ(s.peak_bytes, bx + bz);
  EXPECT_EQ(s.peak_count, 2u);
  EXPECT_EQ(s.peak_reserved_bytes, 16 * MiB);
  EXPECT_EQ(s.total_count, 3u);
  ASSERT_EQ(pool.alloc(5000, nullptr, &y), st_ok);
  s = pool.stats();
  EXPECT_EQ(s.total_count, 4u);
  EXPECT_EQ(s.total_bytes, bx + 2 * by + bz);
  for (void* p : {x, y, z}) ASSERT_EQ(pool.free(p, nullptr, 0), st_ok);
  s = pool.stats();
  EXPECT_EQ(s.current_count, 0u);
  EXPECT_EQ(s.current_bytes, 0u);
  EXPECT_EQ(s.requested_bytes, 0u);
  EXPECT_EQ(s.failed_count, 0u);
}

TYPED_TEST_P(PoolConformance, RejectsBadArgumentsWithoutDamage) {
  TypeParam pool(this->config(4 * MiB, 4 * MiB));
  void* p = reinterpret_cast<void*>(1);
  EXPECT_EQ(pool.alloc(0, nullptr, &p), st_invalid);
  EXPECT_EQ(p, nullptr);
  EXPECT_NE(std::string(pool.error()).find("zero"), std::string::npos) << pool.error();
  EXPECT_EQ(pool.alloc(64, nullptr, nullptr), st_invalid);
  EXPECT_EQ(pool.alloc(SIZE_MAX, nullptr, &p), st_invalid);
  EXPECT_EQ(pool.free(nullptr, nullptr, 0), st_ok);  // like free(NULL)
  ASSERT_EQ(pool.alloc(64 * KiB, nullptr, &p), st_ok);
  int on_stack = 0;
  EXPECT_EQ(pool.free(&on_stack, nullptr, 0), st_unknown_pointer);
  EXPECT_NE(std::string(pool.error()).find("not allocated by this pool"), std::string::npos);
  EXPECT_EQ(pool.free(static_cast<char*>(p) + 256, nullptr, 0), st_unknown_pointer);
  EXPECT_EQ(pool.free(p, nullptr, 1), st_invalid);  // a stream count without streams
  EXPECT_EQ(pool.stats().current_count, 1u);
  ASSERT_EQ(pool.free(p, nullptr, 0), st_ok);
  EXPECT_EQ(pool.free(p, nullptr, 0), st_unknown_pointer);  // double free
  EXPECT_NE(std::string(pool.error()).find("double free"), std::string::npos) << pool.error();
  const pool_stats s = pool.stats();
  EXPECT_EQ(s.current_count, 0u);
  EXPECT_EQ(s.largest_free_bytes, s.reserved_bytes);
  void* q = nullptr;
  ASSERT_EQ(pool.alloc(64 * KiB, nullptr, &q), st_ok);
  EXPECT_EQ(q, p);
  EXPECT_EQ(pool.free(q, nullptr, 0), st_ok);
}

// The heart of the pool: a block freed while a copy still uses it is not handed out until
// that copy has completed, and the happens-before checker agrees.
TYPED_TEST_P(PoolConformance, FreedBlockWaitsForPendingCopies) {
  STASH_REQUIRE_DOUBLE();
  TypeParam pool(this->config(1 * MiB, 1 * MiB));
  test_stream copy_stream, alloc_stream;
  void* block = nullptr;
  ASSERT_EQ(pool.alloc(1 * MiB, alloc_stream, &block), st_ok) << pool.error();
  void* other = nullptr;  // the copy's other end
  ASSERT_EQ(cudaMalloc(&other, 1 * MiB), cudaSuccess);
  ASSERT_EQ(double_api().stream_pause(copy_stream), cudaSuccess);
  // Pinned block: an offload (D2H) writes it. Device block: a D2H reads it.
  if (TypeParam::host_accessible) {
    ASSERT_EQ(cudaMemcpyAsync(block, other, 1 * MiB, cudaMemcpyDeviceToHost, copy_stream), cudaSuccess);
  } else {
    ASSERT_EQ(cudaMemcpyAsync(other, block, 1 * MiB, cudaMemcpyDeviceToDevice, copy_stream), cudaSuccess);
  }
  const cudaStream_t used[] = {copy_stream};
  ASSERT_EQ(pool.free(block, used, 1), st_ok) << pool.error();
  EXPECT_EQ(pool.stats().pending_count, 1u);
  EXPECT_EQ(pool.stats().pending_bytes, 1 * MiB);
  void* again = nullptr;
  EXPECT_EQ(pool.alloc(1 * MiB, alloc_stream, &again), st_oom);  // not handed out
  EXPECT_NE(std::string(pool.error()).find("pending 1048576"), std::string::npos) << pool.error();
  ASSERT_EQ(double_api().stream_resume(copy_stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(copy_stream), cudaSuccess);
  ASSERT_EQ(pool.alloc(1 * MiB, alloc_stream, &again), st_ok) << pool.error();
  EXPECT_EQ(again, block);
  // New use of the block; the checker reports it if it could overlap the copy.
  if (TypeParam::host_accessible) {
    double_api().host_access(again, 1 * MiB, 1);
  } else {
    const void* w[] = {again};
    const size_t ws[] = {1 * MiB};
    ASSERT_EQ(double_api().enqueue_compute(alloc_stream, 0.1, "reuse", nullptr, nullptr, 0, w, ws, 1),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(alloc_stream), cudaSuccess);
  }
  EXPECT_TRUE(double_api().violations().empty());
  EXPECT_EQ(pool.free(again, nullptr, 0), st_ok);
  EXPECT_EQ(cudaFree(other), cudaSuccess);
}

// With room to grow, the pool hands out other memory instead of the pending block.
TYPED_TEST_P(PoolConformance, PendingBlockIsSkippedWhenThereIsRoom) {
  STASH_REQUIRE_DOUBLE();
  TypeParam pool(this->config(2 * MiB, 1 * MiB));
  test_stream copy_stream, alloc_stream;
  void* block = nullptr;
  ASSERT_EQ(pool.alloc(1 * MiB, alloc_stream, &block), st_ok) << pool.error();
  void* other = nullptr;
  ASSERT_EQ(cudaMalloc(&other, 1 * MiB), cudaSuccess);
  ASSERT_EQ(double_api().stream_pause(copy_stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(other, block, 1 * MiB, cudaMemcpyDefault, copy_stream), cudaSuccess);
  const cudaStream_t used[] = {copy_stream};
  ASSERT_EQ(pool.free(block, used, 1), st_ok);
  void* fresh = nullptr;
  ASSERT_EQ(pool.alloc(1 * MiB, alloc_stream, &fresh), st_ok) << pool.error();
  EXPECT_NE(fresh, block);
  ASSERT_EQ(double_api().stream_resume(copy_stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(copy_stream), cudaSuccess);
  EXPECT_EQ(pool.stats().pending_count, 0u);
  EXPECT_EQ(pool.free(fresh, nullptr, 0), st_ok);
  EXPECT_EQ(cudaFree(other), cudaSuccess);
}

TYPED_TEST_P(PoolConformance, WaitPolicyWaitsForPendingBlocksThenTimesOut) {
  STASH_REQUIRE_DOUBLE();
  if (!TypeParam::has_wait_policy) GTEST_SKIP() << "no exhaustion policy on this pool";
  void* other = nullptr;
  ASSERT_EQ(cudaMalloc(&other, 1 * MiB), cudaSuccess);
  // First a copy that never finishes in time, then one that does.
  for (const uint32_t timeout_ms : {30u, 60000u}) {
    conformance_config c = this->config(1 * MiB, 1 * MiB);
    c.wait_when_exhausted = true;
    c.wait_timeout_ms = timeout_ms;
    TypeParam pool(c);
    test_stream copy_stream;
    void* block = nullptr;
    ASSERT_EQ(pool.alloc(1 * MiB, nullptr, &block), st_ok);
    ASSERT_EQ(double_api().stream_pause(copy_stream), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(other, block, 1 * MiB, cudaMemcpyHostToDevice, copy_stream),
              cudaSuccess);
    const cudaStream_t used[] = {copy_stream};
    ASSERT_EQ(pool.free(block, used, 1), st_ok);
    void* again = nullptr;
    if (timeout_ms == 30u) {
      EXPECT_EQ(pool.alloc(1 * MiB, nullptr, &again), st_timeout);
      EXPECT_NE(std::string(pool.error()).find("pending 1048576"), std::string::npos)
          << pool.error();
      ASSERT_EQ(double_api().stream_resume(copy_stream), cudaSuccess);
    } else {
      // The allocation waits (polling, without blocking the pool) until the copy is done.
      ASSERT_EQ(double_api().stream_resume(copy_stream), cudaSuccess);
      ASSERT_EQ(pool.alloc(1 * MiB, nullptr, &again), st_ok) << pool.error();
      EXPECT_EQ(again, block);
      EXPECT_EQ(pool.free(again, nullptr, 0), st_ok);
    }
  }
  EXPECT_EQ(cudaFree(other), cudaSuccess);
}

TYPED_TEST_P(PoolConformance, CleanErrorAndIntactPoolWhenCudaFails) {
  STASH_REQUIRE_DOUBLE();
  TypeParam pool(this->config(8 * MiB, 4 * MiB));
  double_api().inject_fault(TypeParam::fault_api, 1, cudaErrorMemoryAllocation);
  void* p = nullptr;
  const int st = pool.alloc(4096, nullptr, &p);
  EXPECT_TRUE(st == st_oom || st == st_cuda) << st;
  EXPECT_EQ(p, nullptr);
  std::string msg = pool.error();
  EXPECT_NE(msg.find(TypeParam::fault_api), std::string::npos) << msg;
  EXPECT_NE(msg.find("cudaErrorMemoryAllocation"), std::string::npos) << msg;
  EXPECT_NE(msg.find(".cpp:"), std::string::npos) << msg;  // file:line
  pool_stats s = pool.stats();
  EXPECT_EQ(s.reserved_bytes, 0u);
  EXPECT_EQ(s.failed_count, 1u);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // nothing sticky left behind
  // Any other error is a CUDA error.
  double_api().inject_fault(TypeParam::fault_api, 1, cudaErrorInvalidValue);
  EXPECT_EQ(pool.alloc(4096, nullptr, &p), st_cuda);
  EXPECT_NE(std::string(pool.error()).find("cudaErrorInvalidValue"), std::string::npos);
  // Intact: the next allocation grows normally.
  ASSERT_EQ(pool.alloc(4096, nullptr, &p), st_ok) << pool.error();
  // A failing event record during free leaves the block allocated.
  test_stream s1;
  const cudaStream_t used[] = {s1};
  double_api().inject_fault("cudaEventRecord", 1, cudaErrorLaunchFailure);
  EXPECT_EQ(pool.free(p, used, 1), st_cuda);
  EXPECT_NE(std::string(pool.error()).find("cudaEventRecord"), std::string::npos) << pool.error();
  EXPECT_EQ(pool.stats().current_count, 1u);
  EXPECT_EQ(pool.free(p, used, 1), st_ok) << pool.error();
  ASSERT_EQ(cudaStreamSynchronize(s1), cudaSuccess);
  s = pool.stats();
  EXPECT_EQ(s.current_count, 0u);
  EXPECT_EQ(s.pending_count, 0u);
}

TYPED_TEST_P(PoolConformance, SurvivesConcurrentChurn) {
  TypeParam pool(this->config(256 * MiB, 8 * MiB));
  constexpr int threads = 4;
  constexpr int iterations = 1500;
  std::atomic<uint64_t> allocations{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      cudaStream_t stream = nullptr;
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      std::mt19937 rng(1234u + static_cast<unsigned>(t));
      struct live_block {
        void* p;
        size_t n;
        unsigned char tag;
      };
      std::vector<live_block> live;
      for (int i = 0; i < iterations; ++i) {
        if (live.size() < 8 && (live.empty() || rng() % 2 == 0)) {
          const size_t n = 1 + rng() % (64 * KiB);
          void* p = nullptr;
          if (pool.alloc(n, stream, &p) != st_ok) {
            ++failures;
            continue;
          }
          ++allocations;
          const unsigned char tag = static_cast<unsigned char>(t * 64 + i % 64);
          if (TypeParam::host_accessible) std::memset(p, tag, n);
          live.push_back({p, n, tag});
        } else {
          const size_t k = rng() % live.size();
          const live_block b = live[k];
          if (TypeParam::host_accessible) {
            const auto* c = static_cast<const unsigned char*>(b.p);
            if (c[0] != b.tag || c[b.n - 1] != b.tag) ++failures;  // overlapping blocks
          }
          const cudaStream_t used[] = {stream};
          if (pool.free(b.p, used, i % 3 == 0 ? 1 : 0) != st_ok) ++failures;
          live[k] = live.back();
          live.pop_back();
        }
      }
      for (const live_block& b : live) {
        if (pool.free(b.p, nullptr, 0) != st_ok) ++failures;
      }
      cudaStreamSynchronize(stream);
      (void)pool.stats();  // reaps this stream's guards before the stream goes away
      cudaStreamDestroy(stream);
    });
  }
  for (std::thread& w : workers) w.join();
  EXPECT_EQ(failures.load(), 0);
  const pool_stats s = pool.stats();
  EXPECT_EQ(s.total_count, allocations.load());
  EXPECT_EQ(s.current_count, 0u);
  EXPECT_EQ(s.current_bytes, 0u);
  EXPECT_EQ(s.pending_count, 0u);
  EXPECT_LE(s.reserved_bytes, 256 * MiB);
}

REGISTER_TYPED_TEST_SUITE_P(PoolConformance, BlocksAreAlignedAndSizedByAlignmentOnly,
                            SplitsAndCoalescesInsideOneSlab, EnforcesTheCapWithAReport,
                            KeepsExactStatistics, RejectsBadArgumentsWithoutDamage,
                            FreedBlockWaitsForPendingCopies, PendingBlockIsSkippedWhenThereIsRoom,
                            WaitPolicyWaitsForPendingBlocksThenTimesOut,
                            CleanErrorAndIntactPoolWhenCudaFails, SurvivesConcurrentChurn);

}  // namespace stash::test
