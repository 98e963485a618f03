// Shared gtest main for suites that talk to the CUDA runtime. See Note [cpu and gpu
// variants of one test binary] in cmake/StashTesting.cmake.
#include <cstdlib>
#include <cstring>
#include <iostream>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "double_api.h"

namespace {

class RuntimeEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* want = std::getenv("STASH_TEST_RUNTIME");
    const bool want_double = want && std::strcmp(want, "double") == 0;
    const bool want_real = want && std::strcmp(want, "real") == 0;
    if (want_double && !stash::test::on_double()) {
      FAIL() << "STASH_TEST_RUNTIME=double but the test double of libcudart.so.13 did not "
                "load; check LD_LIBRARY_PATH and the binary's RUNPATH";
    }
    if (want_real && stash::test::on_double()) {
      FAIL() << "STASH_TEST_RUNTIME=real but the test double is loaded";
    }
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
      GTEST_SKIP() << "no CUDA device: " << cudaGetErrorString(err);
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new RuntimeEnvironment);
  return RUN_ALL_TESTS();
}
