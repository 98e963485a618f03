// inject.cpp: libstash_inject.so, loaded by the CUDA driver through CUDA_INJECTION64_PATH.
//
// `stash profile -- CMD` runs CMD with
//   CUDA_INJECTION64_PATH = this library   (the driver calls InitializeInjection in cuInit)
//   NVTX_INJECTION64_PATH = libcupti       (NVTX then reports every range to CUPTI, whose
//                                           NVTX callback domain this library follows)
//   STASH_PROFILE_RESULT_DIR = a directory for the results
// InitializeInjection starts the CUPTI profiler with follow_nvtx; at exit each process that
// initialized CUDA writes <dir>/measure.<pid>.json (schema stash.measurement/1), attributed
// in the process itself so that only per-scope samples, not raw records, cross over. When
// profiling is unavailable (another CUPTI client, such as nsys) it prints "stash: profiling
// unavailable: <reason>" and writes a measurement saying so; the program runs on untouched.
//
// NVTX ranges opened before the first CUDA call (before cuInit loads this library) are not
// seen; their pops are ignored (scope_tracker.h). Put the first layer scope after the
// model is on the GPU, as a training loop does anyway.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include <nlohmann/json.hpp>

#include "core/json_file.h"
#include "runtime/measure/attribution.h"
#include "runtime/measure/cupti_profiler.h"

namespace {

std::string g_unavailable;  // set once, in InitializeInjection
pid_t g_pid = 0;            // the process that initialized CUDA


void write_result() noexcept {
  using namespace stash::measure;
  // A child forked after CUDA initialized (a DataLoader worker) inherits this handler but
  // not a usable CUPTI; it ran no profiled work of its own, so it writes nothing.
  if (::getpid() != g_pid) return;
  try {
    const char* dir = std::getenv("STASH_PROFILE_RESULT_DIR");
    measurement m;
    if (g_unavailable.empty()) {
      m = attribute(cupti_profiler::process().stop());
    } else {
      m.available = false;
      m.unavailable_reason = g_unavailable;
    }
    if (!dir || !*dir) return;  // loaded by hand, without `stash profile`: nothing to write
    const std::string path = std::string(dir) + "/measure." + std::to_string(::getpid()) + ".json";
    // Whole or not at all: `stash profile` reads every measure.*.json it finds.
    stash::write_text_file(path, measurement_to_json(m).dump() + "\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stash: profiling failed at exit: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "stash: profiling failed at exit\n");
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  using namespace stash::measure;
  static bool initialized = false;  // the driver calls it once per process; be sure
  if (initialized) return 1;
  initialized = true;
  g_pid = ::getpid();
  try {
    profiler_options o;
    o.follow_nvtx = true;
    o.ask_runtime = false;  // we are inside cuInit (Note [Profiling unavailable])
    g_unavailable = cupti_profiler::process().start(o);
  } catch (const std::exception& e) {
    g_unavailable = e.what();
  }
  if (!g_unavailable.empty()) {
    std::fprintf(stderr, "stash: profiling unavailable: %s\n", g_unavailable.c_str());
  }
  // Registered after the CUDA runtime's own exit handler (the runtime initialized before
  // calling cuInit), so it runs first, while contexts still exist to flush.
  std::atexit(write_result);
  return 1;
}
