#include "checker.h"

#include <algorithm>
#include <cstdio>

namespace stash::dbl {

std::string describe_site(const AccessSite& site) {
  if (site.on_host()) return std::string(site.api) + " on the host";
  if (site.stream_id == 1) return std::string(site.api) + " on the legacy default stream";
  return std::string(site.api) + " on stream #" + std::to_string(site.stream_id);
}

void Checker::access(const void* ptr, size_t bytes, bool is_write, Agent agent,
                     const VectorClock& clock, const AccessSite& site) {
  if (bytes == 0 || ptr == nullptr) return;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(ptr);
  const Entry now{lo, lo + bytes, is_write, agent, clock.get(agent), site};
  size_t keep = 0;
  for (size_t i = 0; i < history_.size(); ++i) {
    Entry& e = history_[i];
    const bool overlap = e.lo < now.hi && now.lo < e.hi;
    if (overlap && (e.is_write || is_write) && !clock.covers(e.agent, e.epoch) &&
        !(e.site.on_host() && site.on_host())) {
      report(e, now);
    }
    // Subsumed: same agent, fully covered, no stronger than the new access.
    const bool subsumed = e.agent == agent && now.lo <= e.lo && e.hi <= now.hi &&
                          (is_write || !e.is_write);
    if (!subsumed) {
      if (keep != i) history_[keep] = e;
      ++keep;
    }
  }
  history_.resize(keep);
  history_.push_back(now);
}

void Checker::forget(const void* ptr, size_t bytes) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(ptr);
  const uintptr_t hi = lo + bytes;
  history_.erase(std::remove_if(history_.begin(), history_.end(),
                                [&](const Entry& e) { return e.lo < hi && lo < e.hi; }),
                 history_.end());
}

void Checker::prune(const VectorClock& host_clock) {
  history_.erase(std::remove_if(history_.begin(), history_.end(),
                                [&](const Entry& e) { return host_clock.covers(e.agent, e.epoch); }),
                 history_.end());
  prune_at_ = std::max(kMinPrune, 2 * history_.size());
}

const char* Checker::intern(const std::string& name) {
  return names_.insert(name).first->c_str();
}

void Checker::report(const Entry& earlier, const Entry& later) {
  if (violations_.size() >= kMaxViolations) return;
  const uintptr_t lo = std::max(earlier.lo, later.lo);
  const uintptr_t hi = std::min(earlier.hi, later.hi);
  char range[96];
  std::snprintf(range, sizeof range, "[%#zx, %#zx) (%zu bytes)", static_cast<size_t>(lo),
                static_cast<size_t>(hi), static_cast<size_t>(hi - lo));
  violations_.push_back(std::string("race on ") + range + ": " +
                        (later.is_write ? "write" : "read") + " by " +
                        describe_site(later.site) + " is not ordered after " +
                        (earlier.is_write ? "write" : "read") + " by " +
                        describe_site(earlier.site));
}

}  // namespace stash::dbl
