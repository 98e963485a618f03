// pareto_svg.cpp: the Pareto curve as a hand-written SVG plot (no plotting library here).
// Budget in GiB on x, predicted step time in ms on y; the envelope is drawn as a step curve
// (a plan found at budget b holds until the next sample), sample points as dots.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "planner/pareto.h"

namespace stash::planner {

namespace {

constexpr double kW = 960, kH = 600;                         // canvas
constexpr double kL = 92, kR = 40, kT = 70, kB = 78;          // plot margins
constexpr double kGiB = 1073741824.0;

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

// A 1-2-2.5-5 tick step giving at most about `target` ticks over `range`.
double tick_step(double range, int target) {
  if (!(range > 0)) return 1;
  const double raw = range / target, mag = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

// Decimals enough to write every multiple of `step` exactly.
std::string tick_format(double step) {
  int d = 0;
  while (d < 4 && std::abs(step * std::pow(10, d) - std::round(step * std::pow(10, d))) > 1e-6) ++d;
  return "%." + std::to_string(d) + "f";
}

struct Axis {
  double lo, hi, px_lo, px_hi;
  double operator()(double v) const { return px_lo + (v - lo) / (hi - lo) * (px_hi - px_lo); }
};

}  // namespace

std::string pareto_svg(const ParetoCurve& c, const std::string& title) {
  // Ranges: the sweep's budgets (and the recompute-all peak when it falls inside a little
  // margin), step times of the curve and of both baselines.
  double xlo = c.from_bytes / kGiB, xhi = c.to_bytes / kGiB;
  if (xhi - xlo < 1e-3) xlo -= 0.5, xhi += 0.5;
  const double xpad = 0.03 * (xhi - xlo);
  xlo -= xpad, xhi += xpad;
  double ylo = c.keep_all.step_ms, yhi = c.recompute_all.step_ms;
  for (const ParetoPoint& p : c.points) ylo = std::min(ylo, p.step_ms), yhi = std::max(yhi, p.step_ms);
  if (yhi - ylo < 1e-6 * std::max(1.0, yhi)) ylo -= 1, yhi += 1;
  const double ypad = 0.06 * (yhi - ylo);
  ylo = std::max(0.0, ylo - ypad), yhi += ypad;
  const Axis X{xlo, xhi, kL, kW - kR}, Y{ylo, yhi, kH - kB, kT};

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
       esc(c.device + ", solver " + c.solver + ", " + std::to_string(c.points.size()) +
           " budgets") + "</text>\n";

  // Grid and ticks.
  s += "<g id=\"x-axis\" font-size=\"12\" text-anchor=\"middle\">\n";
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
       "\" font-size=\"14\" text-anchor=\"middle\">device memory budget (GiB)</text>\n";
  s += "<text transform=\"translate(24 " + fmt("%.1f", (kT + kH - kB) / 2) +
       ") rotate(-90)\" font-size=\"14\" text-anchor=\"middle\">predicted step time (ms)</text>\n";

  // Reference lines: the two baselines' step times, labelled with their peaks.
  auto hline = [&](double ms, const std::string& label, const char* color) {
    if (ms < ylo || ms > yhi) return;
    s += "<line class=\"reference\" x1=\"" + fmt("%.1f", kL) + "\" y1=\"" + fmt("%.1f", Y(ms)) +
         "\" x2=\"" + fmt("%.1f", kW - kR) + "\" y2=\"" + fmt("%.1f", Y(ms)) + "\" stroke=\"" +
         color + "\" stroke-width=\"1.5\" stroke-dasharray=\"7 5\"/>\n";
    s += "<text x=\"" + fmt("%.1f", kW - kR - 6) + "\" y=\"" + fmt("%.1f", Y(ms) - 6) +
         "\" font-size=\"12\" fill=\"" + color + "\" text-anchor=\"end\">" + esc(label) +
         "</text>\n";
  };
  hline(c.keep_all.step_ms,
        "keep-all: " + fmt("%.1f ms", c.keep_all.step_ms) + ", peak " +
            fmt("%.2f GiB", c.keep_all.peak_bytes / kGiB), "#2a7d2a");
  hline(c.recompute_all.step_ms,
        "recompute-all: " + fmt("%.1f ms", c.recompute_all.step_ms) + ", peak " +
            fmt("%.2f GiB", c.recompute_all.peak_bytes / kGiB), "#b03030");

  // The envelope as a step curve, then the samples.
  if (!c.points.empty()) {
    std::string d = "M" + fmt("%.2f", X(c.points[0].budget_bytes / kGiB)) + "," +
                    fmt("%.2f", Y(c.points[0].step_ms));
    for (std::size_t i = 1; i < c.points.size(); ++i)
      d += " H" + fmt("%.2f", X(c.points[i].budget_bytes / kGiB)) + " V" +
           fmt("%.2f", Y(c.points[i].step_ms));
    s += "<path id=\"curve\" d=\"" + d + "\" fill=\"none\" stroke=\"#1f5fbf\" stroke-width=\"2.2\"/>\n";
    for (const ParetoPoint& p : c.points)
      s += "<circle class=\"sample\" cx=\"" + fmt("%.2f", X(p.budget_bytes / kGiB)) + "\" cy=\"" +
           fmt("%.2f", Y(p.step_ms)) + "\" r=\"2.6\" fill=\"#1f5fbf\"/>\n";
  }
  if (c.knee < c.points.size()) {
    const ParetoPoint& k = c.points[c.knee];
    const double x = X(k.budget_bytes / kGiB), y = Y(k.step_ms);
    s += "<circle id=\"knee\" cx=\"" + fmt("%.2f", x) + "\" cy=\"" + fmt("%.2f", y) +
         "\" r=\"7\" fill=\"none\" stroke=\"#e07000\" stroke-width=\"2.5\"/>\n";
    const bool left = x > (kL + kW - kR) / 2;  // keep the label inside the plot
    s += "<text x=\"" + fmt("%.1f", x + (left ? -12 : 12)) + "\" y=\"" + fmt("%.1f", y - 12) +
         "\" font-size=\"13\" font-weight=\"bold\" fill=\"#e07000\" text-anchor=\"" +
         (left ? "end" : "start") + "\">" +
         esc("knee: " + fmt("%.2f GiB", k.budget_bytes / kGiB) + ", " +
             fmt("%.1f ms", k.step_ms)) + "</text>\n";
  }
  // Legend.
  const double lx = kL + 14, ly = kT + 18;
  s += "<g id=\"legend\" font-size=\"12\">\n"
       "<line x1=\"" + fmt("%.1f", lx) + "\" y1=\"" + fmt("%.1f", ly) + "\" x2=\"" +
       fmt("%.1f", lx + 26) + "\" y2=\"" + fmt("%.1f", ly) +
       "\" stroke=\"#1f5fbf\" stroke-width=\"2.2\"/>\n<text x=\"" + fmt("%.1f", lx + 32) +
       "\" y=\"" + fmt("%.1f", ly + 4) + "\">best plan at budget (" + esc(c.solver) +
       ")</text>\n</g>\n";
  s += "</svg>\n";
  return s;
}

}  // namespace stash::planner
