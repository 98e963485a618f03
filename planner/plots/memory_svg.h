// memory_svg.h: device memory over one step as an SVG plot: step curves (a counter holds its
// value until its next sample), e.g. the simulator's predicted "device bytes" beside the
// engine's measured one (Note [Measured device bytes] in runtime/engine/engine_trace.h),
// with the budget as a reference line. `stash demo` writes one per measured plan.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "planner/simulator/simulator.h"
#include "planner/model/trace.h"

namespace stash::planner {

struct memory_series {
  std::string name;   // legend text
  std::string color;  // SVG colour
  std::vector<std::pair<double, double>> samples;  // (ms from the window's start, bytes)
};

// The samples of counter `name` in [from_ms, to_ms], in time order, shifted so that from_ms
// is 0; the value in effect at from_ms (the last sample before it) opens the series, and the
// last value is held to to_ms.
std::vector<std::pair<double, double>> counter_window(const trace_writer& t,
                                                      const std::string& name, double from_ms,
                                                      double to_ms);

// A replay's predicted "device bytes" over its one step (the simulator's trace from 0 to
// step_ms).
std::vector<std::pair<double, double>> step_memory(const sim_result& r);

// counter_window over a measured trace's last pass: from the start of its last forward span
// of layer 0 (any micro-batch) to the end of its last span. Empty without such a span.
std::vector<std::pair<double, double>> last_pass(const trace_writer& t, const std::string& name);

// The plot; budget_bytes 0 draws no budget line. Bytes are shown in MiB below 2 GiB, else
// GiB. Series with no samples are left out of the plot but named in the legend as missing.
std::string memory_svg(const std::vector<memory_series>& series, std::uint64_t budget_bytes,
                       const std::string& title, const std::string& subtitle);

}  // namespace stash::planner
