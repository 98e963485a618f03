// memory_svg.h: the counter window and the plot.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "planner/plots/memory_svg.h"
#include "xml_check.h"

namespace stash::planner {
namespace {

using V = std::vector<std::pair<double, double>>;

trace_writer counters(const V& device) {
  trace_writer t("unit test");
  for (const auto& [ms, v] : device) t.add_counter(kDeviceBytesCounter, ms, v);
  t.add_counter(kPinnedBytesCounter, 12, 999);  // another counter: ignored
  return t;
}

// The window opens with the value in effect at its start, keeps the samples inside it in
// time order (added out of order here), shifted to start at 0, and holds the last to its end.
TEST(MemorySvg, CounterWindowOpensWithTheLevelInEffectAndHoldsTheLast) {
  const trace_writer t = counters({{5, 100}, {30, 400}, {10, 200}, {25, 300}, {50, 500}});
  EXPECT_EQ(counter_window(t, kDeviceBytesCounter, 12, 40),
            (V{{0, 200}, {13, 300}, {18, 400}, {28, 400}}));
  // A sample exactly at the start needs no opening value; nothing inside: the level held.
  EXPECT_EQ(counter_window(t, kDeviceBytesCounter, 10, 20), (V{{0, 200}, {10, 200}}));
  EXPECT_EQ(counter_window(t, kDeviceBytesCounter, 31, 40), (V{{0, 400}, {9, 400}}));
  EXPECT_TRUE(counter_window(t, kDeviceBytesCounter, 0, 4).empty());
  EXPECT_TRUE(counter_window(t, "no such counter", 0, 100).empty());
}

TEST(MemorySvg, PlotsEachSeriesAndTheBudget) {
  const double MiB = 1048576;
  std::vector<memory_series> s = {
      {"predicted (stash simulate)", "#1f5fbf", {{0, 10 * MiB}, {2, 30 * MiB}, {4, 12 * MiB}}},
      {"measured <engine> & pool", "#e07000", {{0, 11 * MiB}, {2.5, 29 * MiB}, {4, 12 * MiB}}},
      {"empty", "#000000", {}}};
  const std::string svg = memory_svg(s, 32 * MiB, "memory at 70%", "double");
  std::string why;
  EXPECT_TRUE(test::well_formed_xml(svg, &why)) << why;
  EXPECT_NE(svg.find("device memory (MiB)"), std::string::npos);
  EXPECT_NE(svg.find("time in the step (ms)"), std::string::npos);
  EXPECT_NE(svg.find("id=\"budget\""), std::string::npos);
  EXPECT_NE(svg.find("budget 32.00 MiB"), std::string::npos);
  EXPECT_NE(svg.find("predicted (stash simulate): peak 30.00 MiB"), std::string::npos);
  EXPECT_NE(svg.find("measured &lt;engine&gt; &amp; pool: peak 29.00 MiB"), std::string::npos);
  EXPECT_NE(svg.find("empty: no samples"), std::string::npos);
  std::size_t paths = 0;
  for (std::size_t i = svg.find("class=\"series\""); i != std::string::npos;
       i = svg.find("class=\"series\"", i + 1))
    ++paths;
  EXPECT_EQ(paths, 2u);  // the empty series draws nothing
  // GiB from 2 GiB up.
  s.resize(1);
  s[0].samples = {{0, 3.0 * 1073741824.0}};
  EXPECT_NE(memory_svg(s, 0, "t", "s").find("device memory (GiB)"), std::string::npos);
}

}  // namespace
}  // namespace stash::planner
