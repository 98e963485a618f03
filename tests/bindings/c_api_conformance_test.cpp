// The conformance suite (tests/allocator/pool_conformance.h) through the C API, so that
// libstash.so's boundary (config structs, status codes, last error) is held to the same
// contract as the C++ pools.
#include <stdexcept>

#include "pool_conformance.h"
#include "stash.h"

namespace stash::test {
namespace {

pool_stats from_c(const stash_pool_stats_t& c) {
  pool_stats s;
  s.current_count = c.current_count;
  s.peak_count = c.peak_count;
  s.total_count = c.total_count;
  s.current_bytes = c.current_bytes;
  s.peak_bytes = c.peak_bytes;
  s.total_bytes = c.total_bytes;
  s.requested_bytes = c.requested_bytes;
  s.pending_count = c.pending_count;
  s.pending_bytes = c.pending_bytes;
  s.reserved_bytes = c.reserved_bytes;
  s.peak_reserved_bytes = c.peak_reserved_bytes;
  s.slab_count = c.slab_count;
  s.largest_free_bytes = c.largest_free_bytes;
  s.limit_bytes = c.limit_bytes;
  s.failed_count = c.failed_count;
  return s;
}

const stash_stream_t* c_streams(const cudaStream_t* s) {
  return reinterpret_cast<const stash_stream_t*>(s);
}

class c_pinned {
 public:
  static constexpr const char* fault_api = "cudaHostAlloc";
  static constexpr bool has_wait_policy = true;
  static constexpr bool host_accessible = true;
  static constexpr size_t default_alignment = 4096;

  explicit c_pinned(const conformance_config& c) {
    stash_pinned_pool_config_t cfg;
    stash_pinned_pool_config_init(&cfg);
    cfg.cap_bytes = c.limit;
    cfg.slab_bytes = c.slab;
    cfg.growth_bytes = c.slab;
    cfg.alignment = c.alignment;
    cfg.on_exhausted = c.wait_when_exhausted ? STASH_EXHAUSTED_WAIT : STASH_EXHAUSTED_FAIL;
    cfg.wait_timeout_ms = c.wait_timeout_ms;
    if (stash_pinned_pool_create(&cfg, &pool_) != STASH_OK) throw std::runtime_error(stash_last_error());
  }
  ~c_pinned() { stash_pinned_pool_destroy(pool_); }
  int alloc(size_t n, cudaStream_t, void** out) { return stash_pinned_alloc(pool_, n, out); }
  int free(void* p, const cudaStream_t* s, size_t n) {
    return stash_pinned_free(pool_, p, c_streams(s), n);
  }
  pool_stats stats() {
    stash_pool_stats_t s;
    stash_pool_stats_init(&s);
    EXPECT_EQ(stash_pinned_stats(pool_, &s), STASH_OK);
    return from_c(s);
  }
  void reset_peak() { EXPECT_EQ(stash_pinned_reset_peak(pool_), STASH_OK); }
  const char* error() { return stash_last_error(); }

 private:
  stash_pinned_pool_t* pool_ = nullptr;
};

class c_device {
 public:
  static constexpr const char* fault_api = "cudaMalloc";
  static constexpr bool has_wait_policy = false;
  static constexpr bool host_accessible = false;
  static constexpr size_t default_alignment = 512;

  explicit c_device(const conformance_config& c) {
    stash_device_pool_config_t cfg;
    stash_device_pool_config_init(&cfg);
    cfg.budget_bytes = c.limit;
    cfg.slab_bytes = c.slab;
    cfg.alignment = c.alignment;
    if (stash_device_pool_create(&cfg, &pool_) != STASH_OK) throw std::runtime_error(stash_last_error());
  }
  ~c_device() { stash_device_pool_destroy(pool_); }
  int alloc(size_t n, cudaStream_t s, void** out) {
    return stash_device_alloc(pool_, n, reinterpret_cast<stash_stream_t>(s), out);
  }
  int free(void* p, const cudaStream_t* s, size_t n) {
    return stash_device_free(pool_, p, c_streams(s), n);
  }
  pool_stats stats() {
    stash_pool_stats_t s;
    stash_pool_stats_init(&s);
    EXPECT_EQ(stash_device_stats(pool_, &s), STASH_OK);
    return from_c(s);
  }
  void reset_peak() { EXPECT_EQ(stash_device_reset_peak(pool_), STASH_OK); }
  const char* error() { return stash_last_error(); }

 private:
  stash_device_pool_t* pool_ = nullptr;
};

using CPools = ::testing::Types<c_pinned, c_device>;
INSTANTIATE_TYPED_TEST_SUITE_P(CApi, PoolConformance, CPools);

}  // namespace
}  // namespace stash::test
