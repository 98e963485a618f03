// options.h: the preload library's settings, from the environment, read once.
//
//   STASH_DISABLE=1            every hook passes straight through to the real runtime
//   STASH_DEVICE_BUDGET=8GiB   per-device cap on the device pool's reserved bytes
//                              (byte_count.h syntax); unset or 0: no budget
//   STASH_PINNED_CAP=16GiB     cap on the pinned pool; unset: the pool's default
//                              (0.8 x available host memory / LOCAL_WORLD_SIZE)
//   STASH_REPORT=path          JSON report written at exit (report.h); "%p" in the
//                              path becomes the process id
//
// Parsed without allocating (getenv and fixed buffers only), in a constructor before main
// and, should a hook run before that constructor (another library's constructor calling
// cudaMalloc), on first use. A malformed value is named on stderr once and ignored.
#pragma once

#include <cstdint>

namespace stash::preload {

struct options {
  bool disabled = false;
  uint64_t device_budget = 0;  // 0: none
  uint64_t pinned_cap = 0;     // 0: the pool's default
  char report_path[4096] = "";  // "" : no report
};

// Thread-safe; parses on the first call.
const options& opts() noexcept;

}  // namespace stash::preload
