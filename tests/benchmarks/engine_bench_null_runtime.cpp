// engine_bench_null_runtime.cpp: a CUDA runtime that does nothing, linked into a second
// build of engine_bench (runtime_engine_bench_nullrt) so that the benchmark measures
// stash's own work on the submit path and nothing of the runtime (the test double's calls
// cost ~1-2 µs each: vector clocks, the happens-before checker, a global lock).
// Definitions in the executable take precedence over libcudart's for every call the
// engine and the pools make. Copies do nothing; events are always complete.
#include <cstdlib>
#include <cstring>

#include <cuda_runtime_api.h>

namespace {
char handles[4096];
int next_handle = 0;
template <class T>
T fake() {
  return reinterpret_cast<T>(&handles[(next_handle++ % 4095) + 1]);
}
}  // namespace

extern "C" {
cudaError_t cudaHostAlloc(void** p, size_t n, unsigned) {
  *p = std::aligned_alloc(4096, (n + 4095) & ~size_t{4095});
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void* p) { std::free(p); return cudaSuccess; }
cudaError_t cudaHostRegister(void*, size_t, unsigned) { return cudaSuccess; }
cudaError_t cudaHostUnregister(void*) { return cudaSuccess; }
cudaError_t cudaMalloc(void** p, size_t n) {
  *p = std::aligned_alloc(4096, (n + 4095) & ~size_t{4095});
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* p) { std::free(p); return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { *e = fake<cudaEvent_t>(); return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t* e) { *e = fake<cudaEvent_t>(); return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) { *ms = 0; return cudaSuccess; }
cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* s) {
  *s = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { *s = fake<cudaStream_t>(); return cudaSuccess; }
cudaError_t cudaStreamCreate(cudaStream_t* s) { *s = fake<cudaStream_t>(); return cudaSuccess; }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void*, const void*, size_t, cudaMemcpyKind, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaGetDevice(int* d) { *d = 0; return cudaSuccess; }
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr, int) { *v = -1; return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char* cudaGetErrorName(cudaError_t) { return "cudaError"; }
const char* cudaGetErrorString(cudaError_t) { return "null runtime"; }
}
