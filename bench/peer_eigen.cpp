// Attention in Eigen 3.4, as its users write it; this file is compiled with
// -march=native so that Eigen's products and exp use the widest vectors.
#include "bench_common.hpp"

#include <Eigen/Dense>

#include <limits>

namespace {

using mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using map = Eigen::Map<const mat>;

void eigen_attention(benchmark::State& state, const bench::config& c) {
  bench::inputs in(c);
  const Eigen::Index n = Eigen::Index(c.n), m = Eigen::Index(c.m), d = Eigen::Index(c.d);
  const map Q(in.Q.data(), n, d), K(in.K.data(), m, d), V(in.V.data(), m, d);
  Eigen::Map<mat> O(in.O.data(), n, d);
  mat S(n, m);
  const float scale = 1.0f / std::sqrt(float(c.d));
  for (auto _ : state) {
    S.noalias() = (Q * K.transpose()) * scale;
    if (c.causal)
      for (Eigen::Index i = 0; i < n; ++i)
        for (Eigen::Index j = i + (m - n) + 1; j < m; ++j) S(i, j) = -std::numeric_limits<float>::infinity();
    for (Eigen::Index i = 0; i < n; ++i) {
      auto row = S.row(i).array();
      row = (row - row.maxCoeff()).exp();
      row /= row.sum();
    }
    O.noalias() = S * V;
    benchmark::DoNotOptimize(in.O.data());
  }
  bench::set_counters(state, c);
  state.SetLabel("eigen " + std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION));
}

const int registered = [] {
  bench::register_all("eigen", eigen_attention);
  return 0;
}();

}  // namespace
