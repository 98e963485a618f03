// gradcheck.h (tests): central finite differences and the error measure the gradient checks
// use.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <vector>

namespace stash::workload::test {

// d f / d v[i] for every i by central differences, step eps * max(1, |v[i]|); v is restored.
inline std::vector<double> fd_gradient(std::vector<double>& v, const std::function<double()>& f,
                                       double eps) {
  std::vector<double> g(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double v0 = v[i];
    const double h = eps * std::max(1.0, std::fabs(v0));
    v[i] = v0 + h;
    const double up = f();
    v[i] = v0 - h;
    const double down = f();
    v[i] = v0;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

// max_i |got[i] - want[i]| / max_i |want[i]|: the error relative to the tensor's scale, so
// that near-zero entries (whose own relative error is meaningless) do not dominate.
template <class G>
double scaled_error(const std::vector<G>& got, const std::vector<double>& want) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(double(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  return scale > 0 ? err / scale : err;
}

template <class T>
std::vector<double> to_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

}  // namespace stash::workload::test
