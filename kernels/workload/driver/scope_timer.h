// scope_timer.h: times the workload's profiler scopes with CUDA events, for when CUPTI is
// unavailable (another CUPTI client, no libcupti, the CPU test double).
//
// Note [Event timing of scopes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// CUPTI attributes kernel busy time to a scope; events measure the stream's elapsed time
// between the scope's first and last enqueued op instead. On one stream with nothing else
// queued the two agree up to launch gaps, which is why this is a fallback and the profile
// says so. Pairs are recorded while the step is enqueued and read after the caller
// synchronized (harvest), so timing adds no host waits inside the step. Medians over steps
// are what the profile takes, as stash profile does.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <tuple>
#include <vector>

#include "stash.h"

namespace stash::workload {

class scope_timer {
 public:
  explicit scope_timer(cudaStream_t stream) : stream_(stream) {}
  ~scope_timer();
  scope_timer(const scope_timer&) = delete;
  scope_timer& operator=(const scope_timer&) = delete;

  // Records the opening event; returns a handle for end(). Throws std::runtime_error on a
  // CUDA error.
  std::size_t begin();
  // Records the closing event of `handle` for scope (kind, layer, tensor); tensor -1 for
  // layer scopes.
  void end(std::size_t handle, stash_scope_kind_t kind, int layer, int tensor) noexcept;
  // Reads every completed pair into the samples (call after synchronizing the stream).
  void harvest();
  // Median of the samples of a scope in ms; -1 when none.
  double median_ms(stash_scope_kind_t kind, int layer, int tensor) const;
  std::size_t sample_count(stash_scope_kind_t kind, int layer, int tensor) const;

 private:
  struct pair {
    cudaEvent_t begin = nullptr, end = nullptr;
    int kind = 0, layer = 0, tensor = -1;
    bool closed = false;
  };
  cudaEvent_t take();
  cudaStream_t stream_;
  std::vector<pair> open_;
  std::vector<cudaEvent_t> spare_;
  std::map<std::tuple<int, int, int>, std::vector<double>> samples_;
};

}  // namespace stash::workload
