// The conformance suite (pool_conformance.h) for the C++ pools.
#include <memory>

#include "device_pool.h"
#include "pinned_pool.h"
#include "pool_conformance.h"
#include "core/error.h"

namespace stash::test {
namespace {

class cpp_pinned {
 public:
  static constexpr const char* fault_api = "cudaHostAlloc";
  static constexpr bool has_wait_policy = true;
  static constexpr bool host_accessible = true;
  static constexpr size_t default_alignment = 4096;

  explicit cpp_pinned(const conformance_config& c) {
    pinned_pool_config pc;
    pc.cap_bytes = c.limit;
    pc.slab_bytes = c.slab;
    pc.growth_bytes = c.slab;
    pc.alignment = c.alignment;
    pc.on_exhausted = c.wait_when_exhausted ? exhaustion_policy::wait : exhaustion_policy::fail;
    pc.wait_timeout_ms = c.wait_timeout_ms;
    pool_ = std::make_unique<pinned_pool>(pc);
  }
  int alloc(size_t n, cudaStream_t, void** out) { return static_cast<int>(pool_->allocate(n, out)); }
  int free(void* p, const cudaStream_t* s, size_t n) {
    return static_cast<int>(pool_->deallocate(p, s, n));
  }
  pool_stats stats() { return pool_->stats(); }
  void reset_peak() { pool_->reset_peak(); }
  const char* error() { return last_error(); }

 private:
  std::unique_ptr<pinned_pool> pool_;
};

class cpp_device {
 public:
  static constexpr const char* fault_api = "cudaMalloc";
  static constexpr bool has_wait_policy = false;
  static constexpr bool host_accessible = false;
  static constexpr size_t default_alignment = 512;

  explicit cpp_device(const conformance_config& c) {
    device_pool_config dc;
    dc.budget_bytes = c.limit;
    dc.slab_bytes = c.slab;
    dc.alignment = c.alignment;
    pool_ = std::make_unique<device_pool>(dc);
  }
  int alloc(size_t n, cudaStream_t s, void** out) {
    return static_cast<int>(pool_->allocate(n, s, out));
  }
  int free(void* p, const cudaStream_t* s, size_t n) {
    return static_cast<int>(pool_->deallocate(p, s, n));
  }
  pool_stats stats() { return pool_->stats(); }
  void reset_peak() { pool_->reset_peak(); }
  const char* error() { return last_error(); }

 private:
  std::unique_ptr<device_pool> pool_;
};

using CppPools = ::testing::Types<cpp_pinned, cpp_device>;
INSTANTIATE_TYPED_TEST_SUITE_P(Cpp, PoolConformance, CppPools);

}  // namespace
}  // namespace stash::test
