// memory_svg.cpp: memory_svg.h.
#include "planner/plots/memory_svg.h"

#include <algorithm>
#include <cmath>

#include "planner/plots/svg_plot.h"

namespace stash::planner {

using namespace svg;

std::vector<std::pair<double, double>> counter_window(const trace_writer& t,
                                                      const std::string& name, double from_ms,
                                                      double to_ms) {
  std::vector<std::pair<double, double>> all;
  for (const counter_sample& c : t.counters())
    if (c.name == name) all.emplace_back(c.t_ms, c.value);
  std::stable_sort(all.begin(), all.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::pair<double, double>> out;
  double before = -1;  // the value in effect at from_ms
  for (const auto& [ms, v] : all) {
    if (ms < from_ms) {
      before = v;
    } else if (ms <= to_ms) {
      if (out.empty() && before >= 0 && ms > from_ms) out.emplace_back(0.0, before);
      out.emplace_back(ms - from_ms, v);
    }
  }
  if (out.empty() && before >= 0) out.emplace_back(0.0, before);
  if (!out.empty() && out.back().first < to_ms - from_ms)
    out.emplace_back(to_ms - from_ms, out.back().second);
  return out;
}

std::vector<std::pair<double, double>> step_memory(const sim_result& r) {
  return counter_window(r.trace, kDeviceBytesCounter, 0, r.step_ms);
}

std::vector<std::pair<double, double>> last_pass(const trace_writer& t, const std::string& name) {
  double from = -1, to = 0;
  for (const trace_span& s : t.spans()) {
    to = std::max(to, s.end_ms());
    if (s.kind == span_kind::forward && s.layer == 0) from = std::max(from, s.start_ms);
  }
  if (from < 0) return {};
  return counter_window(t, name, from, to);
}

std::string memory_svg(const std::vector<memory_series>& series, std::uint64_t budget_bytes,
                       const std::string& title, const std::string& subtitle) {
  double xhi = 0, yhi = static_cast<double>(budget_bytes);
  for (const memory_series& s : series)
    for (const auto& [ms, v] : s.samples) xhi = std::max(xhi, ms), yhi = std::max(yhi, v);
  const bool gib = yhi >= 2.0 * 1073741824.0;
  const double unit = gib ? 1073741824.0 : 1048576.0;
  const char* unit_name = gib ? "GiB" : "MiB";
  if (!(xhi > 0)) xhi = 1;
  double ytop = yhi / unit;
  if (!(ytop > 0)) ytop = 1;
  // Headroom above the highest level for the legend's lines.
  const plot_axis X{0, xhi * 1.02, kL, kW - kR},
      Y{0, ytop * (1.1 + 0.05 * static_cast<double>(series.size())), kH - kB, kT};
  std::string s = open_plot(title, subtitle, X, Y, "time in the step (ms)",
                            std::string("device memory (") + unit_name + ")");
  if (budget_bytes > 0) {
    const double y = Y(budget_bytes / unit);
    s += "<line id=\"budget\" x1=\"" + fmt("%.1f", kL) + "\" y1=\"" + fmt("%.1f", y) +
         "\" x2=\"" + fmt("%.1f", kW - kR) + "\" y2=\"" + fmt("%.1f", y) +
         "\" stroke=\"#b03030\" stroke-width=\"1.5\" stroke-dasharray=\"7 5\"/>\n";
    s += "<text x=\"" + fmt("%.1f", kW - kR - 6) + "\" y=\"" + fmt("%.1f", y - 6) +
         "\" font-size=\"12\" fill=\"#b03030\" text-anchor=\"end\">" +
         esc("budget " + fmt("%.2f ", budget_bytes / unit) + unit_name) + "</text>\n";
  }
  for (const memory_series& m : series) {
    if (m.samples.empty()) continue;
    std::string d = "M" + fmt("%.2f", X(m.samples[0].first)) + "," +
                    fmt("%.2f", Y(m.samples[0].second / unit));
    for (std::size_t i = 1; i < m.samples.size(); ++i)
      d += " H" + fmt("%.2f", X(m.samples[i].first)) + " V" +
           fmt("%.2f", Y(m.samples[i].second / unit));
    s += "<path class=\"series\" d=\"" + d + "\" fill=\"none\" stroke=\"" + esc(m.color) +
         "\" stroke-width=\"2\" stroke-opacity=\"0.85\"/>\n";
  }
  // Legend, with each series' peak.
  double ly = kT + 18;
  s += "<g id=\"legend\" font-size=\"12\">\n";
  for (const memory_series& m : series) {
    double peak = 0;
    for (const auto& [ms, v] : m.samples) peak = std::max(peak, v);
    const std::string text =
        m.samples.empty() ? m.name + ": no samples"
                          : m.name + ": peak " + fmt("%.2f ", peak / unit) + unit_name;
    s += "<line x1=\"" + fmt("%.1f", kL + 14) + "\" y1=\"" + fmt("%.1f", ly) + "\" x2=\"" +
         fmt("%.1f", kL + 40) + "\" y2=\"" + fmt("%.1f", ly) + "\" stroke=\"" + esc(m.color) +
         "\" stroke-width=\"2\"/>\n<text x=\"" + fmt("%.1f", kL + 46) + "\" y=\"" +
         fmt("%.1f", ly + 4) + "\">" + esc(text) + "</text>\n";
    ly += 18;
  }
  s += "</g>\n</svg>\n";
  return s;
}

}  // namespace stash::planner
