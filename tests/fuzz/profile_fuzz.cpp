// profile_fuzz.cpp: libFuzzer target for the profile parser (planner/model/profile.cpp).
//
// Contract under test: any byte string either parses into a step_profile or is rejected with
// stash::input_error. Any other exception, crash, sanitizer report or hang is a
// bug. A parsed profile must survive a round trip through profile_to_json unchanged (same
// digest), and the canonical evaluator must accept it with keep-all decisions.
//
// Build and bounded run (libFuzzer adds new inputs to the FIRST directory, so a scratch
// directory comes first and the shipped seed corpus stays as it is):
//   CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DSTASH_BUILD_FUZZERS=ON \
//       -DSTASH_BUILD_KERNELS=OFF && cmake --build build-fuzz --target profile_fuzz
//   mkdir -p /tmp/profile_fuzz && build-fuzz/tests/fuzz/profile_fuzz -max_total_time=60 \
//       -max_len=8192 /tmp/profile_fuzz tests/fuzz/corpus
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "core/budget.h"
#include "planner/model/plan.h"
#include "planner/model/profile.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace stash::planner;
  using stash::input_error;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)stash::parse_budget_spec(text);
  } catch (const input_error&) {
  }
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  step_profile p;
  try {
    p = profile_from_json(j);
  } catch (const input_error&) {
    return 0;
  }
  const step_profile q = profile_from_json(profile_to_json(p));
  if (profile_sha256(p) != profile_sha256(q)) std::abort();
  const evaluation ev = evaluate(p, keep_all(p), UINT64_MAX);
  if (!ev.valid) {
    // Keep-all offloads nothing and breaks no rule: it is valid under an unlimited budget.
    std::abort();
  }
  return 0;
}
