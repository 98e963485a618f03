// pareto_svg.h: the Pareto curve of a sweep (planner/solvers/pareto.h) as an SVG plot.
#pragma once

#include <string>

#include "planner/solvers/pareto.h"

namespace stash::planner {

// A complete SVG document: axes with ticks and units, the envelope as a step curve, the
// sample points, the knee, the keep-all and recompute-all reference lines, a title.
std::string pareto_svg(const pareto_curve& c, const std::string& title);

}  // namespace stash::planner
