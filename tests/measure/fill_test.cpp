// Filling a skeleton profile from a measurement; the no-skeleton mode; measurement and
// link-section files.
#include <cstdio>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "planner/model/profile.h"
#include "runtime/measure/measurement.h"
#include "runtime/measure/profile_fill.h"

namespace stash::measure {
namespace {

using nlohmann::json;

planner::step_profile skeleton() {
  const json j = json::parse(R"({
    "schema": "stash.profile/1", "source": "analytic",
    "device": {"name": "NVIDIA H200", "memory_bytes": 150323855360},
    "link": {"h2d_gbps": 10.0, "d2h_gbps": 10.0, "bidir_gbps": 15.0, "local_ranks": 1},
    "host": {"pinnable_bytes": 400000000000},
    "fixed_bytes": 20000000000,
    "layers": [
      {"name": "layers.0", "signature": "block", "fwd_ms": 0, "bwd_ms": 0, "bwd_temp_bytes": 0,
       "tensors": [{"name": "input", "bytes": 33554432, "recompute_ms": 0,
                    "offloadable": true, "recomputable": false, "must_keep": false},
                   {"name": "attn_out", "bytes": 33554432, "recompute_ms": 0,
                    "offloadable": true, "recomputable": true, "must_keep": false}]},
      {"name": "layers.1", "signature": "block", "fwd_ms": 0, "bwd_ms": 0, "bwd_temp_bytes": 0,
       "tensors": [{"name": "input", "bytes": 33554432, "recompute_ms": 0,
                    "offloadable": true, "recomputable": false, "must_keep": false},
                   {"name": "attn_out", "bytes": 33554432, "recompute_ms": 0.7,
                    "offloadable": true, "recomputable": true, "must_keep": false}]}]})");
  return planner::profile_from_json(j);
}

measurement sample_measurement() {
  measurement m;
  m.layers[0].fwd_ms = {9.0, 2.0, 2.2};
  m.layers[0].bwd_ms = {4.0, 4.4};
  m.layers[1].fwd_ms = {3.0};
  m.layers[1].bwd_ms = {6.0};
  m.tensors[{0, "attn_out"}] = {0.5, 0.4, 0.6};
  m.kernels = 12;
  m.dropped_records = 3;
  m.warnings.push_back("3 activity records were dropped");
  return m;
}

TEST(FillProfile, FillsTimesFromScopesAndMarksMeasured) {
  const planner::step_profile sk = skeleton();
  const filled_profile f = fill_profile(sample_measurement(), &sk, std::nullopt);
  ASSERT_TRUE(f.plannable);
  const planner::step_profile p = planner::profile_from_json(f.json);
  EXPECT_EQ(p.source, planner::profile_source::measured);
  EXPECT_DOUBLE_EQ(p.layers[0].fwd_ms, 2.2);
  EXPECT_DOUBLE_EQ(p.layers[0].bwd_ms, 4.2);
  EXPECT_DOUBLE_EQ(p.layers[1].fwd_ms, 3.0);
  EXPECT_DOUBLE_EQ(p.layers[1].bwd_ms, 6.0);
  EXPECT_DOUBLE_EQ(p.layers[0].tensors[1].recompute_ms, 0.5);
  // Not measured: the skeleton's value stays, and a note says so.
  EXPECT_DOUBLE_EQ(p.layers[1].tensors[1].recompute_ms, 0.7);
  EXPECT_EQ(p.layers[0].tensors[0].bytes, 33554432u);
  EXPECT_DOUBLE_EQ(p.link.h2d_gbps, 10.0);  // no link given: the skeleton's
  EXPECT_EQ(f.json["measurement"]["dropped_records"], 3);
  bool tensor_note = false, dropped_note = false;
  for (const std::string& n : f.notes) {
    // Layer 1's attn_out; the inputs are not recomputable and need no producer time.
    tensor_note |= n.find("1 of 2 recomputable tensors had no stash:tensor scope") != std::string::npos;
    dropped_note |= n.find("dropped") != std::string::npos;
  }
  EXPECT_TRUE(tensor_note);
  EXPECT_TRUE(dropped_note);
  EXPECT_EQ(f.json["measurement"]["notes"], nlohmann::json(f.notes));
}

// Everything the skeleton needs measured, nothing dropped: no notes, in the file too.
TEST(FillProfile, ACompleteMeasurementHasNoNotes) {
  const planner::step_profile sk = skeleton();
  measurement m = sample_measurement();
  m.tensors[{1, "attn_out"}] = {0.8};
  m.step_outside_ms = {0.1};
  m.dropped_records = 0;
  m.warnings.clear();
  const filled_profile f = fill_profile(m, &sk, std::nullopt);
  EXPECT_TRUE(f.notes.empty()) << f.notes.front();
  EXPECT_TRUE(f.json["measurement"]["notes"].is_array());
  EXPECT_TRUE(f.json["measurement"]["notes"].empty());
}

TEST(FillProfile, MergesAGivenLinkSection) {
  const planner::step_profile sk = skeleton();
  planner::link_profile link;
  link.h2d_gbps = 52.5;
  link.d2h_gbps = 51.0;
  link.bidir_gbps = 90.0;
  link.local_ranks = 4;
  const filled_profile f = fill_profile(sample_measurement(), &sk, link);
  const planner::step_profile p = planner::profile_from_json(f.json);
  EXPECT_DOUBLE_EQ(p.link.h2d_gbps, 52.5);
  EXPECT_DOUBLE_EQ(p.link.d2h_gbps, 51.0);
  EXPECT_DOUBLE_EQ(p.link.bidir_gbps, 90.0);
  EXPECT_EQ(p.link.local_ranks, 4);
}

TEST(FillProfile, NamesLayersTheRunDidNotMeasure) {
  const planner::step_profile sk = skeleton();
  measurement m;
  m.layers[0].fwd_ms = {1.0};
  m.layers[0].bwd_ms = {2.0};
  m.layers[7].fwd_ms = {1.0};
  const filled_profile f = fill_profile(m, &sk, std::nullopt);
  std::string all;
  for (const std::string& n : f.notes) all += n + "\n";
  EXPECT_NE(all.find("no forward scope measured for layers 1"), std::string::npos) << all;
  EXPECT_NE(all.find("no backward scope measured for layers 1"), std::string::npos) << all;
  EXPECT_NE(all.find("measured layers 7 are not in the skeleton"), std::string::npos) << all;
}

TEST(FillProfile, WithoutSkeletonWritesLayerTimesOnly) {
  const filled_profile f = fill_profile(sample_measurement(), nullptr, std::nullopt);
  EXPECT_FALSE(f.plannable);
  EXPECT_EQ(f.json["plannable"], false);
  EXPECT_EQ(f.json["source"], "measured");
  ASSERT_EQ(f.json["layers"].size(), 2u);
  EXPECT_DOUBLE_EQ(f.json["layers"][0]["fwd_ms"].get<double>(), 2.2);
  EXPECT_DOUBLE_EQ(f.json["layers"][1]["bwd_ms"].get<double>(), 6.0);
  EXPECT_FALSE(f.json.contains("link"));
  ASSERT_FALSE(f.notes.empty());
  EXPECT_NE(f.notes.back().find("cannot be planned yet"), std::string::npos);
  // It is deliberately not a complete profile: the planner refuses it.
  EXPECT_THROW(planner::profile_from_json(f.json), stash::input_error);
}

TEST(Measurement, JsonRoundTripAndMerge) {
  const measurement a = sample_measurement();
  const measurement b = measurement_from_json(measurement_to_json(a));
  EXPECT_EQ(b.layers.at(0).fwd_ms, a.layers.at(0).fwd_ms);
  EXPECT_EQ(b.tensors.at({0, "attn_out"}), a.tensors.at({0, "attn_out"}));
  EXPECT_EQ(b.dropped_records, 3u);
  measurement merged = a;
  merged.merge(b);
  EXPECT_EQ(merged.layers.at(0).fwd_ms.size(), 6u);
  EXPECT_EQ(merged.dropped_records, 6u);
  EXPECT_EQ(merged.processes, 2u);
  measurement off;
  off.available = false;
  off.unavailable_reason = "no CUDA-capable device is detected";
  merged.merge(off);
  EXPECT_FALSE(merged.available);
  EXPECT_EQ(merged.unavailable_reason, "no CUDA-capable device is detected");
  json bad = measurement_to_json(a);
  bad["schema"] = "stash.measurement/0";
  EXPECT_THROW(measurement_from_json(bad), stash::input_error);
  bad = measurement_to_json(a);
  bad["layers"][0]["fwd_ms"][0] = -1.0;
  EXPECT_THROW(measurement_from_json(bad), stash::input_error);
}

// Note [Time outside the layers]: the step overhead is the median of the per-step samples.
TEST(FillProfile, StepOverheadIsTheMedianOfTheStepSamples) {
  const planner::step_profile sk = skeleton();
  measurement m = sample_measurement();
  m.step_outside_ms = {5.0, 0.3, 0.4, 0.35};  // a slow first step
  const filled_profile f = fill_profile(m, &sk, std::nullopt);
  const planner::step_profile p = planner::profile_from_json(f.json);
  EXPECT_DOUBLE_EQ(p.step_overhead_ms, 0.375);
  EXPECT_DOUBLE_EQ(f.json["step_overhead_ms"].get<double>(), 0.375);
  EXPECT_EQ(f.json["measurement"]["steps"], 4);
  for (const std::string& n : f.notes)
    EXPECT_EQ(n.find("no step measured"), std::string::npos) << n;
  // Without a skeleton the figure is written too.
  const filled_profile bare = fill_profile(m, nullptr, std::nullopt);
  EXPECT_DOUBLE_EQ(bare.json["step_overhead_ms"].get<double>(), 0.375);
  // No step measured: the skeleton's value stays, and a note says so.
  planner::step_profile with = sk;
  with.step_overhead_ms = 1.5;
  const filled_profile none = fill_profile(sample_measurement(), &with, std::nullopt);
  EXPECT_DOUBLE_EQ(planner::profile_from_json(none.json).step_overhead_ms, 1.5);
  bool note = false;
  for (const std::string& n : none.notes) note |= n.find("no step measured") != std::string::npos;
  EXPECT_TRUE(note);
}

TEST(Measurement, StepSamplesRoundTripMergeAndAreOptional) {
  measurement a = sample_measurement();
  a.step_outside_ms = {0.5, 0.25};
  const measurement b = measurement_from_json(measurement_to_json(a));
  EXPECT_EQ(b.step_outside_ms, a.step_outside_ms);
  measurement merged = a;
  merged.merge(b);
  EXPECT_EQ(merged.step_outside_ms, (std::vector<double>{0.5, 0.25, 0.5, 0.25}));
  json older = measurement_to_json(a);  // written before the field existed
  older.erase("step_outside_ms");
  EXPECT_TRUE(measurement_from_json(older).step_outside_ms.empty());
  json bad = measurement_to_json(a);
  bad["step_outside_ms"][1] = -1.0;
  try {
    measurement_from_json(bad);
    ADD_FAILURE() << "a negative sample was accepted";
  } catch (const stash::input_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("step_outside_ms[1]:", 0), 0u) << e.what();
  }
}

TEST(LinkSection, ReadsBenchOutputAndRejectsBadFiles) {
  const std::string path = ::testing::TempDir() + "/link_section.json";
  {
    std::ofstream(path) << R"({"link": {"h2d_gbps": 50, "d2h_gbps": 40, "bidir_gbps": 60,
                                        "local_ranks": 2}, "link_bench": {}})";
  }
  const planner::link_profile l = load_link_section(path);
  EXPECT_DOUBLE_EQ(l.h2d_gbps, 50);
  EXPECT_DOUBLE_EQ(l.d2h_gbps, 40);
  EXPECT_DOUBLE_EQ(l.bidir_gbps, 60);
  EXPECT_EQ(l.local_ranks, 2);
  { std::ofstream(path) << R"({"link": {"h2d_gbps": -1, "d2h_gbps": 40, "bidir_gbps": 60}})"; }
  EXPECT_THROW(load_link_section(path), stash::input_error);
  { std::ofstream(path) << R"({"nothing": 1})"; }
  EXPECT_THROW(load_link_section(path), stash::input_error);
  EXPECT_THROW(load_link_section(path + ".missing"), stash::input_error);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace stash::measure
