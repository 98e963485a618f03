// fill_checksum.h: device kernels that fill a buffer with a seeded pattern and fold a
// buffer into an order-independent 64-bit checksum (pattern.h). Offload round-trip tests
// on a GPU use them to prove that bytes come back from host memory intact without copying
// whole tensors back to the host.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace stash::kernels {

// Enqueues a fill of `bytes` at `dst` on `stream`. Equivalent to fill_pattern_host.
cudaError_t fill_pattern(void* dst, std::size_t bytes, std::uint64_t seed, cudaStream_t stream);

// Enqueues the checksum of `bytes` at `src`; the result is written to the device word
// `*d_result` (overwritten, not accumulated) in stream order. Equal to checksum_host.
cudaError_t checksum(const void* src, std::size_t bytes, std::uint64_t* d_result,
                     cudaStream_t stream);

}  // namespace stash::kernels
