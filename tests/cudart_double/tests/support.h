// support.h: helpers shared by the double's own tests.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "double_api.h"

#define CUDA_OK(expr)                                                        \
  do {                                                                       \
    const cudaError_t stash_err_ = (expr);                                   \
    ASSERT_EQ(stash_err_, cudaSuccess) << #expr << ": " << cudaGetErrorName(stash_err_); \
  } while (0)

namespace stash::test {

inline const DoubleApi& dbl() { return double_api(); }

// Every test on the double starts from stashdbl_reset() and must leave no violation
// behind unless it consumed them (checked_violations()).
class OnDouble : public ::testing::Test {
 protected:
  void SetUp() override {
    STASH_REQUIRE_DOUBLE();
    dbl().reset();
  }
  void TearDown() override {
    if (!on_double()) return;
    for (const std::string& v : dbl().violations()) ADD_FAILURE() << "unexpected: " << v;
    dbl().reset();
  }
  // Returns and clears the violations recorded so far.
  std::vector<std::string> take_violations() {
    std::vector<std::string> v = dbl().violations();
    dbl().clear_violations();
    return v;
  }
};

// Owners, so that a failing assertion does not leak into later tests.
struct StreamOwner {
  cudaStream_t s = nullptr;
  explicit StreamOwner(unsigned flags = cudaStreamDefault) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&s, flags), cudaSuccess);
  }
  ~StreamOwner() {
    if (on_double()) dbl().stream_resume(s);
    cudaStreamDestroy(s);
  }
  operator cudaStream_t() const { return s; }
};

struct EventOwner {
  cudaEvent_t e = nullptr;
  explicit EventOwner(unsigned flags = cudaEventDefault) {
    EXPECT_EQ(cudaEventCreateWithFlags(&e, flags), cudaSuccess);
  }
  ~EventOwner() { cudaEventDestroy(e); }
  operator cudaEvent_t() const { return e; }
};

struct DeviceBuffer {
  void* p = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t bytes) : n(bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
  template <class T = unsigned char>
  T* get() const {
    return static_cast<T*>(p);
  }
};

struct PinnedBuffer {
  void* p = nullptr;
  size_t n = 0;
  explicit PinnedBuffer(size_t bytes) : n(bytes) {
    EXPECT_EQ(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), cudaSuccess);
  }
  ~PinnedBuffer() {
    if (p) cudaFreeHost(p);
  }
  template <class T = unsigned char>
  T* get() const {
    return static_cast<T*>(p);
  }
};

}  // namespace stash::test
