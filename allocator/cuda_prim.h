// cuda_prim.h: stash's one layer over the CUDA runtime: thin wrappers, RAII owners of
// streams and events, and the one family of check macros. The allocator, the engine, the
// measurement code (runtime/), the workload's backends (kernels/workload/) and the demo's
// training program (tools/demo/driver/) all use it.
//
// Note [One CUDA primitive layer]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Where: allocator/ is the lowest folder that may include the CUDA runtime (core/, below
// it, and planner/, beside it, are pure C++), and the folder rule lets every folder above
// it (runtime, kernels, bindings, tools) use what is here. The CPU-only half of the error
// model (status, the thread-local error text, stash::error) is in the bottom folder, in
// core/error.h.
//
// Contract (after mimalloc's prim.h and RMM's detail/error.hpp):
//  - Each wrapper is one runtime call and returns its cudaError_t unchanged; none throws,
//    allocates, logs or synchronizes beyond what the wrapped call itself does (noted per
//    function). The caller decides what an error means. Code with no wrapper to want (a
//    one-off cudaGetDeviceProperties in a benchmark) calls the runtime inside a check macro.
//  - One check-macro family, naming file:line, the call and the CUDA error as
//    "file:line: call failed: cudaErrorName (description)":
//      STASH_CUDA_FAIL(call)  hot paths: writes that text into the fixed thread-local buffer
//                             (no allocation), clears the runtime's sticky error and returns
//                             status::cuda_error from the enclosing function;
//      STASH_CUDA_TRY(call)   cold paths: the same text, thrown as stash::error(cuda_error).
//    record_cuda_error() is the function behind both, for a path that must undo something
//    before it returns.
//  - Release functions and the owners' destructors treat cudaErrorCudartUnloading (the
//    runtime is being torn down at process exit and has released everything already) as
//    success, as RMM's destructors do; an owner's destructor reports nothing and leaves no
//    sticky error behind.
//  - Only these runtime entry points are used, so the CPU test double must export them:
//    cudaHostAlloc, cudaFreeHost, cudaHostRegister, cudaHostUnregister, cudaMalloc,
//    cudaFree, cudaStreamCreateWithFlags, cudaStreamDestroy, cudaStreamSynchronize,
//    cudaStreamWaitEvent, cudaStreamIsCapturing, cudaEventCreateWithFlags,
//    cudaEventDestroy, cudaEventRecord, cudaEventQuery, cudaEventSynchronize,
//    cudaEventElapsedTime, cudaMemcpyAsync, cudaGetDeviceCount, cudaGetDevice,
//    cudaSetDevice, cudaDeviceGetAttribute, cudaGetLastError, cudaGetErrorName,
//    cudaGetErrorString (and those runtime/measure/link_bench.cpp calls inside the macros).
#pragma once

#include <cstddef>
#include <string>

#include <cuda_runtime_api.h>

#include "core/error.h"

namespace stash::prim {

// cudaErrorCudartUnloading (process teardown: the runtime has released everything) becomes
// cudaSuccess and is cleared from the last error; any other error is returned unchanged.
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

// A non-blocking stream (no implicit synchronization with the legacy default stream).
cudaError_t stream_create(cudaStream_t* out) noexcept;
cudaError_t stream_destroy(cudaStream_t s) noexcept;  // unloading counts as success
cudaError_t stream_synchronize(cudaStream_t s) noexcept;
// `waiter` waits (device-side) for the work `ev` captured; the host never blocks.
cudaError_t stream_wait(cudaStream_t waiter, cudaEvent_t ev) noexcept;
// *capturing = true while `stream` is being captured into a graph, and also when the
// query itself is refused because of a capture (the legacy stream queried during a
// global-mode capture elsewhere). Other errors (a destroyed stream) leave it false.
cudaError_t stream_capturing(cudaStream_t stream, bool* capturing) noexcept;

// timing = false gives cudaEventDisableTiming (cheaper records: the pools' guards and the
// engine's completion events); true for events that are read with event_elapsed.
cudaError_t event_create(cudaEvent_t* out, bool timing = false) noexcept;
cudaError_t event_destroy(cudaEvent_t ev) noexcept;  // unloading counts as success
cudaError_t event_record(cudaEvent_t ev, cudaStream_t stream) noexcept;
// cudaSuccess: complete; cudaErrorNotReady: pending (cleared from the last error, so the
// caller's own checks do not see it); anything else: an error. Never blocks.
cudaError_t event_query(cudaEvent_t ev) noexcept;
// Blocks the calling thread; never on an allocation path.
cudaError_t event_synchronize(cudaEvent_t ev) noexcept;  // unloading counts as success
// Milliseconds from `from` to `to` (timing events); cudaErrorNotReady (cleared) while
// either is pending.
cudaError_t event_elapsed(float* ms, cudaEvent_t from, cudaEvent_t to) noexcept;

// While alive, the calling thread's stream-capture mode is relaxed
// (cudaThreadExchangeStreamCaptureMode), then restored: a host query or wait on an event
// recorded before a Global capture began, made while it runs, would otherwise invalidate
// that capture (what torch.cuda.graph begins; seen on an H200).
class relaxed_capture_mode {
 public:
  relaxed_capture_mode() noexcept;
  ~relaxed_capture_mode();
  relaxed_capture_mode(const relaxed_capture_mode&) = delete;
  relaxed_capture_mode& operator=(const relaxed_capture_mode&) = delete;

 private:
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeRelaxed;
  bool exchanged_ = false;
};

// Asynchronous copies on `s`.
cudaError_t copy_d2h(void* host, const void* device, size_t bytes, cudaStream_t s) noexcept;
cudaError_t copy_h2d(void* device, const void* host, size_t bytes, cudaStream_t s) noexcept;

cudaError_t current_device(int* device) noexcept;
cudaError_t set_device(int device) noexcept;
// The host NUMA node closest to `device` (cudaDevAttrHostNumaId); -1 when unknown.
int host_numa_node(int device) noexcept;
// Why no GPU can be used, in the CUDA runtime's words ("CUDA driver version is
// insufficient for CUDA runtime version", "no CUDA-capable device is detected"), or ""
// when cudaGetDeviceCount finds a device. Clears the runtime's sticky error. Cold path
// (returns a std::string).
std::string device_problem();

// Clears the runtime's sticky last error after a call that failed on purpose.
void clear_runtime_error() noexcept;

// Writes "file:line: call failed: cudaErrorName (text)" into the thread-local error buffer,
// clears the runtime's sticky error, and returns status::cuda_error. Never allocates.
status record_cuda_error(cudaError_t err, const char* call, const char* file,
                         int line) noexcept;
// The same, thrown as stash::error(status::cuda_error).
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file,
                                   int line);

// Owners: one template for every runtime handle stash owns. Move-only; an empty owner holds
// nullptr; reset() and destruction release through the layer's release function (which
// tolerates unloading) and clear any error it left behind (there is no one to report it to).
template <class Handle, cudaError_t (*Release)(Handle) noexcept>
class owner {
 public:
  owner() = default;
  explicit owner(Handle h) noexcept : h_(h) {}
  ~owner() { reset(); }
  owner(owner&& o) noexcept : h_(o.h_) { o.h_ = nullptr; }
  owner& operator=(owner&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = o.h_;
      o.h_ = nullptr;
    }
    return *this;
  }
  owner(const owner&) = delete;
  owner& operator=(const owner&) = delete;
  Handle get() const noexcept { return h_; }
  Handle* out() noexcept { return &h_; }  // for a create call into an empty owner
  void reset() noexcept {
    if (h_ && Release(h_) != cudaSuccess) clear_runtime_error();
    h_ = nullptr;
  }

 private:
  Handle h_ = nullptr;
};

using stream_owner = owner<cudaStream_t, stream_destroy>;
using event_owner = owner<cudaEvent_t, event_destroy>;
using device_buffer = owner<void*, device_free>;  // from device_alloc(buf.out(), n)

// Cold-path constructors: a new non-blocking stream, a new event, throwing on failure.
stream_owner make_stream();
event_owner make_event(bool timing = false);

}  // namespace stash::prim

// Hot path: on failure, record the error and return status::cuda_error.
#define STASH_CUDA_FAIL(call)                                                          \
  do {                                                                                 \
    const cudaError_t stash_err_ = (call);                                             \
    if (stash_err_ != cudaSuccess)                                                     \
      return ::stash::prim::record_cuda_error(stash_err_, #call, __FILE__, __LINE__); \
  } while (0)

// Cold path: on failure, throw stash::error(status::cuda_error) with the same text.
#define STASH_CUDA_TRY(call)                                                    \
  do {                                                                          \
    const cudaError_t stash_err_ = (call);                                      \
    if (stash_err_ != cudaSuccess)                                              \
      ::stash::prim::throw_cuda_error(stash_err_, #call, __FILE__, __LINE__); \
  } while (0)
