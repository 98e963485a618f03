// measurement.h: what attribution learns from one or more profiled processes: per-layer
// forward/backward GPU time and per-tensor producer time, one sample per scope instance,
// with the bookkeeping that says how much to trust them.
//
// The injection library writes a measurement per process (schema stash.measurement/1)
// and `stash profile` merges them; profile_fill.h turns one into a stash.profile/1.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/stats.h"

namespace stash::measure {

inline constexpr const char* kMeasurementSchema = "stash.measurement/1";

struct layer_samples {
  std::vector<double> fwd_ms;  // one per outermost forward scope of the layer
  std::vector<double> bwd_ms;
};

struct measurement {
  bool available = true;
  std::string unavailable_reason;  // "no CUDA-capable device is detected", ...

  std::map<int, layer_samples> layers;
  // (layer, tensor name) -> producer time samples; layer -1: the tensor scope had no
  // enclosing layer scope.
  std::map<std::pair<int, std::string>, std::vector<double>> tensors;
  // Per step, the GPU busy time of kernels outside every layer scope (the loss, the
  // optimizer, data kernels): Note [Time outside the layers] in attribution.h. One sample
  // per outermost forward scope of layer 0; the profile's step_overhead_ms is the median.
  std::vector<double> step_outside_ms;

  std::uint64_t kernels = 0;                 // kernel records seen
  std::uint64_t kernels_by_correlation = 0;  // attributed through an external id
  std::uint64_t kernels_by_launch_thread = 0;  // through the launching thread's scopes
  std::uint64_t kernels_outside_scopes = 0;  // launched while no stash scope was open
  std::uint64_t kernels_untimed = 0;         // records without timestamps
  double kernel_ms = 0;                      // sum of all kernel durations
  double outside_ms = 0;                     // sum over kernels outside every scope
  std::uint64_t h2d_bytes = 0, d2h_bytes = 0;
  std::uint64_t dropped_records = 0;
  std::uint64_t processes = 1;
  std::vector<std::string> warnings;

  // Appends other's samples and adds its counters (several processes of one job).
  void merge(const measurement& other);
};

// The median of the samples (the mean of the middle two for an even count); 0 when empty:
// core/stats.h's, under the name the profiler's code and tests call it by.
// Note [Steps and the median]: a profiled program usually runs several steps, the first
// slower (cuBLAS handles, autotuning, allocator growth); the median of the per-step
// samples ignores such outliers without a "skip the first N" knob.
using stash::median;

nlohmann::json measurement_to_json(const measurement& m);
// Throws stash::input_error naming the field for malformed input.
measurement measurement_from_json(const nlohmann::json& j);

}  // namespace stash::measure
