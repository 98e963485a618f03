// vector_clock.h: vector clocks for the happens-before checker.
//
// Agents are the host and every stream (the legacy default stream included). Agent ids
// are dense and never reused, so a clock is a plain vector indexed by agent id; a missing
// component reads as 0. Every agent starts its own component at 1 when it first acts, so
// epoch 0 means "never" and (agent, epoch) pairs with epoch >= 1 name one point in the
// agent's history.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace stash::dbl {

using Agent = uint32_t;
constexpr Agent kHostAgent = 0;

class VectorClock {
 public:
  uint64_t get(Agent a) const { return a < c_.size() ? c_[a] : 0; }

  void set(Agent a, uint64_t v) {
    if (a >= c_.size()) c_.resize(a + 1, 0);
    c_[a] = v;
  }

  // Advances this agent's own component; returns the new epoch.
  uint64_t tick(Agent a) {
    set(a, get(a) + 1);
    return c_[a];
  }

  void join(const VectorClock& o) {
    if (o.c_.size() > c_.size()) c_.resize(o.c_.size(), 0);
    for (size_t i = 0; i < o.c_.size(); ++i) c_[i] = std::max(c_[i], o.c_[i]);
  }

  // True when the point (a, epoch) happens-before (or is) the state this clock describes.
  bool covers(Agent a, uint64_t epoch) const { return get(a) >= epoch; }

 private:
  std::vector<uint64_t> c_;
};

}  // namespace stash::dbl
