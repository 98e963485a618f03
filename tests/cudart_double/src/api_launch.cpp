// api_launch.cpp: nvcc's registration and launch entry points, and kernel launches.
//
// Note [Kernel launches]
// No kernel can run on a CPU. Registration (__cudaRegisterFatBinary and kin, run by
// static constructors of every nvcc-compiled object) succeeds and does nothing, so
// binaries that contain kernels load and run their host code. Every launch, through the
// <<<>>> path (__cudaPushCallConfiguration, __cudaPopCallConfiguration, __cudaGetKernel,
// __cudaLaunchKernel) or cudaLaunchKernel/cudaLaunchKernelExC/cudaLaunchCooperativeKernel,
// fails with cudaErrorNoKernelImageForDevice, "no kernel image is available for execution
// on the device", which is exactly the situation, and records it as the last error (an
// invalid stream still fails with cudaErrorInvalidResourceHandle first). Nothing is
// enqueued, so a launch has no effect on streams, clocks or the checker.
#include <mutex>
#include <vector>

#include "streams.h"

namespace stash::dbl {
namespace {

struct LaunchConfig {
  dim3 grid, block;
  size_t shared_mem;
  cudaStream_t stream;
};
thread_local std::vector<LaunchConfig> launch_configs;

void* fatbin_handle_storage = nullptr;

cudaError_t launch(cudaStream_t stream) {
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  if (find_stream(st, stream) == nullptr) return fail(cudaErrorInvalidResourceHandle);
  return fail(cudaErrorNoKernelImageForDevice);
}

}  // namespace
}  // namespace stash::dbl

using namespace stash::dbl;

// --- registration: no-ops (they return void and cannot fail) ---------------------------

STASHDBL_EXPORT void** __cudaRegisterFatBinary(void*) { return &fatbin_handle_storage; }
STASHDBL_EXPORT void __cudaRegisterFatBinaryEnd(void**) {}
STASHDBL_EXPORT void __cudaUnregisterFatBinary(void**) {}
STASHDBL_EXPORT void __cudaRegisterVar(void**, char*, char*, const char*, int, size_t, int, int) {}
STASHDBL_EXPORT void __cudaRegisterManagedVar(void**, void**, char*, const char*, int, size_t, int,
                                             int) {}
STASHDBL_EXPORT char __cudaInitModule(void**) { return 1; }
STASHDBL_EXPORT void __cudaRegisterFunction(void**, const char*, char*, const char*, int, uint3*,
                                           uint3*, dim3*, dim3*, int*) {}

// --- the <<<>>> path ---------------------------------------------------------------------

STASHDBL_EXPORT unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                                    struct CUstream_st* stream) {
  launch_configs.push_back({gridDim, blockDim, sharedMem, stream});
  return 0;
}

STASHDBL_EXPORT cudaError_t __cudaPopCallConfiguration(dim3* gridDim, dim3* blockDim,
                                                      size_t* sharedMem, void* stream) {
  if (launch_configs.empty()) return fail(cudaErrorMissingConfiguration);
  const LaunchConfig c = launch_configs.back();
  launch_configs.pop_back();
  if (gridDim) *gridDim = c.grid;
  if (blockDim) *blockDim = c.block;
  if (sharedMem) *sharedMem = c.shared_mem;
  if (stream) *static_cast<cudaStream_t*>(stream) = c.stream;
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* func) {
  STASHDBL_ENTER("__cudaGetKernel");
  if (kernel == nullptr) return fail(cudaErrorInvalidValue);
  *kernel = reinterpret_cast<cudaKernel_t>(const_cast<void*>(func));
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t __cudaLaunchKernel(cudaKernel_t, dim3, dim3, void**, size_t,
                                              cudaStream_t stream) {
  STASHDBL_ENTER("__cudaLaunchKernel");
  return launch(stream);
}

STASHDBL_EXPORT cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t, dim3, dim3, void**, size_t,
                                                   cudaStream_t stream) {
  STASHDBL_ENTER("__cudaLaunchKernel");
  return launch(stream);
}

// --- runtime launch APIs -------------------------------------------------------------------

STASHDBL_EXPORT cudaError_t cudaLaunchKernel(const void*, dim3, dim3, void**, size_t,
                                            cudaStream_t stream) {
  STASHDBL_ENTER("cudaLaunchKernel");
  return launch(stream);
}

STASHDBL_EXPORT cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void*,
                                               void**) {
  STASHDBL_ENTER("cudaLaunchKernelExC");
  if (config == nullptr) return fail(cudaErrorInvalidValue);
  return launch(config->stream);
}

STASHDBL_EXPORT cudaError_t cudaLaunchCooperativeKernel(const void*, dim3, dim3, void**, size_t,
                                                       cudaStream_t stream) {
  STASHDBL_ENTER("cudaLaunchCooperativeKernel");
  return launch(stream);
}

STASHDBL_EXPORT cudaError_t cudaLaunchKernel_ptsz(const void* f, dim3 g, dim3 b, void** a,
                                                 size_t s, cudaStream_t st) {
  return cudaLaunchKernel(f, g, b, a, s, st);
}

STASHDBL_EXPORT cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t* c, const void* f,
                                                    void** a) {
  return cudaLaunchKernelExC(c, f, a);
}

STASHDBL_EXPORT cudaError_t cudaLaunchCooperativeKernel_ptsz(const void* f, dim3 g, dim3 b,
                                                            void** a, size_t s, cudaStream_t st) {
  return cudaLaunchCooperativeKernel(f, g, b, a, s, st);
}
