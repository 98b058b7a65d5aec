// softmax(S, sink): attention sinks, a number or one per head, against the
// long-double reference, naive and fused (the compiled kernels, decoding,
// the user-unit kernel with a predicate or a modifier), with windows and a
// fully masked row; per head on rank-4 tensors with grouped-query heads;
// eval_with_lse's L with the sink; merge with a part of no keys, and a sink
// in one part of a split; errors. A sink σ is one more key whose score is σ
// and whose value row is 0: the reference appends it (with_sink below) and
// holds the result to that problem's bound (extension_support.hpp's
// check_pair), which covers ours, whose sink score carries no error at all.
#include <catch2/catch.hpp>

#include "extension_support.hpp"

#include <qkv/qkv.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>

using namespace qkv;
using namespace test::ext;

namespace {

// Q, K, V with the sink as one more key: q' = [q 1], k' = [k 0; 0 σ/c],
// v' = [v; 0], so that c·q'·k'_m = σ and the sink adds nothing to O.
struct extended {
  ref::mat q, k, v;
};
inline extended with_sink(const ref::mat& q, const ref::mat& k, const ref::mat& v, real c, real sigma) {
  extended x{ref::mat(q.rows, q.cols + 1), ref::mat(k.rows + 1, k.cols + 1), ref::mat(v.rows + 1, v.cols)};
  for (std::size_t i = 0; i < q.rows; ++i) {
    for (std::size_t t = 0; t < q.cols; ++t) x.q(i, t) = q(i, t);
    x.q(i, q.cols) = 1;
  }
  for (std::size_t j = 0; j < k.rows; ++j)
    for (std::size_t t = 0; t < k.cols; ++t) x.k(j, t) = k(j, t);
  x.k(k.rows, k.cols) = sigma / c;
  for (std::size_t j = 0; j < v.rows; ++j)
    for (std::size_t t = 0; t < v.cols; ++t) x.v(j, t) = v(j, t);
  return x;
}

// The scores of the extended problem, with keep(i, j) masking the real keys.
template <class T, class Keep>
scores sink_scores(const extended& x, real c, const Keep& keep) {
  scores sc = scaled<T>(dot_scores<T>(x.q, x.k), c);
  const std::size_t m = x.k.rows - 1;
  sc.s = masked_by(sc.s, [&](std::size_t i, std::size_t j) { return j == m || keep(i, j); });
  return sc;
}

const auto everything = [](std::size_t, std::size_t) { return true; };

// check_pair; with a sink far above the scores, every weight is exp(s − σ)
// with s − σ near −35, and both strategies' errors are dominated by the
// rounding of that exponent (|s − σ|·u relative, in directions that differ
// at random): their largest over a few thousand outputs then differ by more
// than 2× for some inputs, either way round, while their means agree. The
// fused mean error is held to twice the naive one there.
template <class T, class A, class B>
void check_sink(const A& got_naive, const B& got_fused, const scores& sc, const ref::mat& v, bool far_above) {
  check_pair<T>(got_naive, got_fused, sc, v, !far_above);
  if (!far_above) return;
  const ref::mat want = ref::matmul(ref::softmax(sc.s), v);
  const real floor = 8 * ref::unit_roundoff<T> * ref::max_abs(want);
  CHECK(mean_error(got_fused, want) <= 2 * std::fmax(mean_error(got_naive, want), floor));
}

}  // namespace

TEMPLATE_TEST_CASE("softmax(S, sink) with a number: naive and fused against the reference", "[sink]", float, double) {
  using T = TestType;
  const auto [n_, m_] = GENERATE(table<std::size_t, std::size_t>({{1, 1}, {1, 300}, {4, 300}, {37, 53}, {130, 257}, {70, 5000}}));
  const std::size_t n = n_, m = m_;  // (clang 14 captures no structured binding)
  const T sigma = GENERATE(T(-2), T(1.5), T(40));  // below, among and far above the scores
  if (test::emulation_skips(n, m, 24, 20)) return;
  INFO("n = " << n << ", m = " << m << ", sink = " << sigma << ", " << type_name(T()) << ", kernels " << active_arch());
  inputs<T> in(n, m, 24, 24, 20, static_cast<std::uint32_t>(n + 3 * m), 2);
  const T root = qkv::sqrt(T(24));
  const real c = 1 / static_cast<real>(root);
  const extended x = with_sink(ref::from(in.Q), ref::from(in.K), ref::from(in.V), c, sigma);
  const bool far = sigma > T(30);
  {
    const auto e = softmax(in.Q * transpose(in.K) / root, sigma) * in.V;
    check_sink<T>(eval(e, naive), eval(e, fused), sink_scores<T>(x, c, everything), x.v, far);
  }
  {
    INFO("causal, with a window");
    const auto keep = [&](std::size_t i, std::size_t j) { return j + n <= i + m && j + n + 20 > i + m; };
    const auto e = softmax(window(causal(in.Q * transpose(in.K) / root), 19, 0), sigma) * in.V;
    check_sink<T>(eval(e, naive), eval(e, fused), sink_scores<T>(x, c, keep), x.v, far);
  }
  {
    INFO("a mask matrix with empty rows: zeros there");
    const auto keep = [&](std::size_t i, std::size_t j) { return bool(in.M(i, j)); };
    const auto e = softmax(masked(in.Q * transpose(in.K) / root, in.M), sigma) * in.V;
    const auto got = eval(e, fused);
    check_sink<T>(eval(e, naive), got, sink_scores<T>(x, c, keep), x.v, far);
    if (n > 1) CHECK(zero_row(got, 1));  // inputs masks every row i % 5 == 1
  }
  {
    INFO("a predicate and a modifier: the kernel instantiated here");
    const alibi_t<T> alibi{T(0.125)};
    const auto keep = [](std::size_t i, std::size_t j) { return (i + j) % 4 != 0; };
    const auto e = softmax(masked(score_mod(in.Q * transpose(in.K) / root, alibi), keep), sigma) * in.V;
    scores sc = modified(scaled<T>(dot_scores<T>(x.q, x.k), c), alibi);
    // The sink's score is not modified: undo it for the last key.
    for (std::size_t i = 0; i < n; ++i) sc.s(i, m) = sigma, sc.err(i, m) = 0;
    sc.s = masked_by(sc.s, [&](std::size_t i, std::size_t j) { return j == m || keep(i, j); });
    check_sink<T>(eval(e, naive), eval(e, fused), sc, x.v, far);
  }
}

TEST_CASE("softmax(S, sinks) per head on rank-4 tensors: each head with its own number", "[sink][tensor]") {
  constexpr std::size_t d = 16;
  // {70, 30}: causal with n > m, the first 40 rows of every head see nothing.
  const auto [n_, m_] = GENERATE(table<std::size_t, std::size_t>({{70, 300}, {3, 130}, {1, 50}, {70, 30}}));
  const std::size_t n = n_, m = m_;  // (clang 14 captures no structured binding)
  const std::size_t B = 2, H = 4, Hk = 2;
  INFO("n = " << n << ", m = " << m);
  ref::rng rng(std::uint32_t(n + m));
  tensor<float, dyn, dyn, dyn, d> Q(B, H, n), K(B, Hk, m), V(B, Hk, m);
  fill(Q, rng), fill(K, rng), fill(V, rng);
  matrix<float, 1, dyn> sinks(1, H);
  for (std::size_t h = 0; h < H; ++h) sinks(0, h) = float(h) - 1.5f;
  const auto fused_o = eval(softmax(causal(Q * transpose(K)), sinks) * V);
  const auto naive_o = eval(softmax(causal(Q * transpose(K)), sinks) * V, naive);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h) {
      INFO("b = " << b << ", h = " << h);
      const auto q = Q.matrix_at(b, h), k = K.matrix_at(b, h / 2), v = V.matrix_at(b, h / 2);
      CHECK(same_bits(fused_o.matrix_at(b, h), eval(softmax(causal(q * transpose(k)), sinks(0, h)) * v)));
      CHECK(same_bits(naive_o.matrix_at(b, h), eval(softmax(causal(q * transpose(k)), sinks(0, h)) * v, naive)));
      for (std::size_t i = 0; i + m < n; ++i) {
        INFO("row " << i << " sees nothing: zeros");
        CHECK(zero_row(fused_o.matrix_at(b, h), i));
        CHECK(zero_row(naive_o.matrix_at(b, h), i));
      }
    }
  // A matrix expression has one head: a 1 × 1 matrix is its sink.
  matrix<float, dyn, dyn> q(n, d), k(m, d), v(m, d), one(1, 1);
  rng.fill(q), rng.fill(k), rng.fill(v);
  one(0, 0) = 0.75f;
  CHECK(same_bits(eval(softmax(q * transpose(k), one) * v), eval(softmax(q * transpose(k), 0.75f) * v)));
  // Sink matrices of another shape are errors.
  matrix<float, dyn, dyn> three(1, 3), tall(4, 1);
  CHECK_THROWS_AS(softmax(causal(Q * transpose(K)), three), std::invalid_argument);
  CHECK_THROWS_AS(softmax(causal(Q * transpose(K)), tall), std::invalid_argument);
  CHECK_THROWS_AS(softmax(q * transpose(k), three), std::invalid_argument);
}

TEST_CASE("a sink matrix is held as every operand: its values when evaluated, a temporary's kept", "[sink][tensor]") {
  tensor<float, dyn, dyn, dyn, dyn> Q(2, 3, 5, 8), K(2, 3, 7, 8), V(2, 3, 7, 4), dO(2, 3, 5, 4);
  ref::rng rng(3);
  test::fill(Q, rng), test::fill(K, rng), test::fill(V, rng), test::fill(dO, rng);
  dmat<float> sinks(1, 3);
  sinks(0, 0) = -1, sinks(0, 1) = 0.5f, sinks(0, 2) = 2;
  const auto e = softmax(Q * transpose(K), sinks) * V;
  const auto before = eval(e);
  const auto [g_before] = gradient(e, dO, wrt(sinks));
  sinks(0, 1) = 3;  // a step of gradient descent on the sinks, with the same expression
  const auto after = eval(e), after_naive = eval(e, naive);
  const auto fresh = eval(softmax(Q * transpose(K), sinks) * V);
  CHECK(same_bits_tensor(after, fresh));
  CHECK(!same_bits_tensor(after, before));
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t i = 0; i < 5; ++i)
      for (std::size_t c = 0; c < 4; ++c) {
        CHECK(after(b, 0, i, c) == before(b, 0, i, c));  // heads 0 and 2 unchanged
        CHECK(after(b, 2, i, c) == before(b, 2, i, c));
        CHECK(after_naive(b, 1, i, c) == Approx(after(b, 1, i, c)).margin(1e-6));
      }
  const auto [g_after] = gradient(e, dO, wrt(sinks));
  const auto [g_fresh] = gradient(softmax(Q * transpose(K), sinks) * V, dO, wrt(sinks));
  CHECK(same_bits(g_after, g_fresh));
  CHECK(g_after(0, 1) != g_before(0, 1));
  // A temporary sink matrix: its values are kept by the expression.
  const auto kept = softmax(Q * transpose(K), dmat<float>(sinks)) * V;
  CHECK(same_bits_tensor(eval(kept), fresh));
}

TEST_CASE("eval_with_lse with a sink: L = log(exp(sink) + sum exp(s)); a row that sees nothing has L = sink", "[sink][lse]") {
  const std::size_t n = 37, m = 90, d = 16;
  inputs<float> in(n, m, d, d, d, 9, 2);
  const float sigma = 0.5f;
  const auto [O, L] = eval_with_lse(softmax(masked(in.Q * transpose(in.K) / 4.0f, in.M), sigma) * in.V);
  CHECK(same_bits(O, eval(softmax(masked(in.Q * transpose(in.K) / 4.0f, in.M), sigma) * in.V)));
  for (std::size_t i = 0; i < n; ++i) {
    double mx = sigma, sum = 0;
    std::vector<double> s;
    for (std::size_t j = 0; j < m; ++j) {
      if (!in.M(i, j)) continue;
      double t = 0;
      for (std::size_t c = 0; c < d; ++c) t += double(in.Q(i, c)) * double(in.K(j, c));
      s.push_back(t / 4), mx = std::fmax(mx, t / 4);
    }
    sum = std::exp(sigma - mx);
    for (double t : s) sum += std::exp(t - mx);
    const double want = mx + std::log(sum);
    INFO("row " << i);
    // The scores' error (γ_16·Σ|q||k|/4 < 1e-5 here) and a few ulps of L.
    CHECK(std::fabs(double(L(i, 0)) - want) <= 1e-5 * std::fmax(1, std::fabs(want)));
    if (s.empty()) CHECK(L(i, 0) == sigma);
  }
}

TEST_CASE("merge: a part of no keys contributes nothing; a sink in one part of a split", "[sink][lse]") {
  const std::size_t n = 20, m = 300, d = 16;
  inputs<float> in(n, m, d, d, d, 4, 2);
  const auto [O, L] = eval_with_lse(softmax(in.Q * transpose(in.K) / 4.0f) * in.V);
  matrix<float, dyn, dyn> K0(0, d), V0(0, d);
  const auto [Oe, Le] = eval_with_lse(softmax(in.Q * transpose(K0) / 4.0f) * V0);
  for (std::size_t i = 0; i < n; ++i) {
    CHECK(std::isinf(Le(i, 0)));
    CHECK(Le(i, 0) < 0);
    CHECK(zero_row(Oe, i));
  }
  const auto [Om, Lm] = merge(O, L, Oe, Le);
  CHECK(same_bits(Om, O));
  CHECK(same_bits(Lm, L));
  const auto [Om2, Lm2] = merge(Oe, Le, O, L);
  CHECK(same_bits(Om2, O));
  CHECK(same_bits(Lm2, L));
  // Keys [0, 120) with the sink, [120, 300) without: merged, the whole with the sink.
  const matrix_view<const float, dyn, dyn> Ka(in.K.data(), 120, d, d), Kb(in.K.data() + 120 * d, 180, d, d);
  const matrix_view<const float, dyn, dyn> Va(in.V.data(), 120, d, d), Vb(in.V.data() + 120 * d, 180, d, d);
  const auto [Oa, La] = eval_with_lse(softmax(in.Q * transpose(Ka) / 4.0f, 2.0f) * Va);
  const auto [Ob, Lb] = eval_with_lse(softmax(in.Q * transpose(Kb) / 4.0f) * Vb);
  const auto [Os, Ls] = merge(Oa, La, Ob, Lb);
  const auto [Ow, Lw] = eval_with_lse(softmax(in.Q * transpose(in.K) / 4.0f, 2.0f) * in.V);
  // Both are within the forward's error of the exact result (outputs ≤ 1,
  // scores ≤ 4 with errors ≤ 1e-5): 1e-5 apart at most.
  CHECK(ref::max_error(Os, ref::from(Ow)) <= 1e-5);
  CHECK(ref::max_error(Ls, ref::from(Lw)) <= 1e-5);
}
