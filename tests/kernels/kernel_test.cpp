// Fill and checksum kernels against the host reference. Kernels need a GPU: this suite
// is labelled gpu and skips without a device (the shared test main).
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "tests/kernels/fill_checksum.h"
#include "tests/kernels/pattern.h"

namespace k = stash::kernels;

#define ASSERT_CUDA(x) ASSERT_EQ(cudaSuccess, (x)) << cudaGetErrorString(x)

TEST(Kernels, FillMatchesHostReferenceAndChecksumAgrees) {
  for (std::size_t bytes : {std::size_t{8}, std::size_t{13}, std::size_t{1} << 20,
                            (std::size_t{64} << 20) + 3}) {
    void* d = nullptr;
    std::uint64_t* d_sum = nullptr;
    ASSERT_CUDA(cudaMalloc(&d, bytes));
    ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&d_sum), sizeof(std::uint64_t)));
    ASSERT_CUDA(k::fill_pattern(d, bytes, 42, nullptr));
    ASSERT_CUDA(k::checksum(d, bytes, d_sum, nullptr));
    std::vector<unsigned char> got(bytes), want(bytes);
    std::uint64_t sum = 0;
    ASSERT_CUDA(cudaMemcpy(got.data(), d, bytes, cudaMemcpyDeviceToHost));
    ASSERT_CUDA(cudaMemcpy(&sum, d_sum, sizeof(sum), cudaMemcpyDeviceToHost));
    k::fill_pattern_host(want.data(), bytes, 42);
    EXPECT_EQ(want, got) << bytes << " bytes";
    EXPECT_EQ(k::checksum_host(want.data(), bytes), sum) << bytes << " bytes";
    cudaFree(d);
    cudaFree(d_sum);
  }
}

TEST(Kernels, MisalignedFillIsRejected) {
  void* d = nullptr;
  ASSERT_CUDA(cudaMalloc(&d, 64));
  EXPECT_EQ(cudaErrorInvalidValue,
            k::fill_pattern(static_cast<char*>(d) + 1, 16, 1, nullptr));
  cudaFree(d);
}
