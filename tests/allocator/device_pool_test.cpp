// Device-pool behaviour beyond the conformance suite: stream-ordered reuse, the budget's
// release of cached slabs, release_cached, and configuration errors.
#include <gtest/gtest.h>

#include <string>

#include "device_pool.h"
#include "double_api.h"
#include "core/error.h"

namespace stash {
namespace {

constexpr size_t MiB = 1024 * 1024;

class Stream {
 public:
  Stream() { cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking); }
  ~Stream() {
    cudaStreamSynchronize(s_);
    cudaStreamDestroy(s_);
  }
  operator cudaStream_t() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

device_pool_config config(size_t budget) {
  device_pool_config c;
  c.budget_bytes = budget;
  c.slab_bytes = 4 * MiB;
  return c;
}

TEST(DevicePool, SameStreamReusesAtOnceOtherStreamsDoNot) {
  device_pool pool(config(64 * MiB));
  Stream a, b;
  void* p = nullptr;
  ASSERT_EQ(pool.allocate(1 * MiB, a, &p), status::ok) << last_error();
  ASSERT_EQ(pool.deallocate(p, nullptr, 0), status::ok);
  void* q = nullptr;
  ASSERT_EQ(pool.allocate(1 * MiB, a, &q), status::ok);
  EXPECT_EQ(q, p);  // stream order makes it safe
  ASSERT_EQ(pool.deallocate(q, nullptr, 0), status::ok);
  void* r = nullptr;
  ASSERT_EQ(pool.allocate(1 * MiB, b, &r), status::ok);
  EXPECT_NE(r, p);  // b gets its own slab
  EXPECT_EQ(pool.stats().slab_count, 2u);
  ASSERT_EQ(pool.deallocate(r, nullptr, 0), status::ok);
}

TEST(DevicePool, AllocationStreamNeedsNoEventAtFree) {
  device_pool pool(config(64 * MiB));
  Stream a;
  void* p = nullptr;
  ASSERT_EQ(pool.allocate(1 * MiB, a, &p), status::ok);
  const cudaStream_t used[] = {a};
  ASSERT_EQ(pool.deallocate(p, used, 1), status::ok);
  EXPECT_EQ(pool.stats().pending_count, 0u);
}

// held_bytes / held_peak_since_last (the engine's "device bytes" samples): blocks in use
// plus blocks freed but still awaited by another stream, and the highest such level since
// the previous read.
TEST(DevicePool, HeldBytesCountPendingBlocksAndPeakPerWindow) {
  if (!test::on_double()) GTEST_SKIP() << "pausing a stream needs the double";
  device_pool pool(config(64 * MiB));
  Stream a, b;
  EXPECT_EQ(pool.held_peak_since_last(), 0u);
  void *p = nullptr, *q = nullptr, *r = nullptr;
  ASSERT_EQ(pool.allocate(2 * MiB, a, &p), status::ok);
  ASSERT_EQ(pool.allocate(1 * MiB, a, &q), status::ok);
  EXPECT_EQ(pool.held_bytes(), 3 * MiB);
  ASSERT_EQ(test::double_api().stream_pause(b), cudaSuccess);
  const cudaStream_t used[] = {b};
  ASSERT_EQ(pool.deallocate(p, used, 1), status::ok);  // b has not reached its event
  EXPECT_EQ(pool.held_bytes(), 3 * MiB);
  ASSERT_EQ(pool.deallocate(q, nullptr, 0), status::ok);
  EXPECT_EQ(pool.held_bytes(), 2 * MiB);
  EXPECT_EQ(pool.held_peak_since_last(), 3 * MiB);
  EXPECT_EQ(pool.held_peak_since_last(), 2 * MiB);  // a new window starts at the level
  ASSERT_EQ(pool.allocate(4 * MiB, a, &r), status::ok);
  ASSERT_EQ(pool.deallocate(r, nullptr, 0), status::ok);
  EXPECT_EQ(pool.held_peak_since_last(), 6 * MiB);
  ASSERT_EQ(test::double_api().stream_resume(b), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  EXPECT_EQ(pool.stats().pending_count, 0u);  // stats() retires the completed guard
  EXPECT_EQ(pool.held_bytes(), 0u);
}

TEST(DevicePool, BudgetPressureReleasesOtherStreamsCachedSlabs) {
  device_pool pool(config(8 * MiB));
  Stream a, b;
  void* p = nullptr;
  ASSERT_EQ(pool.allocate(6 * MiB, a, &p), status::ok);
  ASSERT_EQ(pool.deallocate(p, nullptr, 0), status::ok);  // cached for a
  void* q = nullptr;
  ASSERT_EQ(pool.allocate(6 * MiB, b, &q), status::ok) << last_error();
  const pool_stats s = pool.stats();
  EXPECT_LE(s.reserved_bytes, 8 * MiB);
  EXPECT_EQ(s.slab_count, 1u);
  ASSERT_EQ(pool.deallocate(q, nullptr, 0), status::ok);
}

TEST(DevicePool, ReleaseCachedGivesBackOnlyFreeSlabs) {
  device_pool pool(config(0));  // no budget
  Stream a, b;
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(pool.allocate(1 * MiB, a, &p), status::ok);
  ASSERT_EQ(pool.allocate(1 * MiB, b, &q), status::ok);
  ASSERT_EQ(pool.deallocate(p, nullptr, 0), status::ok);
  EXPECT_EQ(pool.release_cached(), 4 * MiB);
  const pool_stats s = pool.stats();
  EXPECT_EQ(s.reserved_bytes, 4 * MiB);
  EXPECT_EQ(s.limit_bytes, 0u);
  ASSERT_EQ(pool.deallocate(q, nullptr, 0), status::ok);
  EXPECT_EQ(pool.release_cached(), 4 * MiB);
}

TEST(DevicePool, LargeRequestsGetTheirOwnSlabWithoutPowerOfTwoRounding) {
  device_pool pool(config(0));
  void* p = nullptr;
  ASSERT_EQ(pool.allocate(129'500'000, nullptr, &p), status::ok);
  const pool_stats s = pool.stats();
  EXPECT_EQ(s.reserved_bytes, 130'023'424u);  // 2 MiB granules, not 256 MiB
  ASSERT_EQ(pool.deallocate(p, nullptr, 0), status::ok);
}

TEST(DevicePool, DeviceOutOfMemoryIsAnOomWithTheReport) {
  STASH_REQUIRE_DOUBLE();
  test::double_api().reset();
  test::double_api().set_device_memory(64 * MiB);
  {
    device_pool pool(config(0));
    void* p = nullptr;
    EXPECT_EQ(pool.allocate(128 * MiB, nullptr, &p), status::out_of_memory);
    const std::string msg = last_error();
    EXPECT_NE(msg.find("cudaErrorMemoryAllocation"), std::string::npos) << msg;
    EXPECT_NE(msg.find("largest free block"), std::string::npos) << msg;
  }
  test::double_api().reset();
}

// During capture the pool must neither query events nor grow. The double never
// captures, so the capture is simulated: cudaStreamIsCapturing fails the way it does for
// a stream caught in another thread's global-mode capture, which the pool treats as
// capturing. Had the pool queried the guard event, it would have found it complete and
// handed the block out.
TEST(DevicePool, NoEventQueryAndNoGrowthWhileCapturing) {
  STASH_REQUIRE_DOUBLE();
  device_pool pool(config(4 * MiB));
  Stream a, b;
  void* block = nullptr;
  ASSERT_EQ(pool.allocate(4 * MiB, a, &block), status::ok);
  const cudaStream_t used[] = {b};
  ASSERT_EQ(pool.deallocate(block, used, 1), status::ok);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);  // the guard event is complete
  test::double_api().inject_fault("cudaStreamIsCapturing", 1, cudaErrorStreamCaptureImplicit);
  void* p = nullptr;
  EXPECT_EQ(pool.allocate(4 * MiB, a, &p), status::out_of_memory);
  EXPECT_NE(std::string(last_error()).find("capturing"), std::string::npos) << last_error();
  EXPECT_EQ(pool.stats().reserved_bytes, 4 * MiB);
  test::double_api().clear_faults();
  ASSERT_EQ(pool.allocate(4 * MiB, a, &p), status::ok) << last_error();  // capture over
  EXPECT_EQ(p, block);
  EXPECT_EQ(pool.deallocate(p, nullptr, 0), status::ok);
}

TEST(DevicePool, RejectsBadConfigurations) {
  device_pool_config c;
  c.alignment = 128;
  EXPECT_THROW(device_pool{c}, error);
  c.alignment = 1000;
  EXPECT_THROW(device_pool{c}, error);
}

}  // namespace
}  // namespace stash
