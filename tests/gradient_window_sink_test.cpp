// Gradients through windows, sinks and the batch/head forms: node by node
// and fused against the long-double backward of gradient_reference.hpp
// (its bounds argued there), a window as a mask of its pairs and a sink as
// one more key of score σ and value 0 (so dQ, dK, dV are that problem's,
// cropped to the real keys and dimensions: its bound covers a sink score
// with no error); the batch/head forms per slice.
#include "gradient_reference.hpp"
#include "support.hpp"

#include <catch2/catch.hpp>

#include <qkv/qkv.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

using namespace qkv;

namespace {

ref::mat crop(const ref::mat& a, std::size_t rows, std::size_t cols) {
  ref::mat r(rows, cols);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) r(i, j) = a(i, j);
  return r;
}

struct in_window {
  std::size_t n, m, left, right;
  bool operator()(std::size_t i, std::size_t j) const {
    const long long ip = static_cast<long long>(i + m) - static_cast<long long>(n), jj = static_cast<long long>(j);
    return jj >= ip - static_cast<long long>(left) && jj <= ip + static_cast<long long>(right);
  }
};

}  // namespace

TEMPLATE_TEST_CASE("gradients through window(S, left, right) and softmax(S, sink), against the reference",
                   "[gradient][window][sink]", float, double) {
  using T = TestType;
  const auto [n_, m_, dk_, dv_] = GENERATE(table<std::size_t, std::size_t, std::size_t, std::size_t>(
      {{1, 40, 8, 8}, {33, 70, 17, 9}, {70, 33, 16, 24}, {67, 130, 33, 17}, {4, 300, 16, 16}}));
  const std::size_t n = n_, m = m_, dk = dk_, dv = dv_;  // (clang 14 captures no structured binding)
  const auto [left_, right_] = GENERATE(table<std::size_t, std::size_t>({{10, 0}, {3, 5}, {0, 0}}));
  const std::size_t left = left_, right = right_;  // (clang 14 captures no structured binding)
  const T sigma = GENERATE(-std::numeric_limits<T>::infinity(), T(0.5));
  INFO("n = " << n << ", m = " << m << ", dk = " << dk << ", dv = " << dv << ", left = " << left << ", right = " << right
              << ", sink = " << sigma);
  ref::rng rng(static_cast<std::uint32_t>(n * 13 + m * 5 + dk + left));
  matrix<T, dyn, dyn> Q(n, dk), K(m, dk), V(m, dv), dO(n, dv);
  rng.fill(Q, -2, 2), rng.fill(K, -2, 2), rng.fill(V), rng.fill(dO);
  const T c = T(1) / std::sqrt(T(dk));
  const bool sink = sigma != -std::numeric_limits<T>::infinity();
  // The reference problem: the sink as key m, [q 1]·[0 σ/c] = σ/c, value 0.
  const std::size_t ms = m + (sink ? 1 : 0), dks = dk + (sink ? 1 : 0);
  ref::mat q(n, dks), k(ms, dks), v(ms, dv);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t t = 0; t < dk; ++t) q(i, t) = Q(i, t);
    if (sink) q(i, dk) = 1;
  }
  for (std::size_t j = 0; j < m; ++j) {
    for (std::size_t t = 0; t < dk; ++t) k(j, t) = K(j, t);
    for (std::size_t t = 0; t < dv; ++t) v(j, t) = V(j, t);
  }
  if (sink) k(m, dk) = static_cast<ref::real>(sigma) / static_cast<ref::real>(c);
  const in_window w{n, m, left, right};
  const auto keep = [&](std::size_t i, std::size_t j) { return j == m || w(i, j); };
  const auto e = softmax(window(Q * transpose(K) * c, left, right), sigma) * V;
  for (const bool fused_pass : {false, true}) {
    INFO((fused_pass ? "fused" : "node by node"));
    const auto [dQ, dK, dV] = fused_pass ? gradient(e, dO, wrt(Q, K, V), fused) : gradient(e, dO, wrt(Q, K, V), naive);
    const ref::gradient_reference r =
        ref::attention_backward<T>(q, k, v, ref::from(dO), c, ref::attention_form::mask, keep, nullptr, fused_pass);
    CHECK(ref::worst_ratio(dQ, crop(r.dq, n, dk), crop(r.bq, n, dk)) <= 1);
    CHECK(ref::worst_ratio(dK, crop(r.dk, m, dk), crop(r.bk, m, dk)) <= 1);
    CHECK(ref::worst_ratio(dV, crop(r.dv, m, dv), crop(r.bv, m, dv)) <= 1);
    // A row whose window is empty passes back exactly 0.
    for (std::size_t i = 0; i < n; ++i) {
      bool any = false;
      for (std::size_t j = 0; j < m; ++j) any = any || w(i, j);
      if (!any)
        for (std::size_t t = 0; t < dk; ++t) CHECK(dQ(i, t) == T(0));
    }
  }
}

TEST_CASE("gradients of the batch/head forms on tensors: each slice as its matrix", "[gradient][head][tensor]") {
  const std::size_t B = 2, H = 2, n = 37, m = 50, d = 8;
  ref::rng rng(3);
  tensor<double, dyn, dyn, dyn, dyn> Q(B, H, n, d), K(B, H, m, d), V(B, H, m, d), dO(B, H, n, d);
  test::fill(Q, rng, -2, 2), test::fill(K, rng, -2, 2), test::fill(V, rng), test::fill(dO, rng);
  const auto alibi = [](auto s, std::size_t b, std::size_t h, auto i, auto j) {
    return s - decltype(s)(0.25 * double(h + 1) + 0.125 * double(b)) * (i - j);
  };
  const auto lengths = [](std::size_t b, std::size_t, std::size_t, std::size_t j) { return j < 30 + 10 * b; };
  const auto e = softmax(masked(causal(score_mod(Q * transpose(K), key_aligned(alibi))), lengths)) * V;
  for (const bool fused_pass : {false, true}) {
    INFO((fused_pass ? "fused" : "node by node"));
    const auto [dQ, dK, dV] = fused_pass ? gradient(e, dO, wrt(Q, K, V), fused) : gradient(e, dO, wrt(Q, K, V), naive);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H; ++h) {
        INFO("b = " << b << ", h = " << h);
        const double slope = 0.25 * double(h + 1) + 0.125 * double(b);
        const auto one = [slope](auto s, auto i, auto j) { return s - decltype(s)(slope) * (i - j); };
        const std::size_t len = 30 + 10 * b;
        const auto keep = [len](std::size_t, std::size_t j) { return j < len; };
        const auto q = Q.matrix_at(b, h), k = K.matrix_at(b, h), v = V.matrix_at(b, h);
        const auto g = dO.matrix_at(b, h);
        const auto es = softmax(masked(causal(score_mod(q * transpose(k), key_aligned(one))), keep)) * v;
        const auto [dq, dk, dv] = fused_pass ? gradient(es, g, wrt(q, k, v), fused) : gradient(es, g, wrt(q, k, v), naive);
        CHECK(test::same_bits(dQ.matrix_at(b, h), dq));
        CHECK(test::same_bits(dK.matrix_at(b, h), dk));
        CHECK(test::same_bits(dV.matrix_at(b, h), dv));
      }
  }
}

TEST_CASE("the gradient with respect to per-head sinks: central differences, node by node and fused", "[gradient][sink]") {
  const std::size_t B = 2, H = 4, Hk = 2, n = 37, m = 50, d = 8;
  ref::rng rng(11);
  tensor<double, dyn, dyn, dyn, dyn> Q(B, H, n, d), K(B, Hk, m, d), V(B, Hk, m, d), dO(B, H, n, d);
  test::fill(Q, rng, -2, 2), test::fill(K, rng, -2, 2), test::fill(V, rng), test::fill(dO, rng);
  matrix<double, 1, dyn> sinks(1, H);
  for (std::size_t h = 0; h < H; ++h) sinks(0, h) = 0.5 * double(h) - 0.75;
  // Each row sees its 10 keys of the window and the sink of its head.
  const auto e = [&] { return softmax(window(causal(Q * transpose(K) / 2.0), 9, 0), sinks) * V; };
  const auto loss = [&] {
    const auto o = eval(e(), naive);
    ref::real s = 0;
    for (std::size_t x = 0; x < o.size(); ++x) s += static_cast<ref::real>(o.data()[x]) * dO.data()[x];
    return s;
  };
  for (const bool fused_pass : {false, true}) {
    INFO((fused_pass ? "fused" : "node by node"));
    const auto [dS, dQ] = fused_pass ? gradient(e(), dO, wrt(sinks, Q), fused) : gradient(e(), dO, wrt(sinks, Q), naive);
    static_assert(std::is_same_v<std::remove_cvref_t<decltype(dS)>, matrix<double, 1, dyn>>);
    REQUIRE(dS.cols() == H);
    for (std::size_t h = 0; h < H; ++h) {
      INFO("head " << h);
      // Central differences, step 1e-5: O(h²) of the third derivative (below
      // 1e-9 for these few-unit scores) plus the loss's rounding over 2h
      // (1e-16 / 1e-5): 1e-7 covers both, against gradients of order 1.
      const double keep = sinks(0, h), step = 1e-5;
      sinks(0, h) = keep + step;
      const ref::real up = loss();
      sinks(0, h) = keep - step;
      const ref::real down = loss();
      sinks(0, h) = keep;
      const double want = static_cast<double>((up - down) / (2 * step));
      CHECK(std::fabs(dS(0, h) - want) <= 1e-7);
      CHECK(dS(0, h) != 0);
    }
    (void)dQ;
  }
}
