// qkv::benchmark(e): both strategies timed on the operands e holds, their
// results compared, the bytes each held measured (the node-by-node
// evaluation holds the n × m scores, the fused one far less), what ran and
// where; an expression without a fused form; bad arguments; the table.
#include <catch2/catch.hpp>

#include "reference.hpp"
#include "support.hpp"

#include <qkv/qkv.hpp>

#include <cmath>
#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>

using namespace qkv;

namespace {

// The dot product as a user writes it.
struct my_dot {
  template <class V>
  V operator()(const V& q, const V& k) const {
    return q * k;
  }
};

}  // namespace

TEST_CASE("benchmark(e): fused against naive for a user similarity, timed, compared, measured", "[benchmark]") {
  const std::size_t n = 512, m = 1024, d = 32;
  matrix<float, dyn, dyn> Q(n, d), K(m, d), V(m, d);
  ref::rng rng(2);
  rng.fill(Q), rng.fill(K), rng.fill(V);
  const auto e = softmax(causal(similarity(Q, K, my_dot{})) / std::sqrt(float(d))) * V;
  const benchmark_result r = benchmark(e, 0.05);
  CHECK(r.runs >= 3);
  CHECK(r.fused_ms > 0);
  CHECK(r.naive_ms > 0);
  CHECK(r.speedup == Approx(r.naive_ms / r.fused_ms));
  CHECK(r.gflops == Approx(double(cost(e).flops) / (r.fused_ms * 1e6)));
  // Within the fused float bound of attention_test.cpp for these magnitudes: a few ulps of |V| ≤ 1.
  CHECK(r.max_abs_diff < 1e-5);
  // Node by node, the n × m scores (the weights in place) are held; fused, never an n × m matrix:
  // packed K and V (2·m·d floats, 256 KiB) and each thread's block buffers (at most 256 KiB each
  // here), under half of the scores' 2 MiB.
  CHECK(r.naive_bytes >= n * m * sizeof(float));
  CHECK(r.fused_bytes < n * m * sizeof(float) / 2);
  CHECK(r.path == explain(e));
  CHECK(r.path.find("fused") != std::string::npos);
  CHECK(r.arch == active_arch());
  CHECK(r.threads == threads());
  std::ostringstream table;
  table << r;
  CHECK(table.str().find("speed-up") != std::string::npos);
  CHECK(table.str().find("fused") != std::string::npos);
  CHECK(table.str().find("naive") != std::string::npos);
}

TEST_CASE("benchmark(e): tensors, 2-byte inputs, an expression without a fused form, bad seconds", "[benchmark]") {
  tensor<bf16, dyn, dyn, dyn, dyn> Q(1, 4, 64, 32), K(1, 2, 200, 32), V(1, 2, 200, 32);
  for (std::size_t x = 0; x < Q.size(); ++x) Q.data()[x] = bf16(float(x % 13) / 13 - 0.5f);
  for (std::size_t x = 0; x < K.size(); ++x) K.data()[x] = bf16(float(x % 7) / 7 - 0.5f), V.data()[x] = bf16(float(x % 5) / 5);
  const auto r = benchmark(softmax(Q * transpose(K)) * V, 0.0);
  CHECK(r.runs == 3);
  // bf16 results, each rounded once from float: the two may differ by an ulp of bf16 (2⁻⁸ of values ≤ 1).
  CHECK(r.max_abs_diff <= 1.0 / 128);
  matrix<double, dyn, dyn> A(40, 30), B(30, 20);
  ref::rng rng(4);
  rng.fill(A), rng.fill(B);
  const auto p = benchmark(A * B, 0.0);  // no fused form: the default strategy against node by node
  CHECK(p.max_abs_diff <= 1e-12);
  CHECK(p.path.find("fused") == std::string::npos);
  CHECK_THROWS_AS(benchmark(A * B, -1.0), std::invalid_argument);
}
