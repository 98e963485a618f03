// virtual_cost.h: gives the host backend's ops a duration on the virtual clock of stash's
// CPU test double, so that a run there has a timeline shaped like a GPU's.
//
// Note [Virtual cost of host ops]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// On the double, a cudaLaunchHostFunc takes no virtual time, so the host backend's step
// would be all copies: every plan would look copy-bound and the profile's times would be 0.
// Before each op this decorator enqueues, on the op's stream, the double's enqueue-compute
// call (Note [The test double seam] in test_double.h) of
//     ms = flops / (tflops * 1e9)   for GEMMs (2 m n k flops),
//     ms = bytes / (gbps * 1e6)     for the memory-bound ops (bytes read + written),
// which the double's clock charges like a kernel. The figures are nominal (defaults: 20
// TFLOP/s, 2,000 GB/s, an fp32 GPU of the H100 class), not a prediction of any GPU: the point
// is that the engine's overlap, the profile, the plan and the simulator then face the same
// compute-versus-copy trade-off they face on a device, and their figures can be compared.
// The call is found through the seam (the double exports it; a real runtime does not).
#pragma once

#include <memory>

#include "kernels/workload/backend.h"

namespace stash::workload {

struct virtual_rates {
  double gemm_tflops = 20.0;
  double memory_gbps = 2000.0;
};

// Throws stash::error (invalid_argument) when stash's CPU test double is not the loaded
// runtime.
std::unique_ptr<backend> with_virtual_cost(std::unique_ptr<backend> inner,
                                           const virtual_rates& rates = {});

}  // namespace stash::workload
