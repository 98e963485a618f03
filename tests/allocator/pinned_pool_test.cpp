// Pinned-pool behaviour beyond the conformance suite: reservation (also in the
// background), no pinning on the hot path once reserved, growth, configuration errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "double_api.h"
#include "pinned_pool.h"
#include "core/error.h"

namespace stash {
namespace {

constexpr size_t KiB = 1024;
constexpr size_t MiB = 1024 * KiB;
using test::double_api;

pinned_pool_config small_config() {
  pinned_pool_config c;
  c.cap_bytes = 64 * MiB;
  c.slab_bytes = 8 * MiB;
  c.growth_bytes = 8 * MiB;
  c.report_progress = false;
  return c;
}

class PinnedPool : public ::testing::Test {
 protected:
  void TearDown() override {
    if (test::on_double()) double_api().clear_faults();
  }
};

TEST_F(PinnedPool, ReservesUpFrontInSlabsAndNeverPinsOnTheHotPath) {
  pinned_pool_config c = small_config();
  c.reserve_bytes = 20 * MiB;
  pinned_pool pool(c);
  pool_stats s = pool.stats();
  EXPECT_EQ(s.reserved_bytes, 20 * MiB);
  EXPECT_EQ(s.slab_count, 3u);  // 8 + 8 + 4: no pin larger than slab_bytes
  if (test::on_double()) {
    // Any pin from here on would fail: the hot path must not try.
    double_api().inject_fault("cudaHostAlloc", 1, cudaErrorMemoryAllocation);
    double_api().inject_fault("cudaHostRegister", 1, cudaErrorMemoryAllocation);
  }
  std::vector<void*> blocks;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 8; ++i) {
      void* p = nullptr;
      ASSERT_EQ(pool.allocate(1 * MiB + 4 * KiB * static_cast<size_t>(i), &p), status::ok)
          << last_error();
      blocks.push_back(p);
    }
    for (void* p : blocks) ASSERT_EQ(pool.deallocate(p, nullptr, 0), status::ok);
    blocks.clear();
  }
  EXPECT_EQ(pool.stats().reserved_bytes, 20 * MiB);
  // Reserved slabs are kept.
  EXPECT_EQ(pool.release_cached(), 0u);
}

TEST_F(PinnedPool, BackgroundReservationReportsProgressAndServesAllocations) {
  pinned_pool_config c = small_config();
  c.reserve_bytes = 40 * MiB;
  c.reserve_in_background = true;
  c.report_progress = true;
  ::testing::internal::CaptureStderr();
  {
    pinned_pool pool(c);
    void* p = nullptr;
    ASSERT_EQ(pool.allocate(8 * MiB, &p), status::ok) << last_error();  // waits for a slab
    ASSERT_EQ(pool.wait_for_reservation(), status::ok) << last_error();
    const pool_stats s = pool.stats();
    EXPECT_EQ(s.reserved_bytes, 40 * MiB);
    EXPECT_EQ(s.slab_count, 5u);
    EXPECT_EQ(pool.deallocate(p, nullptr, 0), status::ok);
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("stash: pinned pool: reserved 0.04 of 0.04 GiB (100%)"), std::string::npos)
      << err;
  EXPECT_NE(err.find("reservation done"), std::string::npos) << err;
}

TEST_F(PinnedPool, BackgroundReservationFailureIsReported) {
  STASH_REQUIRE_DOUBLE();
  pinned_pool_config c = small_config();
  c.reserve_bytes = 32 * MiB;
  c.reserve_in_background = true;
  double_api().inject_fault("cudaHostAlloc", 2, cudaErrorMemoryAllocation);
  pinned_pool pool(c);
  EXPECT_EQ(pool.wait_for_reservation(), status::cuda_error);
  EXPECT_NE(std::string(last_error()).find("cudaErrorMemoryAllocation"), std::string::npos)
      << last_error();
  EXPECT_EQ(pool.stats().reserved_bytes, 8 * MiB);  // the first slab landed
  void* p = nullptr;
  ASSERT_EQ(pool.allocate(16 * KiB, &p), status::ok) << last_error();
  EXPECT_EQ(pool.deallocate(p, nullptr, 0), status::ok);
}

TEST_F(PinnedPool, SynchronousReservationFailureThrowsAndPinsNothing) {
  STASH_REQUIRE_DOUBLE();
  pinned_pool_config c = small_config();
  c.reserve_bytes = 24 * MiB;
  double_api().inject_fault("cudaHostAlloc", 2, cudaErrorMemoryAllocation);
  try {
    pinned_pool pool(c);
    FAIL() << "expected the reservation to fail";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), status::cuda_error);
    EXPECT_NE(std::string(e.what()).find("cudaErrorMemoryAllocation"), std::string::npos);
  }
}

TEST_F(PinnedPool, GrowthUnpinsFreeSlabsThatCannotServeTheRequest) {
  pinned_pool_config c = small_config();
  c.growth_bytes = 1 * MiB;
  pinned_pool pool(c);
  void* small = nullptr;
  ASSERT_EQ(pool.allocate(1 * MiB, &small), status::ok);
  ASSERT_EQ(pool.deallocate(small, nullptr, 0), status::ok);
  EXPECT_EQ(pool.stats().reserved_bytes, 1 * MiB);
  void* big = nullptr;
  ASSERT_EQ(pool.allocate(6 * MiB, &big), status::ok);
  const pool_stats s = pool.stats();
  EXPECT_EQ(s.reserved_bytes, 6 * MiB);  // the free 1 MiB slab went back
  EXPECT_EQ(s.slab_count, 1u);
  EXPECT_EQ(s.peak_reserved_bytes, 6 * MiB);  // unpinned before pinning
  EXPECT_EQ(pool.deallocate(big, nullptr, 0), status::ok);
  EXPECT_EQ(pool.release_cached(), 6 * MiB);
  EXPECT_EQ(pool.stats().reserved_bytes, 0u);
}

TEST_F(PinnedPool, RequestsLargerThanASlabAreRejected) {
  pinned_pool pool(small_config());
  void* p = nullptr;
  EXPECT_EQ(pool.allocate(8 * MiB + 1, &p), status::invalid_argument);
  EXPECT_NE(std::string(last_error()).find("slab_bytes"), std::string::npos) << last_error();
}

TEST_F(PinnedPool, LastSlabIsTrimmedToTheCap) {
  pinned_pool_config c = small_config();
  c.cap_bytes = 12 * MiB;
  pinned_pool pool(c);
  void *a = nullptr, *b = nullptr, *x = nullptr;
  ASSERT_EQ(pool.allocate(8 * MiB, &a), status::ok);
  ASSERT_EQ(pool.allocate(3 * MiB, &b), status::ok);
  EXPECT_EQ(pool.stats().reserved_bytes, 12 * MiB);
  EXPECT_EQ(pool.allocate(2 * MiB, &x), status::out_of_memory);
  EXPECT_NE(std::string(last_error()).find("cap 12582912"), std::string::npos) << last_error();
  pool.deallocate(a, nullptr, 0);
  pool.deallocate(b, nullptr, 0);
}

// Negative control for the conformance suite's event-guard test: when the caller does
// not name the stream that still copies into a block, the pool reuses it at once and the
// double's happens-before checker reports the overlap. (So its silence there means
// something.)
TEST_F(PinnedPool, CheckerSeesReuseWhenTheCopyStreamIsNotNamed) {
  STASH_REQUIRE_DOUBLE();
  double_api().clear_violations();
  pinned_pool_config c = small_config();
  c.cap_bytes = 1 * MiB;
  pinned_pool pool(c);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 1 * MiB), cudaSuccess);
  void* block = nullptr;
  ASSERT_EQ(pool.allocate(1 * MiB, &block), status::ok);
  ASSERT_EQ(double_api().stream_pause(s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(block, dev, 1 * MiB, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(pool.deallocate(block, nullptr, 0), status::ok);  // the caller's bug
  void* again = nullptr;
  ASSERT_EQ(pool.allocate(1 * MiB, &again), status::ok);
  EXPECT_EQ(again, block);
  double_api().host_access(again, 1 * MiB, 1);
  ASSERT_EQ(double_api().stream_resume(s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_FALSE(double_api().violations().empty());
  double_api().clear_violations();
  pool.deallocate(again, nullptr, 0);
  cudaFree(dev);
  cudaStreamDestroy(s);
}

TEST_F(PinnedPool, RejectsBadConfigurations) {
  pinned_pool_config c = small_config();
  c.alignment = 3000;
  EXPECT_THROW(pinned_pool{c}, error);
  c = small_config();
  c.alignment = 128;
  EXPECT_THROW(pinned_pool{c}, error);
  c = small_config();
  c.reserve_bytes = c.cap_bytes + 1;
  try {
    pinned_pool pool(c);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), status::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("exceeds the cap"), std::string::npos);
  }
}

TEST_F(PinnedPool, DefaultCapComesFromTheMachine) {
  pinned_pool_config c;
  c.report_progress = false;
  pinned_pool pool(c);
  EXPECT_GT(pool.config().cap_bytes, 0u);
  EXPECT_EQ(pool.config().cap_bytes % 4096, 0u);
  EXPECT_EQ(pool.stats().limit_bytes, pool.config().cap_bytes);
}

TEST_F(PinnedPool, SingleNodeMachinesAreNotPlaced) {
  int nodes = 0;
  for (int i = 0; i < 1024; ++i) {
    const std::string dir = "/sys/devices/system/node/node" + std::to_string(i);
    if (::access(dir.c_str(), F_OK) == 0) ++nodes;
  }
  pinned_pool pool(small_config());
  if (nodes <= 1) {
    EXPECT_EQ(pool.numa_node(), -1);
  } else {
    EXPECT_GE(pool.numa_node(), -1);
  }
  void* p = nullptr;
  ASSERT_EQ(pool.allocate(4 * KiB, &p), status::ok);
  EXPECT_EQ(pool.deallocate(p, nullptr, 0), status::ok);
}

}  // namespace
}  // namespace stash
