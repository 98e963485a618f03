// cupti_api.h: the CUPTI functions runtime/measure calls, from one dlopen of libcupti.
//
// CUDA runtime calls are not here: runtime/measure uses the one primitive layer
// (allocator/cuda_prim.h, Note [One CUDA primitive layer]) like the rest of stash.
//
// libcupti is loaded with dlopen when a profiler starts, never at link time, so that
// libstash.so and the CLI run where CUPTI is absent and pay nothing until a profile is
// asked for. cupti() resolves the few functions the profiler calls; a CUPTI failure is
// reported by the profiler as a reason string (cupti_result_text), never thrown.
#pragma once

#include <cstdint>
#include <string>

#include <cupti.h>

namespace stash::measure {

// The CUPTI functions the profiler uses, from one dlopen of libcupti.so.13.
struct cupti_api {
  std::string path;  // the file loaded, for NVTX_INJECTION64_PATH
  decltype(&cuptiGetResultString) get_result_string = nullptr;
  decltype(&cuptiSubscribe) subscribe = nullptr;
  decltype(&cuptiUnsubscribe) unsubscribe = nullptr;
  decltype(&cuptiEnableDomain) enable_domain = nullptr;
  decltype(&cuptiActivityEnable) activity_enable = nullptr;
  decltype(&cuptiActivityDisable) activity_disable = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) get_next_record = nullptr;
  decltype(&cuptiActivityGetNumDroppedRecords) get_num_dropped = nullptr;
  decltype(&cuptiActivityPushExternalCorrelationId) push_external = nullptr;
  decltype(&cuptiActivityPopExternalCorrelationId) pop_external = nullptr;
  decltype(&cuptiGetTimestamp) get_timestamp = nullptr;
  decltype(&cuptiSetThreadIdType) set_thread_id_type = nullptr;
};

// Loads libcupti once per process (thread-safe). nullptr when it cannot, with the reason
// in *why. Tries the loader's search path, then the toolkit's library folder recorded at
// build time (STASH_CUPTI_DIR).
const cupti_api* cupti(std::string* why) noexcept;

std::string cupti_result_text(CUptiResult r) noexcept;

// The calling thread's kernel thread id, as CUPTI reports it under
// CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM.
std::uint64_t system_thread_id() noexcept;

}  // namespace stash::measure
