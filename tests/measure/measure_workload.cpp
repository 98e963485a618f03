// measure_workload: a tiny CUDA program for `stash profile` on a GPU. Two layers, three
// steps; forward scopes are plain NVTX ranges in the default domain (as PyTorch's
// torch.cuda.nvtx.range_push makes them), backward scopes are ranges in domain "stash",
// and each forward nests a producer scope "stash:tensor:h". Every scope launches
// fill_pattern kernels, so each must come out with a non-zero time.
#include <cstdio>

#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>

#include "tests/kernels/fill_checksum.h"
#include "runtime/measure/scope_name.h"
#include "runtime/nvtx_domain.h"

#define CHECK(call)                                                              \
  do {                                                                           \
    const cudaError_t e = (call);                                                \
    if (e != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,         \
                   cudaGetErrorString(e));                                       \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

int main() {
  constexpr size_t kBytes = size_t{256} << 20;
  void* buf = nullptr;
  CHECK(cudaMalloc(&buf, kBytes));
  for (int step = 0; step < 3; ++step) {
    for (int layer = 0; layer < 2; ++layer) {
      nvtxRangePushA(stash::measure::layer_scope_name(layer, false).c_str());
      nvtxRangePushA(stash::measure::tensor_scope_name("h").c_str());
      CHECK(stash::kernels::fill_pattern(buf, kBytes, step, nullptr));
      nvtxRangePop();
      CHECK(stash::kernels::fill_pattern(buf, kBytes, step + 1, nullptr));
      nvtxRangePop();
    }
    for (int layer = 1; layer >= 0; --layer) {
      stash::nvtx::scoped_range r(stash::measure::layer_scope_name(layer, true).c_str());
      for (int i = 0; i < 3; ++i) CHECK(stash::kernels::fill_pattern(buf, kBytes, i, nullptr));
    }
  }
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaFree(buf));
  std::printf("measure_workload: done\n");
  return 0;
}
