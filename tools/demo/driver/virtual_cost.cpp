// virtual_cost.cpp: Note [Virtual cost of host ops] (virtual_cost.h).
#include "tools/demo/driver/virtual_cost.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "cuda_prim.h"
#include "tools/demo/driver/test_double.h"

namespace stash::workload {
namespace {

using enqueue_fn = test_double::enqueue_compute_fn;

class virtual_cost_backend final : public backend {
 public:
  virtual_cost_backend(std::unique_ptr<backend> inner, const virtual_rates& r, enqueue_fn fn)
      : inner_(std::move(inner)), rates_(r), enqueue_(fn) {}

  const char* name() const noexcept override { return inner_->name(); }

 private:
  // The public ops (backend.cpp) have checked the arguments; the inner backend's public ops
  // check them again, harmlessly.
  void do_gemm(cudaStream_t s, bool ta, bool tb, int m, int n, int k, const float* A,
               const float* B, float beta, float* C) override {
    flops(s, "gemm", 2.0 * m * n * k);
    inner_->gemm(s, ta, tb, m, n, k, A, B, beta, C);
  }
  void do_add_bias(cudaStream_t s, int rows, int cols, const float* bias, float* C) override {
    mem(s, "add_bias", 2.0 * rows * cols);
    inner_->add_bias(s, rows, cols, bias, C);
  }
  void do_bias_grad(cudaStream_t s, int rows, int cols, const float* dC, float* db) override {
    mem(s, "bias_grad", 1.0 * rows * cols);
    inner_->bias_grad(s, rows, cols, dC, db);
  }
  void do_layernorm_stats(cudaStream_t s, int rows, int cols, const float* x,
                          float* st) override {
    mem(s, "layernorm_stats", 1.0 * rows * cols);
    inner_->layernorm_stats(s, rows, cols, x, st);
  }
  void do_layernorm_apply(cudaStream_t s, int rows, int cols, const float* x, const float* st,
                          const float* gamma, const float* beta, float* u) override {
    mem(s, "layernorm_apply", 2.0 * rows * cols);
    inner_->layernorm_apply(s, rows, cols, x, st, gamma, beta, u);
  }
  void do_layernorm_backward(cudaStream_t s, int rows, int cols, const float* du, const float* x,
                             const float* st, const float* gamma, float* dx, float* dgamma,
                             float* dbeta) override {
    mem(s, "layernorm_backward", 4.0 * rows * cols);
    inner_->layernorm_backward(s, rows, cols, du, x, st, gamma, dx, dgamma, dbeta);
  }
  void do_gelu(cudaStream_t s, std::size_t n, const float* h, float* a) override {
    mem(s, "gelu", 2.0 * n);
    inner_->gelu(s, n, h, a);
  }
  void do_gelu_backward(cudaStream_t s, std::size_t n, const float* da, const float* h,
                        float* dh) override {
    mem(s, "gelu_backward", 3.0 * n);
    inner_->gelu_backward(s, n, da, h, dh);
  }
  void do_add(cudaStream_t s, std::size_t n, const float* x, const float* y,
              float* out) override {
    mem(s, "add", 3.0 * n);
    inner_->add(s, n, x, y, out);
  }
  void do_mse_loss(cudaStream_t s, std::size_t n, const float* out, const float* target,
                   float* loss, float* dout) override {
    mem(s, "mse_loss", 3.0 * n);
    inner_->mse_loss(s, n, out, target, loss, dout);
  }
  void do_sgd(cudaStream_t s, std::size_t n, float lr, const float* g, float* w) override {
    mem(s, "sgd", 3.0 * n);
    inner_->sgd(s, n, lr, g, w);
  }
  void do_zero(cudaStream_t s, void* p, std::size_t bytes) override { inner_->zero(s, p, bytes); }

  void charge(cudaStream_t s, const char* op, double ms) {
    const cudaError_t err = enqueue_(s, ms, op, nullptr, nullptr, 0, nullptr, nullptr, 0);
    if (err != cudaSuccess) prim::throw_cuda_error(err, op, __FILE__, __LINE__);
  }
  void flops(cudaStream_t s, const char* op, double f) {
    charge(s, op, f / (rates_.gemm_tflops * 1e9));
  }
  void mem(cudaStream_t s, const char* op, double floats) {
    charge(s, op, floats * sizeof(float) / (rates_.memory_gbps * 1e6));
  }

  std::unique_ptr<backend> inner_;
  virtual_rates rates_;
  enqueue_fn enqueue_;
};

}  // namespace

std::unique_ptr<backend> with_virtual_cost(std::unique_ptr<backend> inner,
                                           const virtual_rates& rates) {
  const enqueue_fn fn = test_double::enqueue_compute();
  if (!fn)
    throw error(status::invalid_argument,
                "stash workload: virtual op costs need stash's CPU test double (Note [The "
                "test double seam]), which is not the loaded runtime");
  if (!(rates.gemm_tflops > 0) || !(rates.memory_gbps > 0))
    throw std::invalid_argument("stash workload: virtual rates must be positive");
  return std::make_unique<virtual_cost_backend>(std::move(inner), rates, fn);
}

}  // namespace stash::workload
