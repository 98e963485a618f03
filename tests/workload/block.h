// block.h (tests): the block of backend.h's Note [The workload's block], forward and
// backward, composed once over an `Ops` adaptor so that the same composition runs
//  - on a backend (float; host immediate/stream or CUDA): backend_ops,
//  - on the double-precision reference loops (gradient checks): ref_ops<double>.
// The driver composes its own training step; this is the tests' independent composition.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "kernels/workload/backend.h"
#include "kernels/workload/elementwise.h"

// Asserts a CUDA runtime call succeeded, naming the call and the error.
#define ASSERT_CUDA(x)                                                      \
  do {                                                                      \
    const cudaError_t err_ = (x);                                           \
    ASSERT_EQ(cudaSuccess, err_) << #x << ": " << cudaGetErrorString(err_); \
  } while (0)

namespace stash::workload::test {

struct dims {
  int T, H, F;
  std::size_t th() const { return std::size_t(T) * H; }
  std::size_t tf() const { return std::size_t(T) * F; }
  std::size_t hf() const { return std::size_t(H) * F; }
};

// Parameters (or their gradients): gamma[H], beta[H], W1[H][F], b1[F], W2[F][H], b2[H].
template <class P>
struct params {
  P gamma, beta, W1, b1, W2, b2;
};

// Saved activations (backend.h order, minus the input x) and backward scratch.
template <class T>
struct saved {
  T *stats, *u, *h, *a;
};
template <class T>
struct scratch {
  T *da, *dh, *du;  // [T][F], [T][F], [T][H]
};

// Adaptor over a backend on one stream.
struct backend_ops {
  backend& b;
  cudaStream_t s;
  using value_type = float;
  void gemm(bool ta, bool tb, int m, int n, int k, const float* A, const float* B, float beta,
            float* C) {
    b.gemm(s, ta, tb, m, n, k, A, B, beta, C);
  }
  void add_bias(int r, int c, const float* bias, float* C) { b.add_bias(s, r, c, bias, C); }
  void bias_grad(int r, int c, const float* dC, float* db) { b.bias_grad(s, r, c, dC, db); }
  void layernorm_stats(int r, int c, const float* x, float* st) {
    b.layernorm_stats(s, r, c, x, st);
  }
  void layernorm_apply(int r, int c, const float* x, const float* st, const float* g,
                       const float* be, float* u) {
    b.layernorm_apply(s, r, c, x, st, g, be, u);
  }
  void layernorm_backward(int r, int c, const float* du, const float* x, const float* st,
                          const float* g, float* dx, float* dg, float* db) {
    b.layernorm_backward(s, r, c, du, x, st, g, dx, dg, db);
  }
  void gelu(std::size_t n, const float* h, float* a) { b.gelu(s, n, h, a); }
  void gelu_backward(std::size_t n, const float* da, const float* h, float* dh) {
    b.gelu_backward(s, n, da, h, dh);
  }
  void add(std::size_t n, const float* x, const float* y, float* o) { b.add(s, n, x, y, o); }
  void mse_loss(std::size_t n, const float* o, const float* t, float* l, float* d) {
    b.mse_loss(s, n, o, t, l, d);
  }
  void zero(float* p, std::size_t n) { b.zero(s, p, n * sizeof(float)); }
};

// Adaptor over the reference loops at precision T (host memory).
template <class T>
struct ref_ops {
  using value_type = T;
  void gemm(bool ta, bool tb, int m, int n, int k, const T* A, const T* B, T beta, T* C) {
    ref::gemm<T>(ta, tb, m, n, k, A, B, beta, C);
  }
  void add_bias(int r, int c, const T* bias, T* C) { ref::add_bias<T>(r, c, bias, C); }
  void bias_grad(int r, int c, const T* dC, T* db) { ref::bias_grad<T>(r, c, dC, db); }
  void layernorm_stats(int r, int c, const T* x, T* st) { ref::layernorm_stats<T>(r, c, x, st); }
  void layernorm_apply(int r, int c, const T* x, const T* st, const T* g, const T* be, T* u) {
    ref::layernorm_apply<T>(r, c, x, st, g, be, u);
  }
  void layernorm_backward(int r, int c, const T* du, const T* x, const T* st, const T* g, T* dx,
                          T* dg, T* db) {
    ref::layernorm_backward<T>(r, c, du, x, st, g, dx, dg, db);
  }
  void gelu(std::size_t n, const T* h, T* a) { ref::gelu<T>(n, h, a); }
  void gelu_backward(std::size_t n, const T* da, const T* h, T* dh) {
    ref::gelu_backward<T>(n, da, h, dh);
  }
  void add(std::size_t n, const T* x, const T* y, T* o) { ref::add<T>(n, x, y, o); }
  void mse_loss(std::size_t n, const T* o, const T* t, T* l, T* d) {
    ref::mse_loss<T>(n, o, t, l, d);
  }
  void zero(T* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) p[i] = T(0);
  }
};

// out = x + (gelu(layernorm(x) W1 + b1) W2 + b2). out must not alias x.
template <class Ops, class T = typename Ops::value_type>
void block_forward(Ops& ops, dims d, const params<const T*>& p, const T* x, saved<T> sv,
                   T* out) {
  ops.layernorm_stats(d.T, d.H, x, sv.stats);
  ops.layernorm_apply(d.T, d.H, x, sv.stats, p.gamma, p.beta, sv.u);
  ops.gemm(false, false, d.T, d.F, d.H, sv.u, p.W1, T(0), sv.h);
  ops.add_bias(d.T, d.F, p.b1, sv.h);
  ops.gelu(d.tf(), sv.h, sv.a);
  ops.gemm(false, false, d.T, d.H, d.F, sv.a, p.W2, T(0), out);
  ops.add_bias(d.T, d.H, p.b2, out);
  ops.add(d.th(), x, out, out);
}

// Given dout = dL/dout, accumulates parameter gradients into g (+=) and writes dx = dL/dx.
template <class Ops, class T = typename Ops::value_type>
void block_backward(Ops& ops, dims d, const params<const T*>& p, const T* x, saved<T> sv,
                    const T* dout, T* dx, params<T*> g, scratch<T> w) {
  ops.gemm(true, false, d.F, d.H, d.T, sv.a, dout, T(1), g.W2);  // dW2 += a^T dout
  ops.bias_grad(d.T, d.H, dout, g.b2);
  ops.gemm(false, true, d.T, d.F, d.H, dout, p.W2, T(0), w.da);  // da = dout W2^T
  ops.gelu_backward(d.tf(), w.da, sv.h, w.dh);
  ops.gemm(true, false, d.H, d.F, d.T, sv.u, w.dh, T(1), g.W1);  // dW1 += u^T dh
  ops.bias_grad(d.T, d.F, w.dh, g.b1);
  ops.gemm(false, true, d.T, d.H, d.F, w.dh, p.W1, T(0), w.du);  // du = dh W1^T
  ops.zero(dx, d.th());
  ops.layernorm_backward(d.T, d.H, w.du, x, sv.stats, p.gamma, dx, g.gamma, g.beta);
  ops.add(d.th(), dx, dout, dx);  // the residual path; out aliases x (elementwise)
}

// Host storage for one block's tensors, every one a separate vector.
template <class T>
struct block_storage {
  dims d;
  std::vector<T> gamma, beta, W1, b1, W2, b2;             // parameters
  std::vector<T> ggamma, gbeta, gW1, gb1, gW2, gb2;       // gradients
  std::vector<T> stats, u, h, a, da, dh, du;              // saved and scratch

  explicit block_storage(dims dd)
      : d(dd), gamma(d.H), beta(d.H), W1(d.hf()), b1(d.F), W2(d.hf()), b2(d.H), ggamma(d.H),
        gbeta(d.H), gW1(d.hf()), gb1(d.F), gW2(d.hf()), gb2(d.H), stats(2 * std::size_t(d.T)),
        u(d.th()), h(d.tf()), a(d.tf()), da(d.tf()), dh(d.tf()), du(d.th()) {}

  params<const T*> p() const {
    return {gamma.data(), beta.data(), W1.data(), b1.data(), W2.data(), b2.data()};
  }
  params<T*> g() {
    return {ggamma.data(), gbeta.data(), gW1.data(), gb1.data(), gW2.data(), gb2.data()};
  }
  params<std::vector<T>*> param_vectors() { return {&gamma, &beta, &W1, &b1, &W2, &b2}; }
  params<std::vector<T>*> grad_vectors() { return {&ggamma, &gbeta, &gW1, &gb1, &gW2, &gb2}; }
  saved<T> sv() { return {stats.data(), u.data(), h.data(), a.data()}; }
  scratch<T> w() { return {da.data(), dh.data(), du.data()}; }
};

// Deterministic pseudo-random fill, uniform in [lo, hi), the same on every platform
// (std::uniform_real_distribution is not specified bit-for-bit across libraries, so the
// mapping from mt19937's integers is done here).
inline void fill_uniform(std::vector<float>& v, std::uint32_t seed, float lo, float hi) {
  std::mt19937 gen(seed);
  for (float& f : v) f = lo + (hi - lo) * float(gen() >> 8) * (1.0f / 16777216.0f);
}

// Parameters as a real model initialises them: gamma near 1, weights ~ 1/sqrt(fan_in).
inline void init_params(block_storage<float>& b, std::uint32_t seed) {
  const float s1 = 1.0f / float(std::sqrt(double(b.d.H)));
  const float s2 = 1.0f / float(std::sqrt(double(b.d.F)));
  fill_uniform(b.gamma, seed + 1, 0.5f, 1.5f);
  fill_uniform(b.beta, seed + 2, -0.5f, 0.5f);
  fill_uniform(b.W1, seed + 3, -s1, s1);
  fill_uniform(b.b1, seed + 4, -0.5f, 0.5f);
  fill_uniform(b.W2, seed + 5, -s2, s2);
  fill_uniform(b.b2, seed + 6, -0.5f, 0.5f);
}

}  // namespace stash::workload::test
