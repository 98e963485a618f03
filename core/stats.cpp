// stats.cpp: the summary statistics of repeated measurements (stats.h).
#include "core/stats.h"

#include <algorithm>

namespace stash {

double median(std::vector<double> v, even_median even) {
  if (v.empty()) return 0;
  // nth_element rather than a sort: linear, and it leaves every smaller sample before mid,
  // where the lower middle one is the largest.
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double hi = v[mid];
  if (v.size() % 2 == 1 || even == even_median::upper_middle) return hi;
  const double lo = *std::max_element(v.begin(), v.begin() + mid);
  return (lo + hi) / 2;
}

rate_summary summarize_rates(const std::vector<double>& gbps) {
  rate_summary r;
  if (gbps.empty()) return r;
  const auto [lo, hi] = std::minmax_element(gbps.begin(), gbps.end());
  r.min_gbps = *lo;
  r.max_gbps = *hi;
  r.median_gbps = median(gbps);
  return r;
}

}  // namespace stash
