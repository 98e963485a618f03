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
//
// Note [Event timing of the step overhead]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The profile's step_overhead_ms is the step's time outside every layer: gradient zeroing,
// the target upload and the loss, the SGD update. Events around the whole step (step pairs,
// begin_step / end_step) give the step's elapsed time; its sample is that minus the layer
// scopes (forward and backward pairs) recorded inside it, divided by the forward passes in
// the step (micro-batches), since the layers' samples and the simulator are per pass, as
// CUPTI's steps are (Note [Time outside the layers], runtime/measure/attribution.h).
// Subtracting, rather than timing the loss and the update in scopes of their own, counts
// everything the step spends outside the layers, whatever it is; on the keep-all run that
// is profiled no copy waits sit between the layers, so nothing else is counted. Unlike
// CUPTI's busy time it includes launch gaps between the layers, as the measured step
// does.
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

  // Records the opening event; returns a handle for end(). Throws stash::error on a
  // CUDA error.
  std::size_t begin();
  // Records the closing event of `handle` for scope (kind, layer, tensor); tensor -1 for
  // layer scopes.
  void end(std::size_t handle, stash_scope_kind_t kind, int layer, int tensor) noexcept;
  // Records the opening event of a whole step; returns a handle for end_step(). Steps do
  // not nest, and every scope begun between begin_step and end_step belongs to the step.
  // Throws stash::error on a CUDA error.
  std::size_t begin_step();
  // Records the step's closing event; `passes` forward passes ran in it (micro-batches).
  void end_step(std::size_t handle, int passes) noexcept;
  // Reads every completed pair into the samples (call after synchronizing the stream).
  void harvest();
  // Median of the samples of a scope in ms; -1 when none. An even count takes the upper
  // middle sample (stash::even_median::upper_middle), a time one instance really took.
  double median_ms(stash_scope_kind_t kind, int layer, int tensor) const;
  std::size_t sample_count(stash_scope_kind_t kind, int layer, int tensor) const;
  // Note [Event timing of the step overhead]: the median per-pass time outside the layer
  // scopes, over the harvested steps, in ms (never negative; the upper middle of an even
  // count, as median_ms); -1 when no step was timed.
  double step_overhead_median_ms() const;
  std::size_t step_count() const { return step_overhead_.size(); }

 private:
  struct pair {
    cudaEvent_t begin = nullptr, end = nullptr;
    int kind = 0, layer = 0, tensor = -1;
    bool closed = false;
    bool step = false;  // a whole step (begin_step), not a scope
    int passes = 1;     // steps: forward passes in it
  };
  cudaEvent_t take();
  cudaStream_t stream_;
  std::vector<pair> open_;
  std::vector<cudaEvent_t> spare_;
  std::map<std::tuple<int, int, int>, std::vector<double>> samples_;
  std::vector<double> step_overhead_;  // one per harvested step, per pass
};

}  // namespace stash::workload
