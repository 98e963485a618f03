// libstash_torch.so, the PyTorch pluggable allocator, called as PyTorch calls it.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include <cuda_runtime_api.h>

#include "stash_torch.h"

namespace {

constexpr size_t MiB = size_t{1} << 20;

stash_pool_stats_t stats(int device = 0) {
  stash_pool_stats_t s;
  std::memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  EXPECT_EQ(stash_torch_stats(device, &s), STASH_OK);
  return s;
}

// Each test starts from an empty pool with no budget (the pool is process-wide).
class TorchAlloc : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(stash_torch_set_budget(-1, 0), STASH_OK); }
};

TEST_F(TorchAlloc, MallocFreeAndStats) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  void* a = stash_torch_malloc(3 * MiB, 0, s);
  void* b = stash_torch_malloc(1000, 0, s);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 512, 0u);
  // Usable device memory: a copy through it round-trips.
  std::string in(1000, 'q'), out(1000, '\0');
  ASSERT_EQ(cudaMemcpy(b, in.data(), 1000, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(out.data(), b, 1000, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(in, out);
  stash_pool_stats_t st = stats();
  EXPECT_EQ(st.current_count, 2u);
  EXPECT_EQ(st.current_bytes, 3 * MiB + 1024);  // rounded to the 512-byte alignment
  EXPECT_EQ(st.requested_bytes, 3 * MiB + 1000);
  stash_torch_free(a, 3 * MiB, 0, s);
  stash_torch_free(b, 1000, 0, s);
  stash_torch_free(nullptr, 0, 0, s);
  st = stats();
  EXPECT_EQ(st.current_count, 0u);
  EXPECT_EQ(st.peak_bytes, 3 * MiB + 1024);
  EXPECT_EQ(st.total_count, 2u);
  // A freed block is reused by the same stream.
  void* c = stash_torch_malloc(3 * MiB, 0, s);
  EXPECT_EQ(c, a);
  stash_torch_free(c, 3 * MiB, 0, s);
  EXPECT_EQ(stash_torch_reset_peak(0), STASH_OK);
  EXPECT_EQ(stats().peak_bytes, 0u);
  size_t released = 0;
  EXPECT_EQ(stash_torch_release_cached(0, &released), STASH_OK);
  EXPECT_GT(released, 0u);
  EXPECT_EQ(stats().reserved_bytes, 0u);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST_F(TorchAlloc, Budget) {
  ASSERT_EQ(stash_torch_set_budget(0, 64 * MiB), STASH_OK);
  EXPECT_EQ(stats().limit_bytes, 64 * MiB);  // before the pool exists, too
  void* a = stash_torch_malloc(40 * MiB, 0, nullptr);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(stash_torch_malloc(40 * MiB, 0, nullptr), nullptr);
  EXPECT_NE(std::strstr(stash_torch_last_error(), "budget"), nullptr) << stash_torch_last_error();
  stash_pool_stats_t st = stats();
  EXPECT_EQ(st.failed_count, 1u);
  EXPECT_EQ(st.limit_bytes, 64 * MiB);
  EXPECT_LE(st.reserved_bytes, 64 * MiB);
  // Not while a block is live.
  EXPECT_EQ(stash_torch_set_budget(0, 128 * MiB), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stats().limit_bytes, 64 * MiB);
  stash_torch_free(a, 40 * MiB, 0, nullptr);
  ASSERT_EQ(stash_torch_set_budget(0, 128 * MiB), STASH_OK);
  void* b = stash_torch_malloc(100 * MiB, 0, nullptr);
  EXPECT_NE(b, nullptr);
  stash_torch_free(b, 100 * MiB, 0, nullptr);
}

TEST_F(TorchAlloc, BadArguments) {
  EXPECT_EQ(stash_torch_malloc(0, 0, nullptr), nullptr);
  EXPECT_EQ(stash_torch_malloc(MiB, -1, nullptr), nullptr);
  EXPECT_EQ(stash_torch_malloc(MiB, 64, nullptr), nullptr);
  EXPECT_NE(std::strstr(stash_torch_last_error(), "out of range"), nullptr);
  EXPECT_EQ(stash_torch_stats(0, nullptr), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stash_torch_set_budget(-2, 0), STASH_ERROR_INVALID_ARGUMENT);
  int foreign = 0;
  stash_torch_free(&foreign, 4, 0, nullptr);  // ignored, with a message
  EXPECT_NE(std::string(stash_torch_last_error()).find("pool"), std::string::npos);
  EXPECT_EQ(stats().current_count, 0u);
}

// Only the stash_torch_* entry points leave the library.
TEST(TorchAllocExports, OnlyStashTorchSymbols) {
  Dl_info info;
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&stash_torch_malloc), &info), 0);
  void* lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr);
  EXPECT_NE(dlsym(lib, "stash_torch_free"), nullptr);
  EXPECT_EQ(dlsym(lib, "_ZN5stash11device_pool8allocateEmP11CUstream_stPPv"), nullptr);
  EXPECT_EQ(dlsym(lib, "stash_device_alloc"), nullptr);
  dlclose(lib);
}

}  // namespace
