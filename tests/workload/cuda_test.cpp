// The CUDA/cuBLAS backend against the host reference (reference_test.cpp proves the
// reference). GPU only: kernels and cuBLAS cannot run on the CPU test double; without a
// device the shared test main skips the suite.
//
// Note [GPU tolerances]
// ~~~~~~~~~~~~~~~~~~~~~
// Errors are scaled to the tensor (scaled_error: max abs error / max abs value). The host
// reference's sums are exact to one float rounding (Note [Host summation order]), so the
// differences are the GPU's own:
//  - elementwise ops: device tanhf (2 ulp) and FMA contraction: ~1e-7; kTolElem = 1e-5.
//  - gemm: fp32 FMA accumulation over k <= 256 terms in cuBLAS's order: ~sqrt(k) 2^-24 ~
//    1e-6 typical, k 2^-24 ~ 2e-5 worst; kTolGemm = 1e-4.
//  - reductions (bias_grad, layernorm): float trees over <= 48 rows / 256 columns: ~1e-6;
//    layernorm dx subtracts two row means (cancellation), hence the same kTolGemm.
//  - two chained blocks, forward and backward: ~20 ops each within the above; kTolBlock =
//    1e-3, still 300x below the 0.3 errors a wrong transpose or a missing term produces
//    (reference_test.cpp's CatchesWrongGradient shows the size of such errors).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "block.h"
#include "gradcheck.h"
#include "kernels/workload/backend.h"

namespace wl = stash::workload;
namespace wt = stash::workload::test;
using wt::scaled_error;
using wt::to_double;

namespace {

constexpr double kTolElem = 1e-5;  // Note [GPU tolerances]
constexpr double kTolGemm = 1e-4;
constexpr double kTolBlock = 1e-3;

void cuda_or_throw(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
  }
}

// A cudaMalloc'd block, freed on scope exit.
struct device_bytes {
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit device_bytes(std::size_t b) : bytes(b) {
    if (b != 0) cuda_or_throw(cudaMalloc(&p, b), "cudaMalloc");  // empty: null, never used
  }
  ~device_bytes() { cudaFree(p); }
  device_bytes(const device_bytes&) = delete;
  device_bytes& operator=(const device_bytes&) = delete;
};

struct device_floats {
  device_bytes mem;
  std::size_t n;
  explicit device_floats(std::size_t count) : mem(count * sizeof(float)), n(count) {}
  explicit device_floats(const std::vector<float>& v) : device_floats(v.size()) { put(v); }
  float* p() const { return static_cast<float*>(mem.p); }
  void put(const std::vector<float>& v) {
    if (n == 0) return;
    cuda_or_throw(cudaMemcpy(p(), v.data(), n * sizeof(float), cudaMemcpyHostToDevice),
                  "cudaMemcpy H2D");
  }
  std::vector<float> get() const {
    std::vector<float> v(n);
    if (n == 0) return v;
    cuda_or_throw(cudaMemcpy(v.data(), p(), n * sizeof(float), cudaMemcpyDeviceToHost),
                  "cudaMemcpy D2H");
    return v;
  }
};

std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1,
                                 float hi = 1) {
  std::vector<float> v(n);
  wt::fill_uniform(v, seed, lo, hi);
  return v;
}

class WorkloadCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    workspace_ = std::make_unique<device_bytes>(wl::kCublasWorkspaceBytes);
    gpu_ = wl::make_cuda_backend(workspace_->p, workspace_->bytes);
    host_ = wl::make_host_backend(wl::host_mode::immediate);
    ASSERT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_) {
      EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(stream_));
      cudaStreamDestroy(stream_);
    }
    gpu_.reset();
  }
  void sync() { cuda_or_throw(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  std::unique_ptr<device_bytes> workspace_;
  std::unique_ptr<wl::backend> gpu_, host_;
  cudaStream_t stream_ = nullptr;
};

// ---- each op --------------------------------------------------------------------------

TEST_F(WorkloadCuda, GemmAllLayoutsAndBetasMatchHost) {
  // Shapes off every tile multiple; k = 0 is the empty product (C = beta C).
  const std::vector<std::tuple<int, int, int>> shapes = {{37, 72, 256}, {1, 5, 3}, {64, 33, 1},
                                                         {6, 7, 0}};
  for (auto [m, n, k] : shapes) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (float beta : {0.0f, 1.0f, 0.5f}) {
          const auto A = random_floats(std::size_t(m) * k, 1 + ta);
          const auto B = random_floats(std::size_t(k) * n, 3 + tb);
          auto C = random_floats(std::size_t(m) * n, 5);
          device_floats dA(A), dB(B), dC(C);
          gpu_->gemm(stream_, ta, tb, m, n, k, dA.p(), dB.p(), beta, dC.p());
          host_->gemm(nullptr, ta, tb, m, n, k, A.data(), B.data(), beta, C.data());
          sync();
          EXPECT_LT(scaled_error(dC.get(), to_double(C)), kTolGemm)
              << "m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb
              << " beta=" << beta;
        }
      }
    }
  }
}

TEST_F(WorkloadCuda, GemmWithBetaZeroIgnoresGarbageInC) {
  const int m = 8, n = 8, k = 8;
  const auto A = random_floats(64, 1), B = random_floats(64, 2);
  std::vector<float> C(64);
  std::memset(C.data(), 0xff, C.size() * sizeof(float));  // NaN bit patterns
  device_floats dA(A), dB(B), dC(C);
  gpu_->gemm(stream_, false, false, m, n, k, dA.p(), dB.p(), 0.0f, dC.p());
  host_->gemm(nullptr, false, false, m, n, k, A.data(), B.data(), 0.0f, C.data());
  sync();
  for (float v : dC.get()) ASSERT_FALSE(std::isnan(v));
  EXPECT_LT(scaled_error(dC.get(), to_double(C)), kTolGemm);
}

TEST_F(WorkloadCuda, RowAndColumnOpsMatchHost) {
  // 300 columns: more than one row block's worth of threads and a partial column block;
  // 45 rows: not a multiple of the column kernel's row stride.
  const int rows = 45, cols = 300;
  const std::size_t n = std::size_t(rows) * cols;
  const auto x = random_floats(n, 11, -3, 5), du = random_floats(n, 12);
  const auto gamma = random_floats(cols, 13, 0.5f, 1.5f), beta = random_floats(cols, 14);
  const auto bias = random_floats(cols, 15), init = random_floats(n, 16);
  const auto initc = random_floats(cols, 17);
  device_floats dx(x), ddu(du), dgamma(gamma), dbeta(beta), dbias(bias);
  device_floats dstats(2 * std::size_t(rows)), du_out(n), dC(init), ddx(init);
  device_floats dbg(initc), ddg(initc), ddb(initc);

  std::vector<float> stats(2 * std::size_t(rows)), u(n), C = init, hdx = init;
  std::vector<float> bg = initc, dg = initc, db = initc;
  gpu_->layernorm_stats(stream_, rows, cols, dx.p(), dstats.p());
  host_->layernorm_stats(nullptr, rows, cols, x.data(), stats.data());
  sync();
  // The GPU's statistics feed the GPU's apply/backward; compare those against the host ops
  // run on the same statistics, so each op is judged on its own.
  const auto gstats = dstats.get();
  EXPECT_LT(scaled_error(gstats, to_double(stats)), kTolElem);
  gpu_->layernorm_apply(stream_, rows, cols, dx.p(), dstats.p(), dgamma.p(), dbeta.p(),
                        du_out.p());
  host_->layernorm_apply(nullptr, rows, cols, x.data(), gstats.data(), gamma.data(),
                         beta.data(), u.data());
  gpu_->layernorm_backward(stream_, rows, cols, ddu.p(), dx.p(), dstats.p(), dgamma.p(),
                           ddx.p(), ddg.p(), ddb.p());
  host_->layernorm_backward(nullptr, rows, cols, du.data(), x.data(), gstats.data(),
                            gamma.data(), hdx.data(), dg.data(), db.data());
  gpu_->add_bias(stream_, rows, cols, dbias.p(), dC.p());
  host_->add_bias(nullptr, rows, cols, bias.data(), C.data());
  gpu_->bias_grad(stream_, rows, cols, ddu.p(), dbg.p());
  host_->bias_grad(nullptr, rows, cols, du.data(), bg.data());
  sync();
  EXPECT_LT(scaled_error(du_out.get(), to_double(u)), kTolElem);
  EXPECT_LT(scaled_error(ddx.get(), to_double(hdx)), kTolGemm);  // accumulated onto init
  EXPECT_LT(scaled_error(ddg.get(), to_double(dg)), kTolGemm);
  EXPECT_LT(scaled_error(ddb.get(), to_double(db)), kTolGemm);
  EXPECT_LT(scaled_error(dC.get(), to_double(C)), kTolElem);
  EXPECT_LT(scaled_error(dbg.get(), to_double(bg)), kTolGemm);
}

TEST_F(WorkloadCuda, ElementwiseOpsAndLossMatchHost) {
  // More elements than one grid-stride pass of the mse kernel's fixed grid (256 x 256).
  const std::size_t n = 70001;
  const auto h = random_floats(n, 21, -6, 6), da = random_floats(n, 22);
  const auto y = random_floats(n, 23), target = random_floats(n, 24);
  const auto w0 = random_floats(n, 25);
  device_floats dh(h), dda(da), dy(y), dtarget(target), dw(w0);
  device_floats da_out(n), ddh(n), dsum(n), dloss(1), ddout(n);
  std::vector<float> a(n), dh_h(n), sum(n), dout(n), w = w0;
  float loss = 0;
  gpu_->gelu(stream_, n, dh.p(), da_out.p());
  host_->gelu(nullptr, n, h.data(), a.data());
  gpu_->gelu_backward(stream_, n, dda.p(), dh.p(), ddh.p());
  host_->gelu_backward(nullptr, n, da.data(), h.data(), dh_h.data());
  gpu_->add(stream_, n, dh.p(), dy.p(), dsum.p());
  host_->add(nullptr, n, h.data(), y.data(), sum.data());
  gpu_->mse_loss(stream_, n, dh.p(), dtarget.p(), dloss.p(), ddout.p());
  host_->mse_loss(nullptr, n, h.data(), target.data(), &loss, dout.data());
  gpu_->sgd(stream_, n, 0.1f, dda.p(), dw.p());
  host_->sgd(nullptr, n, 0.1f, da.data(), w.data());
  sync();
  EXPECT_LT(scaled_error(da_out.get(), to_double(a)), kTolElem);
  EXPECT_LT(scaled_error(ddh.get(), to_double(dh_h)), kTolElem);
  EXPECT_LT(scaled_error(dsum.get(), to_double(sum)), kTolElem);
  EXPECT_LT(scaled_error(ddout.get(), to_double(dout)), kTolElem);
  EXPECT_LT(scaled_error(dw.get(), to_double(w)), kTolElem);
  // Both sides sum the squares in double: the loss agrees to float rounding.
  EXPECT_NEAR(loss, dloss.get()[0], 1e-6 * loss);
}

// ---- two blocks, forward and backward with the loss ----------------------------------

// One block's parameters, gradients and saved tensors in device memory.
struct device_block {
  wt::dims d;
  device_floats gamma, beta, W1, b1, W2, b2;
  device_floats ggamma, gbeta, gW1, gb1, gW2, gb2;
  device_floats stats, u, h, a, da, dh, du;

  device_block(const wt::block_storage<float>& s)
      : d(s.d), gamma(s.gamma), beta(s.beta), W1(s.W1), b1(s.b1), W2(s.W2), b2(s.b2),
        ggamma(d.H), gbeta(d.H), gW1(d.hf()), gb1(d.F), gW2(d.hf()), gb2(d.H),
        stats(2 * std::size_t(d.T)), u(d.th()), h(d.tf()), a(d.tf()), da(d.tf()), dh(d.tf()),
        du(d.th()) {}
  wt::params<const float*> p() const {
    return {gamma.p(), beta.p(), W1.p(), b1.p(), W2.p(), b2.p()};
  }
  wt::params<float*> g() const {
    return {ggamma.p(), gbeta.p(), gW1.p(), gb1.p(), gW2.p(), gb2.p()};
  }
  wt::saved<float> sv() const { return {stats.p(), u.p(), h.p(), a.p()}; }
  wt::scratch<float> w() const { return {da.p(), dh.p(), du.p()}; }
  std::vector<const device_floats*> grads() const {
    return {&ggamma, &gbeta, &gW1, &gb1, &gW2, &gb2};
  }
};

// Everything a two-block step produces, downloaded.
struct step_result {
  std::vector<float> out, dx, loss;
  std::vector<std::vector<float>> grads;  // block 0's six, then block 1's
};

struct two_blocks {
  wt::dims d{48, 64, 256};
  wt::block_storage<float> h0{d}, h1{d};
  std::vector<float> x, target;
  two_blocks() {
    wt::init_params(h0, 100);
    wt::init_params(h1, 200);
    x = random_floats(d.th(), 31, -2, 2);
    target = random_floats(d.th(), 32);
  }

  // Host reference, immediate mode.
  step_result run_host(wl::backend& host) {
    wt::backend_ops ops{host, nullptr};
    std::vector<float> x1(d.th()), out(d.th()), dout(d.th()), dx1(d.th()), dx0(d.th());
    float loss = 0;
    wt::block_forward(ops, d, h0.p(), x.data(), h0.sv(), x1.data());
    wt::block_forward(ops, d, h1.p(), x1.data(), h1.sv(), out.data());
    ops.mse_loss(d.th(), out.data(), target.data(), &loss, dout.data());
    for (auto* b : {&h0, &h1})
      for (auto* g : {&b->ggamma, &b->gbeta, &b->gW1, &b->gb1, &b->gW2, &b->gb2})
        std::fill(g->begin(), g->end(), 0.0f);
    wt::block_backward(ops, d, h1.p(), x1.data(), h1.sv(), dout.data(), dx1.data(), h1.g(),
                       h1.w());
    wt::block_backward(ops, d, h0.p(), x.data(), h0.sv(), dx1.data(), dx0.data(), h0.g(),
                       h0.w());
    step_result r{out, dx0, {loss}, {}};
    for (auto* b : {&h0, &h1})
      for (auto* g : {&b->ggamma, &b->gbeta, &b->gW1, &b->gb1, &b->gW2, &b->gb2})
        r.grads.push_back(*g);
    return r;
  }

  // The same step on a backend over device memory, on stream s, from fresh device buffers.
  step_result run_device(wl::backend& gpu, cudaStream_t s) {
    wt::backend_ops ops{gpu, s};
    device_block b0(h0), b1(h1);
    device_floats dx(x), dtarget(target), x1(d.th()), out(d.th()), dout(d.th());
    device_floats dx1(d.th()), dx0(d.th()), loss(1);
    for (const auto* b : {&b0, &b1})
      for (const auto* g : b->grads()) ops.zero(g->p(), g->n);
    wt::block_forward(ops, d, b0.p(), dx.p(), b0.sv(), x1.p());
    wt::block_forward(ops, d, b1.p(), x1.p(), b1.sv(), out.p());
    ops.mse_loss(d.th(), out.p(), dtarget.p(), loss.p(), dout.p());
    wt::block_backward(ops, d, b1.p(), x1.p(), b1.sv(), dout.p(), dx1.p(), b1.g(), b1.w());
    wt::block_backward(ops, d, b0.p(), dx.p(), b0.sv(), dx1.p(), dx0.p(), b0.g(), b0.w());
    cuda_or_throw(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    step_result r{out.get(), dx0.get(), loss.get(), {}};
    for (const auto* b : {&b0, &b1})
      for (const auto* g : b->grads()) r.grads.push_back(g->get());
    return r;
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool same_bits(const step_result& a, const step_result& b) {
  if (!same_bits(a.out, b.out) || !same_bits(a.dx, b.dx) || !same_bits(a.loss, b.loss)) {
    return false;
  }
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    if (!same_bits(a.grads[i], b.grads[i])) return false;
  }
  return true;
}

TEST_F(WorkloadCuda, TwoBlockStepMatchesHost) {
  two_blocks tb;
  const step_result want = tb.run_host(*host_);
  const step_result got = tb.run_device(*gpu_, stream_);
  EXPECT_LT(scaled_error(got.out, to_double(want.out)), kTolBlock);
  EXPECT_NEAR(want.loss[0], got.loss[0], kTolBlock * want.loss[0]);
  EXPECT_LT(scaled_error(got.dx, to_double(want.dx)), kTolBlock);
  const char* names[] = {"gamma", "beta", "W1", "b1", "W2", "b2"};
  ASSERT_EQ(want.grads.size(), got.grads.size());
  for (std::size_t i = 0; i < want.grads.size(); ++i) {
    EXPECT_LT(scaled_error(got.grads[i], to_double(want.grads[i])), kTolBlock)
        << "block " << i / 6 << " d" << names[i % 6];
  }
}

// Two runs give the same bits, also when the backend moves to another stream in between
// (cuBLAS is re-bound to the caller's workspace on the switch) and back.
TEST_F(WorkloadCuda, StepIsDeterministicAcrossRunsAndStreams) {
  cudaStream_t other = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  two_blocks tb;
  const step_result first = tb.run_device(*gpu_, stream_);
  const step_result second = tb.run_device(*gpu_, stream_);
  const step_result moved = tb.run_device(*gpu_, other);
  const step_result back = tb.run_device(*gpu_, stream_);
  EXPECT_TRUE(same_bits(first, second));
  EXPECT_TRUE(same_bits(first, moved));
  EXPECT_TRUE(same_bits(first, back));
  // Also on the legacy default stream, which the backend is bound to when created.
  EXPECT_TRUE(same_bits(first, tb.run_device(*gpu_, nullptr)));
  ASSERT_CUDA(cudaStreamDestroy(other));
}

// The backend runs in the caller's cudaMalloc'd block: its reduction scratch is the block's
// first bytes (mse partials land there), and unusable blocks are refused by name.
TEST_F(WorkloadCuda, RunsInTheCallersWorkspace) {
  ASSERT_CUDA(cudaMemset(workspace_->p, 0xff, workspace_->bytes));
  const std::size_t n = 1000;
  device_floats out(random_floats(n, 41)), target(random_floats(n, 42)), dout(n), loss(1);
  gpu_->mse_loss(stream_, n, out.p(), target.p(), loss.p(), dout.p());
  sync();
  std::vector<unsigned char> head(256 * sizeof(double));
  ASSERT_CUDA(cudaMemcpy(head.data(), workspace_->p, head.size(), cudaMemcpyDeviceToHost));
  EXPECT_NE(std::vector<unsigned char>(head.size(), 0xff), head)
      << "mse_loss did not use the workspace's scratch";

  // A second backend over a block of its own gives the same bits: no hidden shared state.
  device_bytes other(wl::kCublasWorkspaceBytes);
  auto gpu2 = wl::make_cuda_backend(other.p, other.bytes);
  two_blocks tb;
  EXPECT_TRUE(same_bits(tb.run_device(*gpu_, stream_), tb.run_device(*gpu2, stream_)));

  auto expect_refused = [](void* p, std::size_t bytes, const std::string& why) {
    try {
      wl::make_cuda_backend(p, bytes);
      ADD_FAILURE() << "accepted a workspace that is " << why;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string::npos, std::string(e.what()).find("make_cuda_backend")) << e.what();
    }
  };
  expect_refused(nullptr, wl::kCublasWorkspaceBytes, "null");
  expect_refused(static_cast<char*>(workspace_->p) + 4, wl::kCublasWorkspaceBytes - 4,
                 "misaligned");
  expect_refused(workspace_->p, 100, "too small");
}

TEST_F(WorkloadCuda, BadArgumentsNameTheOp) {
  device_floats buf(16);
  try {
    gpu_->gemm(stream_, false, false, -1, 4, 4, buf.p(), buf.p(), 0.0f, buf.p());
    ADD_FAILURE() << "negative m accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string::npos, std::string(e.what()).find("gemm")) << e.what();
  }
  try {
    gpu_->mse_loss(stream_, 0, buf.p(), buf.p(), buf.p(), buf.p());
    ADD_FAILURE() << "empty mse accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string::npos, std::string(e.what()).find("mse_loss")) << e.what();
  }
  EXPECT_EQ(cudaSuccess, cudaGetLastError());
}

}  // namespace
