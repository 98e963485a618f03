// backend.cpp: the public ops of backend.h, which check their arguments here, once for every
// backend, and then call the backend's do_* hook (Note [Two backends]).
#include "kernels/workload/backend.h"

#include <stdexcept>
#include <string>

namespace stash::workload {
namespace {

// The argument checks of one call of one op. Errors read
// "stash workload <name()> backend: <op>: <what>".
class arg_check {
 public:
  arg_check(const backend& be, const char* op) : be_(be), op_(op) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(std::string("stash workload ") + be_.name() + " backend: " + op_ +
                             ": " + what);
  }
  void require(bool ok, const char* what) const {
    if (!ok) fail(what);
  }
  void dims(long long a, long long b) const {
    if (a < 0 || b < 0) fail("negative size");
  }
  void dims(long long a, long long b, long long c) const {
    if (a < 0 || b < 0 || c < 0) fail("negative size");
  }
  // A pointer to `elems` elements may be null only when there are none.
  void ptr(std::size_t elems, const void* p, const char* name) const {
    if (elems != 0 && p == nullptr) fail(std::string("null pointer for ") + name);
  }

 private:
  const backend& be_;
  const char* op_;
};

}  // namespace

void backend::gemm(cudaStream_t s, bool trans_a, bool trans_b, int m, int n, int k,
                   const float* A, const float* B, float beta, float* C) {
  const arg_check check(*this, "gemm");
  check.dims(m, n, k);
  check.ptr(std::size_t(m) * k, A, "A");
  check.ptr(std::size_t(k) * n, B, "B");
  check.ptr(std::size_t(m) * n, C, "C");
  do_gemm(s, trans_a, trans_b, m, n, k, A, B, beta, C);
}

void backend::add_bias(cudaStream_t s, int rows, int cols, const float* bias, float* C) {
  const arg_check check(*this, "add_bias");
  check.dims(rows, cols);
  check.ptr(rows ? std::size_t(cols) : 0, bias, "bias");  // read only when there is a row
  check.ptr(std::size_t(rows) * cols, C, "C");
  do_add_bias(s, rows, cols, bias, C);
}

void backend::bias_grad(cudaStream_t s, int rows, int cols, const float* dC, float* db) {
  const arg_check check(*this, "bias_grad");
  check.dims(rows, cols);
  check.ptr(std::size_t(rows) * cols, dC, "dC");
  check.ptr(std::size_t(cols), db, "db");
  do_bias_grad(s, rows, cols, dC, db);
}

void backend::layernorm_stats(cudaStream_t s, int rows, int cols, const float* x,
                              float* stats) {
  const arg_check check(*this, "layernorm_stats");
  check.dims(rows, cols);
  check.require(rows == 0 || cols > 0, "a row needs at least one column");
  check.ptr(std::size_t(rows) * cols, x, "x");
  check.ptr(std::size_t(rows) * 2, stats, "stats");
  do_layernorm_stats(s, rows, cols, x, stats);
}

void backend::layernorm_apply(cudaStream_t s, int rows, int cols, const float* x,
                              const float* stats, const float* gamma, const float* beta,
                              float* u) {
  const arg_check check(*this, "layernorm_apply");
  check.dims(rows, cols);
  const std::size_t n = std::size_t(rows) * cols;
  check.ptr(n, x, "x");
  check.ptr(n, stats, "stats");  // n != 0 implies rows, cols != 0
  check.ptr(n, gamma, "gamma");
  check.ptr(n, beta, "beta");
  check.ptr(n, u, "u");
  do_layernorm_apply(s, rows, cols, x, stats, gamma, beta, u);
}

void backend::layernorm_backward(cudaStream_t s, int rows, int cols, const float* du,
                                 const float* x, const float* stats, const float* gamma,
                                 float* dx, float* dgamma, float* dbeta) {
  const arg_check check(*this, "layernorm_backward");
  check.dims(rows, cols);
  const std::size_t n = std::size_t(rows) * cols;
  check.ptr(n, du, "du");
  check.ptr(n, x, "x");
  check.ptr(n, stats, "stats");  // n != 0 implies rows, cols != 0
  check.ptr(n, gamma, "gamma");
  check.ptr(n, dx, "dx");
  check.ptr(n, dgamma, "dgamma");
  check.ptr(n, dbeta, "dbeta");
  do_layernorm_backward(s, rows, cols, du, x, stats, gamma, dx, dgamma, dbeta);
}

void backend::gelu(cudaStream_t s, std::size_t n, const float* h, float* a) {
  const arg_check check(*this, "gelu");
  check.ptr(n, h, "h");
  check.ptr(n, a, "a");
  do_gelu(s, n, h, a);
}

void backend::gelu_backward(cudaStream_t s, std::size_t n, const float* da, const float* h,
                            float* dh) {
  const arg_check check(*this, "gelu_backward");
  check.ptr(n, da, "da");
  check.ptr(n, h, "h");
  check.ptr(n, dh, "dh");
  do_gelu_backward(s, n, da, h, dh);
}

void backend::add(cudaStream_t s, std::size_t n, const float* x, const float* y, float* out) {
  const arg_check check(*this, "add");
  check.ptr(n, x, "x");
  check.ptr(n, y, "y");
  check.ptr(n, out, "out");
  do_add(s, n, x, y, out);
}

void backend::mse_loss(cudaStream_t s, std::size_t n, const float* out, const float* target,
                       float* loss, float* dout) {
  const arg_check check(*this, "mse_loss");
  check.require(n > 0, "the mean of zero elements is undefined");
  check.ptr(n, out, "out");
  check.ptr(n, target, "target");
  check.ptr(1, loss, "loss");
  check.ptr(n, dout, "dout");
  do_mse_loss(s, n, out, target, loss, dout);
}

void backend::sgd(cudaStream_t s, std::size_t n, float lr, const float* g, float* w) {
  const arg_check check(*this, "sgd");
  check.ptr(n, g, "g");
  check.ptr(n, w, "w");
  do_sgd(s, n, lr, g, w);
}

void backend::zero(cudaStream_t s, void* p, std::size_t bytes) {
  const arg_check check(*this, "zero");
  check.ptr(bytes, p, "p");
  do_zero(s, p, bytes);
}

}  // namespace stash::workload
