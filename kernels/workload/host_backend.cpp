// host_backend.cpp: the reference backend (backend.h, Note [Two backends]): the float
// instantiation of the loops in elementwise.h, run now or enqueued on a stream.
//
// Note [Host ops on a stream]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// In stream mode each op becomes one cudaLaunchHostFunc on the caller's stream. Its closure
// (the op's loop with its arguments captured by value) is heap-allocated at enqueue and owned
// by the callback, which deletes it after running it; when the enqueue itself fails, the op
// deletes it and throws. Consequences:
//  - Everything that can fail is checked at enqueue (arguments, the enqueue call), so errors
//    reach the caller as std::runtime_error naming the op. The callback itself cannot fail:
//    the loops neither allocate nor throw, and a host function may not call CUDA anyway.
//  - The pointers are dereferenced by the host when the stream reaches the op, so they must
//    be host-accessible then: on stash's CPU test double, "device" memory is host memory. On a
//    real GPU this mode needs managed or mapped memory; cudaMalloc'd pointers would fault.
//  - Ops are ordered with copies, events and kernels on the same stream like any device work.
//    The double's happens-before checker does not see their reads and writes (a host function
//    declares none); ordering them correctly is still the caller's job.
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>

#include "kernels/workload/backend.h"
#include "kernels/workload/elementwise.h"

namespace stash::workload {
namespace {

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw std::runtime_error(std::string("stash workload host backend: ") + op + ": " + what);
}

void require(bool ok, const char* op, const char* what) {
  if (!ok) fail(op, what);
}

// Arguments every op validates before it runs or is enqueued.
void check_dims(const char* op, long long a, long long b) {
  if (a < 0 || b < 0) fail(op, "negative size");
}
void check_ptr(const char* op, std::size_t elems, const void* p, const char* name) {
  if (elems != 0 && p == nullptr) fail(op, std::string("null pointer for ") + name);
}

struct host_job {
  const char* op;
  std::function<void()> run;

  static void CUDART_CB invoke(void* p) noexcept {
    std::unique_ptr<host_job> job(static_cast<host_job*>(p));
    job->run();
  }
};

class host_backend final : public backend {
 public:
  explicit host_backend(host_mode mode) : mode_(mode) {}

  const char* name() const noexcept override {
    return mode_ == host_mode::immediate ? "host (immediate)" : "host (stream)";
  }

  void gemm(cudaStream_t s, bool trans_a, bool trans_b, int m, int n, int k, const float* A,
            const float* B, float beta, float* C) override {
    constexpr const char* op = "gemm";
    if (m < 0 || n < 0 || k < 0) fail(op, "negative size");
    const std::size_t mk = std::size_t(m) * k, kn = std::size_t(k) * n, mn = std::size_t(m) * n;
    check_ptr(op, mk, A, "A");
    check_ptr(op, kn, B, "B");
    check_ptr(op, mn, C, "C");
    submit(op, s, [=] { ref::gemm<float>(trans_a, trans_b, m, n, k, A, B, beta, C); });
  }

  void add_bias(cudaStream_t s, int rows, int cols, const float* bias, float* C) override {
    constexpr const char* op = "add_bias";
    check_dims(op, rows, cols);
    check_ptr(op, rows ? std::size_t(cols) : 0, bias, "bias");
    check_ptr(op, std::size_t(rows) * cols, C, "C");
    submit(op, s, [=] { ref::add_bias<float>(rows, cols, bias, C); });
  }

  void bias_grad(cudaStream_t s, int rows, int cols, const float* dC, float* db) override {
    constexpr const char* op = "bias_grad";
    check_dims(op, rows, cols);
    check_ptr(op, std::size_t(rows) * cols, dC, "dC");
    check_ptr(op, std::size_t(cols), db, "db");
    submit(op, s, [=] { ref::bias_grad<float>(rows, cols, dC, db); });
  }

  void layernorm_stats(cudaStream_t s, int rows, int cols, const float* x,
                       float* stats) override {
    constexpr const char* op = "layernorm_stats";
    check_dims(op, rows, cols);
    require(rows == 0 || cols > 0, op, "a row needs at least one column");
    check_ptr(op, std::size_t(rows) * cols, x, "x");
    check_ptr(op, std::size_t(rows) * 2, stats, "stats");
    submit(op, s, [=] { ref::layernorm_stats<float>(rows, cols, x, stats); });
  }

  void layernorm_apply(cudaStream_t s, int rows, int cols, const float* x, const float* stats,
                       const float* gamma, const float* beta, float* u) override {
    constexpr const char* op = "layernorm_apply";
    check_dims(op, rows, cols);
    const std::size_t n = std::size_t(rows) * cols;
    check_ptr(op, n, x, "x");
    check_ptr(op, n, stats, "stats");  // n != 0 implies rows, cols != 0
    check_ptr(op, n, gamma, "gamma");
    check_ptr(op, n, beta, "beta");
    check_ptr(op, n, u, "u");
    submit(op, s, [=] { ref::layernorm_apply<float>(rows, cols, x, stats, gamma, beta, u); });
  }

  void layernorm_backward(cudaStream_t s, int rows, int cols, const float* du, const float* x,
                          const float* stats, const float* gamma, float* dx, float* dgamma,
                          float* dbeta) override {
    constexpr const char* op = "layernorm_backward";
    check_dims(op, rows, cols);
    const std::size_t n = std::size_t(rows) * cols;
    check_ptr(op, n, du, "du");
    check_ptr(op, n, x, "x");
    check_ptr(op, n, stats, "stats");  // n != 0 implies rows, cols != 0
    check_ptr(op, n, gamma, "gamma");
    check_ptr(op, n, dx, "dx");
    check_ptr(op, n, dgamma, "dgamma");
    check_ptr(op, n, dbeta, "dbeta");
    submit(op, s, [=] {
      ref::layernorm_backward<float>(rows, cols, du, x, stats, gamma, dx, dgamma, dbeta);
    });
  }

  void gelu(cudaStream_t s, std::size_t n, const float* h, float* a) override {
    constexpr const char* op = "gelu";
    check_ptr(op, n, h, "h");
    check_ptr(op, n, a, "a");
    submit(op, s, [=] { ref::gelu<float>(n, h, a); });
  }

  void gelu_backward(cudaStream_t s, std::size_t n, const float* da, const float* h,
                     float* dh) override {
    constexpr const char* op = "gelu_backward";
    check_ptr(op, n, da, "da");
    check_ptr(op, n, h, "h");
    check_ptr(op, n, dh, "dh");
    submit(op, s, [=] { ref::gelu_backward<float>(n, da, h, dh); });
  }

  void add(cudaStream_t s, std::size_t n, const float* x, const float* y, float* out) override {
    constexpr const char* op = "add";
    check_ptr(op, n, x, "x");
    check_ptr(op, n, y, "y");
    check_ptr(op, n, out, "out");
    submit(op, s, [=] { ref::add<float>(n, x, y, out); });
  }

  void mse_loss(cudaStream_t s, std::size_t n, const float* out, const float* target,
                float* loss, float* dout) override {
    constexpr const char* op = "mse_loss";
    require(n > 0, op, "the mean of zero elements is undefined");
    check_ptr(op, n, out, "out");
    check_ptr(op, n, target, "target");
    check_ptr(op, 1, loss, "loss");
    check_ptr(op, n, dout, "dout");
    submit(op, s, [=] { ref::mse_loss<float>(n, out, target, loss, dout); });
  }

  void sgd(cudaStream_t s, std::size_t n, float lr, const float* g, float* w) override {
    constexpr const char* op = "sgd";
    check_ptr(op, n, g, "g");
    check_ptr(op, n, w, "w");
    submit(op, s, [=] { ref::sgd<float>(n, lr, g, w); });
  }

  void zero(cudaStream_t s, void* p, std::size_t bytes) override {
    constexpr const char* op = "zero";
    check_ptr(op, bytes, p, "p");
    if (bytes == 0) return;
    if (mode_ == host_mode::immediate) {
      std::memset(p, 0, bytes);
      return;
    }
    const cudaError_t err = cudaMemsetAsync(p, 0, bytes, s);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // consumed here, so it is not blamed on a later launch
      fail(op, std::string("cudaMemsetAsync: ") + cudaGetErrorString(err));
    }
  }

 private:
  // Note [Host ops on a stream].
  template <class F>
  void submit(const char* op, cudaStream_t s, F&& f) {
    if (mode_ == host_mode::immediate) {
      f();
      return;
    }
    auto job = std::make_unique<host_job>(host_job{op, std::function<void()>(std::forward<F>(f))});
    const cudaError_t err = cudaLaunchHostFunc(s, &host_job::invoke, job.get());
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      fail(op, std::string("cudaLaunchHostFunc: ") + cudaGetErrorString(err));
    }
    job.release();  // owned by the callback from here on
  }

  host_mode mode_;
};

}  // namespace

std::unique_ptr<backend> make_host_backend(host_mode mode) {
  if (mode != host_mode::immediate && mode != host_mode::stream) {
    throw std::runtime_error("stash workload: make_host_backend: unknown host_mode");
  }
  return std::make_unique<host_backend>(mode);
}

}  // namespace stash::workload
