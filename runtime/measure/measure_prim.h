// measure_prim.h: every CUDA runtime and CUPTI call of runtime/measure, behind one layer.
//
// Contract:
//  - CUDA: thin wrappers are not needed; callers use the runtime directly but only through
//    STASH_MEASURE_CUDA_TRY, which throws measure_error("file:line: call: cudaErrorName
//    (description)") in the manner of RMM_CUDA_TRY. Only these entry points are used, so
//    the CPU test double must export them: cudaGetDeviceCount, cudaSetDevice,
//    cudaGetDevice, cudaGetDeviceProperties, cudaDeviceGetAttribute, cudaMemGetInfo,
//    cudaMalloc, cudaFree, cudaStreamCreateWithFlags, cudaStreamDestroy,
//    cudaStreamSynchronize, cudaStreamWaitEvent, cudaEventCreate, cudaEventRecord,
//    cudaEventSynchronize, cudaEventElapsedTime, cudaEventDestroy, cudaMemcpyAsync,
//    cudaMemset, cudaGetLastError, cudaGetErrorName, cudaGetErrorString.
//  - CUPTI: libcupti is loaded with dlopen when a profiler starts, never at link time,
//    so that libstash.so and the CLI run where CUPTI is absent and pay nothing until a
//    profile is asked for. cupti() resolves the few functions the profiler calls;
//    STASH_CUPTI_TRY names file:line, the call and CUPTI's result string.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

#include <cuda_runtime_api.h>
#include <cupti.h>

namespace stash::measure {

class measure_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace prim {

[[noreturn]] void throw_cuda(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void throw_cupti(CUptiResult r, const char* call, const char* file, int line);

// Why no GPU can be used, in the CUDA runtime's words ("CUDA driver version is
// insufficient for CUDA runtime version", "no CUDA-capable device is detected"), or ""
// when cudaGetDeviceCount finds a device. Clears the runtime's sticky error.
std::string device_problem() noexcept;

// The GPU's nearest host NUMA node (cudaDevAttrHostNumaId); -1 when unknown.
int host_numa_node(int device) noexcept;

// Releases that tolerate process teardown (cudaErrorCudartUnloading counts as success).
void free_device(void* p) noexcept;
void destroy_stream(cudaStream_t s) noexcept;
void destroy_event(cudaEvent_t e) noexcept;

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

}  // namespace prim
}  // namespace stash::measure

#define STASH_MEASURE_CUDA_TRY(call)                                              \
  do {                                                                            \
    const cudaError_t stash_measure_err_ = (call);                                \
    if (stash_measure_err_ != cudaSuccess)                                        \
      ::stash::measure::prim::throw_cuda(stash_measure_err_, #call, __FILE__, __LINE__); \
  } while (0)

// `api` is a const cupti_api*; `fn` one of its members.
#define STASH_CUPTI_TRY(api, fn, ...)                                                      \
  do {                                                                                     \
    const CUptiResult stash_cupti_res_ = (api)->fn(__VA_ARGS__);                           \
    if (stash_cupti_res_ != CUPTI_SUCCESS)                                                 \
      ::stash::measure::prim::throw_cupti(stash_cupti_res_, "cupti " #fn, __FILE__, __LINE__); \
  } while (0)
