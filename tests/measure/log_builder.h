// log_builder.h: builds synthetic activity logs the way CUPTI and the NVTX callbacks
// would produce them, for attribution tests.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "runtime/measure/records.h"
#include "runtime/measure/scope_tracker.h"

namespace stash::measure::test {

constexpr std::uint64_t ms(double v) { return static_cast<std::uint64_t>(v * 1e6); }

class log_builder {
 public:
  void push(std::uint64_t thread, const std::string& name, double at_ms, std::uint64_t domain = 0) {
    apply(thread, tracker_.push(thread, domain, name, ms(at_ms)));
  }
  void pop(std::uint64_t thread, double at_ms, std::uint64_t domain = 0) {
    apply(thread, tracker_.pop(thread, domain, ms(at_ms)));
  }

  // A launch call on `thread` at `at_ms` whose kernel runs [start_ms, end_ms). The
  // external correlation record carries the thread's current id, as CUPTI would; either
  // record can be left out to model a dropped record.
  std::uint32_t launch(std::uint64_t thread, double at_ms, double start_ms, double end_ms,
                       bool external = true, bool api = true, std::uint32_t stream = 7) {
    const std::uint32_t corr = next_corr_++;
    if (api) log_.api_calls.push_back({ms(at_ms), ms(at_ms) + 1000, corr, thread});
    if (external && current_[thread] != 0) log_.external.push_back({current_[thread], corr});
    log_.kernels.push_back({ms(start_ms), ms(end_ms), corr, stream});
    return corr;
  }

  activity_log& log() { return log_; }
  activity_log finish() {
    log_.scopes = tracker_.scopes();
    return log_;
  }

 private:
  void apply(std::uint64_t thread, const scope_tracker::change& c) { current_[thread] = c.after; }

  scope_tracker tracker_;
  activity_log log_;
  std::map<std::uint64_t, std::uint64_t> current_;
  std::uint32_t next_corr_ = 1;
};

}  // namespace stash::measure::test
