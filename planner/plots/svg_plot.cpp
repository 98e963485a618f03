// svg_plot.cpp: svg_plot.h (moved out of pareto_svg.cpp to serve memory_svg.cpp too).
#include "planner/plots/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>

namespace stash::planner::svg {

std::string esc(const std::string& s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += ch;
    }
  }
  return o;
}

std::string fmt(const char* f, double a) {
  char b[64];
  std::snprintf(b, sizeof b, f, a);
  return b;
}

double tick_step(double range, int target) {
  if (!(range > 0)) return 1;
  const double raw = range / target, mag = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

std::string tick_format(double step) {
  int d = 0;
  while (d < 4 && std::abs(step * std::pow(10, d) - std::round(step * std::pow(10, d))) > 1e-6) ++d;
  return "%." + std::to_string(d) + "f";
}

std::string open_plot(const std::string& title, const std::string& subtitle, const plot_axis& X,
                      const plot_axis& Y, const std::string& x_label, const std::string& y_label) {
  std::string s;
  s += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt("%.0f", kW) + "\" height=\"" +
       fmt("%.0f", kH) + "\" viewBox=\"0 0 " + fmt("%.0f", kW) + " " + fmt("%.0f", kH) +
       "\" font-family=\"Helvetica, Arial, sans-serif\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  // Bold sans glyphs average about 0.62 em: shrink a long title to fit the canvas.
  const double title_px = std::min(18.0, (kW - 40) / (0.62 * std::max<std::size_t>(1, title.size())));
  s += "<text x=\"" + fmt("%.1f", kW / 2) + "\" y=\"30\" font-size=\"" + fmt("%.1f", title_px) +
       "\" font-weight=\"bold\" text-anchor=\"middle\">" + esc(title) + "</text>\n";
  s += "<text x=\"" + fmt("%.1f", kW / 2) + "\" y=\"52\" font-size=\"13\" fill=\"#555\" "
       "text-anchor=\"middle\">" +
       esc(subtitle) + "</text>\n";

  // Grid and ticks.
  s += "<g id=\"x-axis\" font-size=\"12\" text-anchor=\"middle\">\n";
  const double xlo = X.lo, xhi = X.hi, ylo = Y.lo, yhi = Y.hi;
  const double xs = tick_step(xhi - xlo, 8);
  const std::string xfmt = tick_format(xs);
  for (double v = std::ceil(xlo / xs) * xs; v <= xhi + 1e-9; v += xs) {
    const double x = X(v);
    s += "<line x1=\"" + fmt("%.1f", x) + "\" y1=\"" + fmt("%.1f", kT) + "\" x2=\"" +
         fmt("%.1f", x) + "\" y2=\"" + fmt("%.1f", kH - kB) + "\" stroke=\"#e4e4e4\"/>\n";
    s += "<line x1=\"" + fmt("%.1f", x) + "\" y1=\"" + fmt("%.1f", kH - kB) + "\" x2=\"" +
         fmt("%.1f", x) + "\" y2=\"" + fmt("%.1f", kH - kB + 6) + "\" stroke=\"black\"/>\n";
    s += "<text x=\"" + fmt("%.1f", x) + "\" y=\"" + fmt("%.1f", kH - kB + 21) + "\">" +
         fmt(xfmt.c_str(), v) + "</text>\n";
  }
  s += "</g>\n<g id=\"y-axis\" font-size=\"12\" text-anchor=\"end\">\n";
  const double ys = tick_step(yhi - ylo, 7);
  const std::string yfmt = tick_format(ys);
  for (double v = std::ceil(ylo / ys) * ys; v <= yhi + 1e-9; v += ys) {
    const double y = Y(v);
    s += "<line x1=\"" + fmt("%.1f", kL) + "\" y1=\"" + fmt("%.1f", y) + "\" x2=\"" +
         fmt("%.1f", kW - kR) + "\" y2=\"" + fmt("%.1f", y) + "\" stroke=\"#e4e4e4\"/>\n";
    s += "<line x1=\"" + fmt("%.1f", kL - 6) + "\" y1=\"" + fmt("%.1f", y) + "\" x2=\"" +
         fmt("%.1f", kL) + "\" y2=\"" + fmt("%.1f", y) + "\" stroke=\"black\"/>\n";
    s += "<text x=\"" + fmt("%.1f", kL - 10) + "\" y=\"" + fmt("%.1f", y + 4) + "\">" +
         fmt(yfmt.c_str(), v) + "</text>\n";
  }
  s += "</g>\n";
  s += "<rect x=\"" + fmt("%.1f", kL) + "\" y=\"" + fmt("%.1f", kT) + "\" width=\"" +
       fmt("%.1f", kW - kR - kL) + "\" height=\"" + fmt("%.1f", kH - kB - kT) +
       "\" fill=\"none\" stroke=\"black\"/>\n";
  s += "<text x=\"" + fmt("%.1f", (kL + kW - kR) / 2) + "\" y=\"" + fmt("%.1f", kH - 22) +
       "\" font-size=\"14\" text-anchor=\"middle\">" + esc(x_label) + "</text>\n";
  s += "<text transform=\"translate(24 " + fmt("%.1f", (kT + kH - kB) / 2) +
       ") rotate(-90)\" font-size=\"14\" text-anchor=\"middle\">" + esc(y_label) + "</text>\n";
  return s;
}

}  // namespace stash::planner::svg
