// host_backend.cpp: the reference backend (backend.h, Note [Two backends]): the float
// instantiation of the loops in elementwise.h, run now or enqueued on a stream.
//
// Note [Host ops on a stream]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// In stream mode each op becomes one cudaLaunchHostFunc on the caller's stream. Its closure
// (the op's loop with its arguments captured by value) is heap-allocated at enqueue and owned
// by the callback, which deletes it after running it; when the enqueue itself fails, the op
// deletes it and throws. Consequences:
//  - Everything that can fail is checked at enqueue (the arguments, by backend.cpp before it
//    calls do_*; the enqueue call), so errors reach the caller as std::runtime_error naming
//    the op (a failed CUDA call is a stash::error, which is one). The callback cannot fail:
//    the loops neither allocate nor throw, and a host function may not call CUDA anyway.
//  - The pointers are dereferenced by the host when the stream reaches the op, so they must
//    be host-accessible then: on stash's CPU test double, "device" memory is host memory. On a
//    real GPU this mode needs managed or mapped memory; cudaMalloc'd pointers would fault.
//  - Under stream capture (CUDA graphs) the op becomes a host node that runs at every replay,
//    so its closure cannot delete itself: the backend keeps it, run by a callback that does
//    not delete, for the backend's life. The backend must outlive every graph captured
//    through it (the built-in workload's model owns its backend and outlives its steps).
//  - Ops are ordered with copies, events and kernels on the same stream like any device work.
//    The double's happens-before checker does not see their reads and writes (a host function
//    declares none); ordering them correctly is still the caller's job.
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda_prim.h"
#include "kernels/workload/backend.h"
#include "kernels/workload/elementwise.h"

namespace stash::workload {
namespace {

struct host_job {
  const char* op;
  std::function<void()> run;

  static void CUDART_CB invoke(void* p) noexcept {
    std::unique_ptr<host_job> job(static_cast<host_job*>(p));
    job->run();
  }
  static void CUDART_CB invoke_kept(void* p) noexcept { static_cast<host_job*>(p)->run(); }
};

class host_backend final : public backend {
 public:
  explicit host_backend(host_mode mode) : mode_(mode) {}

  const char* name() const noexcept override {
    return mode_ == host_mode::immediate ? "host (immediate)" : "host (stream)";
  }

 private:
  // The arguments are valid here: backend.cpp checked them (Note [Two backends]).
  void do_gemm(cudaStream_t s, bool trans_a, bool trans_b, int m, int n, int k, const float* A,
               const float* B, float beta, float* C) override {
    submit("gemm", s, [=] { ref::gemm<float>(trans_a, trans_b, m, n, k, A, B, beta, C); });
  }

  void do_add_bias(cudaStream_t s, int rows, int cols, const float* bias, float* C) override {
    submit("add_bias", s, [=] { ref::add_bias<float>(rows, cols, bias, C); });
  }

  void do_bias_grad(cudaStream_t s, int rows, int cols, const float* dC, float* db) override {
    submit("bias_grad", s, [=] { ref::bias_grad<float>(rows, cols, dC, db); });
  }

  void do_layernorm_stats(cudaStream_t s, int rows, int cols, const float* x,
                          float* stats) override {
    submit("layernorm_stats", s, [=] { ref::layernorm_stats<float>(rows, cols, x, stats); });
  }

  void do_layernorm_apply(cudaStream_t s, int rows, int cols, const float* x,
                          const float* stats, const float* gamma, const float* beta,
                          float* u) override {
    submit("layernorm_apply", s,
           [=] { ref::layernorm_apply<float>(rows, cols, x, stats, gamma, beta, u); });
  }

  void do_layernorm_backward(cudaStream_t s, int rows, int cols, const float* du,
                             const float* x, const float* stats, const float* gamma, float* dx,
                             float* dgamma, float* dbeta) override {
    submit("layernorm_backward", s, [=] {
      ref::layernorm_backward<float>(rows, cols, du, x, stats, gamma, dx, dgamma, dbeta);
    });
  }

  void do_gelu(cudaStream_t s, std::size_t n, const float* h, float* a) override {
    submit("gelu", s, [=] { ref::gelu<float>(n, h, a); });
  }

  void do_gelu_backward(cudaStream_t s, std::size_t n, const float* da, const float* h,
                        float* dh) override {
    submit("gelu_backward", s, [=] { ref::gelu_backward<float>(n, da, h, dh); });
  }

  void do_add(cudaStream_t s, std::size_t n, const float* x, const float* y,
              float* out) override {
    submit("add", s, [=] { ref::add<float>(n, x, y, out); });
  }

  void do_mse_loss(cudaStream_t s, std::size_t n, const float* out, const float* target,
                   float* loss, float* dout) override {
    submit("mse_loss", s, [=] { ref::mse_loss<float>(n, out, target, loss, dout); });
  }

  void do_sgd(cudaStream_t s, std::size_t n, float lr, const float* g, float* w) override {
    submit("sgd", s, [=] { ref::sgd<float>(n, lr, g, w); });
  }

  void do_zero(cudaStream_t s, void* p, std::size_t bytes) override {
    if (bytes == 0) return;
    if (mode_ == host_mode::immediate) {
      std::memset(p, 0, bytes);
      return;
    }
    // The failure is consumed here (throw_cuda_error clears it), so that it is not blamed
    // on a later launch.
    const cudaError_t err = cudaMemsetAsync(p, 0, bytes, s);
    if (err != cudaSuccess)
      prim::throw_cuda_error(err, "zero: cudaMemsetAsync", __FILE__, __LINE__);
  }

  // Note [Host ops on a stream].
  template <class F>
  void submit(const char* op, cudaStream_t s, F&& f) {
    if (mode_ == host_mode::immediate) {
      f();
      return;
    }
    auto job = std::make_unique<host_job>(host_job{op, std::function<void()>(std::forward<F>(f))});
    bool capturing = false;
    // A failed query (a bad stream) fails the launch below with its own error.
    if (prim::stream_capturing(s, &capturing) != cudaSuccess) prim::clear_runtime_error();
    if (capturing) {  // a host node, run at every replay: the backend keeps the closure
      const cudaError_t err = cudaLaunchHostFunc(s, &host_job::invoke_kept, job.get());
      if (err != cudaSuccess) {
        char call[96];
        std::snprintf(call, sizeof call, "%s: cudaLaunchHostFunc (capturing)", op);
        prim::throw_cuda_error(err, call, __FILE__, __LINE__);
      }
      kept_.push_back(std::move(job));
      return;
    }
    const cudaError_t err = cudaLaunchHostFunc(s, &host_job::invoke, job.get());
    if (err != cudaSuccess) {
      char call[96];
      std::snprintf(call, sizeof call, "%s: cudaLaunchHostFunc", op);
      prim::throw_cuda_error(err, call, __FILE__, __LINE__);
    }
    job.release();  // owned by the callback from here on
  }

  host_mode mode_;
  std::vector<std::unique_ptr<host_job>> kept_;  // captured into graphs
};

}  // namespace

std::unique_ptr<backend> make_host_backend(host_mode mode) {
  if (mode != host_mode::immediate && mode != host_mode::stream) {
    throw std::runtime_error("stash workload: make_host_backend: unknown host_mode");
  }
  return std::make_unique<host_backend>(mode);
}

}  // namespace stash::workload
