// layer_terms.h: per-layer quantities shared by the solvers (GLPK-free, header-only).
//
// The canonical step time is separable by layer: layer i contributes
//   fwd_i + bwd_i + R_i + copy_cost_i(O_i),
//   copy_cost_i(O) = max(0, O/d2h - fwd_{i+1}) + max(0, O/h2d - bwd_{i+1})  (0 for the last),
// and layers interact only through the peak rows and the host cap. Every solver relies on
// this: the inner solver optimises one layer's own term exactly, repair prices a change by
// its own layer's delta.
#pragma once

#include <algorithm>
#include <cstdint>

#include "planner/model/plan.h"

namespace stash::planner {

// LP/MIP byte unit. Scaling bytes to MiB keeps coefficients within a few orders of
// magnitude of the milliseconds they trade against; bytes are exact in a double below
// 2^53, so nothing is lost before the division.
inline constexpr double kLpByteUnit = 1048576.0;

// The copy window a layer's offload faces: the next layer's forward and backward.
struct copy_window {
  double fwd_ms = 0, bwd_ms = 0;
  double d2h_bytes_per_ms = 1, h2d_bytes_per_ms = 1;
  bool last = false;  // the last layer offloads nothing (rule), so it has no window

  double cost(double offload_bytes) const {
    if (last || offload_bytes <= 0) return 0;
    return std::max(0.0, offload_bytes / d2h_bytes_per_ms - fwd_ms) +
           std::max(0.0, offload_bytes / h2d_bytes_per_ms - bwd_ms);
  }
};

inline copy_window window_of(const step_profile& p, std::size_t i) {
  copy_window w;
  w.d2h_bytes_per_ms = p.d2h_bytes_per_ms();
  w.h2d_bytes_per_ms = p.h2d_bytes_per_ms();
  if (i + 1 >= p.layers.size()) {
    w.last = true;
  } else {
    w.fwd_ms = p.layers[i + 1].fwd_ms;
    w.bwd_ms = p.layers[i + 1].bwd_ms;
  }
  return w;
}

}  // namespace stash::planner
