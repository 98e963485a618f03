// svg_plot.h: what stash's hand-written SVG plots share (no plotting library here): text
// escaping, number formatting, tick steps, a linear axis, and the canvas of a plot (title,
// grid, ticks, frame, axis labels). pareto_svg.cpp and memory_svg.cpp draw on it.
//
// Note [Where the SVG plots live]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// In planner/, not tools/: the plots are the planner's outputs (the Pareto curve of
// pareto.h; predicted against measured memory of a step, from the trace format of
// trace.h), drawn from planner types alone, as pure C++ with no dependency, so they are
// tested beside what they draw (tests/planner/) and any front end can write them. tools/
// only chooses the files (stash pareto --svg, stash simulate --memory-svg, stash demo). A
// plot that needed more than planner types (a runtime-only figure) would go above it.
#pragma once

#include <string>

namespace stash::planner::svg {

inline constexpr double kW = 960, kH = 600;                 // canvas
inline constexpr double kL = 92, kR = 40, kT = 70, kB = 78;  // plot margins

std::string esc(const std::string& s);        // XML text / attribute escaping
std::string fmt(const char* f, double a);      // snprintf of one number
// A 1-2-2.5-5 tick step giving at most about `target` ticks over `range`.
double tick_step(double range, int target);
// Decimals enough to write every multiple of `step` exactly.
std::string tick_format(double step);

struct plot_axis {
  double lo, hi, px_lo, px_hi;
  double operator()(double v) const { return px_lo + (v - lo) / (hi - lo) * (px_hi - px_lo); }
};

// The opening of a plot over X x Y: the XML header and <svg>, a white background, the
// title (shrunk to fit) and subtitle, grid lines and ticks, the frame and the axis labels.
// The caller appends its marks and closes with "</svg>\n".
std::string open_plot(const std::string& title, const std::string& subtitle, const plot_axis& X,
                      const plot_axis& Y, const std::string& x_label, const std::string& y_label);

}  // namespace stash::planner::svg
