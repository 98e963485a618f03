// Pure CPU tests of the bookkeeping core (no CUDA): best fit, split, coalesce, tags,
// statistics and the invariants after random churn.
#include "block_map.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace stash {
namespace {

constexpr size_t KiB = 1024;
constexpr size_t MiB = 1024 * KiB;

// Fake slab addresses: the map never touches the memory it manages.
void* addr(uintptr_t a) { return reinterpret_cast<void*>(a); }
constexpr uintptr_t slab_a = 0x10000000;
constexpr uintptr_t slab_b = 0x20000000;

void expect_valid(const block_map& m) {
  const char* why = nullptr;
  EXPECT_TRUE(m.check_invariants(&why)) << why;
}

TEST(BlockMap, RoundsToAlignmentOnly) {
  block_map m(4096);
  EXPECT_EQ(m.round_up(1), 4096u);
  EXPECT_EQ(m.round_up(4096), 4096u);
  EXPECT_EQ(m.round_up(4097), 8192u);
  EXPECT_EQ(m.round_up(129'500'000), 129'503'232u);  // not 256 MiB
  EXPECT_EQ(m.round_up(0), 0u);
  EXPECT_EQ(m.round_up(SIZE_MAX), 0u);
  EXPECT_THROW(block_map(3000), std::invalid_argument);
}

TEST(BlockMap, BestFitSplitsAndCoalesces) {
  block_map m(256);
  m.add_slab(addr(slab_a), 1 * MiB, 0, false);
  void* a = m.allocate(256 * KiB, 0, 256 * KiB);
  void* b = m.allocate(256 * KiB, 0, 256 * KiB);
  void* c = m.allocate(256 * KiB, 0, 256 * KiB);
  void* d = m.allocate(256 * KiB, 0, 256 * KiB);
  ASSERT_EQ(a, addr(slab_a));
  ASSERT_EQ(b, addr(slab_a + 256 * KiB));
  ASSERT_EQ(d, addr(slab_a + 768 * KiB));
  EXPECT_EQ(m.allocate(256, 0, 256), nullptr);
  expect_valid(m);
  // Freeing b and c leaves one coalesced 512 KiB hole.
  ASSERT_TRUE(m.release(b));
  ASSERT_TRUE(m.release(c));
  EXPECT_EQ(m.free_block_count(), 1u);
  EXPECT_EQ(m.largest_free(), 512 * KiB);
  EXPECT_EQ(m.allocate(512 * KiB, 0, 512 * KiB), b);
  expect_valid(m);
}

TEST(BlockMap, PicksTheSmallestFittingHoleThenTheLowestAddress) {
  block_map m(256);
  m.add_slab(addr(slab_a), 1 * MiB, 0, false);
  std::vector<void*> p;
  for (size_t s : {100 * KiB, 4 * KiB, 60 * KiB, 4 * KiB, 40 * KiB, 4 * KiB, 40 * KiB, 4 * KiB})
    p.push_back(m.allocate(s, 0, s));
  m.release(p[0]);  // 100 KiB hole
  m.release(p[2]);  // 60 KiB hole
  m.release(p[4]);  // 40 KiB hole
  m.release(p[6]);  // 40 KiB hole, higher address
  EXPECT_EQ(m.allocate(40 * KiB, 0, 1), p[4]);
  EXPECT_EQ(m.allocate(50 * KiB, 0, 1), p[2]);
  EXPECT_EQ(m.allocate(30 * KiB, 0, 1), p[6]);
  expect_valid(m);
}

TEST(BlockMap, NeverCoalescesAcrossSlabs) {
  block_map m(256);
  m.add_slab(addr(slab_a), 64 * KiB, 0, false);
  m.add_slab(addr(slab_a + 64 * KiB), 64 * KiB, 0, false);  // adjacent addresses
  EXPECT_EQ(m.free_block_count(), 2u);
  EXPECT_EQ(m.allocate(128 * KiB, 0, 1), nullptr);
  void* x = m.allocate(64 * KiB, 0, 1);
  void* y = m.allocate(64 * KiB, 0, 1);
  m.release(x);
  m.release(y);
  EXPECT_EQ(m.free_block_count(), 2u);
  expect_valid(m);
}

TEST(BlockMap, TagsSeparateFreeLists) {
  block_map m(256);
  m.add_slab(addr(slab_a), 64 * KiB, 1, false);
  m.add_slab(addr(slab_b), 64 * KiB, 2, false);
  void* p = m.allocate(4 * KiB, 2, 1);
  EXPECT_EQ(p, addr(slab_b));
  EXPECT_EQ(m.block_tag(p), 2u);
  EXPECT_EQ(m.allocate(4 * KiB, 3, 1), nullptr);
  EXPECT_EQ(m.largest_free(1), 64 * KiB);
  EXPECT_EQ(m.largest_free(2), 60 * KiB);
}

TEST(BlockMap, LookupAndBadReleases) {
  block_map m(256);
  m.add_slab(addr(slab_a), 64 * KiB, 0, false);
  void* p = m.allocate(4 * KiB, 0, 1);
  EXPECT_EQ(m.find(p), block_map::lookup::in_use);
  EXPECT_EQ(m.find(addr(slab_a + 8)), block_map::lookup::inside_block);
  EXPECT_EQ(m.find(addr(slab_b)), block_map::lookup::unknown);
  EXPECT_EQ(m.find(addr(slab_a + 4 * KiB)), block_map::lookup::free);
  EXPECT_FALSE(m.release(addr(slab_a + 8)));
  EXPECT_FALSE(m.release(addr(slab_b)));
  EXPECT_TRUE(m.release(p));
  EXPECT_FALSE(m.release(p));  // double free
  expect_valid(m);
}

TEST(BlockMap, RejectsBadSlabs) {
  block_map m(4096);
  EXPECT_THROW(m.add_slab(addr(slab_a + 1), 4096, 0, false), std::invalid_argument);
  EXPECT_THROW(m.add_slab(addr(slab_a), 4095, 0, false), std::invalid_argument);
  m.add_slab(addr(slab_a), 8192, 0, false);
  EXPECT_THROW(m.add_slab(addr(slab_a + 4096), 8192, 0, false), std::invalid_argument);
  EXPECT_THROW(m.add_slab(addr(slab_a - 4096), 8192, 0, false), std::invalid_argument);
  expect_valid(m);
}

TEST(BlockMap, PendingBlocksWaitForEveryGuard) {
  block_map m(256);
  m.add_slab(addr(slab_a), 64 * KiB, 0, false);
  void* p = m.allocate(64 * KiB, 0, 64 * KiB);
  ASSERT_TRUE(m.mark_pending(p, 2));
  EXPECT_EQ(m.find(p), block_map::lookup::pending);
  EXPECT_EQ(m.stats().pending_bytes, 64 * KiB);
  EXPECT_EQ(m.stats().current_bytes, 0u);
  EXPECT_EQ(m.allocate(256, 0, 1), nullptr);
  EXPECT_FALSE(m.release(p));  // a pending block cannot be freed again
  EXPECT_FALSE(m.complete_guard(p));
  EXPECT_TRUE(m.complete_guard(p));
  EXPECT_EQ(m.stats().pending_bytes, 0u);
  EXPECT_EQ(m.allocate(64 * KiB, 0, 1), p);
  expect_valid(m);
}

TEST(BlockMap, ExactStatistics) {
  block_map m(1024);
  m.add_slab(addr(slab_a), 1 * MiB, 0, false);
  void* a = m.allocate(m.round_up(1000), 0, 1000);
  void* b = m.allocate(m.round_up(3000), 0, 3000);
  pool_stats s = m.stats();
  EXPECT_EQ(s.current_count, 2u);
  EXPECT_EQ(s.current_bytes, 1024u + 3072u);
  EXPECT_EQ(s.requested_bytes, 4000u);
  EXPECT_EQ(s.peak_bytes, 4096u);
  EXPECT_EQ(s.total_count, 2u);
  EXPECT_EQ(s.reserved_bytes, 1 * MiB);
  EXPECT_EQ(s.slab_count, 1u);
  m.release(b);
  s = m.stats();
  EXPECT_EQ(s.current_bytes, 1024u);
  EXPECT_EQ(s.peak_bytes, 4096u);
  EXPECT_EQ(s.peak_count, 2u);
  m.reset_peak();
  s = m.stats();
  EXPECT_EQ(s.peak_bytes, 1024u);
  EXPECT_EQ(s.peak_count, 1u);
  EXPECT_EQ(s.total_bytes, 4096u);
  EXPECT_EQ(s.largest_free_bytes, 1 * MiB - 1024);
  m.release(a);
  EXPECT_EQ(m.stats().current_count, 0u);
}

TEST(BlockMap, RemovesOnlyEntirelyFreeUnkeptSlabs) {
  block_map m(256);
  m.add_slab(addr(slab_a), 64 * KiB, 0, false);
  m.add_slab(addr(slab_b), 64 * KiB, 0, true);
  m.add_slab(addr(slab_b + 1 * MiB), 128 * KiB, 0, false);
  void* p = m.allocate(128 * KiB, 0, 1);
  std::vector<void*> gone;
  auto on_removed = [&](void* base, size_t, block_map::tag_t) { gone.push_back(base); };
  EXPECT_EQ(m.remove_free_slabs(on_removed), 64 * KiB);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0], addr(slab_a));
  m.release(p);
  EXPECT_EQ(m.remove_free_slabs(on_removed, 100 * KiB), 0u);  // not below the size
  EXPECT_EQ(m.remove_free_slabs(on_removed), 128 * KiB);
  EXPECT_EQ(m.stats().reserved_bytes, 64 * KiB);
  expect_valid(m);
}

TEST(BlockMap, NoHeapGrowthAtSteadyState) {
  block_map m(256, 64);
  m.add_slab(addr(slab_a), 64 * MiB, 0, false);
  std::vector<void*> live;
  for (int i = 0; i < 50; ++i) live.push_back(m.allocate(m.round_up(1000 + i * 300), 0, 1));
  for (void* p : live) m.release(p);
  live.clear();
  // Same churn again: the node arena serves it from recycled slots.
  std::vector<void*> again;
  again.reserve(50);
  for (int i = 0; i < 50; ++i) again.push_back(m.allocate(m.round_up(1000 + i * 300), 0, 1));
  for (void* p : again) m.release(p);
  expect_valid(m);
}

TEST(BlockMap, RandomChurnKeepsInvariants) {
  block_map m(512);
  m.add_slab(addr(slab_a), 8 * MiB, 0, false);
  m.add_slab(addr(slab_b), 4 * MiB, 0, false);
  std::mt19937_64 rng(42);
  std::vector<void*> live;
  for (int step = 0; step < 20000; ++step) {
    const bool do_alloc = live.empty() || (rng() % 100) < 55;
    if (do_alloc) {
      const size_t req = 1 + rng() % (256 * KiB);
      if (void* p = m.allocate(m.round_up(req), 0, req)) live.push_back(p);
    } else {
      const size_t i = rng() % live.size();
      if (rng() % 4 == 0) {
        ASSERT_TRUE(m.mark_pending(live[i], 1));
        ASSERT_TRUE(m.complete_guard(live[i]));
      } else {
        ASSERT_TRUE(m.release(live[i]));
      }
      live[i] = live.back();
      live.pop_back();
    }
    if (step % 997 == 0) expect_valid(m);
  }
  for (void* p : live) ASSERT_TRUE(m.release(p));
  expect_valid(m);
  EXPECT_EQ(m.free_block_count(), 2u);
  EXPECT_EQ(m.largest_free(), 8 * MiB);
}

}  // namespace
}  // namespace stash
