// The host reference of the workload's math is proven here, on the CPU only: every op's
// backward against central finite differences in double precision, the whole block
// (forward, mse loss, backward) as the float host backend computes it against finite
// differences of the loss, gemm's transposes against a naive loop, determinism, and that the
// checks' tolerances are tight enough to catch a wrong gradient.
//
// Note [Gradient check tolerances]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Finite differences run in double on the templated reference (elementwise.h). With step
// h = 1e-6 the central difference has truncation error ~h^2 |f'''| ~ 1e-12 and rounding error
// ~2^-53 |f| / h ~ 1e-10 |f|; the gradients here are O(1e-2..1) and |f| = O(1), so double
// analytic gradients agree to ~1e-8 of the tensor's scale: kTolDouble = 1e-6.
// The float host backend rounds every stored intermediate to float (2^-24 ~ 6e-8; its sums
// are exact to that, Note [Host summation order]) and the block chains ~10 ops, so its
// gradients carry at most ~1e-6 relative error (1e-7 observed): kTolFloat = 1e-5 leaves a 10x
// margin over that bound, and is 30x below the smallest error CatchesWrongGradient plants
// (the exact-GELU derivative in place of the tanh approximation's: 3e-4 on W1).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "block.h"
#include "gradcheck.h"
#include "kernels/workload/backend.h"
#include "kernels/workload/elementwise.h"

namespace wl = stash::workload;
namespace wt = stash::workload::test;
using wt::fd_gradient;
using wt::scaled_error;
using wt::to_double;

namespace {

constexpr double kFdStep = 1e-6;
constexpr double kTolDouble = 1e-6;  // Note [Gradient check tolerances]
constexpr double kTolFloat = 1e-5;

std::vector<double> random_vec(std::size_t n, std::uint32_t seed, double lo = -1,
                               double hi = 1) {
  std::vector<float> f(n);
  wt::fill_uniform(f, seed, float(lo), float(hi));
  return to_double(f);
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// ---- per-op backward checks, double precision ------------------------------------------

TEST(WorkloadOpGrad, GemmTransposesGiveGradientsOfEveryLayout) {
  const int m = 5, n = 7, k = 3;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      auto A = random_vec(std::size_t(m) * k, 10 + 2 * ta + tb);
      auto B = random_vec(std::size_t(k) * n, 20 + 2 * ta + tb);
      const auto R = random_vec(std::size_t(m) * n, 30);
      std::vector<double> C(std::size_t(m) * n);
      auto L = [&] {
        wl::ref::gemm<double>(ta, tb, m, n, k, A.data(), B.data(), 0.0, C.data());
        return dot(R, C);
      };
      // dL/dA and dL/dB with R as the upstream gradient, by transposed products as the
      // block's backward forms them: d op(A) = R op(B)^T, d op(B) = op(A)^T R, and a stored
      // transposed operand receives the transpose of its op's gradient.
      std::vector<double> dA(A.size()), dB(B.size());
      if (!ta) {
        wl::ref::gemm<double>(false, !tb, m, k, n, R.data(), B.data(), 0.0, dA.data());
      } else {
        wl::ref::gemm<double>(tb, true, k, m, n, B.data(), R.data(), 0.0, dA.data());
      }
      if (!tb) {
        wl::ref::gemm<double>(!ta, false, k, n, m, A.data(), R.data(), 0.0, dB.data());
      } else {
        wl::ref::gemm<double>(true, ta, n, k, m, R.data(), A.data(), 0.0, dB.data());
      }
      EXPECT_LT(scaled_error(dA, fd_gradient(A, L, kFdStep)), kTolDouble) << ta << tb;
      EXPECT_LT(scaled_error(dB, fd_gradient(B, L, kFdStep)), kTolDouble) << ta << tb;
    }
  }
}

TEST(WorkloadOpGrad, BiasGradIsTheGradientOfAddBias) {
  const int rows = 6, cols = 9;
  auto bias = random_vec(cols, 1);
  const auto C0 = random_vec(std::size_t(rows) * cols, 2);
  const auto R = random_vec(C0.size(), 3);
  auto L = [&] {
    auto C = C0;
    wl::ref::add_bias<double>(rows, cols, bias.data(), C.data());
    return dot(R, C);
  };
  std::vector<double> db(cols, 0.0);
  wl::ref::bias_grad<double>(rows, cols, R.data(), db.data());
  EXPECT_LT(scaled_error(db, fd_gradient(bias, L, kFdStep)), kTolDouble);
}

TEST(WorkloadOpGrad, LayerNormBackwardMatchesFiniteDifferences) {
  const int rows = 4, cols = 8;
  auto x = random_vec(std::size_t(rows) * cols, 4, -2, 3);
  auto gamma = random_vec(cols, 5, 0.5, 1.5);
  auto beta = random_vec(cols, 6);
  const auto R = random_vec(x.size(), 7);
  std::vector<double> stats(2 * rows), u(x.size());
  auto L = [&] {
    wl::ref::layernorm_stats<double>(rows, cols, x.data(), stats.data());
    wl::ref::layernorm_apply<double>(rows, cols, x.data(), stats.data(), gamma.data(),
                                     beta.data(), u.data());
    return dot(R, u);
  };
  L();
  std::vector<double> dx(x.size(), 0.0), dgamma(cols, 0.0), dbeta(cols, 0.0);
  wl::ref::layernorm_backward<double>(rows, cols, R.data(), x.data(), stats.data(),
                                      gamma.data(), dx.data(), dgamma.data(), dbeta.data());
  EXPECT_LT(scaled_error(dx, fd_gradient(x, L, kFdStep)), kTolDouble);
  EXPECT_LT(scaled_error(dgamma, fd_gradient(gamma, L, kFdStep)), kTolDouble);
  EXPECT_LT(scaled_error(dbeta, fd_gradient(beta, L, kFdStep)), kTolDouble);
}

TEST(WorkloadOpGrad, GeluBackwardMatchesFiniteDifferences) {
  // Across the curve: the negative tail, the bend near 0, the linear right side.
  auto h = random_vec(64, 8, -6, 6);
  h[0] = 0.0;
  h[1] = -1e-3;
  const auto R = random_vec(h.size(), 9);
  std::vector<double> a(h.size());
  auto L = [&] {
    wl::ref::gelu<double>(h.size(), h.data(), a.data());
    return dot(R, a);
  };
  std::vector<double> dh(h.size());
  wl::ref::gelu_backward<double>(h.size(), R.data(), h.data(), dh.data());
  EXPECT_LT(scaled_error(dh, fd_gradient(h, L, kFdStep)), kTolDouble);
  // The tanh approximation itself: within 1e-3 of x * Phi(x) (exact GELU) everywhere.
  for (double v : h) {
    const double exact = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    EXPECT_NEAR(exact, wl::gelu_tanh(v), 1e-3) << v;
  }
}

TEST(WorkloadOpGrad, MseLossGradientMatchesFiniteDifferences) {
  const std::size_t n = 30;
  auto out = random_vec(n, 10, -2, 2);
  const auto target = random_vec(n, 11);
  std::vector<double> dout(n);
  double loss = 0;
  auto L = [&] {
    wl::ref::mse_loss<double>(n, out.data(), target.data(), &loss, dout.data());
    return loss;
  };
  L();
  const auto analytic = dout;
  double direct = 0;
  for (std::size_t i = 0; i < n; ++i) direct += 0.5 * (out[i] - target[i]) * (out[i] - target[i]);
  EXPECT_NEAR(direct / n, loss, 1e-15);
  EXPECT_LT(scaled_error(analytic, fd_gradient(out, L, kFdStep)), kTolDouble);
}

// ---- the whole block ----------------------------------------------------------------------

// One block, its input and target, stored in float (the backend's type) and in double (the
// same values promoted: finite differences are taken at exactly the point the float backend
// sees).
struct block_problem {
  wt::dims d{6, 8, 16};
  wt::block_storage<float> f{d};
  wt::block_storage<double> g{d};
  std::vector<float> xf, tf;
  std::vector<double> x, target;

  block_problem() {
    wt::init_params(f, 1234);
    xf.resize(d.th());
    tf.resize(d.th());
    wt::fill_uniform(xf, 77, -2.0f, 2.0f);
    wt::fill_uniform(tf, 78, -1.0f, 1.0f);
    x = to_double(xf);
    target = to_double(tf);
    auto pf = f.param_vectors();
    auto pg = g.param_vectors();
    *pg.gamma = to_double(*pf.gamma);
    *pg.beta = to_double(*pf.beta);
    *pg.W1 = to_double(*pf.W1);
    *pg.b1 = to_double(*pf.b1);
    *pg.W2 = to_double(*pf.W2);
    *pg.b2 = to_double(*pf.b2);
  }

  // The loss in double at the current (possibly perturbed) double values.
  template <class Ops>
  double loss(Ops& ops) {
    std::vector<double> out(d.th()), dout(d.th());
    double l = 0;
    wt::block_forward(ops, d, g.p(), x.data(), g.sv(), out.data());
    ops.mse_loss(d.th(), out.data(), target.data(), &l, dout.data());
    return l;
  }

  // Forward, loss, backward with `ops` on storage `s`; returns dx (gradients land in s).
  template <class Ops, class T>
  std::vector<T> gradients(Ops& ops, wt::block_storage<T>& s, const std::vector<T>& xin,
                           const std::vector<T>& tin, T* loss_out = nullptr) {
    std::vector<T> out(d.th()), dout(d.th()), dx(d.th());
    T l = 0;
    wt::block_forward(ops, d, s.p(), xin.data(), s.sv(), out.data());
    ops.mse_loss(d.th(), out.data(), tin.data(), &l, dout.data());
    for (auto* v : {&s.ggamma, &s.gbeta, &s.gW1, &s.gb1, &s.gW2, &s.gb2})
      std::fill(v->begin(), v->end(), T(0));
    wt::block_backward(ops, d, s.p(), xin.data(), s.sv(), dout.data(), dx.data(), s.g(), s.w());
    if (loss_out) *loss_out = l;
    return dx;
  }
};

// Per-tensor scaled errors of analytic gradients against finite differences.
struct block_errors {
  double x, gamma, beta, W1, b1, W2, b2;
};

template <class T>
block_errors compare_with_fd(block_problem& pr, const std::vector<T>& dx,
                             wt::block_storage<T>& s) {
  wt::ref_ops<double> ref;
  auto L = [&] { return pr.loss(ref); };
  auto pg = pr.g.param_vectors();
  block_errors e{};
  e.x = scaled_error(dx, fd_gradient(pr.x, L, kFdStep));
  e.gamma = scaled_error(s.ggamma, fd_gradient(*pg.gamma, L, kFdStep));
  e.beta = scaled_error(s.gbeta, fd_gradient(*pg.beta, L, kFdStep));
  e.W1 = scaled_error(s.gW1, fd_gradient(*pg.W1, L, kFdStep));
  e.b1 = scaled_error(s.gb1, fd_gradient(*pg.b1, L, kFdStep));
  e.W2 = scaled_error(s.gW2, fd_gradient(*pg.W2, L, kFdStep));
  e.b2 = scaled_error(s.gb2, fd_gradient(*pg.b2, L, kFdStep));
  return e;
}

void expect_below(const block_errors& e, double tol) {
  EXPECT_LT(e.x, tol);
  EXPECT_LT(e.gamma, tol);
  EXPECT_LT(e.beta, tol);
  EXPECT_LT(e.W1, tol);
  EXPECT_LT(e.b1, tol);
  EXPECT_LT(e.W2, tol);
  EXPECT_LT(e.b2, tol);
}

TEST(WorkloadBlockGrad, DoubleReferenceMatchesFiniteDifferences) {
  block_problem pr;
  wt::ref_ops<double> ref;
  auto dx = pr.gradients(ref, pr.g, pr.x, pr.target);
  expect_below(compare_with_fd(pr, dx, pr.g), kTolDouble);
}

TEST(WorkloadBlockGrad, FloatHostBackendMatchesFiniteDifferences) {
  block_problem pr;
  auto be = wl::make_host_backend(wl::host_mode::immediate);
  wt::backend_ops ops{*be, nullptr};
  float loss = 0;
  auto dx = pr.gradients(ops, pr.f, pr.xf, pr.tf, &loss);
  wt::ref_ops<double> ref;
  EXPECT_NEAR(pr.loss(ref), loss, 1e-6 * pr.loss(ref));
  const block_errors e = compare_with_fd(pr, dx, pr.f);
  expect_below(e, kTolFloat);
}

// A gradient 0.1% off in one entry, and two plausible derivation bugs, must all fail the
// checks above: the tolerances are meaningful.
TEST(WorkloadBlockGrad, CatchesWrongGradient) {
  {
    block_problem pr;
    auto be = wl::make_host_backend(wl::host_mode::immediate);
    wt::backend_ops ops{*be, nullptr};
    auto dx = pr.gradients(ops, pr.f, pr.xf, pr.tf);
    auto big = std::max_element(pr.f.gW1.begin(), pr.f.gW1.end(),
                                [](float a, float b) { return std::fabs(a) < std::fabs(b); });
    *big *= 1.001f;
    EXPECT_GT(compare_with_fd(pr, dx, pr.f).W1, kTolFloat);
  }
  {
    // LayerNorm dx without the mean(g * xhat) term: a classic derivation slip.
    struct wrong_ln : wt::ref_ops<double> {
      void layernorm_backward(int r, int c, const double* du, const double* x,
                              const double* st, const double* g, double* dx, double* dg,
                              double* db) {
        std::vector<double> dx0(std::size_t(r) * c, 0.0);
        wl::ref::layernorm_backward<double>(r, c, du, x, st, g, dx0.data(), dg, db);
        for (int i = 0; i < r; ++i) {
          double sg = 0;
          for (int j = 0; j < c; ++j) sg += du[i * c + j] * g[j];
          for (int j = 0; j < c; ++j)
            dx[i * c + j] += st[2 * i + 1] * (du[i * c + j] * g[j] - sg / c);
        }
      }
    } ops;
    block_problem pr;
    auto dx = pr.gradients(ops, pr.g, pr.x, pr.target);
    const block_errors e = compare_with_fd(pr, dx, pr.g);
    EXPECT_GT(e.x, kTolFloat);
    EXPECT_LT(e.W1, kTolDouble);  // only the broken path is wrong
  }
  {
    // The exact (erf) GELU derivative in place of the tanh approximation's: < 2e-3 apart.
    struct wrong_gelu : wt::ref_ops<double> {
      void gelu_backward(std::size_t n, const double* da, const double* h, double* dh) {
        for (std::size_t i = 0; i < n; ++i) {
          const double v = h[i];
          const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2 * 3.14159265358979323846);
          dh[i] = da[i] * (0.5 * (1 + std::erf(v / std::sqrt(2.0))) + v * pdf);
        }
      }
    } ops;
    block_problem pr;
    auto dx = pr.gradients(ops, pr.g, pr.x, pr.target);
    const block_errors e = compare_with_fd(pr, dx, pr.g);
    EXPECT_GT(e.W1, kTolFloat);
    EXPECT_GT(e.b1, kTolFloat);
    EXPECT_LT(e.W2, kTolDouble);
  }
}

TEST(WorkloadBlockGrad, HostBackendIsDeterministic) {
  block_problem p1, p2;
  auto be = wl::make_host_backend(wl::host_mode::immediate);
  wt::backend_ops ops{*be, nullptr};
  float l1 = 0, l2 = 0;
  const auto dx1 = p1.gradients(ops, p1.f, p1.xf, p1.tf, &l1);
  const auto dx2 = p2.gradients(ops, p2.f, p2.xf, p2.tf, &l2);
  EXPECT_EQ(0, std::memcmp(&l1, &l2, sizeof l1));
  EXPECT_EQ(0, std::memcmp(dx1.data(), dx2.data(), dx1.size() * sizeof(float)));
  auto g1 = p1.f.grad_vectors();
  auto g2 = p2.f.grad_vectors();
  const std::vector<std::pair<std::vector<float>*, std::vector<float>*>> pairs = {
      {g1.gamma, g2.gamma}, {g1.beta, g2.beta}, {g1.W1, g2.W1},
      {g1.b1, g2.b1},       {g1.W2, g2.W2},     {g1.b2, g2.b2}};
  for (auto [a, b] : pairs) {
    EXPECT_EQ(0, std::memcmp(a->data(), b->data(), a->size() * sizeof(float)));
  }
  EXPECT_EQ(0, std::memcmp(p1.f.a.data(), p2.f.a.data(), p1.f.a.size() * sizeof(float)));
}

// ---- gemm layouts and op semantics, float host backend -----------------------------------

// C = op(A) op(B) + beta C by the definition, i-j-p order with a double accumulator: the
// order Note [Host summation order] promises, so the backend must match bit for bit.
std::vector<float> naive_gemm(bool ta, bool tb, int m, int n, int k, const std::vector<float>& A,
                              const std::vector<float>& B, float beta, std::vector<float> C) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double acc = 0;
      for (int p = 0; p < k; ++p) {
        const double a = ta ? A[std::size_t(p) * m + i] : A[std::size_t(i) * k + p];
        const double b = tb ? B[std::size_t(j) * k + p] : B[std::size_t(p) * n + j];
        acc += a * b;
      }
      float& c = C[std::size_t(i) * n + j];
      c = beta == 0 ? float(acc) : float(acc) + beta * c;
    }
  }
  return C;
}

TEST(WorkloadHostBackend, GemmAllTransposesMatchNaiveLoop) {
  auto be = wl::make_host_backend(wl::host_mode::immediate);
  // n = 70 spans two column tiles of the reference loop; k = 0 is the empty product.
  const std::vector<std::tuple<int, int, int>> shapes = {{5, 70, 3}, {1, 1, 1}, {4, 3, 0},
                                                         {9, 8, 33}};
  for (auto [m, n, k] : shapes) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (float beta : {0.0f, 1.0f, -0.5f}) {
          std::vector<float> A(std::size_t(m) * k), B(std::size_t(k) * n), C(std::size_t(m) * n);
          wt::fill_uniform(A, 1, -1, 1);
          wt::fill_uniform(B, 2, -1, 1);
          wt::fill_uniform(C, 3, -1, 1);
          // beta == 0 must not read C: garbage there must not leak into the result.
          if (beta == 0) std::fill(C.begin(), C.end(), std::numeric_limits<float>::quiet_NaN());
          const auto want = naive_gemm(ta, tb, m, n, k, A, B, beta, C);
          be->gemm(nullptr, ta, tb, m, n, k, A.data(), B.data(), beta, C.data());
          ASSERT_EQ(0, std::memcmp(want.data(), C.data(), C.size() * sizeof(float)))
              << "m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb
              << " beta=" << beta;
        }
      }
    }
  }
}

TEST(WorkloadHostBackend, AccumulatingOpsAddToTheirOutputs) {
  auto be = wl::make_host_backend(wl::host_mode::immediate);
  const int rows = 5, cols = 7;
  const std::size_t n = std::size_t(rows) * cols;
  std::vector<float> du(n), x(n), gamma(cols), stats(2 * rows), init(n), initc(cols);
  wt::fill_uniform(du, 1, -1, 1);
  wt::fill_uniform(x, 2, -1, 1);
  wt::fill_uniform(gamma, 3, 0.5f, 1.5f);
  wt::fill_uniform(init, 4, -1, 1);
  wt::fill_uniform(initc, 5, -1, 1);
  be->layernorm_stats(nullptr, rows, cols, x.data(), stats.data());

  std::vector<float> dx0(n, 0.0f), dg0(cols, 0.0f), db0(cols, 0.0f), bg0(cols, 0.0f);
  be->layernorm_backward(nullptr, rows, cols, du.data(), x.data(), stats.data(), gamma.data(),
                         dx0.data(), dg0.data(), db0.data());
  be->bias_grad(nullptr, rows, cols, du.data(), bg0.data());
  auto dx = init;
  auto dg = initc, db = initc, bg = initc;
  be->layernorm_backward(nullptr, rows, cols, du.data(), x.data(), stats.data(), gamma.data(),
                         dx.data(), dg.data(), db.data());
  be->bias_grad(nullptr, rows, cols, du.data(), bg.data());
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(init[i] + dx0[i], dx[i]) << i;
  for (int c = 0; c < cols; ++c) {
    EXPECT_EQ(initc[c] + dg0[c], dg[c]) << c;
    EXPECT_EQ(initc[c] + db0[c], db[c]) << c;
    EXPECT_EQ(initc[c] + bg0[c], bg[c]) << c;
  }
}

TEST(WorkloadHostBackend, ElementwiseOpsAndSgd) {
  auto be = wl::make_host_backend(wl::host_mode::immediate);
  const std::size_t n = 100;
  std::vector<float> x(n), y(n), out(n), w(n), g(n);
  wt::fill_uniform(x, 1, -3, 3);
  wt::fill_uniform(y, 2, -3, 3);
  wt::fill_uniform(w, 3, -1, 1);
  wt::fill_uniform(g, 4, -1, 1);
  const auto w0 = w;
  be->add(nullptr, n, x.data(), y.data(), out.data());
  be->sgd(nullptr, n, 0.25f, g.data(), w.data());
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(x[i] + y[i], out[i]);
    EXPECT_EQ(w0[i] - 0.25f * g[i], w[i]);
  }
  be->add(nullptr, n, x.data(), y.data(), x.data());  // out aliasing an input
  EXPECT_EQ(out, x);
  be->zero(nullptr, out.data(), n * sizeof(float));
  EXPECT_EQ(std::vector<float>(n, 0.0f), out);
}

TEST(WorkloadHostBackend, LayerNormStatsAreMeanAndRstd) {
  auto be = wl::make_host_backend(wl::host_mode::immediate);
  // A row with a large common offset: the two-pass variance keeps its precision.
  const std::vector<float> x = {1000.0f, 1001.0f, 1002.0f, 1003.0f};
  std::vector<float> stats(2);
  be->layernorm_stats(nullptr, 1, 4, x.data(), stats.data());
  EXPECT_EQ(1001.5f, stats[0]);
  EXPECT_FLOAT_EQ(float(1.0 / std::sqrt(1.25 + 1e-5)), stats[1]);
}

TEST(WorkloadHostBackend, BadArgumentsNameTheOp) {
  auto be = wl::make_host_backend(wl::host_mode::immediate);
  float buf[4] = {};
  auto expect_error = [](auto&& call, const std::string& op) {
    try {
      call();
      ADD_FAILURE() << op << " accepted bad arguments";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string::npos, std::string(e.what()).find(op)) << e.what();
    }
  };
  expect_error([&] { be->gemm(nullptr, false, false, -1, 1, 1, buf, buf, 0, buf); }, "gemm");
  expect_error([&] { be->gemm(nullptr, false, false, 1, 1, 1, nullptr, buf, 0, buf); }, "gemm");
  expect_error([&] { be->bias_grad(nullptr, 2, -2, buf, buf); }, "bias_grad");
  expect_error([&] { be->layernorm_stats(nullptr, 1, 0, buf, buf); }, "layernorm_stats");
  expect_error([&] { be->mse_loss(nullptr, 0, buf, buf, buf, buf); }, "mse_loss");
  expect_error([&] { be->gelu(nullptr, 4, buf, nullptr); }, "gelu");
  expect_error([&] { be->zero(nullptr, nullptr, 4); }, "zero");
  // Empty ops are no-ops, not errors.
  be->gemm(nullptr, false, false, 0, 0, 0, nullptr, nullptr, 0, nullptr);
  be->gelu(nullptr, 0, nullptr, nullptr);
}

}  // namespace
