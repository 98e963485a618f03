// gemm_layout.h: the cuBLAS call that computes backend.h's row-major gemm (Note [cuBLAS in
// the workload] in cuda_backend.cu), as plain data, so that the mapping is tested on any
// machine against a column-major reference (tests/workload/gemm_layout_test.cpp) and
// cuda_backend.cu only forwards it.
//
// A row-major [r][c] array is the column-major [c][r] array of its transpose, so the
// row-major C[m][n] = op(A) op(B) is the column-major C^T[n][m] = op(B)^T op(A)^T:
// cublasSgemm(op_b, op_a, n, m, k, B, ldb, A, lda, C, n), where each leading dimension is
// the length of the operand's stored rows (lda = trans_a ? m : k, ldb = trans_b ? k : n).
#pragma once

namespace stash::workload {

struct column_major_gemm {
  // C(m x n, column-major, ldc) = op(first)(m x k) op(second)(k x n) + beta C
  bool trans_first = false, trans_second = false;
  int m = 0, n = 0, k = 0;
  int ld_first = 0, ld_second = 0, ldc = 0;
  bool first_is_b = true;  // the row-major B goes first, A second
};

// The column-major call for backend::gemm(trans_a, trans_b, m, n, k, A, B, beta, C).
constexpr column_major_gemm column_major_for(bool trans_a, bool trans_b, int m, int n, int k) {
  column_major_gemm g;
  g.trans_first = trans_b;
  g.trans_second = trans_a;
  g.m = n;
  g.n = m;
  g.k = k;
  g.ld_first = trans_b ? k : n;
  g.ld_second = trans_a ? m : k;
  g.ldc = n;
  return g;
}

}  // namespace stash::workload
