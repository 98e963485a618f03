#include "double_api.h"

#include <dlfcn.h>

namespace stash::test {

namespace {
template <class F>
void resolve(F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}
}  // namespace

const DoubleApi& double_api() {
  static const DoubleApi api = [] {
    DoubleApi a;
    resolve(a.probe, "stashdbl_probe");
    if (!a.probe) return a;
    resolve(a.reset, "stashdbl_reset");
    resolve(a.set_device_memory, "stashdbl_set_device_memory");
    resolve(a.set_bandwidth, "stashdbl_set_bandwidth");
    resolve(a.host_now_ms, "stashdbl_host_now_ms");
    resolve(a.host_advance_ms, "stashdbl_host_advance_ms");
    resolve(a.enqueue_compute, "stashdbl_enqueue_compute");
    resolve(a.stream_pause, "stashdbl_stream_pause");
    resolve(a.stream_resume, "stashdbl_stream_resume");
    resolve(a.inject_fault, "stashdbl_inject_fault");
    resolve(a.clear_faults, "stashdbl_clear_faults");
    resolve(a.host_access, "stashdbl_host_access");
    resolve(a.violation_count, "stashdbl_violation_count");
    resolve(a.violation_text, "stashdbl_violation_text");
    resolve(a.clear_violations, "stashdbl_clear_violations");
    return a;
  }();
  return api;
}

std::vector<std::string> DoubleApi::violations() const {
  std::vector<std::string> out;
  if (!available()) return out;
  const size_t n = violation_count();
  for (size_t i = 0; i < n; ++i) {
    std::string s(violation_text(i, nullptr, 0) + 1, '\0');
    violation_text(i, s.data(), s.size());
    s.resize(s.size() - 1);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace stash::test
