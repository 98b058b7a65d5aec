// The backward of the extension nodes (grad/extensions.hpp): dual
// numbers against central differences of the functions themselves, on
// numbers and on batches; every built-in similarity, user similarity terms
// and score modifiers against central differences of the whole loss in
// double (the independent check); zeros where the rules promise them; float
// against double.
#include "reference.hpp"
#include "support.hpp"

#include <catch2/catch.hpp>

#include <qkv/qkv.hpp>

#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <stdexcept>
#include <vector>

using namespace qkv;

namespace {

using dmat = matrix<double, dyn, dyn>;

// A function of one variable, its dual on numbers and on batches, and the
// derivative by central differences in long double at x.
template <class F>
void check_dual(const char* what, F f, double x) {
  INFO(what << " at " << x);
  const long double h = 1e-6L;
  const long double fd = (static_cast<long double>(f(dual<double>(double(x + h))).v) -
                          static_cast<long double>(f(dual<double>(double(x - h))).v)) /
                         (2 * h);
  const dual<double> r = f(dual<double>(x, 1.0));
  // Central differences err by h²/6·|f‴| (below 1e-11 for these functions
  // at these points) and by the values' rounding, 1e-16/1e-6: 1e-8 relative
  // leaves room.
  CHECK(std::fabs(r.d - double(fd)) <= 1e-8 * std::fmax(1.0, std::fabs(r.d)));
  using B = xsimd::batch<double>;
  const dual<B> rb = f(dual<B>(B(x), B(1.0)));
  for (std::size_t l = 0; l < B::size; ++l) {
    // xsimd's batch functions are not std's: a few ulps apart.
    CHECK(std::fabs(rb.d.get(l) - r.d) <= 1e-13 * std::fmax(1.0, std::fabs(r.d)));
    CHECK(std::fabs(rb.v.get(l) - r.v) <= 1e-13 * std::fmax(1.0, std::fabs(r.v)));
  }
}

}  // namespace

TEST_CASE("dual numbers: each function's derivative, on numbers and on batches", "[gradient][dual]") {
  check_dual("abs", [](auto x) { return xsimd::abs(x); }, -0.7);
  check_dual("fabs", [](auto x) { using std::fabs; return fabs(x); }, 0.7);
  check_dual("sqrt", [](auto x) { using std::sqrt; return sqrt(x); }, 2.5);
  check_dual("cbrt", [](auto x) { using std::cbrt; return cbrt(x); }, 2.5);
  check_dual("exp", [](auto x) { using std::exp; return exp(x); }, 1.3);
  check_dual("exp2", [](auto x) { return xsimd::exp2(x); }, 1.3);
  check_dual("expm1", [](auto x) { using std::expm1; return expm1(x); }, 0.3);
  check_dual("log", [](auto x) { using std::log; return log(x); }, 1.7);
  check_dual("log2", [](auto x) { using std::log2; return log2(x); }, 1.7);
  check_dual("log10", [](auto x) { using std::log10; return log10(x); }, 1.7);
  check_dual("log1p", [](auto x) { using std::log1p; return log1p(x); }, 0.2);
  check_dual("sin", [](auto x) { using std::sin; return sin(x); }, 0.9);
  check_dual("cos", [](auto x) { return xsimd::cos(x); }, 0.9);
  check_dual("tan", [](auto x) { using std::tan; return tan(x); }, 0.4);
  check_dual("asin", [](auto x) { using std::asin; return asin(x); }, 0.4);
  check_dual("acos", [](auto x) { using std::acos; return acos(x); }, 0.4);
  check_dual("atan", [](auto x) { using std::atan; return atan(x); }, 0.4);
  check_dual("sinh", [](auto x) { using std::sinh; return sinh(x); }, 0.8);
  check_dual("cosh", [](auto x) { using std::cosh; return cosh(x); }, 0.8);
  check_dual("tanh", [](auto x) { using std::tanh; return tanh(x); }, 0.8);
  check_dual("erf", [](auto x) { using std::erf; return erf(x); }, 0.8);
  check_dual("pow(x, 2.5)", [](auto x) { using std::pow; return pow(x, 2.5); }, 1.4);
  check_dual("pow(x, -3)", [](auto x) { using std::pow; return pow(x, -3); }, -1.4);
  check_dual("pow(2, x)", [](auto x) { return xsimd::pow(decltype(x)(2), x); }, 1.4);
  check_dual("x^x", [](auto x) { return xsimd::pow(x, x); }, 1.4);
  check_dual("min", [](auto x) { return xsimd::min(x * x, decltype(x)(1)); }, 0.6);
  check_dual("max", [](auto x) { return xsimd::max(x * x, decltype(x)(1)); }, 0.6);
  check_dual("fma", [](auto x) { using std::fma; return fma(x, x, x); }, 0.6);
  check_dual("arithmetic", [](auto x) { return (3 * x - 0.5) / (x * x + 1) + 2.0 / x - x; }, 0.6);
  check_dual("compound", [](auto x) { auto y = x; y *= x; y += 2; y /= x; y -= x; return -y; }, 0.6);
  check_dual("soft cap", [](auto x) { using std::tanh; return 5.0 * tanh(x / 5.0); }, 3.0);
  // select on a batch picks per lane; a bool picks for a number.
  using B = xsimd::batch<double>;
  const dual<B> x(B(2.0), B(1.0));
  const dual<B> s = xsimd::select(x > dual<B>(1.0), x * x, -x);
  CHECK(s.d.get(0) == 4.0);
  CHECK(xsimd::select(false, dual<double>(2.0, 1.0), dual<double>(3.0, 5.0)).d == 5.0);
  // One-sided where there is no derivative.
  CHECK(xsimd::abs(dual<double>(0.0, 1.0)).d == 0.0);
  CHECK(decltype(x)(30).d.get(0) == 0.0);
  // A constant's derivative takes no part: (2x)′ is 2 at x = ∞, not
  // 1·2 + ∞·0 = NaN; a function of constants is a constant (d = 0).
  const double inf = std::numeric_limits<double>::infinity();
  CHECK((dual<double>(inf, 1.0) * dual<double>(2.0)).d == 2.0);
  CHECK((dual<double>(inf, 1.0) / dual<double>(2.0)).d == 0.5);
  CHECK((dual<double>(inf, 1.0) - dual<double>(inf)).d == 1.0);
  CHECK((dual<B>(B(inf), B(1.0)) * 3.0).d.get(0) == 3.0);
  CHECK(tanh(dual<double>(0.5) * dual<double>(inf)).d == 0.0);
  // A default-made dual is a variable whose parts are set afterwards.
  dual<double> y;
  y.v = 3.0, y.d = 1.0;
  CHECK((y * y).d == 6.0);
}

namespace {

// Σ dO ∘ f(), in long double.
template <class F>
ref::real loss(F f, const dmat& dO) {
  const auto o = f();
  ref::real s = 0;
  for (std::size_t i = 0; i < o.rows(); ++i)
    for (std::size_t j = 0; j < o.cols(); ++j) s += static_cast<ref::real>(o(i, j)) * dO(i, j);
  return s;
}

// The largest gap between g and the central differences of the loss over
// every entry of x. Step 1e-5: the O(h²) error (third derivatives of a few
// units: below 1e-9) and the loss's rounding over 2h (1e-16 / 1e-5) stay
// below 1e-8 against gradients of order 1; terms with a kink (|q − k|) are
// at least 1e-3 from it in these data, past the step.
template <class F, class G>
double worst_gap(F f, dmat& x, const G& g, const dmat& dO) {
  const double h = 1e-5;
  double worst = 0;
  for (std::size_t i = 0; i < x.rows(); ++i)
    for (std::size_t j = 0; j < x.cols(); ++j) {
      const double keep = x(i, j);
      x(i, j) = keep + h;
      const ref::real up = loss(f, dO);
      x(i, j) = keep - h;
      const ref::real down = loss(f, dO);
      x(i, j) = keep;
      worst = std::fmax(worst, std::fabs(double(g(i, j)) - static_cast<double>((up - down) / (2 * h))));
    }
  return worst;
}

struct operands {
  dmat Q, K, V, dO;
  operands(std::size_t n, std::size_t m, std::size_t d, std::size_t dv, std::uint32_t seed)
      : Q(n, d), K(m, d), V(m, dv), dO(n, dv) {
    ref::rng rng(seed);
    rng.fill(Q, -1, 1);
    rng.fill(K, -1, 1);
    rng.fill(V);
    rng.fill(dO);
  }
};

}  // namespace

TEST_CASE("score_mod's gradient, through the user's functor, agrees with central differences", "[gradient][score_mod]") {
  operands x(9, 13, 5, 3, 21);
  dmat &Q = x.Q, &K = x.K, &V = x.V, &dO = x.dO;  // (references, not a structured binding: clang 14 cannot capture one)
  const auto cap = [](auto s, auto, auto) { using std::tanh; return 2.0 * tanh(s / 2.0); };
  const auto alibi = [](auto s, auto i, auto j) { return s - 0.25 * (i - j); };
  // causal around the modifier, as the fused form has it; and n ≠ m.
  const auto soft = [&] { return eval(softmax(causal(score_mod(Q * transpose(K) * 3.0, cap))) * V, naive); };
  const auto [dQ, dK, dV] = gradient(softmax(causal(score_mod(Q * transpose(K) * 3.0, cap))) * V, dO, wrt(Q, K, V));
  CHECK(worst_gap(soft, Q, dQ, dO) < 1e-8);
  CHECK(worst_gap(soft, K, dK, dO) < 1e-8);
  CHECK(worst_gap(soft, V, dV, dO) < 1e-8);
  const auto tilt = [&] { return eval(softmax(score_mod(Q * transpose(K), alibi)) * V, naive); };
  const auto [aQ, aK] = gradient(softmax(score_mod(Q * transpose(K), alibi)) * V, dO, wrt(Q, K));
  CHECK(worst_gap(tilt, Q, aQ, dO) < 1e-8);
  CHECK(worst_gap(tilt, K, aK, dO) < 1e-8);
  // Soft-capping bounds the scores' slope: without it the gradient differs.
  const auto [plainQ] = gradient(softmax(causal(Q * transpose(K) * 3.0)) * V, dO, wrt(Q));
  CHECK_FALSE(test::same_bits(plainQ, dQ));
}

TEST_CASE("user similarity terms differentiate themselves, with and without the component index", "[gradient][similarity]") {
  operands x(7, 11, 6, 4, 5);
  dmat &Q = x.Q, &K = x.K, &V = x.V, &dO = x.dO;  // (references, not a structured binding: clang 14 cannot capture one)
  // The data keep |q − k| ≥ 1e-3, away from the kink of |·|.
  for (std::size_t i = 0; i < Q.rows(); ++i)
    for (std::size_t j = 0; j < K.rows(); ++j)
      for (std::size_t c = 0; c < Q.cols(); ++c) REQUIRE(std::fabs(Q(i, c) - K(j, c)) >= 1e-3);
  const auto neg_l1 = [](auto q, auto k) { return -xsimd::abs(q - k); };
  const auto l1 = [&] { return eval(softmax(similarity(Q, K, neg_l1)) * V, naive); };
  const auto [dQ, dK] = gradient(softmax(similarity(Q, K, neg_l1)) * V, dO, wrt(Q, K));
  CHECK(worst_gap(l1, Q, dQ, dO) < 1e-8);
  CHECK(worst_gap(l1, K, dK, dO) < 1e-8);
  // A weighted term: f(q, k, c) = (1 + c)·q·k, and masked(·, pred), whose
  // hidden keys get exactly nothing.
  const auto weighted = [](auto q, auto k, std::size_t c) { return decltype(q)(1.0 + double(c)) * q * k; };
  const auto even = [](std::size_t i, std::size_t j) { return (i + j) % 2 == 0 || j == 0; };
  const auto w = [&] { return eval(softmax(masked(similarity(Q, K, weighted), even)) * V, naive); };
  const auto [wQ, wK] = gradient(softmax(masked(similarity(Q, K, weighted), even)) * V, dO, wrt(Q, K));
  CHECK(worst_gap(w, Q, wQ, dO) < 1e-8);
  CHECK(worst_gap(w, K, wK, dO) < 1e-8);
  // Key 1 is seen by the odd rows only: its gradient sums those rows.
  const auto [d1] = gradient(softmax(masked(similarity(Q, K, weighted), [](std::size_t, std::size_t j) { return j != 1; })) * V,
                             dO, wrt(K));
  for (std::size_t c = 0; c < K.cols(); ++c) CHECK(d1(1, c) == 0.0);
}

TEST_CASE("the built-in similarities' gradients, their weights included, agree with central differences", "[gradient][similarity]") {
  operands x(8, 10, 5, 3, 17);
  dmat &Q = x.Q, &K = x.K, &V = x.V, &dO = x.dO;  // (references, not a structured binding: clang 14 cannot capture one)
  ref::rng rng(3);
  SECTION("bilinear: Q, K and W") {
    dmat W(5, 5);
    rng.fill(W, -1, 1);
    const auto f = [&] { return eval(softmax(similarity(Q, K, bilinear(W))) * V, naive); };
    const auto [dQ, dK, dW] = gradient(softmax(similarity(Q, K, bilinear(W))) * V, dO, wrt(Q, K, W));
    CHECK(worst_gap(f, Q, dQ, dO) < 1e-8);
    CHECK(worst_gap(f, K, dK, dO) < 1e-8);
    CHECK(worst_gap(f, W, dW, dO) < 1e-8);
  }
  SECTION("additive: Q, K, Wq, Wk and w, as a row and as a column") {
    dmat Wq(5, 4), Wk(5, 4), w(1, 4), wc(4, 1);
    rng.fill(Wq, -1, 1);
    rng.fill(Wk, -1, 1);
    rng.fill(w, -2, 2);
    for (std::size_t c = 0; c < 4; ++c) wc(c, 0) = w(0, c);
    const auto f = [&] { return eval(softmax(similarity(Q, K, additive(Wq, Wk, w))) * V, naive); };
    const auto [dQ, dK, dWq, dWk, dw] =
        gradient(softmax(similarity(Q, K, additive(Wq, Wk, w))) * V, dO, wrt(Q, K, Wq, Wk, w));
    CHECK(worst_gap(f, Q, dQ, dO) < 1e-8);
    CHECK(worst_gap(f, K, dK, dO) < 1e-8);
    CHECK(worst_gap(f, Wq, dWq, dO) < 1e-8);
    CHECK(worst_gap(f, Wk, dWk, dO) < 1e-8);
    CHECK(worst_gap(f, w, dw, dO) < 1e-8);
    const auto [dwc] = gradient(softmax(similarity(Q, K, additive(Wq, Wk, wc))) * V, dO, wrt(wc));
    for (std::size_t c = 0; c < 4; ++c) CHECK(dwc(c, 0) == Approx(dw(0, c)).epsilon(1e-12));
  }
  SECTION("cosine: Q and K (a row of zeros stays zeros, and passes back zeros)") {
    for (std::size_t c = 0; c < 5; ++c) K(3, c) = 0;
    const auto f = [&] { return eval(softmax(similarity(Q, K, cosine) * 4.0) * V, naive); };
    const auto [dQ, dK] = gradient(softmax(similarity(Q, K, cosine) * 4.0) * V, dO, wrt(Q, K));
    CHECK(worst_gap(f, Q, dQ, dO) < 1e-8);
    for (std::size_t c = 0; c < 5; ++c) CHECK(dK(3, c) == 0.0);
    for (std::size_t c = 0; c < 5; ++c) K(3, c) = 0.5;  // elsewhere than 0, central differences apply
    const auto [dK2] = gradient(softmax(similarity(Q, K, cosine) * 4.0) * V, dO, wrt(K));
    CHECK(worst_gap(f, K, dK2, dO) < 1e-8);
  }
  SECTION("neg_sq_l2: Q and K") {
    const auto f = [&] { return eval(softmax(similarity(Q, K, neg_sq_l2)) * V, naive); };
    const auto [dQ, dK] = gradient(softmax(similarity(Q, K, neg_sq_l2)) * V, dO, wrt(Q, K));
    CHECK(worst_gap(f, Q, dQ, dO) < 1e-8);
    CHECK(worst_gap(f, K, dK, dO) < 1e-8);
  }
  SECTION("normalize_rows on its own, and self-attention through a projection into a user term") {
    dmat X(8, 5), W(5, 5);
    rng.fill(X, -1, 1);
    rng.fill(W, -1, 1);
    const auto g = [&] { return eval(normalize_rows(X) * W, naive); };
    dmat dOx(8, 5);
    rng.fill(dOx);
    const auto [dX, dW] = gradient(normalize_rows(X) * W, dOx, wrt(X, W));
    CHECK(worst_gap(g, X, dX, dOx) < 1e-8);
    CHECK(worst_gap(g, W, dW, dOx) < 1e-8);
    const auto term = [](auto q, auto k) { using std::tanh; return tanh(q) * k; };
    const auto h = [&] { return eval(softmax(similarity(X * W, X, term)) * X, naive); };
    const auto [sX, sW] = gradient(softmax(similarity(X * W, X, term)) * X, dOx, wrt(X, W));
    CHECK(worst_gap(h, X, sX, dOx) < 1e-8);
    CHECK(worst_gap(h, W, sW, dOx) < 1e-8);
  }
}

TEST_CASE("extension gradients in float are the double ones to within float's rounding", "[gradient][similarity]") {
  // The same steps in float as in double, from the same (float) inputs:
  // scores of 6 terms of size ≤ 2, weights and their backward as for the
  // plain attention (gradient_reference.hpp), the functor's derivative a few
  // ulps. Normwise, that is within (6 + m + 20)·u·Σ of the largest gradient
  // (Σ ≤ 4 here: |dO|, |V| ≤ 1, |dS| ≤ 2·|P|): 1e-4 absolute covers it
  // against 1e-5 found; a backward that lost a term would be off by 1e-2.
  const std::size_t n = 19, m = 37, d = 6;
  ref::rng rng(8);
  matrix<float, dyn, dyn> Q(n, d), K(m, d), V(m, 3), dO(n, 3);
  rng.fill(Q, -1, 1);
  rng.fill(K, -1, 1);
  rng.fill(V);
  rng.fill(dO);
  const auto widened = [](const matrix<float, dyn, dyn>& a) {
    dmat r(a.rows(), a.cols());
    for (std::size_t i = 0; i < a.rows(); ++i)
      for (std::size_t j = 0; j < a.cols(); ++j) r(i, j) = a(i, j);
    return r;
  };
  const dmat Qd = widened(Q), Kd = widened(K), Vd = widened(V), dOd = widened(dO);
  const auto neg_l1 = [](auto q, auto k) { return -xsimd::abs(q - k); };
  const auto cap = [](auto s, auto, auto) { using std::tanh; return 3.0f * tanh(s / 3.0f); };
  const auto capd = [](auto s, auto, auto) { using std::tanh; return 3.0 * tanh(s / 3.0); };
  const auto [fQ, fK] = gradient(softmax(causal(score_mod(similarity(Q, K, neg_l1), cap))) * V, dO, wrt(Q, K));
  const auto [gQ, gK] = gradient(softmax(causal(score_mod(similarity(Qd, Kd, neg_l1), capd))) * Vd, dOd, wrt(Qd, Kd));
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t c = 0; c < d; ++c) worst = std::fmax(worst, std::fabs(fQ(i, c) - gQ(i, c))), scale = std::fmax(scale, std::fabs(gQ(i, c)));
  for (std::size_t j = 0; j < m; ++j)
    for (std::size_t c = 0; c < d; ++c) worst = std::fmax(worst, std::fabs(fK(j, c) - gK(j, c))), scale = std::fmax(scale, std::fabs(gK(j, c)));
  CHECK(scale > 0.05);
  CHECK(worst < 1e-4);
}

namespace {
// A term weighted by a table of the user's, which it names in operands().
struct table_term {
  const dmat* t;
  template <class V>
  V operator()(const V& q, const V& k, std::size_t c) const { return V((*t)(0, c)) * q * k; }
  auto operands() const { return std::tie(*t); }
};
}  // namespace

TEST_CASE("a matrix a functor reads through operands() is its constant: asking for its gradient throws", "[gradient][similarity]") {
  operands x(4, 5, 3, 2, 1);
  dmat T(1, 3);
  ref::rng rt(2);
  rt.fill(T);
  const auto e = softmax(similarity(x.Q, x.K, table_term{&T})) * x.V;
  CHECK_THROWS_AS(gradient(e, x.dO, wrt(T)), std::invalid_argument);
  const auto [dQ] = gradient(e, x.dO, wrt(x.Q));  // the rest still works
  CHECK(dQ.rows() == 4);
}

TEST_CASE("extension gradients on tensors: grouped heads sum, as the heads' matrix gradients do", "[gradient][tensor]") {
  // 4 query heads over 2 key/value heads, a user term and soft-capping:
  // the tensor's gradients are each head's matrix gradients, a key/value
  // head's summed over its query heads in head order.
  const std::size_t H = 4, n = 9, m = 12, d = 5;
  ref::rng rng(30);
  tensor<double, dyn, dyn, dyn> Q(H, n, d), K(2, m, d), V(2, m, 3), dO(H, n, 3);
  test::fill(Q, rng), test::fill(K, rng), test::fill(V, rng), test::fill(dO, rng);
  const auto term = [](auto q, auto k) { using std::tanh; return tanh(q) * k; };
  const auto cap = [](auto s, auto, auto) { using std::tanh; return 2.0 * tanh(s / 2.0); };
  const auto [dQ, dK, dV] = gradient(softmax(causal(score_mod(similarity(Q, K, term), cap))) * V, dO, wrt(Q, K, V));
  dmat sK(m, d), sV(m, 3);
  for (std::size_t h = 0; h < H; ++h) {
    const auto q = Q.matrix_at(h), k = K.matrix_at(h / 2), v = V.matrix_at(h / 2), o = dO.matrix_at(h);
    const auto [gq, gk, gv] = gradient(softmax(causal(score_mod(similarity(q, k, term), cap))) * v, o, wrt(q, k, v));
    CHECK(test::same_bits(gq, dQ.matrix_at(h)));
    if (h % 2 == 0) sK = dmat(m, d), sV = dmat(m, 3);
    for (std::size_t j = 0; j < m; ++j) {
      for (std::size_t c = 0; c < d; ++c) sK(j, c) += gk(j, c);
      for (std::size_t c = 0; c < 3; ++c) sV(j, c) += gv(j, c);
    }
    if (h % 2 == 1) {
      CHECK(test::same_bits(sK, dK.matrix_at(h / 2)));
      CHECK(test::same_bits(sV, dV.matrix_at(h / 2)));
    }
  }
}
