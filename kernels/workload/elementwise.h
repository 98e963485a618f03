// elementwise.h: the workload's math as functions shared by host and device code, and the
// host reference loops built from them (backend.h, Note [The workload's block]).
//
// Everything is a template on the float type T. The backends instantiate T = float; the
// gradient checks in tests/workload instantiate T = double, so that finite differences of
// the same code are accurate to ~1e-9 and a check can tell a wrong derivative from rounding.
//
// Note [Host summation order]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The host reference loops are deterministic by construction: every sum runs in ascending
// index order (gemm: over p = 0..k-1; bias_grad and dgamma/dbeta: over rows 0..rows-1; row
// statistics: over columns 0..cols-1; mse: over elements 0..n-1) in a `double` accumulator
// (ref_acc), rounded to T once at the end. Each output is therefore within one rounding (plus
// ~n * 2^-53 relative) of the exact result of its float inputs, so when the GPU test compares
// the CUDA backend against this reference, the tolerance measures the GPU's error alone.
// Loops are tiled over output columns (kTile) for cache locality; tiling changes which
// outputs are computed together, never the order in which one output's terms are added.
// The compiler must not reassociate (no -ffast-math on files that include this header).
#pragma once

#include <cstddef>
#include <math.h>

#include "kernels/hd.h"

namespace stash::workload {

// LayerNorm epsilon, added to the biased (divide-by-cols) variance, as torch.nn.LayerNorm.
inline constexpr double kLayerNormEps = 1e-5;

// --- Element functions (host and device) -----------------------------------------------

// Overloads rather than std::: the same call resolves to tanhf/sqrtf in device code, where
// std:: math is not available for every type, and keeps float math in float on the host.
STASH_HD float wl_tanh(float x) { return tanhf(x); }
STASH_HD double wl_tanh(double x) { return tanh(x); }
STASH_HD float wl_sqrt(float x) { return sqrtf(x); }
STASH_HD double wl_sqrt(double x) { return sqrt(x); }

// GELU, tanh approximation (Hendrycks & Gimpel; GPT-2, torch approximate="tanh"):
//   gelu(x) = 0.5 x (1 + tanh(s (x + c x^3))),  s = sqrt(2/pi), c = 0.044715.
template <class T>
STASH_HD T gelu_tanh(T x) {
  const T s = T(0.7978845608028654);  // sqrt(2/pi)
  const T c = T(0.044715);
  const T t = wl_tanh(s * (x + c * x * x * x));
  return T(0.5) * x * (T(1) + t);
}

// d gelu / dx = 0.5 (1 + t) + 0.5 x (1 - t^2) s (1 + 3 c x^2),  t as above.
template <class T>
STASH_HD T gelu_tanh_grad(T x) {
  const T s = T(0.7978845608028654);
  const T c = T(0.044715);
  const T t = wl_tanh(s * (x + c * x * x * x));
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * s * (T(1) + T(3) * c * x * x);
}

// rstd = 1 / sqrt(var + eps). A correctly rounded sqrt and division (not rsqrt, whose device
// version is approximate), so host and device agree on the statistics' last step.
template <class T>
STASH_HD T layernorm_rstd(T var) {
  return T(1) / wl_sqrt(var + T(kLayerNormEps));
}

// xhat = (x - mean) * rstd: the normalised input, recomputed in backward from the saved
// statistics (never saved itself).
template <class T>
STASH_HD T layernorm_xhat(T x, T mean, T rstd) {
  return (x - mean) * rstd;
}

// u = xhat * gamma + beta.
template <class T>
STASH_HD T layernorm_out(T x, T mean, T rstd, T gamma, T beta) {
  return layernorm_xhat(x, mean, rstd) * gamma + beta;
}

// LayerNorm input gradient of one element. With g = du * gamma over a row of n columns,
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
// the two row means coming from a reduction (mean_g, mean_gx).
template <class T>
STASH_HD T layernorm_dx(T g, T xhat, T rstd, T mean_g, T mean_gx) {
  return rstd * (g - mean_g - xhat * mean_gx);
}

// d loss / d out of 0.5 * mean((out - target)^2) over n elements: (out - target) / n.
template <class T>
STASH_HD T mse_grad(T out, T target, T n) {
  return (out - target) / n;
}

// --- Host reference loops (Note [Host summation order]) --------------------------------

namespace ref {

using ref_acc = double;
inline constexpr int kTile = 64;

// C[m][n] = op(A) op(B) + beta * C, row-major (backend.h). beta == 0 does not read C, as in
// BLAS: C may hold garbage (NaN) then.
template <class T>
void gemm(bool trans_a, bool trans_b, int m, int n, int k, const T* A, const T* B, T beta,
          T* C) {
  const std::size_t lda = trans_a ? m : k;  // row stride of A as stored
  const std::size_t ldb = trans_b ? k : n;
  for (int i = 0; i < m; ++i) {
    for (int j0 = 0; j0 < n; j0 += kTile) {
      const int nj = n - j0 < kTile ? n - j0 : kTile;
      ref_acc acc[kTile] = {};
      for (int p = 0; p < k; ++p) {
        const ref_acc a = trans_a ? A[std::size_t(p) * lda + i] : A[std::size_t(i) * lda + p];
        for (int jj = 0; jj < nj; ++jj) {
          const int j = j0 + jj;
          const ref_acc b = trans_b ? B[std::size_t(j) * ldb + p] : B[std::size_t(p) * ldb + j];
          acc[jj] += a * b;
        }
      }
      T* c = C + std::size_t(i) * n + j0;
      for (int jj = 0; jj < nj; ++jj) {
        c[jj] = beta == T(0) ? T(acc[jj]) : T(acc[jj]) + beta * c[jj];
      }
    }
  }
}

template <class T>
void add_bias(int rows, int cols, const T* bias, T* C) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) C[std::size_t(r) * cols + c] += bias[c];
}

// db[c] += sum over rows (ascending) of dC[r][c].
template <class T>
void bias_grad(int rows, int cols, const T* dC, T* db) {
  for (int c0 = 0; c0 < cols; c0 += kTile) {
    const int nc = cols - c0 < kTile ? cols - c0 : kTile;
    ref_acc acc[kTile] = {};
    for (int r = 0; r < rows; ++r) {
      const T* row = dC + std::size_t(r) * cols + c0;
      for (int cc = 0; cc < nc; ++cc) acc[cc] += row[cc];
    }
    for (int cc = 0; cc < nc; ++cc) db[c0 + cc] += T(acc[cc]);
  }
}

// stats[r] = {mean, rstd}: two passes (mean, then the mean of squared deviations), which
// unlike E[x^2] - mean^2 cannot cancel to a negative variance.
template <class T>
void layernorm_stats(int rows, int cols, const T* x, T* stats) {
  for (int r = 0; r < rows; ++r) {
    const T* xr = x + std::size_t(r) * cols;
    ref_acc sum = 0;
    for (int c = 0; c < cols; ++c) sum += xr[c];
    const ref_acc mean = sum / cols;
    ref_acc sq = 0;
    for (int c = 0; c < cols; ++c) sq += (xr[c] - mean) * (xr[c] - mean);
    stats[2 * std::size_t(r)] = T(mean);
    stats[2 * std::size_t(r) + 1] = T(layernorm_rstd<ref_acc>(sq / cols));
  }
}

template <class T>
void layernorm_apply(int rows, int cols, const T* x, const T* stats, const T* gamma,
                     const T* beta, T* u) {
  for (int r = 0; r < rows; ++r) {
    const T mean = stats[2 * std::size_t(r)], rstd = stats[2 * std::size_t(r) + 1];
    for (int c = 0; c < cols; ++c) {
      const std::size_t i = std::size_t(r) * cols + c;
      u[i] = layernorm_out(x[i], mean, rstd, gamma[c], beta[c]);
    }
  }
}

// dx += dLN/dx; dgamma[c] += sum_r du * xhat; dbeta[c] += sum_r du. xhat is recomputed from
// the saved statistics with the forward's element function, so backward sees exactly the
// normalised values forward used.
template <class T>
void layernorm_backward(int rows, int cols, const T* du, const T* x, const T* stats,
                        const T* gamma, T* dx, T* dgamma, T* dbeta) {
  for (int r = 0; r < rows; ++r) {
    const T mean = stats[2 * std::size_t(r)], rstd = stats[2 * std::size_t(r) + 1];
    const std::size_t base = std::size_t(r) * cols;
    ref_acc sg = 0, sgx = 0;
    for (int c = 0; c < cols; ++c) {
      const T g = du[base + c] * gamma[c];
      sg += g;
      sgx += ref_acc(g) * layernorm_xhat(x[base + c], mean, rstd);
    }
    const T mean_g = T(sg / cols), mean_gx = T(sgx / cols);
    for (int c = 0; c < cols; ++c) {
      const T xhat = layernorm_xhat(x[base + c], mean, rstd);
      dx[base + c] += layernorm_dx(du[base + c] * gamma[c], xhat, rstd, mean_g, mean_gx);
    }
  }
  for (int c0 = 0; c0 < cols; c0 += kTile) {
    const int nc = cols - c0 < kTile ? cols - c0 : kTile;
    ref_acc ag[kTile] = {}, ab[kTile] = {};
    for (int r = 0; r < rows; ++r) {
      const T mean = stats[2 * std::size_t(r)], rstd = stats[2 * std::size_t(r) + 1];
      const std::size_t base = std::size_t(r) * cols + c0;
      for (int cc = 0; cc < nc; ++cc) {
        ag[cc] += ref_acc(du[base + cc]) * layernorm_xhat(x[base + cc], mean, rstd);
        ab[cc] += du[base + cc];
      }
    }
    for (int cc = 0; cc < nc; ++cc) {
      dgamma[c0 + cc] += T(ag[cc]);
      dbeta[c0 + cc] += T(ab[cc]);
    }
  }
}

template <class T>
void gelu(std::size_t n, const T* h, T* a) {
  for (std::size_t i = 0; i < n; ++i) a[i] = gelu_tanh(h[i]);
}

template <class T>
void gelu_backward(std::size_t n, const T* da, const T* h, T* dh) {
  for (std::size_t i = 0; i < n; ++i) dh[i] = da[i] * gelu_tanh_grad(h[i]);
}

// out = x + y; out may alias x or y (element i reads only element i).
template <class T>
void add(std::size_t n, const T* x, const T* y, T* out) {
  for (std::size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}

// loss[0] = 0.5 * mean((out - target)^2), dout = (out - target) / n.
template <class T>
void mse_loss(std::size_t n, const T* out, const T* target, T* loss, T* dout) {
  ref_acc sq = 0;
  const T tn = T(n);
  for (std::size_t i = 0; i < n; ++i) {
    const ref_acc d = ref_acc(out[i]) - ref_acc(target[i]);
    sq += d * d;
    dout[i] = mse_grad(out[i], target[i], tn);
  }
  loss[0] = T(0.5 * sq / ref_acc(n));
}

template <class T>
void sgd(std::size_t n, T lr, const T* g, T* w) {
  for (std::size_t i = 0; i < n; ++i) w[i] -= lr * g[i];
}

}  // namespace ref
}  // namespace stash::workload
