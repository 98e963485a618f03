// cuda_calls.h: every CUDA runtime call the prefetch engine makes, behind one narrow layer.
//
// Contract (after mimalloc's prim.h and allocator/cuda_prim.h):
//  - Each wrapper is one runtime call and returns its cudaError_t unchanged; none throws,
//    allocates or logs. The engine decides what an error means.
//  - STASH_ENGINE_CUDA(call) is the hot-path check: on failure it writes
//    "file:line: call: cudaErrorName (text)" into the thread-local error buffer
//    (planner/error.h), clears the runtime's last error, and returns status::cuda_error.
//    STASH_ENGINE_CUDA_TRY is the cold-path variant that throws stash::error.
//  - RAII owners (stream_owner, event_owner) destroy their handle and treat
//    cudaErrorCudartUnloading (process exit) as success, like RMM's destructors.
//  - Entry points used: cudaStreamCreateWithFlags, cudaStreamDestroy, cudaStreamSynchronize,
//    cudaStreamWaitEvent, cudaEventCreateWithFlags, cudaEventDestroy, cudaEventRecord,
//    cudaEventQuery, cudaEventSynchronize, cudaEventElapsedTime, cudaMemcpyAsync,
//    cudaGetLastError, cudaGetErrorName, cudaGetErrorString; the test double exports all.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda_prim.h"  // allocator/: record_cuda_error, the shared error text format
#include "planner/error.h"

namespace stash::engine::cuda {

// A non-blocking stream (no implicit synchronization with the legacy default stream).
cudaError_t stream_create(cudaStream_t* out) noexcept;
cudaError_t stream_destroy(cudaStream_t s) noexcept;  // unloading counts as success
cudaError_t stream_synchronize(cudaStream_t s) noexcept;
// `waiter` waits (device-side) for the work `ev` captured; the host never blocks.
cudaError_t stream_wait(cudaStream_t waiter, cudaEvent_t ev) noexcept;

// timing = false gives cudaEventDisableTiming (cheaper records).
cudaError_t event_create(cudaEvent_t* out, bool timing) noexcept;
cudaError_t event_destroy(cudaEvent_t ev) noexcept;  // unloading counts as success
cudaError_t event_record(cudaEvent_t ev, cudaStream_t s) noexcept;
// cudaSuccess: complete; cudaErrorNotReady: pending (the runtime's last error cleared).
cudaError_t event_query(cudaEvent_t ev) noexcept;
cudaError_t event_synchronize(cudaEvent_t ev) noexcept;
// Milliseconds from `from` to `to`; cudaErrorNotReady (cleared) while either is pending.
cudaError_t event_elapsed(float* ms, cudaEvent_t from, cudaEvent_t to) noexcept;

cudaError_t copy_d2h(void* host, const void* device, size_t bytes, cudaStream_t s) noexcept;
cudaError_t copy_h2d(void* device, const void* host, size_t bytes, cudaStream_t s) noexcept;

// Records the error text and returns status::cuda_error (clears the runtime's last error).
status fail(cudaError_t err, const char* call, const char* file, int line) noexcept;

// Owners. Move-only; an empty owner holds nullptr.
class stream_owner {
 public:
  stream_owner() = default;
  explicit stream_owner(cudaStream_t s) noexcept : s_(s) {}
  ~stream_owner() { reset(); }
  stream_owner(stream_owner&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  stream_owner& operator=(stream_owner&& o) noexcept;
  stream_owner(const stream_owner&) = delete;
  stream_owner& operator=(const stream_owner&) = delete;
  cudaStream_t get() const noexcept { return s_; }
  void reset() noexcept;

 private:
  cudaStream_t s_ = nullptr;
};

class event_owner {
 public:
  event_owner() = default;
  explicit event_owner(cudaEvent_t e) noexcept : e_(e) {}
  ~event_owner() { reset(); }
  event_owner(event_owner&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  event_owner& operator=(event_owner&& o) noexcept;
  event_owner(const event_owner&) = delete;
  event_owner& operator=(const event_owner&) = delete;
  cudaEvent_t get() const noexcept { return e_; }
  void reset() noexcept;

 private:
  cudaEvent_t e_ = nullptr;
};

// Names a stream for Nsight Systems (nvtxNameCudaStreamA; a no-op without a tool).
void name_stream(cudaStream_t s, const char* name) noexcept;

}  // namespace stash::engine::cuda

// Hot path: on failure, record "file:line: call: error" and return status::cuda_error.
#define STASH_ENGINE_CUDA(call)                                                    \
  do {                                                                             \
    const cudaError_t stash_engine_err_ = (call);                                  \
    if (stash_engine_err_ != cudaSuccess)                                          \
      return ::stash::engine::cuda::fail(stash_engine_err_, #call, __FILE__, __LINE__); \
  } while (0)

// Cold path (construction): the same text, thrown as stash::error.
#define STASH_ENGINE_CUDA_TRY(call)                                                   \
  do {                                                                                \
    const cudaError_t stash_engine_err_ = (call);                                     \
    if (stash_engine_err_ != cudaSuccess)                                             \
      ::stash::throw_last_error(                                                      \
          ::stash::engine::cuda::fail(stash_engine_err_, #call, __FILE__, __LINE__)); \
  } while (0)
