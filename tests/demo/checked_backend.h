// checked_backend.h: a backend decorator that declares each op's reads and writes to the
// CPU test double's happens-before checker.
//
// The host backend's ops are cudaLaunchHostFunc callbacks, which declare no memory accesses
// (host_backend.cpp, Note [Host ops on a stream]), so on its own the checker sees only the
// copies around them. Before each op this decorator enqueues, on the same stream, a
// zero-time stashdbl_enqueue_compute with the op's exact byte ranges: stream order makes the
// annotation and the op equivalent for ordering, and the checker then judges every access
// of the training step against the engine's copies and the pool's reuse.
//
// misroute: the name of one op ("gelu") to enqueue on `side` instead of the caller's
// stream, with no ordering at all: a deliberately broken schedule that the checker must
// catch (so a clean run means something).
#pragma once

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "double_api.h"
#include "kernels/workload/backend.h"

namespace stash::test {

class checked_backend final : public workload::backend {
 public:
  explicit checked_backend(std::unique_ptr<workload::backend> inner, std::string misroute = "",
                           cudaStream_t side = nullptr)
      : inner_(std::move(inner)), misroute_(std::move(misroute)), side_(side) {}

  const char* name() const noexcept override { return inner_->name(); }

 private:
  // The public ops (backend.cpp) have checked the arguments; the inner backend's public ops
  // check them again, harmlessly.
  void do_gemm(cudaStream_t s, bool ta, bool tb, int m, int n, int k, const float* A,
               const float* B, float beta, float* C) override {
    s = note(s, "gemm", {{A, fl(m) * k}, {B, fl(k) * n}}, {{C, fl(m) * n}}, beta != 0);
    inner_->gemm(s, ta, tb, m, n, k, A, B, beta, C);
  }
  void do_add_bias(cudaStream_t s, int rows, int cols, const float* bias, float* C) override {
    s = note(s, "add_bias", {{bias, fl(cols)}}, {{C, fl(rows) * cols}}, true);
    inner_->add_bias(s, rows, cols, bias, C);
  }
  void do_bias_grad(cudaStream_t s, int rows, int cols, const float* dC, float* db) override {
    s = note(s, "bias_grad", {{dC, fl(rows) * cols}}, {{db, fl(cols)}}, true);
    inner_->bias_grad(s, rows, cols, dC, db);
  }
  void do_layernorm_stats(cudaStream_t s, int rows, int cols, const float* x,
                          float* st) override {
    s = note(s, "layernorm_stats", {{x, fl(rows) * cols}}, {{st, fl(rows) * 2}}, false);
    inner_->layernorm_stats(s, rows, cols, x, st);
  }
  void do_layernorm_apply(cudaStream_t s, int rows, int cols, const float* x, const float* st,
                          const float* gamma, const float* beta, float* u) override {
    s = note(s, "layernorm_apply",
             {{x, fl(rows) * cols}, {st, fl(rows) * 2}, {gamma, fl(cols)}, {beta, fl(cols)}},
             {{u, fl(rows) * cols}}, false);
    inner_->layernorm_apply(s, rows, cols, x, st, gamma, beta, u);
  }
  void do_layernorm_backward(cudaStream_t s, int rows, int cols, const float* du, const float* x,
                             const float* st, const float* gamma, float* dx, float* dgamma,
                             float* dbeta) override {
    s = note(s, "layernorm_backward",
             {{du, fl(rows) * cols}, {x, fl(rows) * cols}, {st, fl(rows) * 2}, {gamma, fl(cols)}},
             {{dx, fl(rows) * cols}, {dgamma, fl(cols)}, {dbeta, fl(cols)}}, true);
    inner_->layernorm_backward(s, rows, cols, du, x, st, gamma, dx, dgamma, dbeta);
  }
  void do_gelu(cudaStream_t s, std::size_t n, const float* h, float* a) override {
    s = note(s, "gelu", {{h, n}}, {{a, n}}, false);
    inner_->gelu(s, n, h, a);
  }
  void do_gelu_backward(cudaStream_t s, std::size_t n, const float* da, const float* h,
                        float* dh) override {
    s = note(s, "gelu_backward", {{da, n}, {h, n}}, {{dh, n}}, false);
    inner_->gelu_backward(s, n, da, h, dh);
  }
  void do_add(cudaStream_t s, std::size_t n, const float* x, const float* y,
              float* out) override {
    s = note(s, "add", {{x, n}, {y, n}}, {{out, n}}, false);
    inner_->add(s, n, x, y, out);
  }
  void do_mse_loss(cudaStream_t s, std::size_t n, const float* out, const float* target,
                   float* loss, float* dout) override {
    s = note(s, "mse_loss", {{out, n}, {target, n}}, {{loss, 1}, {dout, n}}, false);
    inner_->mse_loss(s, n, out, target, loss, dout);
  }
  void do_sgd(cudaStream_t s, std::size_t n, float lr, const float* g, float* w) override {
    s = note(s, "sgd", {{g, n}}, {{w, n}}, true);
    inner_->sgd(s, n, lr, g, w);
  }
  void do_zero(cudaStream_t s, void* p, std::size_t bytes) override {
    inner_->zero(s, p, bytes);  // a cudaMemsetAsync: the double records it itself
  }

  struct range {
    const void* p;
    std::size_t floats;
  };
  static std::size_t fl(int v) { return static_cast<std::size_t>(v); }

  // Declares the accesses on the stream the op will run on and returns that stream.
  // accumulate: the op also reads what it writes (+=, beta != 0).
  cudaStream_t note(cudaStream_t s, const char* op, std::vector<range> reads,
                    const std::vector<range>& writes, bool accumulate) {
    if (op == misroute_) s = side_;
    if (accumulate) reads.insert(reads.end(), writes.begin(), writes.end());
    std::vector<const void*> rp, wp;
    std::vector<std::size_t> rs, ws;
    for (const range& r : reads) rp.push_back(r.p), rs.push_back(r.floats * sizeof(float));
    for (const range& w : writes) wp.push_back(w.p), ws.push_back(w.floats * sizeof(float));
    const cudaError_t err = double_api().enqueue_compute(
        s, 0.0, op, rp.data(), rs.data(), rp.size(), wp.data(), ws.data(), wp.size());
    if (err != cudaSuccess)
      throw std::runtime_error(std::string("stashdbl_enqueue_compute: ") + op);
    return s;
  }

  std::unique_ptr<workload::backend> inner_;
  std::string misroute_;
  cudaStream_t side_;
};

}  // namespace stash::test
