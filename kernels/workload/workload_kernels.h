// workload_kernels.h (private to kernels/workload): launchers of the CUDA backend's
// non-gemm kernels (workload_kernels.cu). Each enqueues on `s` and returns the launch's
// error (cudaGetLastError), cudaSuccess for empty work. Sizes are validated by the caller
// (cuda_backend.cu).
//
// Note [Deterministic reductions on the GPU]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// No float atomics anywhere: every sum has a fixed shape that depends only on the problem
// size, never on scheduling, so the same inputs give the same bits on every run.
//  - Row reductions (layernorm statistics, layernorm backward's two row means): one block of
//    kRowThreads per row; thread t sums columns t, t + kRowThreads, ... in ascending order,
//    then a fixed shared-memory tree halves the partials.
//  - Column reductions (bias_grad, dgamma/dbeta): one block per kColWidth columns; thread
//    row y sums rows y, y + kColRows, ... in ascending order, then thread row 0 adds the
//    kColRows partials in ascending y. No scratch memory, and each column's sum is one
//    block's, so nothing crosses blocks.
//  - mse_loss: a fixed grid of kMseBlocks blocks (independent of n) writes one partial each
//    to the backend's scratch (kScratchBytes, carved from the caller's workspace); a single
//    block then adds those partials with the same fixed tree. Squares are accumulated in
//    double: the loss is one scalar a user reads, and n may be ~1e8.
// The GPU's orders differ from the host reference's (Note [Host summation order]), so GPU
// and host agree to a few float ulps of the sum, not bitwise.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace stash::workload::kernels {

inline constexpr int kRowThreads = 256;
inline constexpr int kColWidth = 32;
inline constexpr int kColRows = 32;
inline constexpr int kMseBlocks = 256;
inline constexpr int kMseThreads = 256;
// Scratch the backend keeps at the start of its workspace: kMseBlocks doubles, rounded up
// to a page so that the cuBLAS part that follows stays 256-byte aligned (cublasSetWorkspace
// requires it).
inline constexpr std::size_t kScratchBytes = 4096;
static_assert(kMseBlocks * sizeof(double) <= kScratchBytes, "mse partials exceed the scratch");

cudaError_t add_bias(cudaStream_t s, int rows, int cols, const float* bias, float* C);
cudaError_t bias_grad(cudaStream_t s, int rows, int cols, const float* dC, float* db);
cudaError_t layernorm_stats(cudaStream_t s, int rows, int cols, const float* x, float* stats);
cudaError_t layernorm_apply(cudaStream_t s, int rows, int cols, const float* x,
                            const float* stats, const float* gamma, const float* beta, float* u);
cudaError_t layernorm_backward(cudaStream_t s, int rows, int cols, const float* du,
                               const float* x, const float* stats, const float* gamma, float* dx,
                               float* dgamma, float* dbeta);
cudaError_t gelu(cudaStream_t s, std::size_t n, const float* h, float* a);
cudaError_t gelu_backward(cudaStream_t s, std::size_t n, const float* da, const float* h,
                          float* dh);
cudaError_t add(cudaStream_t s, std::size_t n, const float* x, const float* y, float* out);
// `scratch`: kScratchBytes of device memory, 8-byte aligned, owned by the caller and not
// used concurrently by other work.
cudaError_t mse_loss(cudaStream_t s, std::size_t n, const float* out, const float* target,
                     float* loss, float* dout, void* scratch);
cudaError_t sgd(cudaStream_t s, std::size_t n, float lr, const float* g, float* w);

}  // namespace stash::workload::kernels
