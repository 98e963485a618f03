// link_bench.h: `stash bench link`, the host<->device link as stash's offloads use it.
//
// Pinned host buffers (from stash's pinned pool, so on the GPU's NUMA node) and device
// buffers; cudaMemcpyAsync on non-blocking streams, timed with CUDA events; warm-ups, then
// the median of `samples` runs. GB/s = 1e9 B/s. Measured: pinned H2D, pinned D2H, both at
// once (each direction and the aggregate), and pageable H2D/D2H for contrast.
//
// Note [Link buffer size]
// 512 MiB by default: long enough that launch and event overheads vanish (~10 ms at 55
// GB/s) and larger than any cache on the path. Two device buffers are needed (one per
// direction, for the both-at-once run), so the buffer is shrunk to fit:
//     buffer = min(requested, (free - free/8) / 2), rounded down to a MiB
// where free is cudaMemGetInfo's free memory; the 1/8 is left for the CUDA context's own
// growth and for other processes. Below 64 MiB the run is refused: fixed per-copy costs
// would then show up in the figure and make it an underestimate.
//
// Note [Per-rank link share]
// The planner's h2d_gbps and d2h_gbps are per rank. When k local ranks share one link
// (k = --sharers, default LOCAL_WORLD_SIZE, 1 when unset), they offload at the same moments
// (data-parallel ranks run the same schedule), so each gets a share of what the link
// carries with k copies in flight, not what one copy alone gets. The rule, measured rather
// than assumed: run k copies of buffer/k bytes at once on k streams (per direction, and k
// of each direction for both at once), and take
//     per_rank = aggregate_k / k.
// On a PCIe link the copy engines of one direction serialize, so aggregate_k ≈ the single
// figure and per_rank ≈ single / k; a link with more headroom than one copy uses (NVLink-C2C,
// several copy engines) gives more. k = 1 reports the single-copy figures. Use --sharers 1
// when every rank has a link of its own (one GPU per rank, each on its own x16 port).
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "planner/model/profile.h"
#include "core/stats.h"

namespace stash::measure {

// A CUDA failure while measuring: stash::error with status::cuda_error, from the one check
// macro family (STASH_CUDA_TRY, allocator/cuda_prim.h). measure_error names that type here.
using measure_error = stash::error;

inline constexpr size_t kMiB = size_t{1} << 20;
inline constexpr size_t kDefaultLinkBytes = 512 * kMiB;
inline constexpr size_t kMinLinkBytes = 64 * kMiB;

struct link_bench_options {
  int device = 0;
  size_t bytes = kDefaultLinkBytes;
  int samples = 7;
  int warmups = 2;
  int sharers = 0;  // 0: LOCAL_WORLD_SIZE (1 when unset)
  bool pageable = true;
};

// Note [Link buffer size]. 0 when the result would be below kMinLinkBytes.
size_t link_buffer_bytes(size_t requested, size_t free_bytes);

struct link_bench_result {
  std::string device_name;
  int device = 0;
  int numa_node = -1;
  size_t requested_bytes = 0, buffer_bytes = 0, free_bytes = 0;
  int samples = 0, warmups = 0;
  stash::rate_summary h2d, d2h;                      // pinned, one copy at a time
  stash::rate_summary both_h2d, both_d2h, both_sum;  // pinned, one copy per direction at once
  bool pageable = false;
  stash::rate_summary pageable_h2d, pageable_d2h;
  int sharers = 1;                                     // Note [Per-rank link share]
  // The aggregates with `sharers` copies in flight.
  stash::rate_summary shared_h2d, shared_d2h, shared_both;
  int local_ranks = 1;                                 // LOCAL_WORLD_SIZE

  // The profile's link section (per rank).
  planner::link_profile link() const;
};

// Throws measure_error (CUDA failures, named by file:line, status::cuda_error) or
// stash::input_error (a buffer refused by Note [Link buffer size], bad options); both
// are stash::error.
link_bench_result run_link_bench(const link_bench_options& options);

std::string format_link_table(const link_bench_result& r);
// {"link": {...per rank...}, "link_bench": {...every figure...}}: a file that
// `stash profile --link` and profile merging read like a profile's link section.
nlohmann::json link_bench_to_json(const link_bench_result& r);

}  // namespace stash::measure
