// cupti_profiler.h: kernel, copy and API activity through the CUPTI Activity API, with the
// host scopes (NVTX ranges or C API scopes) that attribution needs.
//
// Collects CONCURRENT_KERNEL, MEMCPY, RUNTIME, DRIVER and EXTERNAL_CORRELATION records.
// DRIVER is there because libraries such as cuBLAS launch through the driver API: their
// kernels' correlation ids name driver calls, not runtime calls. While a stash scope is
// open on a thread its id is pushed as that thread's external correlation id (kind
// CUSTOM2), so every API call made inside it is tied to it (Note [Attribution by launch]).
//
// Note [Profiling unavailable]
// CUPTI cannot start when there is no driver or device, when libcupti is missing, or when
// another CUPTI client holds the process (Nsight Systems, Nsight Compute, a second stash
// profiler): cuptiSubscribe then returns CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED.
// start() reports the reason and leaves the program untouched; the caller prints
// "profiling unavailable: <reason>" and carries on. Without a driver CUPTI only says
// CUPTI_ERROR_UNKNOWN (999), so the reason is taken from cudaGetDeviceCount's error,
// which names the problem ("CUDA driver version is insufficient for CUDA runtime
// version"). Inside the injection library, which runs within the driver's cuInit, no
// runtime call may be made, so there the CUPTI text is kept.
//
// One profiler per process: CUPTI's buffer callbacks carry no user pointer.
// Thread safety: start/stop from one thread; scope_push/scope_pop and the NVTX callbacks
// from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "runtime/measure/records.h"
#include "runtime/measure/scope_tracker.h"

namespace stash::measure {

struct profiler_options {
  // Follow NVTX ranges of every domain through CUPTI's NVTX callback domain. Needs
  // NVTX_INJECTION64_PATH to name libcupti (`stash profile` sets it). Off for in-process
  // use through the C API, whose scopes call scope_push/scope_pop directly.
  bool follow_nvtx = false;
  // Ask the CUDA runtime first whether a device is usable, and why not (Note [Profiling
  // unavailable]). Must be false inside InitializeInjection.
  bool ask_runtime = true;
};

class cupti_profiler {
 public:
  static cupti_profiler& process();

  // "" on success; otherwise why profiling is unavailable (nothing stays enabled).
  std::string start(const profiler_options& options);
  bool active() const noexcept;
  // Flushes, disables and returns everything collected since start(). Idempotent.
  activity_log stop();

  // Scopes opened directly (the C API). No-ops while inactive.
  void scope_push(std::string_view name);
  void scope_pop();

  // CUPTI callbacks (C linkage shims in the .cpp); not for other callers.
  void on_nvtx(std::uint32_t cbid, const void* nvtx_data);
  void on_buffer(void* context, std::uint32_t stream_id, std::uint8_t* buffer, size_t valid);

 private:
  cupti_profiler() = default;
  void apply(const scope_tracker::change& c);  // Note [One external correlation id per thread]
  std::uint64_t now() const;
  void teardown();

  mutable std::mutex mutex_;  // guards log_ and the string registry
  bool active_ = false;
  const void* api_ = nullptr;      // prim::cupti_api
  void* subscriber_ = nullptr;     // CUpti_SubscriberHandle
  profiler_options options_;
  std::unique_ptr<scope_tracker> tracker_ = std::make_unique<scope_tracker>();
  activity_log log_;
  std::unordered_map<std::uint64_t, std::string> registered_;  // nvtxStringHandle_t
};

}  // namespace stash::measure
