// double_api.h: run-time access to the test double's own API (stashdbl.h).
//
// Test binaries link the real cudart; on a CPU machine the double is put in its place by
// LD_LIBRARY_PATH. The double-only functions are therefore looked up with dlsym. When the
// process runs on a real runtime every pointer is null and on_double() is false.
#pragma once

#include <string>
#include <vector>

// Relative, so that every target that includes this header finds the contract without
// an extra include directory.
#include "../cudart_double/include/stashdbl.h"

namespace stash::test {

struct DoubleApi {
  decltype(&stashdbl_probe) probe = nullptr;
  decltype(&stashdbl_reset) reset = nullptr;
  decltype(&stashdbl_set_device_memory) set_device_memory = nullptr;
  decltype(&stashdbl_set_bandwidth) set_bandwidth = nullptr;
  decltype(&stashdbl_host_now_ms) host_now_ms = nullptr;
  decltype(&stashdbl_host_advance_ms) host_advance_ms = nullptr;
  decltype(&stashdbl_enqueue_compute) enqueue_compute = nullptr;
  decltype(&stashdbl_stream_pause) stream_pause = nullptr;
  decltype(&stashdbl_stream_resume) stream_resume = nullptr;
  decltype(&stashdbl_inject_fault) inject_fault = nullptr;
  decltype(&stashdbl_clear_faults) clear_faults = nullptr;
  decltype(&stashdbl_host_access) host_access = nullptr;
  decltype(&stashdbl_violation_count) violation_count = nullptr;
  decltype(&stashdbl_violation_text) violation_text = nullptr;
  decltype(&stashdbl_clear_violations) clear_violations = nullptr;

  bool available() const { return probe != nullptr; }
  // All violation texts recorded so far (empty on a real runtime).
  std::vector<std::string> violations() const;
};

// The process-wide table, resolved once.
const DoubleApi& double_api();
inline bool on_double() { return double_api().available(); }

}  // namespace stash::test

// Skips the current test unless it runs on the double.
#define STASH_REQUIRE_DOUBLE()                                              \
  do {                                                                      \
    if (!::stash::test::on_double()) GTEST_SKIP() << "needs the test double"; \
  } while (0)
