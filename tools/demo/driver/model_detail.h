// model_detail.h: internals shared by model.cpp and step.cpp (not installed).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "cuda_prim.h"
#include "core/error.h"
#include "tools/demo/driver/scope_timer.h"
#include "stash.h"

namespace stash::workload::detail {

// Offsets (in floats) of one layer's arrays in the packed parameter and gradient blocks.
struct layer_offsets {
  std::size_t w1 = 0, b1 = 0, w2 = 0, b2 = 0, gamma = 0, beta = 0;
};
layer_offsets offsets(std::size_t hidden, std::size_t ffn);
std::size_t layer_floats(std::size_t hidden, std::size_t ffn);

// Throws stash::error with the C API's status, naming the call and stash_last_error().
// CUDA calls are checked with STASH_CUDA_TRY (allocator/cuda_prim.h).
[[noreturn]] void fail_stash(const char* what, stash_status_t st);

inline void check_stash(stash_status_t st, const char* what) {
  if (st != STASH_OK) fail_stash(what, st);
}

// A profiler scope (stash.h) for the duration of a C++ scope. The scopes are what CUPTI
// attributes kernels to (docs/measure.md); opening one cannot fail for valid arguments.
// With a scope_timer, the scope is also timed with CUDA events (Note [Event timing of
// scopes]); `tensor` is the saved tensor's index for tensor scopes, -1 for layer scopes.
class profile_scope {
 public:
  profile_scope(scope_timer* timer, stash_scope_kind_t kind, int layer, const char* name,
                int tensor = -1)
      : timer_(timer), kind_(kind), layer_(layer), tensor_(tensor) {
    check_stash(stash_profile_scope_begin(kind, kind == STASH_SCOPE_TENSOR ? 0 : layer, name),
                "stash_profile_scope_begin");
    if (timer_) {
      try {
        handle_ = timer_->begin();
      } catch (...) {
        (void)stash_profile_scope_end();
        throw;
      }
    }
  }
  ~profile_scope() {
    if (timer_) timer_->end(handle_, kind_, layer_, tensor_);
    (void)stash_profile_scope_end();
  }
  profile_scope(const profile_scope&) = delete;
  profile_scope& operator=(const profile_scope&) = delete;

 private:
  scope_timer* timer_;
  stash_scope_kind_t kind_;
  int layer_, tensor_;
  std::size_t handle_ = 0;
};

}  // namespace stash::workload::detail
