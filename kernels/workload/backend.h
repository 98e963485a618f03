// backend.h: the math of stash's built-in training workload, behind one interface with two
// implementations.
//
// Note [The workload's block]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A pre-norm transformer MLP block on T = batch * seq tokens of width H, inner width
// F = ffn_mult * H, float32, row-major [rows, cols]:
//     stats, u = layernorm(x; gamma, beta)      stats[T][2] = {mean, rstd}, u[T][H]
//     h        = u W1 + b1                      W1[H][F], h[T][F]
//     a        = gelu(h)                        tanh approximation, a[T][F]
//     y        = a W2 + b2                      W2[F][H]
//     out      = x + y                          the residual; out is the next block's x
// Saved for backward, in this order (the profile's tensor order, the engine's index):
//     0 "input"    x      [T][H]   not recomputable (the block's input)
//     1 "ln.stats" stats  [T][2]   recompute: layernorm statistics of x
//     2 "ln.out"   u      [T][H]   recompute: layernorm of x (needs stats)
//     3 "fc1.out"  h      [T][F]   recompute: u W1 + b1 (needs u)
//     4 "act.out"  a      [T][F]   recompute: gelu(h) (needs h)
// The loss after the last block is 0.5 * mean((out - target)^2) over T*H elements.
//
// Note [Two backends]
// host_backend: plain C++ loops, the reference. It runs the same element functions
//   (elementwise.h) as the CUDA kernels. In `immediate` mode it computes at the call (the
//   pointers are host memory: gradient checks, the CPU reference of the GPU test). In
//   `stream` mode it enqueues each op with cudaLaunchHostFunc on the given stream, so on
//   stash's CPU test double, whose "device" memory is host memory, the workload runs
//   stream-ordered against the real engine, copies and events.
// cuda_backend: cuBLAS (sgemm, workspace from a caller-owned device block set with
//   cublasSetWorkspace, so measured peaks count it) plus the kernels in workload_kernels.cu.
//   GPU only.
// Every op is deterministic: the same inputs give the same bits on the same backend, which
// is what makes "gradients with offload equal gradients without" a bitwise check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include <cuda_runtime_api.h>

namespace stash::workload {

class backend {
 public:
  virtual ~backend() = default;
  virtual const char* name() const noexcept = 0;

  // All ops enqueue on `s` (or compute now, host_backend immediate mode). Pointers are device
  // memory (host memory for host_backend). Errors: std::runtime_error naming the op.

  // C[m][n] = op(A) op(B) + beta * C, row-major, op = transpose when trans_* is true.
  // A is [m][k] (or [k][m] when trans_a), B is [k][n] (or [n][k] when trans_b). With
  // beta == 0, C is written without being read (it may hold garbage), as in BLAS.
  virtual void gemm(cudaStream_t s, bool trans_a, bool trans_b, int m, int n, int k,
                    const float* A, const float* B, float beta, float* C) = 0;
  // C[r][c] += bias[c].
  virtual void add_bias(cudaStream_t s, int rows, int cols, const float* bias, float* C) = 0;
  // db[c] += sum_r dC[r][c].
  virtual void bias_grad(cudaStream_t s, int rows, int cols, const float* dC, float* db) = 0;
  // stats[r] = {mean, rstd} of x[r][*] (eps 1e-5).
  virtual void layernorm_stats(cudaStream_t s, int rows, int cols, const float* x,
                               float* stats) = 0;
  // u[r][c] = (x[r][c] - mean) * rstd * gamma[c] + beta[c].
  virtual void layernorm_apply(cudaStream_t s, int rows, int cols, const float* x,
                               const float* stats, const float* gamma, const float* beta,
                               float* u) = 0;
  // dx += layernorm backward of du; dgamma, dbeta += their gradients.
  virtual void layernorm_backward(cudaStream_t s, int rows, int cols, const float* du,
                                  const float* x, const float* stats, const float* gamma,
                                  float* dx, float* dgamma, float* dbeta) = 0;
  // a = gelu(h), n elements.
  virtual void gelu(cudaStream_t s, std::size_t n, const float* h, float* a) = 0;
  // dh = da * gelu'(h).
  virtual void gelu_backward(cudaStream_t s, std::size_t n, const float* da, const float* h,
                             float* dh) = 0;
  // out = x + y.
  virtual void add(cudaStream_t s, std::size_t n, const float* x, const float* y,
                   float* out) = 0;
  // loss[0] = 0.5 * mean((out - target)^2); dout = (out - target) / n.
  virtual void mse_loss(cudaStream_t s, std::size_t n, const float* out, const float* target,
                        float* loss, float* dout) = 0;
  // w -= lr * g.
  virtual void sgd(cudaStream_t s, std::size_t n, float lr, const float* g, float* w) = 0;
  // Zeroes `bytes` at p: cudaMemsetAsync on `s` (cuda_backend, host_backend stream mode);
  // host_backend immediate mode, whose pointers are plain host memory, memsets now.
  virtual void zero(cudaStream_t s, void* p, std::size_t bytes) = 0;
};

enum class host_mode { immediate, stream };
std::unique_ptr<backend> make_host_backend(host_mode mode);

// cuBLAS handle bound to `workspace` (workspace_bytes, from stash's device pool). Throws
// std::runtime_error when cuBLAS cannot start. Only in builds with STASH_BUILD_KERNELS.
// The workspace must be 256-byte aligned (cublasSetWorkspace) and hold at least 4 KiB: the
// backend keeps its first 4 KiB for its fixed-order reductions (mse_loss) and gives cuBLAS
// the rest. It stays the caller's until the backend is destroyed. The one workspace serves
// every stream, so ops on different streams must not overlap in time (order the streams with
// events); within a stream, ordering is the stream's. Not thread-safe: one thread at a time.
std::unique_ptr<backend> make_cuda_backend(void* workspace, std::size_t workspace_bytes);
// The workspace size cuda_backend asks for (cuBLAS's recommendation for Hopper: 32 MiB).
inline constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20;

}  // namespace stash::workload
