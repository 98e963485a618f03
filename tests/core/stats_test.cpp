// The shared median and rate summary (core/stats.h): the figures the profiler, the link
// and copy benchmarks and the workload's event timer report.
#include <gtest/gtest.h>

#include "core/stats.h"

using namespace stash;

namespace {

TEST(Stats, MedianOfAnOddCountIsTheMiddleSample) {
  EXPECT_DOUBLE_EQ(median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_DOUBLE_EQ(median({3.0, 1.0, 2.0}, even_median::upper_middle), 2.0);
  EXPECT_DOUBLE_EQ(median({7.0}), 7.0);
}

TEST(Stats, EvenCountsTakeTheChosenMiddle) {
  EXPECT_DOUBLE_EQ(median({4.0, 1.0, 3.0, 2.0}), 2.5);
  EXPECT_DOUBLE_EQ(median({4.0, 1.0, 3.0, 2.0}, even_median::upper_middle), 3.0);
  EXPECT_DOUBLE_EQ(median({5.0, 1.0}), 3.0);
  EXPECT_DOUBLE_EQ(median({5.0, 1.0}, even_median::upper_middle), 5.0);
}

TEST(Stats, MedianOfNothingIsZero) {
  EXPECT_DOUBLE_EQ(median({}), 0.0);
  EXPECT_DOUBLE_EQ(median({}, even_median::upper_middle), 0.0);
}

TEST(Stats, RateSummary) {
  const rate_summary r = summarize_rates({20.0, 50.0, 10.0, 40.0});
  EXPECT_DOUBLE_EQ(r.median_gbps, 30.0);
  EXPECT_DOUBLE_EQ(r.min_gbps, 10.0);
  EXPECT_DOUBLE_EQ(r.max_gbps, 50.0);
  const rate_summary none = summarize_rates({});
  EXPECT_EQ(none.median_gbps, 0.0);
  EXPECT_EQ(none.min_gbps, 0.0);
  EXPECT_EQ(none.max_gbps, 0.0);
}

}  // namespace
