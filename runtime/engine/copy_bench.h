// copy_bench.h: `stash bench copy`, the engine's copy bandwidth next to plain
// cudaMemcpyAsync on the same size mix, in the same run.
//
// Note [What the copy benchmark compares]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The question is what the engine's machinery costs the link: a producer event per
// tensor, a cross-stream wait before each copy, pinned blocks from the pool, per-tensor
// completion events, device blocks from the pool for prefetches. So both sides move the
// same tensors (the size mix, in order) between the same kinds of memory:
//   plain   one non-blocking stream per direction; every tensor's device and pinned
//           buffers allocated up front (cudaMalloc / cudaHostAlloc); the D2H copies of the
//           whole mix back to back, then the H2D copies; each direction timed from an
//           event recorded before its first copy to one after its last.
//   engine  one layer per tensor, every tensor OFFLOAD; forward_begin/offload/forward_end
//           per layer, then backward_begin/acquire/release per layer in reverse (lookahead
//           1, as in training), on the engine's own streams with stash's device pool. D2H
//           is timed from an event on the compute stream before the first offload to one
//           on the engine's D2H stream after the last; H2D from an event on the compute
//           stream before the first backward_begin to one on the H2D stream after the last
//           prefetch was issued.
// GB/s = bytes / time (1e9 B/s); warm-ups, then the median of `samples` rounds; ratio =
// engine / plain per direction (the target is >= 0.95). The engine's pools are warm after
// the first round (as in training, where they are reused every step), so the figure is
// the steady state, not first-touch pinning.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/stats.h"

namespace stash::engine {

struct copy_bench_options {
  std::vector<std::size_t> sizes;  // the size mix, in order; empty: default_copy_mix()
  int samples = 5;
  int warmups = 1;
};

// 1, 4, 16, 64 and 256 MiB, twice: 682 MiB per direction, the span of saved-activation
// sizes in the shipped profiles.
std::vector<std::size_t> default_copy_mix();

struct copy_bench_result {
  std::size_t tensors = 0, bytes = 0;  // one direction
  int samples = 0, warmups = 0;
  stash::rate_summary plain_d2h, plain_h2d, engine_d2h, engine_h2d;
  double ratio_d2h = 0, ratio_h2d = 0;  // engine / plain, medians
};

// Throws stash::error (CUDA failures named by file:line, an empty or zero size).
copy_bench_result run_copy_bench(const copy_bench_options& options);

std::string format_copy_table(const copy_bench_result& r);
nlohmann::json copy_bench_to_json(const copy_bench_result& r);

}  // namespace stash::engine
