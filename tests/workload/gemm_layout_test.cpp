// The cuBLAS call of the CUDA backend's gemm (kernels/workload/gemm_layout.h), checked on
// any machine: the column-major call it names, run by a column-major reference with
// cublasSgemm's semantics, must give the row-major product the host reference gives, for
// every transpose combination and non-square shapes. (The GPU test, workload_cuda_tests,
// runs the real cuBLAS; this one catches a swapped operand or leading dimension without
// one.)
#include <gtest/gtest.h>

#include <cstddef>
#include <random>
#include <vector>

#include "kernels/workload/elementwise.h"
#include "kernels/workload/gemm_layout.h"

namespace stash::workload {
namespace {

// cublasSgemm's definition (column-major, element (r, c) of X at X[r + c * ldx]):
// C = op(A) op(B) + beta C with op(A) m x k and op(B) k x n. Independent of gemm_layout.h.
void column_major_sgemm(bool ta, bool tb, int m, int n, int k, const double* A, int lda,
                        const double* B, int ldb, double beta, double* C, int ldc) {
  ASSERT_GE(lda, ta ? k : m);
  ASSERT_GE(ldb, tb ? n : k);
  ASSERT_GE(ldc, m);
  for (int c = 0; c < n; ++c) {
    for (int r = 0; r < m; ++r) {
      double acc = 0;
      for (int p = 0; p < k; ++p) {
        const double a = ta ? A[p + std::size_t(r) * lda] : A[r + std::size_t(p) * lda];
        const double b = tb ? B[c + std::size_t(p) * ldb] : B[p + std::size_t(c) * ldb];
        acc += a * b;
      }
      double& out = C[r + std::size_t(c) * ldc];
      out = acc + (beta == 0 ? 0 : beta * out);
    }
  }
}

TEST(GemmLayout, ColumnMajorCallGivesTheRowMajorProduct) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(-1, 1);
  const int shapes[][3] = {{3, 5, 7}, {7, 3, 5}, {5, 7, 3}, {1, 4, 6}, {6, 1, 2}, {4, 4, 1}};
  for (const auto& s : shapes) {
    const int m = s[0], n = s[1], k = s[2];
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        std::vector<double> A(std::size_t(m) * k), B(std::size_t(k) * n);
        std::vector<double> want(std::size_t(m) * n), got(std::size_t(m) * n);
        for (double& x : A) x = u(rng);
        for (double& x : B) x = u(rng);
        for (std::size_t i = 0; i < want.size(); ++i) want[i] = got[i] = u(rng);
        const double beta = 0.5;
        ref::gemm<double>(ta, tb, m, n, k, A.data(), B.data(), beta, want.data());
        const column_major_gemm g = column_major_for(ta, tb, m, n, k);
        const double* first = g.first_is_b ? B.data() : A.data();
        const double* second = g.first_is_b ? A.data() : B.data();
        column_major_sgemm(g.trans_first, g.trans_second, g.m, g.n, g.k, first, g.ld_first,
                           second, g.ld_second, beta, got.data(), g.ldc);
        for (std::size_t i = 0; i < want.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 1e-12)
              << "m " << m << " n " << n << " k " << k << " ta " << ta << " tb " << tb
              << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace stash::workload
