// stats.h: the summary statistics stash reports of repeated measurements: the median of
// samples, and the median, min and max of measured rates.
//
// One implementation for every folder that measures: the profiler's per-scope times
// (runtime/measure), the link and copy benchmarks (runtime/measure, runtime/engine), the
// workload's event timer (tools/demo/driver) and the CLI. They are plain C++ and know nothing
// of stash's domain, so they sit in core/, below every folder that measures.
#pragma once

#include <vector>

namespace stash {

// Which value an even count of samples takes as its median.
enum class even_median {
  mean_of_middle_two,  // the textbook median
  upper_middle,        // the larger of the middle two: always one of the samples
};

// The median of the samples; 0 when there are none.
double median(std::vector<double> samples,
              even_median even = even_median::mean_of_middle_two);

// Rates in GB/s (1e9 B/s) over a benchmark's samples.
struct rate_summary {
  double median_gbps = 0, min_gbps = 0, max_gbps = 0;
};

// The median (mean of the middle two for an even count), min and max; all 0 when empty.
rate_summary summarize_rates(const std::vector<double>& gbps);

}  // namespace stash
