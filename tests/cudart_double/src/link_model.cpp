#include "link_model.h"

#include <algorithm>

namespace stash::dbl {

namespace {
// GB/s (1e9 B/s) to bytes per virtual millisecond.
double bytes_per_ms(double gbps) { return gbps * 1e6; }
}  // namespace

Interval LinkModel::schedule(CopyDir dir, double earliest, size_t bytes,
                             const LinkConfig& cfg) {
  const int d = static_cast<int>(dir);
  const double full = bytes_per_ms(dir == CopyDir::kH2D ? cfg.h2d_gbps : cfg.d2h_gbps);
  const double shared = std::min(full, bytes_per_ms(cfg.bidir_gbps / 2.0));
  const double start = std::max(earliest, free_at_[d]);

  // Walk the opposite engine's bookings (sorted, disjoint: that engine is FIFO) and
  // integrate the transfer rate: `full` in the gaps, `shared` inside a booking.
  double remaining = static_cast<double>(bytes);
  double t = start;
  double end = -1.0;
  for (const Interval& iv : busy_[1 - d]) {
    if (iv.end <= t) continue;
    if (iv.start > t) {
      const double cap = (iv.start - t) * full;
      if (remaining <= cap) {
        end = t + remaining / full;
        break;
      }
      remaining -= cap;
      t = iv.start;
    }
    const double cap = (iv.end - t) * shared;
    if (remaining <= cap) {
      end = t + remaining / shared;
      break;
    }
    remaining -= cap;
    t = iv.end;
  }
  if (end < 0.0) end = t + remaining / full;
  if (bytes == 0) end = start;

  free_at_[d] = end;
  busy_[d].push_back({start, end});
  if (busy_[d].size() > kKeepIntervals) busy_[d].pop_front();
  return {start, end};
}

void LinkModel::reset() {
  free_at_[0] = free_at_[1] = 0.0;
  busy_[0].clear();
  busy_[1].clear();
}

}  // namespace stash::dbl
