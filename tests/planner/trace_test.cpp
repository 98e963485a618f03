// Trace format (Note [Trace format]) and overlap report (Note [Overlap report]).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/model/plan.h"
#include "planner/simulator/simulator.h"
#include "planner/model/trace.h"

namespace stash::planner {
namespace {

using nlohmann::json;

trace_writer sample_trace() {
  trace_writer w("unit test");
  // A copy span first: the compute track must still get tid 1.
  trace_span copy;
  copy.track = kD2HTrack;
  copy.name = "d2h L0 x";
  copy.kind = span_kind::d2h;
  copy.start_ms = 5;
  copy.dur_ms = 8;
  copy.layer = 0;
  copy.tensor = "x";
  copy.bytes = 4096;
  copy.extra["gbps"] = 12.5;
  w.add_span(copy);
  w.add_span(kComputeTrack, "fwd L0", span_kind::forward, 0, 10, 0);
  w.add_span(kComputeTrack, "wait d2h L0", span_kind::wait, 10, 2, 0);
  w.add_span(kComputeTrack, "bwd L0", span_kind::backward, 12, 8, 0);
  w.add_span(kH2DTrack, "h2d L1 y", span_kind::h2d, 20, 5, 1);
  w.add_counter(kDeviceBytesCounter, 0, 100);
  w.add_counter(kDeviceBytesCounter, 10, 250);
  w.add_counter(kPinnedBytesCounter, 10, 4096);
  w.set_metadata("source", "unit");
  return w;
}

// A writer may add samples out of time order (the engine harvests its ops per stream); the
// JSON lists them in time order, samples of one instant in the order they were added.
TEST(Trace, CountersAreWrittenInTimeOrder) {
  trace_writer w("unit test");
  w.add_counter(kDeviceBytesCounter, 30, 3);
  w.add_counter(kDeviceBytesCounter, 10, 1);
  w.add_counter(kDeviceBytesCounter, 20, 2);
  w.add_counter(kDeviceBytesCounter, 10, 4);
  const json j = w.to_json();
  std::vector<std::pair<double, double>> got;
  for (const json& e : j["traceEvents"])
    if (e["ph"] == "C") got.emplace_back(e["ts"].get<double>(), e["args"]["bytes"].get<double>());
  const std::vector<std::pair<double, double>> want = {
      {10000, 1}, {10000, 4}, {20000, 2}, {30000, 3}};
  EXPECT_EQ(got, want);
}

TEST(Trace, JsonHasMetadataTracksSpansAndCounters) {
  const json j = json::parse(sample_trace().to_json().dump());  // through text, as a viewer reads it
  ASSERT_TRUE(j["traceEvents"].is_array());
  EXPECT_EQ(j["displayTimeUnit"], "ms");
  EXPECT_EQ(j["otherData"]["source"], "unit");
  std::map<std::string, int> tid_of;
  int process_names = 0, sort_indexes = 0, spans = 0, counters = 0;
  for (const json& e : j["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("name")) << e.dump();
    const std::string ph = e["ph"];
    if (ph == "M" && e["name"] == "process_name") {
      ++process_names;
      EXPECT_EQ(e["args"]["name"], "unit test");
    } else if (ph == "M" && e["name"] == "thread_name") {
      tid_of[e["args"]["name"]] = e["tid"];
    } else if (ph == "M" && e["name"] == "thread_sort_index") {
      ++sort_indexes;
    } else if (ph == "X") {
      ++spans;
      ASSERT_TRUE(e["ts"].is_number() && e["dur"].is_number() && e.contains("cat"));
      if (e["name"] == "d2h L0 x") {
        EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 5000);  // microseconds
        EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 8000);
        EXPECT_EQ(e["cat"], "d2h");
        EXPECT_EQ(e["args"]["layer"], 0);
        EXPECT_EQ(e["args"]["tensor"], "x");
        EXPECT_EQ(e["args"]["bytes"], 4096);
        EXPECT_DOUBLE_EQ(e["args"]["gbps"].get<double>(), 12.5);
      }
    } else if (ph == "C") {
      ++counters;
      ASSERT_TRUE(e["args"]["bytes"].is_number());
    }
  }
  EXPECT_EQ(process_names, 1);
  EXPECT_EQ(spans, 5);
  EXPECT_EQ(counters, 3);
  ASSERT_EQ(tid_of.size(), 3u);
  EXPECT_EQ(sort_indexes, 3);
  EXPECT_EQ(tid_of[kComputeTrack], 1);
  EXPECT_EQ(tid_of[kD2HTrack], 2);
  EXPECT_EQ(tid_of[kH2DTrack], 3);
  for (const json& e : j["traceEvents"])
    if (e["ph"] == "X" && e["cat"] == "forward") {
      EXPECT_EQ(e["tid"], 1);
    }
}

TEST(Trace, ReadsBackWhatItWrites) {
  const trace_writer w = sample_trace();
  const std::string path = ::testing::TempDir() + "stash_trace_test.json";
  w.write(path);
  std::ifstream in(path);
  const trace_writer r = trace_from_json(json::parse(in));
  std::remove(path.c_str());
  EXPECT_EQ(r.process_name(), "unit test");
  ASSERT_EQ(r.spans().size(), w.spans().size());
  for (std::size_t i = 0; i < w.spans().size(); ++i) {
    const trace_span &a = w.spans()[i], &b = r.spans()[i];
    EXPECT_EQ(a.track, b.track);
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_DOUBLE_EQ(a.start_ms, b.start_ms);
    EXPECT_DOUBLE_EQ(a.dur_ms, b.dur_ms);
    EXPECT_EQ(a.layer, b.layer);
    EXPECT_EQ(a.tensor, b.tensor);
    EXPECT_EQ(a.bytes, b.bytes);
    EXPECT_EQ(a.extra, b.extra);
  }
  ASSERT_EQ(r.counters().size(), 3u);
  EXPECT_EQ(r.counters()[1].name, kDeviceBytesCounter);
  EXPECT_DOUBLE_EQ(r.counters()[1].value, 250);
  EXPECT_THROW(trace_from_json(json::object()), input_error);
  EXPECT_THROW(trace_from_json(json{{"traceEvents", {{{"ph", "X"}, {"name", "no ts"}}}}}),
               input_error);
  EXPECT_THROW(w.write("/nonexistent-dir/trace.json"), std::runtime_error);
}

// The d2h copy [5, 13] lies under fwd [0, 10] for 5 ms and under bwd [12, 20] for 1 ms;
// the wait [10, 12] is layer 0's exposed time. The h2d copy [20, 25] is under nothing.
TEST(OverlapReport, HandComputed) {
  trace_writer w = sample_trace();
  w.add_span(kD2HTrack, "wait on the copy stream", span_kind::wait, 0, 100, 0);  // not compute
  const overlap_report r = compute_overlap(w.spans());
  ASSERT_EQ(r.layers.size(), 2u);
  EXPECT_EQ(r.layers[0].layer, 0);
  EXPECT_DOUBLE_EQ(r.layers[0].d2h_ms, 8);
  EXPECT_DOUBLE_EQ(r.layers[0].copy_ms, 8);
  EXPECT_DOUBLE_EQ(r.layers[0].hidden_ms, 6);
  EXPECT_DOUBLE_EQ(r.layers[0].exposed_ms, 2);
  EXPECT_EQ(r.layers[1].layer, 1);
  EXPECT_DOUBLE_EQ(r.layers[1].h2d_ms, 5);
  EXPECT_DOUBLE_EQ(r.layers[1].hidden_ms, 0);
  EXPECT_DOUBLE_EQ(r.total.copy_ms, 13);
  EXPECT_DOUBLE_EQ(r.total.hidden_ms, 6);
  EXPECT_DOUBLE_EQ(r.total.exposed_ms, 2);
  const std::string table = format_overlap_report(r);
  EXPECT_NE(table.find("exposed ms"), std::string::npos);
  EXPECT_NE(table.find("total"), std::string::npos);
  EXPECT_NE(table.find("75.0%"), std::string::npos);  // layer 0: 6 of 8 ms hidden
}

// Overlapping compute spans (an engine may emit nested ranges) are counted once.
TEST(OverlapReport, CoverageCountsOverlappingComputeOnce) {
  trace_writer w;
  w.add_span(kComputeTrack, "fwd L0", span_kind::forward, 0, 10, 0);
  w.add_span(kComputeTrack, "recompute L0", span_kind::recompute, 4, 4, 0);
  w.add_span(kComputeTrack, "bwd L0", span_kind::backward, 15, 5, 0);
  w.add_span(kH2DTrack, "h2d L0", span_kind::h2d, 2, 16, 0);  // [2, 18]: 8 + 3 under compute
  const overlap_report r = compute_overlap(w.spans());
  EXPECT_DOUBLE_EQ(r.total.hidden_ms, 11);
}

// A simulated timeline is well-formed: streams never run two things at once, the device
// counter peaks at the reported peak, and the report's exposed time is the canonical one.
TEST(Trace, SimulatorTimelineIsConsistent) {
  constexpr std::uint64_t MiB = 1048576;
  step_profile p;
  p.link = {8, 6, 10, 1};
  p.pinnable_bytes = 1ull << 40;
  p.fixed_bytes = 64 * MiB;
  for (int i = 0; i < 6; ++i) {
    layer_profile l;
    l.name = "layers." + std::to_string(i);
    l.signature = "b";
    l.fwd_ms = 1 + 0.25 * i;
    l.bwd_ms = 2 + 0.5 * (i % 3);
    l.bwd_temp_bytes = 8 * MiB;
    for (int j = 0; j < 4; ++j) {
      tensor_profile t;
      t.name = "t" + std::to_string(j);
      t.bytes = (4 + 3 * j) * MiB;
      t.recompute_ms = 0.2;
      t.recomputable = j > 0;
      l.tensors.push_back(t);
    }
    p.layers.push_back(l);
  }
  decision_table d = keep_all(p);
  for (int i = 0; i < 5; ++i) d[i][3] = tensor_action::offload, d[i][1] = tensor_action::recompute;
  d[2][0] = tensor_action::offload;
  const sim_result r = simulate(p, d);
  const evaluation ev = evaluate(p, d, ~0ull);
  ASSERT_GT(ev.exposed_copy_ms, 0);  // the case must overrun to test the waits
  std::map<std::string, std::vector<std::pair<double, double>>> by_track;
  for (const trace_span& s : r.trace.spans()) by_track[s.track].push_back({s.start_ms, s.end_ms()});
  EXPECT_EQ(by_track.size(), 3u);
  for (auto& [track, iv] : by_track) {
    std::sort(iv.begin(), iv.end());
    for (std::size_t k = 1; k < iv.size(); ++k)
      EXPECT_LE(iv[k - 1].second, iv[k].first + 1e-12) << track;
  }
  double device_max = 0, pinned_last = -1;
  for (const counter_sample& c : r.trace.counters()) {
    if (c.name == kDeviceBytesCounter) device_max = std::max(device_max, c.value);
    if (c.name == kPinnedBytesCounter) pinned_last = c.value;
  }
  EXPECT_EQ(static_cast<std::uint64_t>(device_max), r.peak_bytes);
  EXPECT_EQ(pinned_last, 0);  // every pinned block is returned by the end of backward
  const overlap_report rep = compute_overlap(r.trace.spans());
  EXPECT_NEAR(rep.total.exposed_ms, ev.exposed_copy_ms, 1e-9);
  EXPECT_NEAR(rep.total.d2h_ms, ev.offloaded_bytes / p.d2h_bytes_per_ms(), 1e-9);
  EXPECT_NEAR(rep.total.h2d_ms, ev.offloaded_bytes / p.h2d_bytes_per_ms(), 1e-9);
  EXPECT_LE(rep.total.hidden_ms, rep.total.copy_ms);
  // Round trip through JSON keeps the report.
  const overlap_report again = compute_overlap(trace_from_json(r.trace.to_json()).spans());
  EXPECT_NEAR(again.total.exposed_ms, rep.total.exposed_ms, 1e-9);
  EXPECT_NEAR(again.total.hidden_ms, rep.total.hidden_ms, 1e-9);
}

}  // namespace
}  // namespace stash::planner
