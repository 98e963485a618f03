// workload_kernels.cu: the CUDA backend's kernels other than gemm (cuBLAS). The element math
// is elementwise.h's, shared with the host reference; reductions follow Note [Deterministic
// reductions on the GPU] in workload_kernels.h.
#include "kernels/workload/elementwise.h"
#include "kernels/workload/workload_kernels.h"

namespace stash::workload::kernels {
namespace {

constexpr int kMapThreads = 256;
constexpr std::size_t kMaxMapBlocks = 65535;  // grid-stride beyond this: the GPU is full
constexpr int kMaxRowBlocks = 65535;

unsigned map_blocks(std::size_t n) {
  const std::size_t b = (n + kMapThreads - 1) / kMapThreads;
  return static_cast<unsigned>(b < kMaxMapBlocks ? b : kMaxMapBlocks);
}

// --- elementwise ops: one grid-stride kernel over a functor per op ---------------------

template <class F>
__global__ void map_kernel(std::size_t n, F f) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    f(i);
  }
}

template <class F>
cudaError_t launch_map(cudaStream_t s, std::size_t n, F f) {
  if (n == 0) return cudaSuccess;
  map_kernel<<<map_blocks(n), kMapThreads, 0, s>>>(n, f);
  return cudaGetLastError();
}

struct add_bias_op {
  std::size_t cols;
  const float* bias;
  float* C;
  __device__ void operator()(std::size_t i) const { C[i] += bias[i % cols]; }
};

struct layernorm_apply_op {
  std::size_t cols;
  const float *x, *stats, *gamma, *beta;
  float* u;
  __device__ void operator()(std::size_t i) const {
    const std::size_t r = i / cols, c = i % cols;
    u[i] = layernorm_out(x[i], stats[2 * r], stats[2 * r + 1], gamma[c], beta[c]);
  }
};

struct gelu_op {
  const float* h;
  float* a;
  __device__ void operator()(std::size_t i) const { a[i] = gelu_tanh(h[i]); }
};

struct gelu_backward_op {
  const float *da, *h;
  float* dh;
  __device__ void operator()(std::size_t i) const { dh[i] = da[i] * gelu_tanh_grad(h[i]); }
};

struct add_op {
  const float *x, *y;
  float* out;
  __device__ void operator()(std::size_t i) const { out[i] = x[i] + y[i]; }
};

struct sgd_op {
  float lr;
  const float* g;
  float* w;
  __device__ void operator()(std::size_t i) const { w[i] -= lr * g[i]; }
};

// --- row reductions -----------------------------------------------------------------------

// Sum of one value per thread over a block of kRowThreads, by a fixed halving tree. Every
// thread gets the result; `sh` is reusable after the call.
template <class T>
__device__ T block_sum(T v, T* sh) {
  const int t = threadIdx.x;
  sh[t] = v;
  __syncthreads();
  for (int half = kRowThreads / 2; half > 0; half >>= 1) {
    if (t < half) sh[t] += sh[t + half];
    __syncthreads();
  }
  const T total = sh[0];
  __syncthreads();
  return total;
}

__global__ void __launch_bounds__(kRowThreads)
    layernorm_stats_kernel(int rows, int cols, const float* x, float* stats) {
  __shared__ float sh[kRowThreads];
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + std::size_t(r) * cols;
    float s = 0;
    for (int c = threadIdx.x; c < cols; c += kRowThreads) s += xr[c];
    const float mean = block_sum(s, sh) / float(cols);
    float q = 0;
    for (int c = threadIdx.x; c < cols; c += kRowThreads) {
      const float d = xr[c] - mean;
      q += d * d;
    }
    const float var = block_sum(q, sh) / float(cols);
    if (threadIdx.x == 0) {
      stats[2 * std::size_t(r)] = mean;
      stats[2 * std::size_t(r) + 1] = layernorm_rstd(var);
    }
  }
}

// dx += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = du * gamma, per row.
__global__ void __launch_bounds__(kRowThreads)
    layernorm_dx_kernel(int rows, int cols, const float* du, const float* x,
                        const float* stats, const float* gamma, float* dx) {
  __shared__ float sh[kRowThreads];
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::size_t base = std::size_t(r) * cols;
    const float mean = stats[2 * std::size_t(r)], rstd = stats[2 * std::size_t(r) + 1];
    float sg = 0, sgx = 0;
    for (int c = threadIdx.x; c < cols; c += kRowThreads) {
      const float g = du[base + c] * gamma[c];
      sg += g;
      sgx += g * layernorm_xhat(x[base + c], mean, rstd);
    }
    const float mean_g = block_sum(sg, sh) / float(cols);
    const float mean_gx = block_sum(sgx, sh) / float(cols);
    for (int c = threadIdx.x; c < cols; c += kRowThreads) {
      const float xhat = layernorm_xhat(x[base + c], mean, rstd);
      dx[base + c] += layernorm_dx(du[base + c] * gamma[c], xhat, rstd, mean_g, mean_gx);
    }
  }
}

int row_blocks(int rows) { return rows < kMaxRowBlocks ? rows : kMaxRowBlocks; }

// --- column reductions --------------------------------------------------------------------

// kLayerNorm: out0[c] += sum_r d[r][c] * xhat[r][c], out1[c] += sum_r d[r][c] (dgamma, dbeta).
// Otherwise: out0[c] += sum_r d[r][c] (bias_grad); x, stats and out1 are unused.
template <bool kLayerNorm>
__global__ void __launch_bounds__(kColWidth* kColRows)
    column_sums_kernel(int rows, int cols, const float* d, const float* x, const float* stats,
                       float* out0, float* out1) {
  __shared__ float s0[kColRows][kColWidth + 1];  // +1: no bank conflicts on the column read
  __shared__ float s1[kLayerNorm ? kColRows : 1][kColWidth + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * kColWidth + tx;
  float a0 = 0, a1 = 0;
  if (c < cols) {
    for (int r = ty; r < rows; r += kColRows) {
      const std::size_t i = std::size_t(r) * cols + c;
      if constexpr (kLayerNorm) {
        const float xhat =
            layernorm_xhat(x[i], stats[2 * std::size_t(r)], stats[2 * std::size_t(r) + 1]);
        a0 += d[i] * xhat;
        a1 += d[i];
      } else {
        a0 += d[i];
      }
    }
  }
  s0[ty][tx] = a0;
  if constexpr (kLayerNorm) s1[ty][tx] = a1;
  __syncthreads();
  if (ty == 0 && c < cols) {
    float t0 = 0, t1 = 0;
    for (int y = 0; y < kColRows; ++y) {
      t0 += s0[y][tx];
      if constexpr (kLayerNorm) t1 += s1[y][tx];
    }
    out0[c] += t0;
    if constexpr (kLayerNorm) out1[c] += t1;
  }
}

template <bool kLayerNorm>
cudaError_t launch_column_sums(cudaStream_t s, int rows, int cols, const float* d,
                               const float* x, const float* stats, float* out0, float* out1) {
  if (cols == 0) return cudaSuccess;
  const dim3 block(kColWidth, kColRows);
  const unsigned grid = static_cast<unsigned>((cols + kColWidth - 1) / kColWidth);
  column_sums_kernel<kLayerNorm><<<grid, block, 0, s>>>(rows, cols, d, x, stats, out0, out1);
  return cudaGetLastError();
}

// --- mse ----------------------------------------------------------------------------------

__global__ void __launch_bounds__(kMseThreads)
    mse_partial_kernel(std::size_t n, const float* out, const float* target, float* dout,
                       double* partials) {
  __shared__ double sh[kMseThreads];
  const float fn = float(n);
  double acc = 0;
  for (std::size_t i = blockIdx.x * std::size_t(kMseThreads) + threadIdx.x; i < n;
       i += std::size_t(kMseBlocks) * kMseThreads) {
    const float o = out[i], t = target[i];
    const double d = double(o) - double(t);
    acc += d * d;
    dout[i] = mse_grad(o, t, fn);
  }
  static_assert(kMseThreads == kRowThreads, "block_sum assumes kRowThreads");
  const double total = block_sum(acc, sh);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void __launch_bounds__(kMseThreads)
    mse_final_kernel(std::size_t n, const double* partials, float* loss) {
  __shared__ double sh[kMseThreads];
  static_assert(kMseBlocks == kMseThreads, "one partial per thread");
  const double total = block_sum(partials[threadIdx.x], sh);
  if (threadIdx.x == 0) loss[0] = float(0.5 * total / double(n));
}

}  // namespace

cudaError_t add_bias(cudaStream_t s, int rows, int cols, const float* bias, float* C) {
  return launch_map(s, std::size_t(rows) * cols, add_bias_op{std::size_t(cols), bias, C});
}

cudaError_t bias_grad(cudaStream_t s, int rows, int cols, const float* dC, float* db) {
  return launch_column_sums<false>(s, rows, cols, dC, nullptr, nullptr, db, nullptr);
}

cudaError_t layernorm_stats(cudaStream_t s, int rows, int cols, const float* x, float* stats) {
  if (rows == 0) return cudaSuccess;
  layernorm_stats_kernel<<<row_blocks(rows), kRowThreads, 0, s>>>(rows, cols, x, stats);
  return cudaGetLastError();
}

cudaError_t layernorm_apply(cudaStream_t s, int rows, int cols, const float* x,
                            const float* stats, const float* gamma, const float* beta,
                            float* u) {
  return launch_map(s, std::size_t(rows) * cols,
                    layernorm_apply_op{std::size_t(cols), x, stats, gamma, beta, u});
}

cudaError_t layernorm_backward(cudaStream_t s, int rows, int cols, const float* du,
                               const float* x, const float* stats, const float* gamma, float* dx,
                               float* dgamma, float* dbeta) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  layernorm_dx_kernel<<<row_blocks(rows), kRowThreads, 0, s>>>(rows, cols, du, x, stats, gamma,
                                                               dx);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return launch_column_sums<true>(s, rows, cols, du, x, stats, dgamma, dbeta);
}

cudaError_t gelu(cudaStream_t s, std::size_t n, const float* h, float* a) {
  return launch_map(s, n, gelu_op{h, a});
}

cudaError_t gelu_backward(cudaStream_t s, std::size_t n, const float* da, const float* h,
                          float* dh) {
  return launch_map(s, n, gelu_backward_op{da, h, dh});
}

cudaError_t add(cudaStream_t s, std::size_t n, const float* x, const float* y, float* out) {
  return launch_map(s, n, add_op{x, y, out});
}

cudaError_t mse_loss(cudaStream_t s, std::size_t n, const float* out, const float* target,
                     float* loss, float* dout, void* scratch) {
  if (n == 0) return cudaErrorInvalidValue;
  auto* partials = static_cast<double*>(scratch);
  mse_partial_kernel<<<kMseBlocks, kMseThreads, 0, s>>>(n, out, target, dout, partials);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  mse_final_kernel<<<1, kMseThreads, 0, s>>>(n, partials, loss);
  return cudaGetLastError();
}

cudaError_t sgd(cudaStream_t s, std::size_t n, float lr, const float* g, float* w) {
  return launch_map(s, n, sgd_op{lr, g, w});
}

}  // namespace stash::workload::kernels
