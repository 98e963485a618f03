// op_specs.h: the ops of copies, memsets and emulated compute, built from their
// arguments. A direct call builds and enqueues one at once; a captured call records the
// arguments in a graph node and cudaGraphLaunch builds the op again, against the memory
// table of that moment (Note [Graph replay] in capture.h).
//
// Every function here expects state().mu held. On failure nothing is built and the
// error is returned (not yet recorded as the last error).
#pragma once

#include <cstddef>
#include <vector>

#include "streams.h"

namespace stash::dbl {

// cudaMemcpy*: Note [Copy kinds] in api_copy.cpp. `*host_waits` is set when the host
// side is pageable (a direct call is then synchronous with the host). A zero-byte copy
// succeeds with an empty spec (`*empty` set).
cudaError_t copy_spec(State& st, void* dst, const void* src, size_t count, int kind,
                      const char* api, OpSpec* out, bool* host_waits, bool* empty);

// cudaMemset*: device memory (or foreign memory under its opt-in) only.
cudaError_t memset_spec(State& st, void* ptr, int value, size_t count, const char* api,
                        OpSpec* out, bool* empty);

// stashdbl_enqueue_compute: `api` must be interned (Checker::intern) or static.
struct ComputeArgs {
  const char* api = "";
  double ms = 0.0;
  std::vector<Access> accesses;
};
OpSpec compute_spec(State& st, const ComputeArgs& args);

}  // namespace stash::dbl
