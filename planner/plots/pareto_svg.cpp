// pareto_svg.cpp: the Pareto curve as a hand-written SVG plot (no plotting library here).
// Budget in GiB on x, predicted step time in ms on y; the envelope is drawn as a step curve
// (a plan found at budget b holds until the next sample), sample points as dots.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "planner/plots/pareto_svg.h"

#include "planner/plots/svg_plot.h"

namespace stash::planner {

namespace {

using namespace svg;

constexpr double kGiB = 1073741824.0;

}  // namespace

std::string pareto_svg(const pareto_curve& c, const std::string& title) {
  // Ranges: the sweep's budgets (and the recompute-all peak when it falls inside a little
  // margin), step times of the curve and of both baselines.
  double xlo = c.from_bytes / kGiB, xhi = c.to_bytes / kGiB;
  if (xhi - xlo < 1e-3) xlo -= 0.5, xhi += 0.5;
  const double xpad = 0.03 * (xhi - xlo);
  xlo -= xpad, xhi += xpad;
  double ylo = c.keep_all.step_ms, yhi = c.recompute_all.step_ms;
  for (const pareto_point& p : c.points)
    ylo = std::min(ylo, p.step_ms), yhi = std::max(yhi, p.step_ms);
  if (yhi - ylo < 1e-6 * std::max(1.0, yhi)) ylo -= 1, yhi += 1;
  const double ypad = 0.06 * (yhi - ylo);
  ylo = std::max(0.0, ylo - ypad), yhi += ypad;
  const plot_axis X{xlo, xhi, kL, kW - kR}, Y{ylo, yhi, kH - kB, kT};

  std::string s = open_plot(title,
                            c.device + ", solver " + c.solver + ", " +
                                std::to_string(c.points.size()) + " budgets",
                            X, Y, "device memory budget (GiB)", "predicted step time (ms)");

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
    for (const pareto_point& p : c.points)
      s += "<circle class=\"sample\" cx=\"" + fmt("%.2f", X(p.budget_bytes / kGiB)) + "\" cy=\"" +
           fmt("%.2f", Y(p.step_ms)) + "\" r=\"2.6\" fill=\"#1f5fbf\"/>\n";
  }
  if (c.knee < c.points.size()) {
    const pareto_point& k = c.points[c.knee];
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
