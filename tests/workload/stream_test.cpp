// The host backend in stream mode (Note [Host ops on a stream]): ops are host functions on a
// CUDA stream, so on stash's CPU test double, whose device memory is host memory, the
// workload runs stream-ordered among copies. Stream mode dereferences its pointers on the
// host, which cudaMalloc'd memory on a real GPU does not allow: every test here needs the
// double and skips on a real runtime.
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "block.h"
#include "double_api.h"
#include "kernels/workload/backend.h"

namespace wl = stash::workload;
namespace wt = stash::workload::test;

namespace {

// A cudaMalloc'd float array, freed on scope exit.
struct device_array {
  float* p = nullptr;
  std::size_t n = 0;
  explicit device_array(std::size_t count) : n(count) {
    if (cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(float)) != cudaSuccess) {
      throw std::runtime_error("cudaMalloc failed");
    }
  }
  ~device_array() { cudaFree(p); }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
};

// A pinned host array: copies from it are truly asynchronous (pageable ones are not).
struct pinned_array {
  float* p = nullptr;
  std::size_t n = 0;
  explicit pinned_array(std::size_t count) : n(count) {
    if (cudaMallocHost(reinterpret_cast<void**>(&p), n * sizeof(float)) != cudaSuccess) {
      throw std::runtime_error("cudaMallocHost failed");
    }
  }
  ~pinned_array() { cudaFreeHost(p); }
  pinned_array(const pinned_array&) = delete;
  pinned_array& operator=(const pinned_array&) = delete;
};

class WorkloadStream : public ::testing::Test {
 protected:
  void SetUp() override {
    STASH_REQUIRE_DOUBLE();
    stash::test::double_api().reset();
    ASSERT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
    if (stash::test::on_double()) {
      EXPECT_EQ(0u, stash::test::double_api().violation_count());
      stash::test::double_api().clear_faults();
    }
  }
  cudaStream_t stream_ = nullptr;
};

// Copies a host vector into a fresh device array on the stream (pageable source: the copy
// is synchronous on the double, so `v` may go away after the call).
std::unique_ptr<device_array> upload(const std::vector<float>& v, cudaStream_t s) {
  auto d = std::make_unique<device_array>(v.size());
  if (cudaMemcpyAsync(d->p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice, s) !=
      cudaSuccess) {
    throw std::runtime_error("upload failed");
  }
  return d;
}

std::vector<float> download(const device_array& d, cudaStream_t s) {
  std::vector<float> v(d.n);
  if (cudaMemcpyAsync(v.data(), d.p, d.n * sizeof(float), cudaMemcpyDeviceToHost, s) !=
          cudaSuccess ||
      cudaStreamSynchronize(s) != cudaSuccess) {
    throw std::runtime_error("download failed");
  }
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_F(WorkloadStream, BlockMatchesImmediateModeBitwise) {
  const wt::dims d{6, 8, 16};
  wt::block_storage<float> h(d);
  wt::init_params(h, 99);
  std::vector<float> x(d.th()), target(d.th());
  wt::fill_uniform(x, 5, -2, 2);
  wt::fill_uniform(target, 6, -1, 1);

  // Immediate mode on host vectors: the expected bits.
  auto imm = wl::make_host_backend(wl::host_mode::immediate);
  wt::backend_ops iops{*imm, nullptr};
  std::vector<float> out(d.th()), dout(d.th()), dx(d.th());
  float loss = 0;
  wt::block_forward(iops, d, h.p(), x.data(), h.sv(), out.data());
  iops.mse_loss(d.th(), out.data(), target.data(), &loss, dout.data());
  wt::block_backward(iops, d, h.p(), x.data(), h.sv(), dout.data(), dx.data(), h.g(), h.w());

  // Stream mode on device arrays, everything enqueued before one synchronize at the end.
  auto sb = wl::make_host_backend(wl::host_mode::stream);
  wt::backend_ops sops{*sb, stream_};
  auto gamma = upload(h.gamma, stream_), beta = upload(h.beta, stream_);
  auto W1 = upload(h.W1, stream_), b1 = upload(h.b1, stream_);
  auto W2 = upload(h.W2, stream_), b2 = upload(h.b2, stream_);
  auto d_x = upload(x, stream_), d_target = upload(target, stream_);
  // Saved tensors, backward scratch, outputs and gradients (d_ = device, g_ = gradient).
  device_array d_stats(2 * std::size_t(d.T)), d_u(d.th()), d_h(d.tf()), d_a(d.tf());
  device_array d_da(d.tf()), d_dh(d.tf()), d_du(d.th());
  device_array d_out(d.th()), d_dout(d.th()), d_dx(d.th()), d_loss(1);
  device_array g_gamma(d.H), g_beta(d.H), g_W1(d.hf()), g_b1(d.F), g_W2(d.hf()), g_b2(d.H);
  for (auto* g : {&g_gamma, &g_beta, &g_W1, &g_b1, &g_W2, &g_b2}) sops.zero(g->p, g->n);
  const wt::params<const float*> p{gamma->p, beta->p, W1->p, b1->p, W2->p, b2->p};
  const wt::params<float*> g{g_gamma.p, g_beta.p, g_W1.p, g_b1.p, g_W2.p, g_b2.p};
  const wt::saved<float> sv{d_stats.p, d_u.p, d_h.p, d_a.p};
  wt::block_forward(sops, d, p, d_x->p, sv, d_out.p);
  sops.mse_loss(d.th(), d_out.p, d_target->p, d_loss.p, d_dout.p);
  wt::block_backward(sops, d, p, d_x->p, sv, d_dout.p, d_dx.p, g, {d_da.p, d_dh.p, d_du.p});

  EXPECT_TRUE(same_bits(out, download(d_out, stream_)));
  EXPECT_TRUE(same_bits({loss}, download(d_loss, stream_)));
  EXPECT_TRUE(same_bits(dx, download(d_dx, stream_)));
  EXPECT_TRUE(same_bits(h.a, download(d_a, stream_)));
  EXPECT_TRUE(same_bits(h.stats, download(d_stats, stream_)));
  EXPECT_TRUE(same_bits(h.ggamma, download(g_gamma, stream_)));
  EXPECT_TRUE(same_bits(h.gbeta, download(g_beta, stream_)));
  EXPECT_TRUE(same_bits(h.gW1, download(g_W1, stream_)));
  EXPECT_TRUE(same_bits(h.gb1, download(g_b1, stream_)));
  EXPECT_TRUE(same_bits(h.gW2, download(g_W2, stream_)));
  EXPECT_TRUE(same_bits(h.gb2, download(g_b2, stream_)));
}

// H2D copy -> gelu -> D2H copy, all pending behind a paused stream: the op runs after the
// copy that fills its input and before the copy that reads its output, and not at the call.
TEST_F(WorkloadStream, OpsRunInStreamOrderWithCopies) {
  const std::size_t n = 257;
  pinned_array src(n), dst(n);
  device_array h(n), a(n);
  for (std::size_t i = 0; i < n; ++i) {
    src.p[i] = -4.0f + 8.0f * float(i) / float(n);
    dst.p[i] = -1.0f;
  }
  auto be = wl::make_host_backend(wl::host_mode::stream);
  ASSERT_CUDA(cudaMemset(h.p, 0, n * sizeof(float)));
  // 0x7f7f7f7f (3.39e38): no value gelu or sgd could produce from h here.
  ASSERT_CUDA(cudaMemset(a.p, 0x7f, n * sizeof(float)));
  float sentinel;
  std::memset(&sentinel, 0x7f, sizeof sentinel);
  ASSERT_CUDA(stash::test::double_api().stream_pause(stream_));
  ASSERT_CUDA(cudaMemcpyAsync(h.p, src.p, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
  be->gelu(stream_, n, h.p, a.p);
  be->sgd(stream_, n, 1.0f, h.p, a.p);  // a = gelu(h) - h: a second op, ordered after the first
  ASSERT_CUDA(cudaMemcpyAsync(dst.p, a.p, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  EXPECT_EQ(cudaErrorNotReady, cudaStreamQuery(stream_));
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(sentinel, a.p[i]) << "op ran at the call";
  ASSERT_CUDA(stash::test::double_api().stream_resume(stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(wl::gelu_tanh(src.p[i]) - 1.0f * src.p[i], dst.p[i]) << i;
  }
}

TEST_F(WorkloadStream, FailedEnqueueIsReportedNamingTheOp) {
  auto be = wl::make_host_backend(wl::host_mode::stream);
  device_array h(16), a(16);
  auto expect_error = [](auto&& call, const std::string& op, const std::string& api) {
    try {
      call();
      ADD_FAILURE() << op << ": the injected fault went unreported";
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      EXPECT_NE(std::string::npos, what.find(op)) << what;
      EXPECT_NE(std::string::npos, what.find(api)) << what;
      EXPECT_NE(std::string::npos, what.find(cudaGetErrorString(cudaErrorLaunchFailure)))
          << what;
    }
  };
  const auto& dbl = stash::test::double_api();
  dbl.inject_fault("cudaLaunchHostFunc", 1, cudaErrorLaunchFailure);
  expect_error([&] { be->gelu(stream_, 16, h.p, a.p); }, "gelu", "cudaLaunchHostFunc");
  dbl.inject_fault("cudaLaunchHostFunc", 1, cudaErrorLaunchFailure);
  expect_error([&] { be->gemm(stream_, false, false, 4, 4, 4, h.p, h.p, 0.0f, a.p); }, "gemm",
               "cudaLaunchHostFunc");
  dbl.inject_fault("cudaMemsetAsync", 1, cudaErrorLaunchFailure);
  expect_error([&] { be->zero(stream_, a.p, 16 * sizeof(float)); }, "zero", "cudaMemsetAsync");
  // The failure was consumed: the runtime's last error is clean, and the stream still works.
  EXPECT_EQ(cudaSuccess, cudaGetLastError());
  ASSERT_CUDA(cudaMemset(h.p, 0, 16 * sizeof(float)));
  be->gelu(stream_, 16, h.p, a.p);
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  for (int i = 0; i < 16; ++i) EXPECT_EQ(0.0f, a.p[i]);
}

}  // namespace
