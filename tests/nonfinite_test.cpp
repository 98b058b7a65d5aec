// Scores too large for the fused kernel's folded scale, and NaN or ±∞ in key
// and value rows that a mask hides: every strategy, decoding and blocked,
// gives what the rule says (docs/api.md, "What a masked key reads").
#include <catch2/catch.hpp>

#include "support.hpp"

#include <qkv/qkv.hpp>

#include <cmath>
#include <cstddef>
#include <limits>

using namespace qkv;

namespace {

using fmat = matrix<float, dyn, dyn>;

// Every strategy's result of e, in one list.
template <class E>
void for_each_strategy(const E& e, auto&& check) {
  check("naive", eval(e, naive));
  check("fused", eval(e, fused));
}

}  // namespace

TEST_CASE("huge scaled scores: the issue's example gives 1 in every strategy", "[nonfinite][attention]") {
  for (const float q : {1e10f, 3e9f, -1e10f}) {
    const fmat Q{{q}}, K{{1.f}, {0.999f}}, V{{1.f}, {2.f}};
    // Scores 3q and 2.997q: the larger takes all the weight (e^(−0.003·3q) is 0).
    const float expected = q > 0 ? 1.f : 2.f;
    for_each_strategy(softmax(Q * transpose(K) * 3.0f) * V, [&](const char* how, const fmat& O) {
      INFO(how << ", q = " << q);
      CHECK(O(0, 0) == expected);
    });
  }
}

TEST_CASE("huge scaled scores: the largest score takes all the weight, any shape", "[nonfinite][attention]") {
  // Q(i, 0) = ±1e9 and K(j, 0) = j / m: scores 3e9·q·k, neighbours 3e9/m ≥ 2e6
  // apart, so the row's weight is exactly 1 on its largest visible score and
  // exactly 0 elsewhere, and the output is that key's value row, bit for bit.
  // Every |score| above 2²⁴ is past the point where the fold of the scale
  // into the exponent would round m by more than exp can take.
  for (const std::size_t n : {1, 3, 70}) {
    for (const std::size_t m : {5, 300, 1100}) {
      for (const bool is_causal : {false, true}) {
        fmat Q(n, 2), K(m, 2), V(m, 3);
        for (std::size_t i = 0; i < n; ++i) Q(i, 0) = (i % 2 ? -1e9f : 1e9f), Q(i, 1) = 1.f;
        for (std::size_t j = 0; j < m; ++j) {
          K(j, 0) = static_cast<float>(j) / static_cast<float>(m);
          for (std::size_t c = 0; c < 3; ++c) V(j, c) = static_cast<float>(j * 3 + c);
        }
        const auto check = [&](const char* how, const fmat& O) {
          INFO(how << ": n = " << n << ", m = " << m << (is_causal ? ", causal" : ""));
          for (std::size_t i = 0; i < n; ++i) {
            if (is_causal && i + m < n) continue;  // nothing visible: zeros, tested elsewhere
            const std::size_t last = is_causal ? i + m - n : m - 1;
            const std::size_t best = i % 2 ? 0 : std::min(last, m - 1);
            for (std::size_t c = 0; c < 3; ++c) REQUIRE(O(i, c) == V(best, c));
          }
        };
        if (is_causal) for_each_strategy(softmax(causal(Q * transpose(K) * 3.0f)) * V, check);
        else for_each_strategy(softmax(Q * transpose(K) * 3.0f) * V, check);
      }
    }
  }
}

TEST_CASE("NaN in a value row that causal hides reaches no row that cannot see it", "[nonfinite][mask]") {
  // Q and K zero: every visible key weighs the same, so row i is the mean of
  // V's rows 0..i + m − n; the last key's value is NaN, seen only by the last row.
  for (const std::size_t n : {1, 2, 4, 5, 6, 17, 70, 300}) {
    const fmat Q(n, 4), K(n, 4);
    fmat V(n, 3);
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t c = 0; c < 3; ++c) V(j, c) = 1.f + static_cast<float>(c);
    V(n - 1, 0) = std::numeric_limits<float>::quiet_NaN();
    V(n - 1, 2) = std::numeric_limits<float>::infinity();
    for_each_strategy(softmax(causal(Q * transpose(K))) * V, [&](const char* how, const fmat& O) {
      INFO(how << ": n = " << n);
      // Each weight is 1/(keys seen) within a few u, and the weighted sum of
      // up to n equal values is within γ_n: (n + 5)·ε, relative, covers both.
      const double tolerance = static_cast<double>(n + 5) * std::numeric_limits<float>::epsilon();
      for (std::size_t i = 0; i + 1 < n; ++i)
        for (std::size_t c = 0; c < 3; ++c)
          REQUIRE(O(i, c) == Approx(1.f + static_cast<float>(c)).epsilon(tolerance));
      CHECK(std::isnan(O(n - 1, 0)));
      CHECK(std::isinf(O(n - 1, 2)));
    });
  }
}

TEST_CASE("a padded key/value cache: masked keys are never read, whatever they hold", "[nonfinite][mask]") {
  // m keys of which the last `pad` hold NaN and ±∞ in K and V; a mask hides
  // them. The result must be the attention over the first m − pad keys, as
  // the reference computes it, within the bound of tests/reference.hpp.
  ref::rng rng(17);
  for (const std::size_t n : {1, 4, 5, 70}) {
    for (const std::size_t m : {9, 300, 1100}) {
      const std::size_t pad = m / 3, real = m - pad;
      fmat Q(n, 8), K(m, 8), V(m, 5);
      rng.fill(Q);
      rng.fill(K);
      rng.fill(V);
      matrix<bool, dyn, dyn> M(n, m);
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < real; ++j) M(i, j) = true;
      for (std::size_t j = real; j < m; ++j)
        for (std::size_t c = 0; c < 8; ++c) {
          K(j, c) = (j + c) % 2 ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
          if (c < 5) V(j, c) = (j + c) % 2 ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
        }
      const auto Kr = matrix_view<const float, dyn, dyn>(K.data(), real, 8);
      const auto Vr = matrix_view<const float, dyn, dyn>(V.data(), real, 5);
      const ref::real scale = 1 / std::sqrt(8.0L);
      const ref::mat q = ref::from(Q), k = ref::from(Kr), v = ref::from(Vr);
      const ref::mat scores = ref::scale(ref::matmul(q, ref::transpose(k)), scale);
      const ref::mat weights = ref::softmax(scores);
      const ref::mat want = ref::matmul(weights, v);
      const ref::mat bound = ref::attention_bound<float>(q, k, v, scale, scores, weights);
      const auto e = softmax(masked(Q * transpose(K) / std::sqrt(8.0f), M)) * V;
      for_each_strategy(e, [&](const char* how, const fmat& O) {
        INFO(how << ": n = " << n << ", m = " << m);
        CHECK(ref::worst_ratio(O, want, bound) <= 1);
      });
      // A predicate hides them alike.
      const auto p = softmax(masked(Q * transpose(K) / std::sqrt(8.0f), [real](std::size_t, std::size_t j) {
                       return j < real;
                     })) * V;
      for_each_strategy(p, [&](const char* how, const fmat& O) {
        INFO(how << " (predicate): n = " << n << ", m = " << m);
        CHECK(ref::worst_ratio(O, want, bound) <= 1);
      });
    }
  }
}

TEST_CASE("NaN in a value row that a row sees poisons that row, with or without masks nearby", "[nonfinite]") {
  for (const std::size_t n : {3, 70}) {
    const std::size_t m = 300;
    fmat Q(n, 4), K(m, 4), V(m, 2);
    for (std::size_t j = 0; j < m; ++j) V(j, 0) = V(j, 1) = 1.f;
    V(10, 1) = std::numeric_limits<float>::quiet_NaN();
    matrix<bool, dyn, dyn> M(n, m);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < m; ++j) M(i, j) = (i % 2 == 0) || j != 10;  // odd rows hide key 10
    for_each_strategy(softmax(masked(Q * transpose(K), M)) * V, [&](const char* how, const fmat& O) {
      INFO(how << ": n = " << n);
      for (std::size_t i = 0; i < n; ++i) {
        CHECK(O(i, 0) == Approx(1.f));
        if (i % 2 == 0) CHECK(std::isnan(O(i, 1)));
        else CHECK(O(i, 1) == Approx(1.f));
      }
    });
  }
}

TEST_CASE("gradients of a padded cache: masked keys' NaN reaches no gradient, node by node or fused", "[nonfinite][gradient]") {
  using dmat = matrix<double, dyn, dyn>;
  dmat Q(1, 1), K(2, 1), V(2, 1), dO(1, 1);
  Q(0, 0) = 0.5, K(0, 0) = 1, V(0, 0) = 2, dO(0, 0) = 1;
  K(1, 0) = std::nan(""), V(1, 0) = std::nan("");  // padding, masked for every row
  matrix<bool, dyn, dyn> M(1, 2);
  M(0, 0) = true, M(0, 1) = false;
  const auto e = softmax(masked(Q * transpose(K), M)) * V;
  // One key seen: dQ = 0, dK = (0, 0), dV = (1, 0), every strategy.
  const auto check = [](const dmat& dq, const dmat& dk, const dmat& dv) {
    CHECK(dq(0, 0) == 0.0);
    CHECK(dk(0, 0) == 0.0);
    CHECK(dk(1, 0) == 0.0);
    CHECK(dv(0, 0) == 1.0);
    CHECK(dv(1, 0) == 0.0);
  };
  {
    const auto [dq, dk, dv] = gradient(e, dO, wrt(Q, K, V), fused);
    check(dq, dk, dv);
  }
  {
    const auto [dq, dk, dv] = gradient(e, dO, wrt(Q, K, V), naive);
    check(dq, dk, dv);
  }
  {
    const auto [dq, dk, dv] = gradient(softmax(masked(similarity(Q, K, neg_sq_l2), M)) * V, dO, wrt(Q, K, V), naive);
    CHECK(std::isfinite(dq(0, 0)));
    CHECK(dk(1, 0) == 0.0);
    CHECK(dv(1, 0) == 0.0);
  }
  // A differentiated bias takes the node-by-node path by default: the same.
  dmat B(1, 2);
  B(0, 0) = 0.25, B(0, 1) = -0.5;
  const auto [dq, dk, dv, db] = gradient(softmax(masked(Q * transpose(K), M) + B) * V, dO, wrt(Q, K, V, B));
  check(dq, dk, dv);
  CHECK(db(0, 0) == 0.0);
  CHECK(db(0, 1) == 0.0);
}

TEST_CASE("values near the largest float: naive finite always, fused while the weighted sum is (pitfalls.md)",
          "[nonfinite]") {
  fmat Q(1, 4), K(2, 4), V(2, 3);
  for (std::size_t c = 0; c < 4; ++c) Q(0, c) = 1, K(0, c) = K(1, c) = 0.5f;  // two equal weights
  for (std::size_t c = 0; c < 3; ++c) V(0, c) = V(1, c) = 3e38f;
  const auto e = softmax(Q * transpose(K)) * V;
  const auto naive_out = eval(e, naive);
  for (std::size_t c = 0; c < 3; ++c) CHECK(naive_out(0, c) == Approx(3e38f).epsilon(1e-6));
  // Within the documented range, (keys seen)·max|V| = 2·1e38 < 3.4e38: fused is finite and right.
  for (std::size_t c = 0; c < 3; ++c) V(0, c) = V(1, c) = 1e38f;
  const auto fused_out = eval(e, fused);
  for (std::size_t c = 0; c < 3; ++c) CHECK(fused_out(0, c) == Approx(1e38f).epsilon(1e-6));
}
