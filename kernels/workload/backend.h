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
// Both implement the protected do_* hooks (the non-virtual-interface idiom): each public op
// validates its arguments in one place, backend.cpp (sizes, null pointers; the errors name
// the backend and the op), and then calls its do_* hook, which does only what is specific to
// the backend. Backend-specific checks (cuda_backend's workspace, the enqueue and launch
// results) stay in the implementations. Decorators (virtual_cost.cpp, the tests'
// checked_backend.h) override do_* and forward to the wrapped backend's public op.
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
  // memory (host memory for host_backend). Each op checks its arguments first (backend.cpp;
  // Note [Two backends]), then calls its do_* hook. Errors: std::runtime_error naming the op
  // ("stash workload <name()> backend: <op>: <what>" for bad arguments); a failed CUDA call
  // is stash::error (a std::runtime_error) from STASH_CUDA_TRY (allocator/cuda_prim.h),
  // naming the op and the call.

  // C[m][n] = op(A) op(B) + beta * C, row-major, op = transpose when trans_* is true.
  // A is [m][k] (or [k][m] when trans_a), B is [k][n] (or [n][k] when trans_b). With
  // beta == 0, C is written without being read (it may hold garbage), as in BLAS.
  void gemm(cudaStream_t s, bool trans_a, bool trans_b, int m, int n, int k, const float* A,
            const float* B, float beta, float* C);
  // C[r][c] += bias[c].
  void add_bias(cudaStream_t s, int rows, int cols, const float* bias, float* C);
  // db[c] += sum_r dC[r][c].
  void bias_grad(cudaStream_t s, int rows, int cols, const float* dC, float* db);
  // stats[r] = {mean, rstd} of x[r][*] (eps 1e-5).
  void layernorm_stats(cudaStream_t s, int rows, int cols, const float* x, float* stats);
  // u[r][c] = (x[r][c] - mean) * rstd * gamma[c] + beta[c].
  void layernorm_apply(cudaStream_t s, int rows, int cols, const float* x, const float* stats,
                       const float* gamma, const float* beta, float* u);
  // dx += layernorm backward of du; dgamma, dbeta += their gradients.
  void layernorm_backward(cudaStream_t s, int rows, int cols, const float* du, const float* x,
                          const float* stats, const float* gamma, float* dx, float* dgamma,
                          float* dbeta);
  // a = gelu(h), n elements.
  void gelu(cudaStream_t s, std::size_t n, const float* h, float* a);
  // dh = da * gelu'(h).
  void gelu_backward(cudaStream_t s, std::size_t n, const float* da, const float* h, float* dh);
  // out = x + y.
  void add(cudaStream_t s, std::size_t n, const float* x, const float* y, float* out);
  // loss[0] = 0.5 * mean((out - target)^2); dout = (out - target) / n.
  void mse_loss(cudaStream_t s, std::size_t n, const float* out, const float* target,
                float* loss, float* dout);
  // w -= lr * g.
  void sgd(cudaStream_t s, std::size_t n, float lr, const float* g, float* w);
  // Zeroes `bytes` at p: cudaMemsetAsync on `s` (cuda_backend, host_backend stream mode);
  // host_backend immediate mode, whose pointers are plain host memory, memsets now.
  void zero(cudaStream_t s, void* p, std::size_t bytes);

 protected:
  // The ops' implementations, called with arguments the public op has validated; same
  // parameters and meaning as the op of the same name.
  virtual void do_gemm(cudaStream_t s, bool trans_a, bool trans_b, int m, int n, int k,
                       const float* A, const float* B, float beta, float* C) = 0;
  virtual void do_add_bias(cudaStream_t s, int rows, int cols, const float* bias,
                           float* C) = 0;
  virtual void do_bias_grad(cudaStream_t s, int rows, int cols, const float* dC,
                            float* db) = 0;
  virtual void do_layernorm_stats(cudaStream_t s, int rows, int cols, const float* x,
                                  float* stats) = 0;
  virtual void do_layernorm_apply(cudaStream_t s, int rows, int cols, const float* x,
                                  const float* stats, const float* gamma, const float* beta,
                                  float* u) = 0;
  virtual void do_layernorm_backward(cudaStream_t s, int rows, int cols, const float* du,
                                     const float* x, const float* stats, const float* gamma,
                                     float* dx, float* dgamma, float* dbeta) = 0;
  virtual void do_gelu(cudaStream_t s, std::size_t n, const float* h, float* a) = 0;
  virtual void do_gelu_backward(cudaStream_t s, std::size_t n, const float* da,
                                const float* h, float* dh) = 0;
  virtual void do_add(cudaStream_t s, std::size_t n, const float* x, const float* y,
                      float* out) = 0;
  virtual void do_mse_loss(cudaStream_t s, std::size_t n, const float* out,
                           const float* target, float* loss, float* dout) = 0;
  virtual void do_sgd(cudaStream_t s, std::size_t n, float lr, const float* g, float* w) = 0;
  virtual void do_zero(cudaStream_t s, void* p, std::size_t bytes) = 0;
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
