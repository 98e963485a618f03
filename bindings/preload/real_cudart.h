// real_cudart.h: the runtime's own allocation entry points, behind the hooks.
#pragma once

#include <cuda_runtime_api.h>

namespace stash::preload {

// The real functions of libcudart.so.13 (or of whatever library provides that version
// node: the CPU test double in tests). A pointer is null only when no loaded library
// exports the name (the _ptsz variants on a runtime without them).
struct real_cudart {
  cudaError_t (*malloc)(void**, size_t);
  cudaError_t (*free)(void*);
  cudaError_t (*malloc_async)(void**, size_t, cudaStream_t);
  cudaError_t (*free_async)(void*, cudaStream_t);
  cudaError_t (*malloc_async_ptsz)(void**, size_t, cudaStream_t);
  cudaError_t (*free_async_ptsz)(void*, cudaStream_t);
  cudaError_t (*malloc_host)(void**, size_t);
  cudaError_t (*host_alloc)(void**, size_t, unsigned int);
  cudaError_t (*free_host)(void*);
};

// Resolved on first use (thread-safe, once); never allocates after that.
const real_cudart& real() noexcept;

}  // namespace stash::preload
