// engine_fixture.h: a compute stream, stash's device pool and a prefetch engine, on the
// test double (cpu) or a real GPU (gpu), plus helpers to fill and read device memory.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "device_pool.h"
#include "double_api.h"
#include "prefetch_engine.h"

namespace stash::test {

using engine::engine_config;
using engine::engine_plan;
using engine::prefetch_engine;
using engine::tensor_action;
using engine::tensor_key;
using engine::tensor_state;

// "oo k" style plans: one string per layer, one letter per tensor (o/k/r).
inline engine_plan plan_of(const std::vector<std::string>& layers) {
  std::vector<size_t> per;
  std::vector<tensor_action> actions;
  for (const std::string& l : layers) {
    per.push_back(l.size());
    for (char c : l)
      actions.push_back(c == 'o'   ? tensor_action::offload
                        : c == 'r' ? tensor_action::recompute
                                   : tensor_action::keep);
  }
  return engine_plan::from_actions(per.size(), per.data(), actions.data());
}

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (on_double()) double_api().reset();
    ASSERT_EQ(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), cudaSuccess);
    device_pool_config dc;
    pool_ = std::make_unique<device_pool>(dc);
  }
  void TearDown() override {
    engine_.reset();
    pool_.reset();
    cudaStreamDestroy(compute_);
    if (on_double()) double_api().clear_faults();
  }

  engine_config config() const {
    engine_config c;
    c.compute = compute_;
    c.pool = pool_.get();
    c.pinned.cap_bytes = size_t{256} << 20;
    c.pinned.slab_bytes = size_t{64} << 20;
    c.pinned.growth_bytes = size_t{4} << 20;
    c.pinned.numa_placement = false;
    c.pinned.report_progress = false;
    return c;
  }
  void make(const engine_config& c, engine_plan p) {
    engine_ = std::make_unique<prefetch_engine>(c);
    ASSERT_EQ(engine_->set_plan(std::move(p)), status::ok) << last_error();
  }

  void* dev_alloc(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(pool_->allocate(bytes, compute_, &p), status::ok) << last_error();
    return p;
  }
  // Pageable async copies are synchronous with the host, on the compute stream's order.
  void fill(void* dev, const std::vector<uint8_t>& src) {
    ASSERT_EQ(cudaMemcpyAsync(dev, src.data(), src.size(), cudaMemcpyHostToDevice, compute_),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(compute_), cudaSuccess);
  }
  std::vector<uint8_t> read(const void* dev, size_t bytes) {
    std::vector<uint8_t> out(bytes);
    EXPECT_EQ(cudaMemcpyAsync(out.data(), dev, bytes, cudaMemcpyDeviceToHost, compute_),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(compute_), cudaSuccess);
    return out;
  }
  static std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> v(n);
    for (auto& b : v) b = static_cast<uint8_t>(rng());
    return v;
  }
  static size_t differing(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
    size_t d = a.size() > b.size() ? a.size() - b.size() : b.size() - a.size();
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d += a[i] != b[i];
    return d;
  }
  std::vector<std::string> violations() const { return double_api().violations(); }

  cudaStream_t compute_ = nullptr;
  std::unique_ptr<device_pool> pool_;
  std::unique_ptr<prefetch_engine> engine_;
};

}  // namespace stash::test
