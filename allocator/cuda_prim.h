// cuda_prim.h: every CUDA runtime call the allocator makes, behind one narrow layer.
//
// Contract (after mimalloc's prim.h):
//  - Each function is a thin wrapper over one runtime call and returns its cudaError_t
//    unchanged; none throws, allocates, logs or synchronizes beyond what the wrapped call
//    itself does (noted per function). The pools decide what an error means.
//  - Callers turn an error into a status with STASH_CUDA_FAIL (hot paths: writes the
//    thread-local error text, returns status::cuda_error) or STASH_CUDA_TRY (cold paths:
//    throws stash::error). Both name file:line, the call and the CUDA error's name, in the
//    manner of RMM_CUDA_TRY.
//  - Release functions used by destructors treat cudaErrorCudartUnloading (the runtime is
//    being torn down at process exit, and has released everything already) as success.
//  - Only these runtime entry points are used, so the CPU test double must export them:
//    cudaHostAlloc, cudaFreeHost, cudaHostRegister, cudaHostUnregister, cudaMalloc,
//    cudaFree, cudaEventCreateWithFlags, cudaEventDestroy, cudaEventRecord, cudaEventQuery,
//    cudaEventSynchronize,
//    cudaStreamIsCapturing, cudaGetDevice, cudaSetDevice, cudaDeviceGetAttribute,
//    cudaGetLastError, cudaGetErrorName, cudaGetErrorString.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

#include "planner/error.h"

namespace stash::prim {

// cudaErrorCudartUnloading (process teardown: the runtime has released everything) becomes
// cudaSuccess and is cleared from the last error; any other error is returned unchanged.
// For release paths that run from destructors, here and in the runtime's own primitives.
cudaError_t tolerate_unloading(cudaError_t err) noexcept;

// Page-locked, portable (usable from every context) host memory.
cudaError_t host_alloc(void** out, size_t bytes) noexcept;
cudaError_t host_free(void* p) noexcept;  // unloading counts as success
// Pins an existing host range (portable). Synchronizes like the runtime call does.
cudaError_t host_register(void* p, size_t bytes) noexcept;
cudaError_t host_unregister(void* p) noexcept;  // unloading counts as success
// Device memory on the current device. device_free synchronizes the device (cudaFree).
cudaError_t device_alloc(void** out, size_t bytes) noexcept;
cudaError_t device_free(void* p) noexcept;  // unloading counts as success

// Events without timing (cheaper to record); query never blocks.
cudaError_t event_create(cudaEvent_t* out) noexcept;
cudaError_t event_destroy(cudaEvent_t ev) noexcept;  // unloading counts as success
cudaError_t event_record(cudaEvent_t ev, cudaStream_t stream) noexcept;
// cudaSuccess: complete; cudaErrorNotReady: pending; anything else: an error.
cudaError_t event_query(cudaEvent_t ev) noexcept;
// Blocks the calling thread; only for destructors (never the allocation path).
cudaError_t event_synchronize(cudaEvent_t ev) noexcept;  // unloading counts as success

// *capturing = true while `stream` is being captured into a graph, and also when the
// query itself is refused because of a capture (the legacy stream queried during a
// global-mode capture elsewhere). Other errors (a destroyed stream) leave it false.
cudaError_t stream_capturing(cudaStream_t stream, bool* capturing) noexcept;

cudaError_t current_device(int* device) noexcept;
cudaError_t set_device(int device) noexcept;
// The host NUMA node closest to `device` (cudaDevAttrHostNumaId); -1 when unknown.
int host_numa_node(int device) noexcept;

// Clears the runtime's sticky last error after a call that failed on purpose.
void clear_runtime_error() noexcept;

// Writes "file:line: call: cudaErrorName (text)" into the thread-local error buffer.
status record_cuda_error(cudaError_t err, const char* call, const char* file,
                         int line) noexcept;

}  // namespace stash::prim

// Hot path: on failure, record the error and return status::cuda_error.
#define STASH_CUDA_FAIL(call)                                                    \
  do {                                                                           \
    const cudaError_t stash_err_ = (call);                                       \
    if (stash_err_ != cudaSuccess)                                               \
      return ::stash::prim::record_cuda_error(stash_err_, #call, __FILE__, __LINE__); \
  } while (0)

// Cold path: on failure, throw stash::error with the same text.
#define STASH_CUDA_TRY(call)                                                       \
  do {                                                                             \
    const cudaError_t stash_err_ = (call);                                         \
    if (stash_err_ != cudaSuccess)                                                 \
      ::stash::throw_last_error(                                                   \
          ::stash::prim::record_cuda_error(stash_err_, #call, __FILE__, __LINE__)); \
  } while (0)
