// cuda_backend.cu: the GPU backend (backend.h, Note [Two backends]): cuBLAS sgemm for the
// products, workload_kernels.cu for the rest.
//
// Note [cuBLAS in the workload]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// - Row-major through a column-major library: a row-major [r][c] array is the column-major
//   [c][r] array of its transpose, so C = op(A) op(B) (row-major) is computed as
//   C^T = op(B)^T op(A)^T (column-major): sgemm(op_b, op_a, n, m, k, B, ldb, A, lda, C, n)
//   with lda = trans_a ? m : k and ldb = trans_b ? k : n, the stored rows' lengths. The
//   mapping is gemm_layout.h's, tested against a column-major reference on any machine.
// - Math: CUBLAS_DEFAULT_MATH, set explicitly. For sgemm that means IEEE fp32 inputs with
//   fp32 accumulation: no TF32 tensor cores (CUBLAS_TF32_TENSOR_OP_MATH) and no BF16x9
//   emulation (CUBLAS_FP32_EMULATED_BF16X9_MATH); both are opt-in and neither is taken, so
//   results are comparable to the host reference at fp32 tolerances.
// - Atomics: CUBLAS_ATOMICS_NOT_ALLOWED (the default, set explicitly), so no routine picks
//   an atomics-based, run-to-run varying implementation.
// - Workspace: the caller's block (from stash's device pool, so measured peaks include it),
//   never cuBLAS's own pool. cublasSetStream unconditionally resets the workspace to cuBLAS's
//   default pool, so every stream switch is followed by cublasSetWorkspace; switches happen
//   only when an op's stream differs from the bound one. With a user workspace, one stream
//   active at a time and atomics off, cuBLAS documents bit-wise reproducible results on GPUs
//   of the same architecture and SM count with the same toolkit.
// - The first kernels::kScratchBytes of the block are this backend's own scratch (the mse
//   partials, Note [Deterministic reductions on the GPU]); cuBLAS gets the rest.
// - One workspace serves every stream, so ops on different streams must not run concurrently
//   (order them with events); the workload runs its math on one compute stream.
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "cuda_prim.h"
#include "kernels/workload/backend.h"
#include "kernels/workload/gemm_layout.h"
#include "kernels/workload/workload_kernels.h"

namespace stash::workload {
namespace {

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw std::runtime_error(std::string("stash workload cuda backend: ") + op + ": " + what);
}

void check_cublas(cublasStatus_t st, const char* op, const char* call) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    fail(op, std::string(call) + ": " + cublasGetStatusName(st) + ": " +
                 cublasGetStatusString(st));
  }
}

class cuda_backend final : public backend {
 public:
  cuda_backend(void* workspace, std::size_t bytes) {
    constexpr const char* op = "make_cuda_backend";
    if (workspace == nullptr) fail(op, "null workspace");
    if (reinterpret_cast<std::uintptr_t>(workspace) % 256 != 0) {
      fail(op, "workspace must be 256-byte aligned (cublasSetWorkspace)");
    }
    if (bytes < kernels::kScratchBytes) {
      fail(op, "workspace of " + std::to_string(bytes) + " bytes is smaller than the " +
                   std::to_string(kernels::kScratchBytes) + " bytes of reduction scratch");
    }
    scratch_ = workspace;
    cublas_ws_ = static_cast<char*>(workspace) + kernels::kScratchBytes;
    cublas_bytes_ = bytes - kernels::kScratchBytes;
    check_cublas(cublasCreate(&handle_), op, "cublasCreate");
    try {
      check_cublas(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), op, "cublasSetMathMode");
      check_cublas(cublasSetAtomicsMode(handle_, CUBLAS_ATOMICS_NOT_ALLOWED), op,
                   "cublasSetAtomicsMode");
      check_cublas(cublasSetPointerMode(handle_, CUBLAS_POINTER_MODE_HOST), op,
                   "cublasSetPointerMode");
      bind(nullptr, op);
    } catch (...) {
      cublasDestroy(handle_);
      throw;
    }
  }

  ~cuda_backend() override {
    // cublasDestroy waits for the handle's work. Its status is ignored: at process exit the
    // runtime may already be unloading, and a destructor has no one to report to.
    (void)cublasDestroy(handle_);
  }

  cuda_backend(const cuda_backend&) = delete;
  cuda_backend& operator=(const cuda_backend&) = delete;

  const char* name() const noexcept override { return "cuda"; }

 private:
  // The arguments are valid here: backend.cpp checked them (Note [Two backends]).
  void do_gemm(cudaStream_t s, bool trans_a, bool trans_b, int m, int n, int k, const float* A,
               const float* B, float beta, float* C) override {
    constexpr const char* op = "gemm";
    if (m == 0 || n == 0) return;
    if (k == 0) {
      empty_product(s, std::size_t(m) * n, beta, C);
      return;
    }
    bind(s, op);
    const float alpha = 1.0f;
    // Note [cuBLAS in the workload]: C^T = op(B)^T op(A)^T, column-major.
    auto op_of = [](bool t) { return t ? CUBLAS_OP_T : CUBLAS_OP_N; };
    const column_major_gemm g = column_major_for(trans_a, trans_b, m, n, k);
    const float* first = g.first_is_b ? B : A;
    const float* second = g.first_is_b ? A : B;
    check_cublas(cublasSgemm(handle_, op_of(g.trans_first), op_of(g.trans_second), g.m, g.n,
                             g.k, &alpha, first, g.ld_first, second, g.ld_second, &beta, C,
                             g.ldc),
                 op, "cublasSgemm");
  }

  void do_add_bias(cudaStream_t s, int rows, int cols, const float* bias, float* C) override {
    STASH_CUDA_TRY(kernels::add_bias(s, rows, cols, bias, C));
  }

  void do_bias_grad(cudaStream_t s, int rows, int cols, const float* dC, float* db) override {
    STASH_CUDA_TRY(kernels::bias_grad(s, rows, cols, dC, db));
  }

  void do_layernorm_stats(cudaStream_t s, int rows, int cols, const float* x,
                          float* stats) override {
    STASH_CUDA_TRY(kernels::layernorm_stats(s, rows, cols, x, stats));
  }

  void do_layernorm_apply(cudaStream_t s, int rows, int cols, const float* x,
                          const float* stats, const float* gamma, const float* beta,
                          float* u) override {
    STASH_CUDA_TRY(kernels::layernorm_apply(s, rows, cols, x, stats, gamma, beta, u));
  }

  void do_layernorm_backward(cudaStream_t s, int rows, int cols, const float* du,
                             const float* x, const float* stats, const float* gamma, float* dx,
                             float* dgamma, float* dbeta) override {
    STASH_CUDA_TRY(
        kernels::layernorm_backward(s, rows, cols, du, x, stats, gamma, dx, dgamma, dbeta));
  }

  void do_gelu(cudaStream_t s, std::size_t n, const float* h, float* a) override {
    STASH_CUDA_TRY(kernels::gelu(s, n, h, a));
  }

  void do_gelu_backward(cudaStream_t s, std::size_t n, const float* da, const float* h,
                        float* dh) override {
    STASH_CUDA_TRY(kernels::gelu_backward(s, n, da, h, dh));
  }

  void do_add(cudaStream_t s, std::size_t n, const float* x, const float* y,
              float* out) override {
    STASH_CUDA_TRY(kernels::add(s, n, x, y, out));
  }

  void do_mse_loss(cudaStream_t s, std::size_t n, const float* out, const float* target,
                   float* loss, float* dout) override {
    STASH_CUDA_TRY(kernels::mse_loss(s, n, out, target, loss, dout, scratch_));
  }

  void do_sgd(cudaStream_t s, std::size_t n, float lr, const float* g, float* w) override {
    STASH_CUDA_TRY(kernels::sgd(s, n, lr, g, w));
  }

  void do_zero(cudaStream_t s, void* p, std::size_t bytes) override {
    if (bytes == 0) return;
    const cudaError_t err = cudaMemsetAsync(p, 0, bytes, s);
    if (err != cudaSuccess)
      prim::throw_cuda_error(err, "zero: cudaMemsetAsync", __FILE__, __LINE__);
  }

  // C = beta C for k == 0, by BLAS semantics (beta == 0 writes zeros without reading C, as
  // the host reference does). Done here rather than trusting sgemm's k == 0 path, which the
  // cuBLAS documentation leaves unspecified.
  void empty_product(cudaStream_t s, std::size_t elems, float beta, float* C) {
    constexpr const char* op = "gemm";
    if (beta == 1.0f) return;
    if (beta == 0.0f) {
      const cudaError_t err = cudaMemsetAsync(C, 0, elems * sizeof(float), s);
      if (err != cudaSuccess)
        prim::throw_cuda_error(err, "gemm: cudaMemsetAsync", __FILE__, __LINE__);
      return;
    }
    bind(s, op);
    constexpr std::size_t kChunk = std::size_t{1} << 30;  // sscal counts in int
    for (std::size_t at = 0; at < elems; at += kChunk) {
      const int count = static_cast<int>(elems - at < kChunk ? elems - at : kChunk);
      check_cublas(cublasSscal(handle_, count, &beta, C + at, 1), op, "cublasSscal");
    }
  }

  // Points cuBLAS at stream `s` with the caller's workspace (Note [cuBLAS in the workload]).
  void bind(cudaStream_t s, const char* op) {
    if (bound_ && s == stream_) return;
    bound_ = false;  // until both calls succeed: a failed rebind is retried by the next op
    check_cublas(cublasSetStream(handle_, s), op, "cublasSetStream");
    check_cublas(cublasSetWorkspace(handle_, cublas_ws_, cublas_bytes_), op,
                 "cublasSetWorkspace");
    stream_ = s;
    bound_ = true;
  }

  cublasHandle_t handle_ = nullptr;
  void* scratch_ = nullptr;
  void* cublas_ws_ = nullptr;
  std::size_t cublas_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  bool bound_ = false;
};

}  // namespace

std::unique_ptr<backend> make_cuda_backend(void* workspace, std::size_t workspace_bytes) {
  return std::make_unique<cuda_backend>(workspace, workspace_bytes);
}

}  // namespace stash::workload
