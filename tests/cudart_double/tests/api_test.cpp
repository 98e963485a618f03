// Entry points outside streams: fault injection, kernel launches, memory accounting and
// the default pool, device queries, errors, pointer attributes, bad arguments.
#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "support.h"

// nvcc's launch path, as its generated host code declares it (crt/host_runtime.h).
extern "C" {
unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                     struct CUstream_st* stream);
cudaError_t __cudaPopCallConfiguration(dim3* gridDim, dim3* blockDim, size_t* sharedMem,
                                       void* stream);
cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* func);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void** args,
                               size_t sharedMem, cudaStream_t stream);
}

namespace stash::test {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

class Api : public OnDouble {};

TEST_F(Api, FaultFailsTheNthCallThenNothing) {
  void* p[4] = {};
  dbl().inject_fault("cudaMalloc", 2, cudaErrorMemoryAllocation);
  CUDA_OK(cudaMalloc(&p[0], 256));
  void* untouched = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(cudaMalloc(&untouched, 256), cudaErrorMemoryAllocation);
  EXPECT_EQ(untouched, reinterpret_cast<void*>(0x1)) << "a failed call does nothing";
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  CUDA_OK(cudaMalloc(&p[1], 256));
  CUDA_OK(cudaMalloc(&p[2], 256));
  for (void* q : p) CUDA_OK(cudaFree(q));
}

TEST_F(Api, FaultsCountByExactName) {
  StreamOwner s;
  PinnedBuffer h(256);
  DeviceBuffer d(256);
  void* q = nullptr;
  dbl().inject_fault("cudaHostAlloc", 1, cudaErrorMemoryAllocation);
  dbl().inject_fault("cudaMemcpyAsync", 3, cudaErrorLaunchFailure);
  CUDA_OK(cudaMallocHost(&q, 64));  // another name: not counted
  CUDA_OK(cudaMemcpy(d.p, h.p, 256, cudaMemcpyHostToDevice));
  void* never = nullptr;
  EXPECT_EQ(cudaHostAlloc(&never, 64, 0), cudaErrorMemoryAllocation);
  EXPECT_EQ(never, nullptr);
  CUDA_OK(cudaMemcpyAsync(d.p, h.p, 256, cudaMemcpyHostToDevice, s));
  CUDA_OK(cudaMemcpyAsync(d.p, h.p, 256, cudaMemcpyHostToDevice, s));
  EXPECT_EQ(cudaMemcpyAsync(d.p, h.p, 256, cudaMemcpyHostToDevice, s), cudaErrorLaunchFailure);
  CUDA_OK(cudaMemcpyAsync(d.p, h.p, 256, cudaMemcpyHostToDevice, s));
  dbl().inject_fault("cudaStreamSynchronize", 1, cudaErrorIllegalAddress);
  dbl().clear_faults();
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaFreeHost(q));
  cudaGetLastError();
}

void not_a_kernel() {}

TEST_F(Api, KernelLaunchFailsAndSetsLastError) {
  CUDA_OK(cudaGetLastError());
  EXPECT_EQ(cudaLaunchKernel(reinterpret_cast<const void*>(&not_a_kernel), dim3(1), dim3(1),
                             nullptr, 0, nullptr),
            cudaErrorNoKernelImageForDevice);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorNoKernelImageForDevice);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorNoKernelImageForDevice) << "peek does not reset";
  EXPECT_EQ(cudaGetLastError(), cudaErrorNoKernelImageForDevice);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "get resets";

  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(32);
  EXPECT_EQ(cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(&not_a_kernel), nullptr),
            cudaErrorNoKernelImageForDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorNoKernelImageForDevice);

  // What `kernel<<<4, 64>>>()` compiles to.
  ASSERT_EQ(__cudaPushCallConfiguration(dim3(4), dim3(64), 0, nullptr), 0u);
  dim3 grid, block;
  size_t shmem = 1;
  cudaStream_t stream = reinterpret_cast<cudaStream_t>(0x1234);
  CUDA_OK(__cudaPopCallConfiguration(&grid, &block, &shmem, &stream));
  EXPECT_EQ(grid.x, 4u);
  EXPECT_EQ(block.x, 64u);
  EXPECT_EQ(shmem, 0u);
  EXPECT_EQ(stream, nullptr);
  cudaKernel_t k = nullptr;
  CUDA_OK(__cudaGetKernel(&k, reinterpret_cast<const void*>(&not_a_kernel)));
  EXPECT_EQ(__cudaLaunchKernel(k, grid, block, nullptr, shmem, stream),
            cudaErrorNoKernelImageForDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorNoKernelImageForDevice);
  EXPECT_EQ(__cudaPopCallConfiguration(&grid, &block, &shmem, &stream),
            cudaErrorMissingConfiguration);
  cudaGetLastError();
}

TEST_F(Api, MemGetInfoTracksAllocations) {
  dbl().set_device_memory(1024 * kMiB);
  size_t free = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free, &total));
  EXPECT_EQ(total, 1024 * kMiB);
  EXPECT_EQ(free, 1024 * kMiB);
  void* a = nullptr;
  void* b = nullptr;
  CUDA_OK(cudaMalloc(&a, 256 * kMiB));
  CUDA_OK(cudaMemGetInfo(&free, &total));
  EXPECT_EQ(free, 768 * kMiB);
  EXPECT_EQ(cudaMalloc(&b, 800 * kMiB), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  CUDA_OK(cudaMalloc(&b, 768 * kMiB));
  CUDA_OK(cudaMemGetInfo(&free, &total));
  EXPECT_EQ(free, 0u);
  void* c = nullptr;
  EXPECT_EQ(cudaMalloc(&c, 1), cudaErrorMemoryAllocation);
  CUDA_OK(cudaFree(a));
  CUDA_OK(cudaFree(b));
  CUDA_OK(cudaMemGetInfo(&free, &total));
  EXPECT_EQ(free, 1024 * kMiB);
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  EXPECT_EQ(prop.totalGlobalMem, 1024 * kMiB);
  cudaGetLastError();
}

TEST_F(Api, StreamOrderedFreeReturnsMemoryWhenTheStreamGetsThere) {
  dbl().set_device_memory(1024 * kMiB);
  StreamOwner s;
  cudaMemPool_t pool;
  CUDA_OK(cudaDeviceGetDefaultMemPool(&pool, 0));
  void* p = nullptr;
  CUDA_OK(dbl().stream_pause(s));
  CUDA_OK(cudaMallocAsync(&p, 100 * kMiB, s));
  CUDA_OK(cudaFreeAsync(p, s));
  size_t free = 0, total = 0;
  uint64_t used = 0, reserved = 0, high = 0;
  CUDA_OK(cudaMemGetInfo(&free, &total));
  EXPECT_EQ(free, 924 * kMiB) << "the free has not happened yet";
  CUDA_OK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  EXPECT_EQ(used, 100 * kMiB);
  EXPECT_EQ(cudaFree(p), cudaErrorInvalidValue) << "already freed (stream-ordered)";
  CUDA_OK(dbl().stream_resume(s));
  CUDA_OK(cudaStreamSynchronize(s));  // release threshold 0: the pool gives it all back
  CUDA_OK(cudaMemGetInfo(&free, &total));
  EXPECT_EQ(free, 1024 * kMiB);
  CUDA_OK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  CUDA_OK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
  EXPECT_EQ(used, 0u);
  EXPECT_EQ(high, 100 * kMiB);

  // With a release threshold the pool keeps freed bytes reserved until trimmed.
  uint64_t threshold = UINT64_MAX;
  CUDA_OK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  CUDA_OK(cudaMallocFromPoolAsync(&p, 64 * kMiB, pool, s));
  CUDA_OK(cudaFreeAsync(p, s));
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  EXPECT_EQ(reserved, 64 * kMiB);
  CUDA_OK(cudaMemGetInfo(&free, &total));
  EXPECT_EQ(free, 960 * kMiB);
  CUDA_OK(cudaMemPoolTrimTo(pool, 0));
  CUDA_OK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  EXPECT_EQ(reserved, 0u);
  uint64_t zero = 0;
  CUDA_OK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  CUDA_OK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
  EXPECT_EQ(high, 0u);
  CUDA_OK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &zero));
}

TEST_F(Api, DeviceQueries) {
  int n = 0, dev = -1, v = 0;
  CUDA_OK(cudaGetDeviceCount(&n));
  EXPECT_EQ(n, 1);
  CUDA_OK(cudaSetDevice(0));
  EXPECT_EQ(cudaSetDevice(1), cudaErrorInvalidDevice);
  cudaGetLastError();
  CUDA_OK(cudaGetDevice(&dev));
  EXPECT_EQ(dev, 0);
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  EXPECT_STREQ(prop.name, "stash test double");
  EXPECT_EQ(prop.totalGlobalMem, size_t{80} << 30);
  EXPECT_EQ(prop.asyncEngineCount, 2);
  CUDA_OK(cudaDeviceGetAttribute(&v, cudaDevAttrMemoryPoolsSupported, 0));
  EXPECT_EQ(v, 1);
  CUDA_OK(cudaDeviceGetAttribute(&v, cudaDevAttrHostNumaId, 0));
  EXPECT_EQ(v, 0);
  CUDA_OK(cudaDeviceGetAttribute(&v, cudaDevAttrConcurrentManagedAccess, 0));
  EXPECT_EQ(v, 1);
  CUDA_OK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 0));
  EXPECT_EQ(v, 9);
  CUDA_OK(cudaRuntimeGetVersion(&v));
  EXPECT_EQ(v, 13000);
  CUDA_OK(cudaDriverGetVersion(&v));
  EXPECT_EQ(v, 13000);
  int least = 1, greatest = 1;
  CUDA_OK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  EXPECT_EQ(least, 0);
  EXPECT_EQ(greatest, -5);
}

TEST_F(Api, BadArgumentsFailCleanly) {
  int local = 0;
  void* d = nullptr;
  EXPECT_EQ(cudaFree(&local), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFreeHost(&local), cudaErrorInvalidValue);
  CUDA_OK(cudaMalloc(&d, 256));
  EXPECT_EQ(cudaFreeHost(d), cudaErrorInvalidValue);
  // Kinds must match the pointers (Note [Copy kinds]); device ranges must fit.
  EXPECT_EQ(cudaMemcpy(&local, d, 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d, &local, 4, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(&local, d, 512, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(&local, d, 4, static_cast<cudaMemcpyKind>(9)),
            cudaErrorInvalidMemcpyDirection);
  EXPECT_EQ(cudaMemsetAsync(&local, 0, 4, nullptr), cudaErrorInvalidValue);
  CUDA_OK(cudaFree(d));
  EXPECT_EQ(cudaFree(d), cudaErrorInvalidValue) << "double free";
  cudaStream_t bogus = reinterpret_cast<cudaStream_t>(&local);
  EXPECT_EQ(cudaStreamSynchronize(bogus), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamDestroy(nullptr), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventQuery(reinterpret_cast<cudaEvent_t>(&local)),
            cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
}

// The rest also runs on a real GPU.

TEST(ApiCommon, ErrorNamesAndStrings) {
  EXPECT_STREQ(cudaGetErrorName(cudaSuccess), "cudaSuccess");
  EXPECT_STREQ(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorNotReady), "device not ready");
  EXPECT_STREQ(cudaGetErrorName(cudaErrorNoKernelImageForDevice),
               "cudaErrorNoKernelImageForDevice");
  EXPECT_STREQ(cudaGetErrorName(cudaErrorStreamCaptureUnsupported),
               "cudaErrorStreamCaptureUnsupported");
}

// Note [Foreign memory as device memory]: PyTorch's CPU tensors handed to the engine as
// device blocks. Off (the default), a device-to-host copy from plain host memory breaks
// the kind rule; on, it is a device-side, asynchronous copy, and so is the way back.
TEST_F(Api, ForeignMemoryCountsAsDeviceOnlyWhenOptedIn) {
  using set_fn = int (*)(int);
  const auto set_foreign = reinterpret_cast<set_fn>(
      dlsym(RTLD_DEFAULT, "stashdbl_set_foreign_is_device"));
  ASSERT_NE(set_foreign, nullptr) << "the double exports stashdbl_set_foreign_is_device";
  StreamOwner s(cudaStreamNonBlocking);
  PinnedBuffer pinned(4096);
  DeviceBuffer d(4096);
  std::vector<unsigned char> framework(4096, 7);  // "device" memory of a host framework
  std::vector<unsigned char> plain(4096, 0);

  EXPECT_EQ(set_foreign(0), 0) << "off unless STASHDBL_FOREIGN_IS_DEVICE=1 at load";
  EXPECT_EQ(cudaMemcpyAsync(pinned.p, framework.data(), 4096, cudaMemcpyDeviceToHost, s),
            cudaErrorInvalidValue);
  cudaGetLastError();

  EXPECT_EQ(set_foreign(1), 0);
  cudaPointerAttributes a{};
  CUDA_OK(cudaPointerGetAttributes(&a, framework.data()));
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  CUDA_OK(cudaPointerGetAttributes(&a, pinned.p));
  EXPECT_EQ(a.type, cudaMemoryTypeHost) << "the double's own blocks keep their kind";
  // Asynchronous, as a device-to-pinned copy is: nothing moves while the stream is paused.
  std::memset(pinned.p, 0, 4096);
  CUDA_OK(dbl().stream_pause(s));
  CUDA_OK(cudaMemcpyAsync(pinned.p, framework.data(), 4096, cudaMemcpyDeviceToHost, s));
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  EXPECT_EQ(pinned.get()[0], 0);
  CUDA_OK(dbl().stream_resume(s));
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(pinned.get()[4095], 7);
  // Back into other foreign memory (a tensor the framework allocated for the prefetch).
  CUDA_OK(cudaMemcpyAsync(plain.data(), pinned.p, 4096, cudaMemcpyHostToDevice, s));
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(plain, framework);
  // The kind rule still holds, now with foreign memory on the device side.
  EXPECT_EQ(cudaMemcpyAsync(pinned.p, framework.data(), 4096, cudaMemcpyHostToHost, s),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpyAsync(framework.data(), pinned.p, 4096, cudaMemcpyDeviceToHost, s),
            cudaErrorInvalidValue);
  cudaGetLastError();
  CUDA_OK(cudaMemcpyAsync(d.p, framework.data(), 4096, cudaMemcpyDeviceToDevice, s));
  CUDA_OK(cudaMemsetAsync(plain.data(), 1, 16, s));
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(plain[15], 1);

  EXPECT_EQ(set_foreign(0), 1) << "returns the previous value";
  CUDA_OK(cudaPointerGetAttributes(&a, framework.data()));
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
  EXPECT_EQ(cudaMemsetAsync(plain.data(), 1, 16, s), cudaErrorInvalidValue);
  cudaGetLastError();
  set_foreign(1);
  dbl().reset();
  EXPECT_EQ(set_foreign(0), 0) << "reset restores the value from load";
}

TEST(ApiCommon, PointerAttributes) {
  void* d = nullptr;
  void* h = nullptr;
  CUDA_OK(cudaMalloc(&d, 4096));
  CUDA_OK(cudaHostAlloc(&h, 4096, cudaHostAllocDefault));
  void* reg = std::aligned_alloc(4096, 8192);
  CUDA_OK(cudaHostRegister(reg, 8192, cudaHostRegisterDefault));
  int local = 0;
  cudaPointerAttributes a{};
  CUDA_OK(cudaPointerGetAttributes(&a, static_cast<char*>(d) + 100));
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  EXPECT_EQ(a.device, 0);
  CUDA_OK(cudaPointerGetAttributes(&a, h));
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  EXPECT_EQ(a.hostPointer, h);
  CUDA_OK(cudaPointerGetAttributes(&a, static_cast<char*>(reg) + 4096));
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  CUDA_OK(cudaPointerGetAttributes(&a, &local));
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
  EXPECT_EQ(cudaHostRegister(reg, 4096, 0), cudaErrorHostMemoryAlreadyRegistered);
  CUDA_OK(cudaHostUnregister(reg));
  EXPECT_EQ(cudaHostUnregister(reg), cudaErrorHostMemoryNotRegistered);
  cudaGetLastError();
  std::free(reg);
  CUDA_OK(cudaFreeHost(h));
  CUDA_OK(cudaFree(d));
}

TEST(ApiCommon, NeverCapturing) {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, -100));
  unsigned flags = 0;
  int prio = 1, least = 0, greatest = 0;
  CUDA_OK(cudaStreamGetFlags(s, &flags));
  EXPECT_EQ(flags, unsigned{cudaStreamNonBlocking});
  CUDA_OK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CUDA_OK(cudaStreamGetPriority(s, &prio));
  EXPECT_EQ(prio, greatest) << "clamped";
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
  CUDA_OK(cudaStreamIsCapturing(s, &status));
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  status = cudaStreamCaptureStatusActive;
  unsigned long long id = 7;
  CUDA_OK(cudaStreamGetCaptureInfo(s, &status, &id));
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  CUDA_OK(cudaStreamDestroy(s));
}

}  // namespace
}  // namespace stash::test
