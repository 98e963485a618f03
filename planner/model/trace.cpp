// trace.cpp: Chrome/Perfetto JSON writer and reader, and the overlap report (trace.h).
#include "planner/model/trace.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/json_file.h"
#include "planner/model/profile.h"

namespace stash::planner {

namespace {

constexpr int kPid = 1;
constexpr std::pair<span_kind, const char*> kKindNames[] = {
    {span_kind::forward, "forward"},
    {span_kind::recompute, "recompute"},
    {span_kind::backward, "backward"},
    {span_kind::d2h, "d2h"},
    {span_kind::h2d, "h2d"},
    {span_kind::wait, "wait"},
    {span_kind::step_overhead, "step_overhead"},
    {span_kind::other, "other"}};

bool is_compute(span_kind k) {
  return k == span_kind::forward || k == span_kind::recompute || k == span_kind::backward ||
         k == span_kind::step_overhead;
}
bool is_copy(span_kind k) { return k == span_kind::d2h || k == span_kind::h2d; }

// Sorted, disjoint [start, end) intervals covering every compute span.
std::vector<std::pair<double, double>> compute_cover(const std::vector<trace_span>& spans) {
  std::vector<std::pair<double, double>> iv;
  for (const trace_span& s : spans)
    if (is_compute(s.kind) && s.dur_ms > 0) iv.emplace_back(s.start_ms, s.end_ms());
  std::sort(iv.begin(), iv.end());
  std::vector<std::pair<double, double>> merged;
  for (const auto& p : iv) {
    if (!merged.empty() && p.first <= merged.back().second)
      merged.back().second = std::max(merged.back().second, p.second);
    else
      merged.push_back(p);
  }
  return merged;
}

double covered(const std::vector<std::pair<double, double>>& cover, double a, double b) {
  // First interval that ends after a; walk while intervals start before b.
  auto it = std::upper_bound(cover.begin(), cover.end(), a,
                             [](double t, const std::pair<double, double>& p) { return t < p.second; });
  double sum = 0;
  for (; it != cover.end() && it->first < b; ++it)
    sum += std::max(0.0, std::min(b, it->second) - std::max(a, it->first));
  return sum;
}

}  // namespace

const char* to_string(span_kind k) {
  for (const auto& [kind, name] : kKindNames)
    if (kind == k) return name;
  return "other";
}

span_kind span_kind_from_string(const std::string& s) {
  for (const auto& [kind, name] : kKindNames)
    if (s == name) return kind;
  return span_kind::other;
}

trace_writer::trace_writer(std::string process_name) : process_name_(std::move(process_name)) {}

void trace_writer::add_span(trace_span s) { spans_.push_back(std::move(s)); }

void trace_writer::add_span(const std::string& track, const std::string& name, span_kind kind,
                            double start_ms, double dur_ms, int layer) {
  trace_span s;
  s.track = track;
  s.name = name;
  s.kind = kind;
  s.start_ms = start_ms;
  s.dur_ms = dur_ms;
  s.layer = layer;
  spans_.push_back(std::move(s));
}

void trace_writer::add_counter(const std::string& name, double t_ms, double value) {
  counters_.push_back({name, t_ms, value});
}

void trace_writer::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

nlohmann::json trace_writer::to_json() const {
  using nlohmann::json;
  json events = json::array();
  events.push_back({{"ph", "M"}, {"pid", kPid}, {"tid", 0}, {"name", "process_name"},
                    {"args", {{"name", process_name_}}}});
  // Tracks in order of first use; the compute stream first when present, so viewers show
  // compute above the copy streams.
  std::vector<std::string> tracks;
  auto track_id = [&](const std::string& t) {
    auto it = std::find(tracks.begin(), tracks.end(), t);
    if (it != tracks.end()) return static_cast<int>(it - tracks.begin()) + 1;
    tracks.push_back(t);
    return static_cast<int>(tracks.size());
  };
  for (const trace_span& s : spans_)
    if (s.track == kComputeTrack) { track_id(s.track); break; }
  for (const trace_span& s : spans_) track_id(s.track);
  for (std::size_t i = 0; i < tracks.size(); ++i) {
    const int tid = static_cast<int>(i) + 1;
    events.push_back({{"ph", "M"}, {"pid", kPid}, {"tid", tid}, {"name", "thread_name"},
                      {"args", {{"name", tracks[i]}}}});
    events.push_back({{"ph", "M"}, {"pid", kPid}, {"tid", tid}, {"name", "thread_sort_index"},
                      {"args", {{"sort_index", tid}}}});
  }
  for (const trace_span& s : spans_) {
    json args = json::object();
    if (s.layer >= 0) args["layer"] = s.layer;
    if (!s.tensor.empty()) args["tensor"] = s.tensor;
    if (s.bytes) args["bytes"] = s.bytes;
    for (const auto& [k, v] : s.extra) args[k] = v;
    events.push_back({{"ph", "X"}, {"pid", kPid}, {"tid", track_id(s.track)},
                      {"name", s.name}, {"cat", to_string(s.kind)},
                      {"ts", s.start_ms * 1000.0}, {"dur", s.dur_ms * 1000.0},
                      {"args", std::move(args)}});
  }
  // Samples in time order (a writer may add them out of order: the engine harvests per
  // stream); stable, so samples at one instant keep the order they were added in.
  std::vector<counter_sample> counters = counters_;
  std::stable_sort(
      counters.begin(), counters.end(),
      [](const counter_sample& a, const counter_sample& b) { return a.t_ms < b.t_ms; });
  for (const counter_sample& c : counters) {
    // Byte counts are integers; write them as such while a double holds them exactly.
    const bool integral = c.value >= 0 && c.value < 9007199254740992.0 && c.value == std::floor(c.value);
    json value = integral ? json(static_cast<std::uint64_t>(c.value)) : json(c.value);
    events.push_back({{"ph", "C"}, {"pid", kPid}, {"tid", 0}, {"name", c.name},
                      {"ts", c.t_ms * 1000.0}, {"args", {{"bytes", std::move(value)}}}});
  }
  json other = json::object();
  for (const auto& [k, v] : metadata_) other[k] = v;
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"},
          {"otherData", std::move(other)}};
}

void trace_writer::write(const std::string& path) const {
  write_text_file(path, to_json().dump() + "\n");  // compact: a trace has many events
}

trace_writer trace_from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array())
    throw input_error("trace: expected an object with a \"traceEvents\" array");
  std::string process = "stash";
  std::map<int, std::string> track_names;
  const auto& events = j["traceEvents"];
  for (const auto& e : events) {
    if (!e.is_object() || e.value("ph", "") != "M") continue;
    const std::string what = e.value("name", "");
    if (what == "process_name") process = e["args"].value("name", process);
    if (what == "thread_name") track_names[e.value("tid", 0)] = e["args"].value("name", "");
  }
  trace_writer w(process);
  for (std::size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    const std::string where = "trace: traceEvents[" + std::to_string(i) + "]";
    if (!e.is_object()) throw input_error(where + ": not an object");
    const std::string ph = e.value("ph", "");
    if (ph != "X" && ph != "C") continue;
    if (!e.contains("ts") || !e["ts"].is_number()) throw input_error(where + ".ts: missing");
    const double ts_ms = e["ts"].get<double>() / 1000.0;
    const auto args = e.value("args", nlohmann::json::object());
    if (ph == "C") {
      for (const auto& [k, v] : args.items())
        if (v.is_number()) w.add_counter(e.value("name", ""), ts_ms, v.get<double>());
      continue;
    }
    if (!e.contains("dur") || !e["dur"].is_number()) throw input_error(where + ".dur: missing");
    trace_span s;
    const int tid = e.value("tid", 0);
    auto t = track_names.find(tid);
    s.track = t != track_names.end() ? t->second : "tid " + std::to_string(tid);
    s.name = e.value("name", "");
    s.kind = span_kind_from_string(e.value("cat", ""));
    s.start_ms = ts_ms;
    s.dur_ms = e["dur"].get<double>() / 1000.0;
    for (const auto& [k, v] : args.items()) {
      if (k == "layer" && v.is_number_integer()) s.layer = v.get<int>();
      else if (k == "tensor" && v.is_string()) s.tensor = v.get<std::string>();
      else if (k == "bytes" && v.is_number_unsigned()) s.bytes = v.get<std::uint64_t>();
      else if (v.is_number()) s.extra[k] = v.get<double>();
    }
    w.add_span(std::move(s));
  }
  const nlohmann::json other = j.value("otherData", nlohmann::json::object());
  for (const auto& [k, v] : other.items())
    if (v.is_string()) w.set_metadata(k, v.get<std::string>());
  return w;
}

overlap_report compute_overlap(const std::vector<trace_span>& spans) {
  const auto cover = compute_cover(spans);
  std::map<int, layer_overlap> by_layer;
  for (const trace_span& s : spans) {
    const bool copy = is_copy(s.kind);
    const bool wait = s.kind == span_kind::wait && s.track == kComputeTrack;
    if (!copy && !wait) continue;
    layer_overlap& l = by_layer[s.layer];
    l.layer = s.layer;
    if (wait) {
      l.exposed_ms += s.dur_ms;
      continue;
    }
    (s.kind == span_kind::d2h ? l.d2h_ms : l.h2d_ms) += s.dur_ms;
    l.copy_ms += s.dur_ms;
    l.hidden_ms += covered(cover, s.start_ms, s.end_ms());
  }
  overlap_report r;
  for (auto& [layer, l] : by_layer) {
    r.total.d2h_ms += l.d2h_ms;
    r.total.h2d_ms += l.h2d_ms;
    r.total.copy_ms += l.copy_ms;
    r.total.hidden_ms += l.hidden_ms;
    r.total.exposed_ms += l.exposed_ms;
    r.layers.push_back(l);
  }
  return r;
}

std::string format_overlap_report(const overlap_report& r) {
  std::string out;
  char line[160];
  std::snprintf(line, sizeof line, "%-7s %10s %10s %10s %10s %8s %11s\n", "layer", "d2h ms",
                "h2d ms", "copy ms", "hidden ms", "hidden%", "exposed ms");
  out += line;
  auto row = [&](const std::string& label, const layer_overlap& l) {
    const double pct = l.copy_ms > 0 ? 100.0 * l.hidden_ms / l.copy_ms : 100.0;
    std::snprintf(line, sizeof line, "%-7s %10.3f %10.3f %10.3f %10.3f %7.1f%% %11.3f\n",
                  label.c_str(), l.d2h_ms, l.h2d_ms, l.copy_ms, l.hidden_ms, pct,
                  l.exposed_ms);
    out += line;
  };
  for (const layer_overlap& l : r.layers) row(l.layer >= 0 ? std::to_string(l.layer) : "-", l);
  row("total", r.total);
  return out;
}

}  // namespace stash::planner
