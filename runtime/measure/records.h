// records.h: the activity records that attribution works on, free of CUDA and CUPTI types.
//
// The CUPTI profiler (cupti_profiler.cpp) converts CUPTI's records into these, reading only
// the fields that every CUDA 13.x record version has; the tests build them by hand. Times
// are nanoseconds on one clock (CUPTI's timestamps, which NVTX scopes also use).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace stash::measure {

// A kernel as the GPU ran it. correlation_id ties it to the API call that launched it.
struct kernel_record {
  std::uint64_t start_ns = 0;
  std::uint64_t end_ns = 0;  // start == end == 0: the timestamps were not collected
  std::uint32_t correlation_id = 0;
  std::uint32_t stream_id = 0;
};

enum class copy_direction { h2d, d2h, other };

struct memcpy_record {
  std::uint64_t start_ns = 0;
  std::uint64_t end_ns = 0;
  std::uint64_t bytes = 0;
  std::uint32_t correlation_id = 0;
  std::uint32_t stream_id = 0;
  copy_direction direction = copy_direction::other;
};

// A runtime or driver API call: which host thread made it, and when.
struct api_record {
  std::uint64_t start_ns = 0;
  std::uint64_t end_ns = 0;
  std::uint32_t correlation_id = 0;
  std::uint64_t thread_id = 0;
};

// CUPTI's EXTERNAL_CORRELATION record: the API call `correlation_id` was made while
// `external_id` (a scope's id, see scope_tracker.h) was the thread's innermost scope.
struct external_correlation_record {
  std::uint64_t external_id = 0;
  std::uint32_t correlation_id = 0;
};

// One opening of a host-side scope (an NVTX push / a C API scope_begin) on one thread.
struct scope_record {
  std::uint64_t id = 0;      // > 0, unique in the process; the external correlation id
  std::uint64_t parent = 0;  // the thread's innermost open scope when it opened; 0: none
  std::string name;          // "stash:layer:3:fwd", "stash:tensor:attn_norm"
  std::uint64_t thread_id = 0;
  std::uint64_t begin_ns = 0;
  std::uint64_t end_ns = 0;  // 0: never closed (the program exited inside it)
};

// Everything one profiling session collected.
struct activity_log {
  std::vector<kernel_record> kernels;
  std::vector<memcpy_record> copies;
  std::vector<api_record> api_calls;
  std::vector<external_correlation_record> external;
  std::vector<scope_record> scopes;
  std::uint64_t dropped_records = 0;  // records CUPTI could not store (full buffers)
};

}  // namespace stash::measure
