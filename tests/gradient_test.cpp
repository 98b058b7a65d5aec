// gradient(e, dO, wrt(X...)) and vjp(e), node by node (grad/gradient.hpp):
// the attention's dQ, dK, dV against the long-double analytic reference with
// an error bound argued below; central finite differences in double as an
// independent check, through projections and a leaf read three times; the
// contract's small print (zeros for a leaf e does not read, vjp equal to
// gradient, exact zeros where masked, shape errors).
#include "gradient_reference.hpp"
#include "reference.hpp"
#include "support.hpp"

#include <catch2/catch.hpp>

#include <qkv/qkv.hpp>

#include <cmath>
#include <limits>

using namespace qkv;

namespace {

using ref::attention_form;

const char* name(attention_form f) {
  switch (f) {
    case attention_form::causal: return "causal";
    case attention_form::mask: return "mask with an empty row";
    case attention_form::bias: return "bias";
    default: return "plain";
  }
}

// Row n/2 keeps nothing (n > 2); elsewhere a pattern.
matrix<bool, dyn, dyn> pattern(std::size_t n, std::size_t m) {
  matrix<bool, dyn, dyn> keep(n, m);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) keep(i, j) = (i * 5 + j * 3) % 4 != 0 && !(n > 2 && i == n / 2);
  return keep;
}

template <class T, class Strategy>
auto attention(const matrix<T, dyn, dyn>& Q, const matrix<T, dyn, dyn>& K, const matrix<T, dyn, dyn>& V, T c,
               attention_form f, const matrix<bool, dyn, dyn>& keep, const matrix<T, dyn, dyn>& B,
               const matrix<T, dyn, dyn>& dO, Strategy how) {
  switch (f) {
    case attention_form::causal: return gradient(softmax(causal(Q * transpose(K)) * c) * V, dO, wrt(Q, K, V), how);
    case attention_form::mask: return gradient(softmax(masked(Q * transpose(K) * c, keep)) * V, dO, wrt(Q, K, V), how);
    case attention_form::bias: return gradient(softmax(Q * transpose(K) * c + B) * V, dO, wrt(Q, K, V), how);
    default: return gradient(softmax(Q * transpose(K) * c) * V, dO, wrt(Q, K, V), how);
  }
}

}  // namespace

// Shapes across the fused kernel's tails: query blocks of 64 to 66 rows
// (with MR = 4, 6 or 8), key tiles of 64, vector widths 2 to 16.
TEMPLATE_TEST_CASE("the attention backward, node by node and fused, matches the reference within its bound",
                   "[gradient]", float, double) {
  using T = TestType;
  const auto [n, m, dk, dv] = GENERATE(table<std::size_t, std::size_t, std::size_t, std::size_t>(
      {{1, 1, 1, 1}, {3, 5, 4, 2}, {7, 13, 5, 3}, {17, 9, 8, 6}, {33, 70, 17, 9}, {70, 33, 64, 40},
       {67, 130, 33, 17}, {140, 65, 16, 64}}));
  for (attention_form f : {attention_form::plain, attention_form::causal, attention_form::mask, attention_form::bias}) {
    INFO("n = " << n << ", m = " << m << ", dk = " << dk << ", dv = " << dv << ", " << name(f));
    ref::rng rng(static_cast<std::uint32_t>(n * 13 + m * 5 + dk));
    matrix<T, dyn, dyn> Q(n, dk), K(m, dk), V(m, dv), dO(n, dv), B(n, m);
    rng.fill(Q, -2, 2);
    rng.fill(K, -2, 2);
    rng.fill(V);
    rng.fill(dO);
    rng.fill(B, -3, 3);
    const auto keep = pattern(n, m);
    const T c = T(1) / std::sqrt(T(dk));
    using R = ref::real_for<T>;
    const ref::mat_for<T> rb = ref::from<R>(B);
    for (const bool fused_pass : {false, true}) {
      INFO((fused_pass ? "fused" : "node by node"));
      const auto [dQ, dK, dV] = fused_pass ? attention(Q, K, V, c, f, keep, B, dO, qkv::fused)
                                           : attention(Q, K, V, c, f, keep, B, dO, naive);
      const auto r = ref::attention_backward<T>(ref::from<R>(Q), ref::from<R>(K), ref::from<R>(V), ref::from<R>(dO),
                                                static_cast<R>(c), f, keep, &rb, fused_pass);
      CHECK(ref::worst_ratio(dQ, r.dq, r.bq) <= 1);
      CHECK(ref::worst_ratio(dK, r.dk, r.bk) <= 1);
      CHECK(ref::worst_ratio(dV, r.dv, r.bv) <= 1);
      if (f == attention_form::mask && n > 2)
        for (std::size_t j = 0; j < dk; ++j) CHECK(dQ(n / 2, j) == T(0));  // a row that sees nothing: exactly 0
    }
  }
}

namespace {

// Σ dO ∘ f(), in long double.
template <class F>
ref::real loss(F f, const matrix<double, dyn, dyn>& dO) {
  const auto o = f();
  ref::real s = 0;
  for (std::size_t i = 0; i < o.rows(); ++i)
    for (std::size_t j = 0; j < o.cols(); ++j) s += static_cast<ref::real>(o(i, j)) * dO(i, j);
  return s;
}

// Central differences of the loss in x(i, j), step h: error O(h²) from the
// third derivative (entries and scores of a few units: below 1e-9 at h =
// 1e-5) plus the loss's rounding over 2h (1e-16 / 1e-5): 1e-7 covers both
// with room, against gradients of order 1.
template <class F>
double central(F f, matrix<double, dyn, dyn>& x, std::size_t i, std::size_t j, const matrix<double, dyn, dyn>& dO) {
  const double h = 1e-5, keep = x(i, j);
  x(i, j) = keep + h;
  const ref::real up = loss(f, dO);
  x(i, j) = keep - h;
  const ref::real down = loss(f, dO);
  x(i, j) = keep;
  return static_cast<double>((up - down) / (2 * h));
}

}  // namespace

TEST_CASE("gradients agree with central differences through projections and a leaf read three times", "[gradient]") {
  // Self-attention over X with projections: X reaches the result through
  // Q = X Wq, K = X Wk and V = X Wv, so dX sums three paths.
  const std::size_t n = 11, d = 6, a = 5;
  ref::rng rng(9);
  matrix<double, dyn, dyn> X(n, d), Wq(d, a), Wk(d, a), Wv(d, 4), dO(n, 4);
  rng.fill(X);
  rng.fill(Wq);
  rng.fill(Wk);
  rng.fill(Wv);
  rng.fill(dO);
  const double c = 1 / std::sqrt(double(a));
  auto forward = [&] { return eval(softmax(causal((X * Wq) * transpose(X * Wk)) * c) * (X * Wv), naive); };
  const auto [dX, dWq, dWv] = gradient(softmax(causal((X * Wq) * transpose(X * Wk)) * c) * (X * Wv), dO, wrt(X, Wq, Wv));
  double worst = 0;
  for (std::size_t i = 0; i < n; i += 2)
    for (std::size_t j = 0; j < d; ++j) worst = std::max(worst, std::fabs(dX(i, j) - central(forward, X, i, j, dO)));
  for (std::size_t i = 0; i < d; ++i)
    for (std::size_t j = 0; j < a; ++j) worst = std::max(worst, std::fabs(dWq(i, j) - central(forward, Wq, i, j, dO)));
  for (std::size_t i = 0; i < d; ++i)
    for (std::size_t j = 0; j < 4; ++j) worst = std::max(worst, std::fabs(dWv(i, j) - central(forward, Wv, i, j, dO)));
  CHECK(worst < 1e-7);

  // Q = K = V = X: the sum of the three gradients of separate leaves.
  matrix<double, dyn, dyn> Y(n, d), dY(n, d);
  rng.fill(Y);
  rng.fill(dY);
  const auto [dSelf] = gradient(softmax(Y * transpose(Y) * c) * Y, dY, wrt(Y));
  const matrix<double, dyn, dyn> Q = Y, K = Y, V = Y;
  const auto [dQ, dK, dV] = gradient(softmax(Q * transpose(K) * c) * V, dY, wrt(Q, K, V));
  double gap = 0;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < d; ++j) gap = std::max(gap, std::fabs(dSelf(i, j) - (dQ(i, j) + dK(i, j) + dV(i, j))));
  CHECK(gap < 1e-13);
  // A leaf named twice has the same sum twice: the first path's gradient
  // becomes one sum and is copied into the other, the later paths add to both.
  const auto [dSelf1, dSelf2] = gradient(softmax(Y * transpose(Y) * c) * Y, dY, wrt(Y, Y));
  CHECK(test::same_bits(dSelf1, dSelf));
  CHECK(test::same_bits(dSelf2, dSelf));
}

TEST_CASE("gradient: zeros for what e does not read, views name their leaf, vjp is gradient", "[gradient]") {
  ref::rng rng(4);
  matrix<float, 6, 4> Q, K;
  matrix<float, 6, 3> V, dO;
  matrix<float, 2, 2> unused;
  rng.fill(Q);
  rng.fill(K);
  rng.fill(V);
  rng.fill(dO);
  rng.fill(unused);
  const auto e = softmax(Q * transpose(K) / sqrt(dim<4>)) * V;
  const auto [dQ, dU, dV] = gradient(e, dO, wrt(Q, unused, V));
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(dQ)>, matrix<float, 6, 4>>);  // static extents kept
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 2; ++j) CHECK(dU(i, j) == 0.0f);
  // A view with the same data, extents and strides names the same leaf.
  const matrix_view<const float, dyn, dyn> Qv(Q);
  const auto [dQv] = gradient(e, dO, wrt(Qv));
  CHECK(test::same_bits(dQv, dQ));
  // The fused backward's dK, moved into the first sum, copied into the second.
  const matrix<float, dyn, dyn> Qd = Q, Kd = K, Vd = V, dOd = dO;
  const auto ed = softmax(Qd * transpose(Kd) / sqrt(dim<4>)) * Vd;
  const auto [dK1, dQd, dK2] = gradient(ed, dOd, wrt(Kd, Qd, Kd));
  const auto [dKd] = gradient(ed, dOd, wrt(Kd));
  CHECK(test::same_bits(dK1, dKd));
  CHECK(test::same_bits(dK2, dKd));
  CHECK(test::same_bits(dQd, std::get<0>(gradient(ed, dOd, wrt(Qd)))));
  // vjp: the value is eval(e), and the pullback gives gradient's bits, as often as asked.
  const auto [O, back] = vjp(e);
  CHECK(test::same_bits(O, eval(e)));
  for (int twice = 0; twice < 2; ++twice) {
    const auto [dQ2, dV2] = back(dO, wrt(Q, V));
    CHECK(test::same_bits(dQ2, dQ));
    CHECK(test::same_bits(dV2, dV));
  }
}

TEST_CASE("gradient: dO of another shape is a shape_error", "[gradient]") {
  matrix<float, dyn, dyn> Q(4, 3), K(5, 3), V(5, 2), dO(4, 3);
  CHECK_THROWS_AS(gradient(softmax(Q * transpose(K)) * V, dO, wrt(Q)), shape_error);
}

TEST_CASE("gradient: float queries over a bf16 cache give the float gradients, rounded once for K and V", "[gradient][half]") {
  const std::size_t n = 9, m = 14, d = 6;
  ref::rng rng(12);
  matrix<float, dyn, dyn> Q(n, d), dO(n, d), Kf(m, d), Vf(m, d);
  matrix<bf16, dyn, dyn> K(m, d), V(m, d);
  rng.fill(Q);
  rng.fill(dO);
  rng.fill(K);
  rng.fill(V);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < d; ++j) Kf(i, j) = K(i, j), Vf(i, j) = V(i, j);
  const auto [dQ, dK, dV] = gradient(softmax(causal(Q * transpose(K)) / 2.0f) * V, dO, wrt(Q, K, V));
  const auto [dQf, dKf, dVf] = gradient(softmax(causal(Q * transpose(Kf)) / 2.0f) * Vf, dO, wrt(Q, Kf, Vf));
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(dK)>, matrix<bf16, dyn, dyn>>);
  CHECK(test::same_bits(dQ, dQf));
  bool rounded = true;
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < d; ++j)
      rounded = rounded && dK(i, j).bits() == bf16(dKf(i, j)).bits() && dV(i, j).bits() == bf16(dVf(i, j)).bits();
  CHECK(rounded);
}

TEMPLATE_TEST_CASE("gradient: expressions on bf16 or f16 alone are the float gradients of the same values, rounded once",
                   "[gradient][half]", bf16, f16) {
  using H = TestType;
  const std::size_t n = 19, m = 26, d = 8;
  ref::rng rng(14);
  matrix<H, dyn, dyn> Q(n, d), K(m, d), V(m, d), dO(n, d);
  rng.fill(Q, -2, 2), rng.fill(K, -2, 2), rng.fill(V), rng.fill(dO);
  const auto widened = [](const matrix<H, dyn, dyn>& a) {
    matrix<float, dyn, dyn> r(a.rows(), a.cols());
    for (std::size_t i = 0; i < a.rows(); ++i)
      for (std::size_t j = 0; j < a.cols(); ++j) r(i, j) = float(a(i, j));
    return r;
  };
  const auto Qf = widened(Q), Kf = widened(K), Vf = widened(V), dOf = widened(dO);
  const auto cap = [](auto s, auto, auto) { using std::tanh; return 4.0f * tanh(s / 4.0f); };
  const auto rounded = [](const matrix<H, dyn, dyn>& g, const matrix<float, dyn, dyn>& f) {
    bool same = true;
    for (std::size_t i = 0; i < g.rows(); ++i)
      for (std::size_t j = 0; j < g.cols(); ++j) same = same && g(i, j).bits() == H(f(i, j)).bits();
    return same;
  };
  const auto e = softmax(causal(score_mod(Q * transpose(K) / 3.0f, cap))) * V;
  const auto ef = softmax(causal(score_mod(Qf * transpose(Kf) / 3.0f, cap))) * Vf;
  const auto [dQ, dK, dV] = gradient(e, dO, wrt(Q, K, V));
  const auto [fQ, fK, fV] = gradient(ef, dOf, wrt(Qf, Kf, Vf));
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(dQ)>, matrix<H, dyn, dyn>>);
  CHECK(rounded(dQ, fQ));
  CHECK(rounded(dK, fK));
  CHECK(rounded(dV, fV));
  const auto [nQ, nK, nV] = gradient(e, dO, wrt(Q, K, V), naive);
  const auto [gQ, gK, gV] = gradient(ef, dOf, wrt(Qf, Kf, Vf), naive);
  CHECK(rounded(nQ, gQ));
  CHECK(rounded(nK, gK));
  CHECK(rounded(nV, gV));
  // vjp's value is eval(e), bit for bit, and its pullback gradient's.
  const auto [O, back] = vjp(e);
  CHECK(test::same_bits(O, eval(e)));
  const auto [bQ, bK, bV] = back(dO, wrt(Q, K, V));
  CHECK(test::same_bits(bQ, dQ));
  CHECK(test::same_bits(bK, dK));
  CHECK(test::same_bits(bV, dV));
}
