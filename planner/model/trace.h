// trace.h: stash's timeline format (Chrome / Perfetto "Trace Event" JSON) and the overlap
// report computed from it. Written by the simulator (`stash simulate`) and by the runtime
// engine, so a predicted and a measured timeline open side by side in ui.perfetto.dev or
// chrome://tracing, and both print the same overlap report.
//
// Note [Trace format]
// ~~~~~~~~~~~~~~~~~~~
// One JSON object {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}:
//   * metadata: "ph":"M" process_name (pid 1) and, per track, thread_name and
//     thread_sort_index; a track is a stream ("compute", "stash d2h", "stash h2d"), tids
//     numbered from 1 in order of first use;
//   * spans: complete events "ph":"X" with "ts"/"dur" in microseconds (doubles), "cat" =
//     the span_kind ("forward", "recompute", "backward", "d2h", "h2d", "wait",
//     "step_overhead", "other") and
//     "args" {layer, tensor, bytes} where known plus any numeric extras;
//   * counters: "ph":"C" named "device bytes" and "pinned bytes" (any name is allowed), with
//     args {"bytes": value}; a counter holds its value until its next sample.
// The category and the layer argument are what the overlap report reads, so a writer that
// wants the report must fill them: compute spans carry the layer they run, copy spans the
// layer that owns the tensor, wait spans the layer whose copies the compute stream waits for.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace stash::planner {

// step_overhead: compute outside every layer (the loss, the optimizer; the simulator's
// span for the profile's step_overhead_ms). It counts as compute in the overlap report.
enum class span_kind { forward, recompute, backward, d2h, h2d, wait, step_overhead, other };
const char* to_string(span_kind k);
span_kind span_kind_from_string(const std::string& s);  // unknown text -> other

inline constexpr const char* kComputeTrack = "compute";
inline constexpr const char* kD2HTrack = "stash d2h";
inline constexpr const char* kH2DTrack = "stash h2d";
inline constexpr const char* kDeviceBytesCounter = "device bytes";
inline constexpr const char* kPinnedBytesCounter = "pinned bytes";

struct trace_span {
  std::string track;  // the stream it ran on
  std::string name;
  span_kind kind = span_kind::other;
  double start_ms = 0;
  double dur_ms = 0;
  int layer = -1;           // -1: not tied to a layer
  std::string tensor;       // copies: the tensor moved
  std::uint64_t bytes = 0;  // copies: bytes moved
  std::map<std::string, double> extra;  // further numeric args, written as-is

  double end_ms() const { return start_ms + dur_ms; }
};

struct counter_sample {
  std::string name;
  double t_ms = 0;
  double value = 0;
};

class trace_writer {
 public:
  explicit trace_writer(std::string process_name = "stash");

  void add_span(trace_span s);
  void add_span(const std::string& track, const std::string& name, span_kind kind, double start_ms,
                double dur_ms, int layer = -1);
  void add_counter(const std::string& name, double t_ms, double value);
  // Process-level facts written under "otherData" (e.g. the source: simulate / engine).
  void set_metadata(const std::string& key, const std::string& value);

  const std::vector<trace_span>& spans() const { return spans_; }
  const std::vector<counter_sample>& counters() const { return counters_; }
  const std::string& process_name() const { return process_name_; }

  nlohmann::json to_json() const;
  // Throws std::runtime_error naming the path when it cannot be written.
  void write(const std::string& path) const;

 private:
  std::string process_name_;
  std::vector<trace_span> spans_;
  std::vector<counter_sample> counters_;
  std::map<std::string, std::string> metadata_;
};

// Reads back the spans and counters of a trace in the format above (ours or the engine's);
// events of other phases are ignored. Throws input_error on a structurally bad trace.
trace_writer trace_from_json(const nlohmann::json& j);

// Note [Overlap report]
// ~~~~~~~~~~~~~~~~~~~~~
// Per layer (the layer that owns the copied tensors) and in total:
//   copy_ms    = summed duration of its d2h and h2d spans;
//   hidden_ms  = the part of those spans that lies under compute spans (forward, recompute,
//                backward, step_overhead) on the compute track, i.e. |copy ∩ ∪compute| per
//                span;
//   exposed_ms = summed duration of wait spans on the compute track attributed to the layer:
//                the time compute stood still for its copies.
// copy_ms - hidden_ms can exceed exposed_ms (a copy may also run while compute waits for
// something else), so the three are reported separately rather than derived.
struct layer_overlap {
  int layer = -1;
  double d2h_ms = 0, h2d_ms = 0;
  double copy_ms = 0, hidden_ms = 0, exposed_ms = 0;
};

struct overlap_report {
  std::vector<layer_overlap> layers;  // ascending layer, only layers with copies or waits
  layer_overlap total;
};

overlap_report compute_overlap(const std::vector<trace_span>& spans);
// A fixed-width table; layers with nothing to report are omitted.
std::string format_overlap_report(const overlap_report& r);

}  // namespace stash::planner
