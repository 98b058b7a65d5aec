// eval_with_lse(e) and merge(O1, L1, O2, L2) (parts/lse.hpp): O as eval(e)
// gives it, L against each row's log-sum-exp in double, −∞ for a row that
// sees nothing; tensors as their matrices; merging the halves of a key set
// equal to attending over the whole within a small factor of the whole's
// error, a part of −∞ contributing nothing, the grouping of three parts
// changing nothing beyond rounding; shape errors.
#include "reference.hpp"
#include "support.hpp"

#include <catch2/catch.hpp>

#include <qkv/qkv.hpp>

#include <cmath>
#include <cstddef>
#include <limits>

using namespace qkv;

namespace {

using fmat = matrix<float, dyn, dyn>;
using bmat = matrix<bool, dyn, dyn>;

// log Σ_j exp(c·q_i·k_j) over the keys keep(i, j) leaves, in double.
template <class Keep>
std::vector<double> reference_lse(const fmat& Q, const fmat& K, double c, Keep keep) {
  std::vector<double> L(Q.rows());
  for (std::size_t i = 0; i < Q.rows(); ++i) {
    std::vector<double> s;
    for (std::size_t j = 0; j < K.rows(); ++j) {
      if (!keep(i, j)) continue;
      double dotp = 0;
      for (std::size_t x = 0; x < Q.cols(); ++x) dotp += double(Q(i, x)) * double(K(j, x));
      s.push_back(c * dotp);
    }
    double m = -INFINITY, sum = 0;
    for (double v : s) m = std::fmax(m, v);
    for (double v : s) sum += std::exp(v - m);
    L[i] = s.empty() ? -INFINITY : m + std::log(sum);
  }
  return L;
}

}  // namespace

TEST_CASE("eval_with_lse: O is eval(e)'s, L each row's log-sum-exp, -inf for a row that sees nothing", "[lse]") {
  const auto [n_, m_, d_] = GENERATE(table<std::size_t, std::size_t, std::size_t>({{1, 1, 1}, {7, 13, 5}, {70, 33, 64}, {67, 130, 33}}));
  const std::size_t n = n_, m = m_, d = d_;  // (clang 14 captures no structured binding)
  INFO("n = " << n << ", m = " << m << ", d = " << d);
  ref::rng rng(static_cast<std::uint32_t>(n + 3 * m));
  fmat Q(n, d), K(m, d), V(m, d);
  rng.fill(Q, -2, 2), rng.fill(K, -2, 2), rng.fill(V);
  bmat M(n, m);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) M(i, j) = (i + 2 * j) % 3 != 0 && !(n > 2 && i == 1);
  const float c = 1.0f / std::sqrt(float(d));
  // L of S = c·Q Kᵀ in float: the scores' error γ_d·c·Σ|q||k| (below 2e-5
  // here) plus the sum's, a few ulps of L: 1e-4 relative to max(1, |L|).
  const auto close = [](float got, double want) {
    if (std::isinf(want)) return got == float(want);
    return std::fabs(double(got) - want) <= 1e-4 * std::fmax(1.0, std::fabs(want));
  };
  SECTION("plain and masked") {
    const auto e = softmax(Q * transpose(K) * c) * V;
    const auto [O, L] = eval_with_lse(e);
    static_assert(std::is_same_v<std::remove_cvref_t<decltype(L)>, matrix<float, dyn, 1>>);
    CHECK(test::same_bits(O, eval(e)));
    const auto want = reference_lse(Q, K, c, [](std::size_t, std::size_t) { return true; });
    for (std::size_t i = 0; i < n; ++i) CHECK(close(L(i, 0), want[i]));
    const auto em = softmax(masked(Q * transpose(K) * c, M)) * V;
    const auto [Om, Lm] = eval_with_lse(em);
    CHECK(test::same_bits(Om, eval(em)));
    const auto wm = reference_lse(Q, K, c, [&](std::size_t i, std::size_t j) { return bool(M(i, j)); });
    for (std::size_t i = 0; i < n; ++i) CHECK(close(Lm(i, 0), wm[i]));
  }
  SECTION("causal with n != m, and a predicate") {
    const auto e = softmax(causal(Q * transpose(K)) * c) * V;
    const auto [O, L] = eval_with_lse(e);
    CHECK(test::same_bits(O, eval(e)));
    const auto want = reference_lse(Q, K, c, [&](std::size_t i, std::size_t j) { return j + n <= i + m; });
    for (std::size_t i = 0; i < n; ++i) CHECK(close(L(i, 0), want[i]));
    const auto odd = [](std::size_t i, std::size_t j) { return (i + j) % 2 == 1; };
    const auto ep = softmax(masked(Q * transpose(K) * c, odd)) * V;
    const auto [Op, Lp] = eval_with_lse(ep);
    CHECK(test::same_bits(Op, eval(ep)));
    const auto wp = reference_lse(Q, K, c, odd);
    for (std::size_t i = 0; i < n; ++i) CHECK(close(Lp(i, 0), wp[i]));
  }
}

TEST_CASE("eval_with_lse: bf16 inputs give eval(e)'s bf16 O and a float L; tensors give their matrices' results",
          "[lse][tensor][half]") {
  ref::rng rng(5);
  matrix<bf16, dyn, dyn> Q(20, 16), K(40, 16), V(40, 16);
  rng.fill(Q), rng.fill(K), rng.fill(V);
  const auto e = softmax(causal(Q * transpose(K)) / 4.0f) * V;
  const auto [O, L] = eval_with_lse(e);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(O)>, matrix<bf16, dyn, dyn>>);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(L)>, matrix<float, dyn, 1>>);
  CHECK(test::same_bits(O, eval(e)));
  for (std::size_t i = 0; i < 20; ++i) CHECK(std::isfinite(L(i, 0)));

  tensor<float, dyn, 4, dyn, 8> Qt(2, 30);  // grouped: 4 query heads over 2 key/value heads
  tensor<float, dyn, 2, dyn, 8> Kg(2, 30), Vg(2, 30);
  test::fill(Qt, rng), test::fill(Kg, rng), test::fill(Vg, rng);
  const auto et = softmax(causal(Qt * transpose(Kg)) / 3.0f) * Vg;
  const auto [Ot, Lt] = eval_with_lse(et);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(Lt)>, tensor<float, dyn, 4, dyn, 1>>);
  CHECK(test::same_bits_tensor(Ot, eval(et)));
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t h = 0; h < 4; ++h) {
      const auto q = Qt.matrix_at(b, h), k = Kg.matrix_at(b, h / 2), v = Vg.matrix_at(b, h / 2);
      const auto [o, l] = eval_with_lse(softmax(causal(q * transpose(k)) / 3.0f) * v);
      const auto lt = Lt.matrix_at(b, h);
      bool same = true;
      for (std::size_t i = 0; i < 30; ++i) same = same && l(i, 0) == lt(i, 0);
      CHECK(same);
      CHECK(test::same_bits(o, Ot.matrix_at(b, h)));
    }
}

TEST_CASE("eval_with_lse with V of no columns gives the normalisers alone", "[lse]") {
  // A 1 × 1 query against keys 0.5 and −1: L = log(e^0.5 + e^−1), with a sink σ = 0.25 one more term.
  fmat Q(1, 1), K(2, 1), V(2, 0);
  Q(0, 0) = 1, K(0, 0) = 0.5f, K(1, 0) = -1;
  const double want = std::log(std::exp(0.5) + std::exp(-1.0));
  const auto [O, L] = eval_with_lse(softmax(Q * transpose(K)) * V);
  CHECK(O.cols() == 0);
  CHECK(L(0, 0) == Approx(want).epsilon(1e-6));
  const auto [Os, Ls] = eval_with_lse(softmax(Q * transpose(K), 0.25f) * V);
  CHECK(Ls(0, 0) == Approx(std::log(std::exp(want) + std::exp(0.25))).epsilon(1e-6));
  // Larger, with causal and tails: the same L as with values.
  ref::rng rng(5);
  fmat Qb(37, 24), Kb(300, 24), Vb(300, 9), V0(300, 0);
  rng.fill(Qb), rng.fill(Kb), rng.fill(Vb);
  const auto with = eval_with_lse(softmax(causal(Qb * transpose(Kb))) * Vb);
  const auto without = eval_with_lse(softmax(causal(Qb * transpose(Kb))) * V0);
  for (std::size_t i = 0; i < 37; ++i) CHECK(without.second(i, 0) == Approx(with.second(i, 0)).epsilon(1e-5));
}

TEST_CASE("merge: two halves of the keys give the whole, within a small factor of the whole's error", "[lse]") {
  const std::size_t n = 45, m = 150, m1 = 61, d = 24;
  ref::rng rng(8);
  fmat Q(n, d), K(m, d), V(m, d);
  rng.fill(Q, -2, 2), rng.fill(K, -2, 2), rng.fill(V);
  bmat M(n, m);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) M(i, j) = (i * 7 + j * 3) % 5 != 0 && i != 4 && !(i == 9 && j >= m1);
  const float c = 0.25f;
  const auto [O, L] = eval_with_lse(softmax(masked(Q * transpose(K) * c, M)) * V);
  // The halves: keys [0, m1) and [m1, m), their mask's columns as views.
  const matrix_view<const float, dyn, dyn> K1(K.data(), m1, d, d), K2(K.data() + m1 * d, m - m1, d, d);
  const matrix_view<const float, dyn, dyn> V1(V.data(), m1, d, d), V2(V.data() + m1 * d, m - m1, d, d);
  const matrix_view<const bool, dyn, dyn> M1(M.data(), n, m1, m), M2(M.data() + m1, n, m - m1, m);
  const auto [Oa, La] = eval_with_lse(softmax(masked(Q * transpose(K1) * c, M1)) * V1);
  const auto [Ob, Lb] = eval_with_lse(softmax(masked(Q * transpose(K2) * c, M2)) * V2);
  const auto [Om, Lm] = merge(Oa, La, Ob, Lb);
  // Against double: the whole's error and the merged one's.
  const ref::mat want =
      ref::matmul(ref::softmax(ref::masked(ref::scale(ref::matmul(ref::from(Q), ref::transpose(ref::from(K))), c), M)),
                  ref::from(V));
  const double whole = ref::max_error(O, want), merged = ref::max_error(Om, want);
  INFO("whole " << whole << ", merged " << merged);
  CHECK(merged <= 4 * whole + 1e-6);
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isinf(L(i, 0))) CHECK(Lm(i, 0) == L(i, 0));
    else CHECK(std::fabs(Lm(i, 0) - L(i, 0)) <= 1e-5f * std::fmax(1.0f, std::fabs(L(i, 0))));
  }
  // Row 4 sees nothing in either half: zeros and -inf; row 9 nothing in the
  // second: the first half's row, bit for bit.
  CHECK(Lm(4, 0) == -std::numeric_limits<float>::infinity());
  for (std::size_t x = 0; x < d; ++x) CHECK(Om(4, x) == 0.0f);
  CHECK(Lb(9, 0) == -std::numeric_limits<float>::infinity());
  for (std::size_t x = 0; x < d; ++x) CHECK(Om(9, x) == Oa(9, x));
  CHECK(Lm(9, 0) == La(9, 0));
}

TEST_CASE("merge: three parts in either grouping agree to rounding; shapes are checked", "[lse]") {
  const std::size_t n = 30, d = 16;
  ref::rng rng(2);
  fmat Q(n, d), K(90, d), V(90, d);
  rng.fill(Q, -2, 2), rng.fill(K, -2, 2), rng.fill(V);
  const auto part = [&](std::size_t j0, std::size_t count) {
    const matrix_view<const float, dyn, dyn> k(K.data() + j0 * d, count, d, d), v(V.data() + j0 * d, count, d, d);
    return eval_with_lse(softmax(Q * transpose(k) * 0.3f) * v);
  };
  const auto [Oa, La] = part(0, 20);
  const auto [Ob, Lb] = part(20, 33);
  const auto [Oc, Lc] = part(53, 37);
  const auto [Oab, Lab] = merge(Oa, La, Ob, Lb);
  const auto [O1, L1] = merge(Oab, Lab, Oc, Lc);
  const auto [Obc, Lbc] = merge(Ob, Lb, Oc, Lc);
  const auto [O2, L2] = merge(Oa, La, Obc, Lbc);
  // Each merge rounds its weights and sums: a few ulps of |O| ≤ 1.
  CHECK(ref::max_error(O1, ref::from(O2)) <= 1e-6);
  fmat wrong(n + 1, d);
  matrix<float, dyn, 1> wrong_l(n + 1, 1);
  CHECK_THROWS_AS(merge(Oa, La, wrong, wrong_l), shape_error);
  CHECK_THROWS_AS(merge(Oa, Lb, Ob, wrong_l), shape_error);
}
