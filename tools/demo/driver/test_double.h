// test_double.h: the one place outside tests/ that knows stash's CPU test double of
// libcudart.so.13 (tests/cudart_double/; its own API is tests/cudart_double/include/).
//
// Note [The test double seam]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The double is a test fixture: nothing in the product links it, and the product runs the
// same binaries against it as against the real runtime (LD_LIBRARY_PATH chooses). Two
// features of `stash demo` still depend on which runtime is loaded:
//  - `--backend host` runs the workload's host backend stream-ordered, which dereferences
//    "device" pointers on the host. Only the double, whose device memory is host memory,
//    can run it; on any other runtime it must refuse, and `--backend auto` must not take
//    the double for a GPU.
//  - On the double the host backend's ops get a duration on its virtual clock (Note
//    [Virtual cost of host ops] in virtual_cost.h), through the double's enqueue-compute
//    call.
// Both are answered here and nowhere else: the double's exported functions are looked up
// by name in the running process (a real runtime does not export them, so the answers are
// "no" and nullptr there). The signature is restated below rather than included, because
// tools/ may not depend on tests/; tests/demo/driver_test.cpp static_asserts that
// it is the double's own. Python reaches the double through its own seam, the STASH_CUDART
// environment variable (bindings/python/stash).
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace stash::workload::test_double {

// True when the loaded CUDA runtime is stash's test double.
bool loaded() noexcept;

// The double's "enqueue compute" call: on `stream`, work that takes `ms` of virtual time,
// named `name`, reading and writing the given ranges (which its race checker tracks).
using enqueue_compute_fn = cudaError_t (*)(cudaStream_t stream, double ms, const char* name,
                                           const void* const* reads, const std::size_t* read_sizes,
                                           std::size_t n_reads, const void* const* writes,
                                           const std::size_t* write_sizes, std::size_t n_writes);
// nullptr when the loaded runtime is not the double.
enqueue_compute_fn enqueue_compute() noexcept;

}  // namespace stash::workload::test_double
