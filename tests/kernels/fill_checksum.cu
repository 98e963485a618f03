#include "fill_checksum.h"
#include "pattern.h"

namespace stash::kernels {
namespace {

constexpr int kThreads = 256;

int grid_for(std::size_t words) {
  // Grid-stride loops: cap the grid, it only needs to fill the machine.
  const std::size_t blocks = (words + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 4096 ? (blocks ? blocks : 1) : 4096);
}

__global__ void fill_kernel(unsigned char* dst, std::size_t bytes, std::uint64_t seed) {
  const std::size_t words = bytes / 8;
  auto* out = reinterpret_cast<std::uint64_t*>(dst);  // dst is 8-byte aligned (checked)
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < words;
       i += std::size_t(gridDim.x) * blockDim.x) {
    out[i] = pattern_word(seed, i);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const std::uint64_t w = pattern_word(seed, words);
    for (std::size_t b = 0; b < bytes % 8; ++b)
      dst[8 * words + b] = static_cast<unsigned char>(w >> (8 * b));
  }
}

__global__ void checksum_kernel(const unsigned char* src, std::size_t bytes,
                                unsigned long long* result) {
  const std::size_t words = bytes / 8;
  const auto* in = reinterpret_cast<const std::uint64_t*>(src);
  std::uint64_t local = 0;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < words;
       i += std::size_t(gridDim.x) * blockDim.x) {
    local += checksum_term(in[i], i);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0 && bytes % 8) {
    std::uint64_t w = 0;
    for (std::size_t b = 0; b < bytes % 8; ++b)
      w |= std::uint64_t(src[8 * words + b]) << (8 * b);
    local += checksum_term(w, words);
  }
  // Warp reduction, then one atomic per warp; addition mod 2^64 is order-independent.
  for (int off = 16; off > 0; off >>= 1) local += __shfl_down_sync(0xffffffffu, local, off);
  if ((threadIdx.x & 31) == 0) atomicAdd(result, static_cast<unsigned long long>(local));
}

}  // namespace

cudaError_t fill_pattern(void* dst, std::size_t bytes, std::uint64_t seed, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || reinterpret_cast<std::uintptr_t>(dst) % 8) return cudaErrorInvalidValue;
  fill_kernel<<<grid_for(bytes / 8), kThreads, 0, stream>>>(static_cast<unsigned char*>(dst),
                                                             bytes, seed);
  return cudaGetLastError();
}

cudaError_t checksum(const void* src, std::size_t bytes, std::uint64_t* d_result,
                     cudaStream_t stream) {
  if (d_result == nullptr || (bytes && (src == nullptr || reinterpret_cast<std::uintptr_t>(src) % 8)))
    return cudaErrorInvalidValue;
  if (cudaError_t e = cudaMemsetAsync(d_result, 0, sizeof(*d_result), stream); e != cudaSuccess)
    return e;
  if (bytes == 0) return cudaSuccess;
  checksum_kernel<<<grid_for(bytes / 8), kThreads, 0, stream>>>(
      static_cast<const unsigned char*>(src), bytes,
      reinterpret_cast<unsigned long long*>(d_result));
  return cudaGetLastError();
}

}  // namespace stash::kernels
