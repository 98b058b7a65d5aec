// softmax and whole attention expressions, naive strategy, against the
// reference and against the lecture's worked example.
#include <catch2/catch.hpp>

#include "laws.hpp"
#include "reference.hpp"

#include <qkv/qkv.hpp>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string_view>
#include <tuple>
#include <vector>

using namespace qkv;

TEST_CASE("the lecture's worked example (§5)", "[attention][lecture]") {
  const matrix<double, 3, 2> K{{1, 0}, {0, 1}, {1, 1}};
  const matrix<double, 3, 2> V{{10, 0}, {0, 10}, {5, 5}};
  const matrix<double, 1, 2> q{{1, 0}};

  const auto scores = eval(q * transpose(K));
  CHECK(scores(0, 0) == 1.0);
  CHECK(scores(0, 1) == 0.0);
  CHECK(scores(0, 2) == 1.0);

  const auto scaled = eval(q * transpose(K) / sqrt(dim<2>));
  CHECK(scaled(0, 0) == Approx(0.707).margin(5e-4));  // the lecture rounds to 3 places

  const auto w = eval(softmax(q * transpose(K) / sqrt(dim<2>)));
  CHECK(w(0, 0) == Approx(0.401).margin(5e-4));
  CHECK(w(0, 1) == Approx(0.198).margin(5e-4));
  CHECK(w(0, 2) == Approx(0.401).margin(5e-4));
  CHECK(w(0, 0) + w(0, 1) + w(0, 2) == Approx(1.0).epsilon(1e-15));

  // The lecture prints (6.015, 3.985) from weights rounded to three places;
  // the exact output is 5 + 5·(e^{1/√2} − 1)/(2e^{1/√2} + 1) and its mirror.
  const double e = std::exp(1 / std::sqrt(2.0));
  const double exact0 = (15 * e) / (2 * e + 1), exact1 = (10 + 5 * e) / (2 * e + 1);
  const auto O = eval(softmax(q * transpose(K) / sqrt(dim<2>)) * V);
  CHECK(O(0, 0) == Approx(exact0).epsilon(1e-14));
  CHECK(O(0, 1) == Approx(exact1).epsilon(1e-14));
  CHECK(O(0, 0) == Approx(6.016681).margin(5e-7));
  CHECK(O(0, 1) == Approx(3.983319).margin(5e-7));

  // §5.1: without the scale the weights are (0.422, 0.155, 0.422).
  const auto w1 = eval(softmax(q * transpose(K)));
  CHECK(w1(0, 0) == Approx(0.422).margin(5e-4));
  CHECK(w1(0, 1) == Approx(0.155).margin(5e-4));
  CHECK(w1(0, 2) == Approx(0.422).margin(5e-4));
  CHECK(w1(0, 0) > w(0, 0));  // "slightly more concentrated"
}

TEST_CASE("self-test (d): the query q = (0 1)", "[attention][lecture]") {
  const matrix<float, 3, 2> K{{1, 0}, {0, 1}, {1, 1}};
  const matrix<float, 3, 2> V{{10, 0}, {0, 10}, {5, 5}};
  const matrix<float, 1, 2> q{{0, 1}};
  const auto w = eval(softmax(q * transpose(K) / sqrt(dim<2>)));
  // Keys 2 and 3 tie; the mirror image of the worked example.
  CHECK(w(0, 0) == Approx(0.197776).margin(1e-6));
  CHECK(w(0, 1) == Approx(0.401112).margin(1e-6));
  CHECK(w(0, 2) == Approx(0.401112).margin(1e-6));
  const auto O = eval(softmax(q * transpose(K) / sqrt(dim<2>)) * V);
  CHECK(O(0, 0) == Approx(3.983319).margin(2e-6));
  CHECK(O(0, 1) == Approx(6.016681).margin(2e-6));
}

TEST_CASE("softmax rows match the reference within the softmax bound", "[attention][softmax]") {
  const std::size_t cols = GENERATE(1, 2, 3, 15, 16, 17, 31, 33, 63, 65, 129, 1000);
  ref::rng rng{std::uint32_t(cols)};
  for (double range : {1.0, 30.0, 1e4}) {
    matrix<float, dyn, dyn> S(5, cols);
    rng.fill(S, -range, range);
    const auto s = ref::from(S);
    const auto p = ref::softmax(s);
    INFO("cols = " << cols << ", scores in ±" << range);
    const auto P = eval(softmax(S));
    CHECK(ref::worst_ratio(P, p, ref::softmax_bound<float>(s, p)) <= 1);
    matrix<double, dyn, dyn> Sd(5, cols);
    rng.fill(Sd, -range, range);
    const auto sd = ref::from(Sd);
    const auto pd = ref::softmax(sd);
    CHECK(ref::worst_ratio(eval(softmax(Sd)), pd, ref::softmax_bound<double>(sd, pd)) <= 1);
  }
}

TEST_CASE("softmax: masked rows become zeros and NaN poisons only its row", "[attention][softmax]") {
  constexpr float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const matrix<float, 4, 3> S{{-inf, -inf, -inf}, {1, nan, 2}, {-inf, 0, -inf}, {-inf, nan, -inf}};
  const auto P = eval(softmax(S));
  for (std::size_t j = 0; j < 3; ++j) {
    CHECK(P(0, j) == 0.0f);
    CHECK(std::isnan(P(1, j)));
    CHECK(std::isnan(P(3, j)));
  }
  CHECK(P(2, 0) == 0.0f);
  CHECK(P(2, 1) == 1.0f);
  CHECK(P(2, 2) == 0.0f);
  // Large scores do not overflow: exp sees only differences from the row maximum.
  const matrix<float, 1, 2> big{{1e30f, 1e30f}};
  const auto Pb = eval(softmax(big));
  CHECK(Pb(0, 0) == 0.5f);
  CHECK(Pb(0, 1) == 0.5f);
}

namespace {

// Builds Q, K, V, a bias and three masks (random, with rows masked whole,
// and whole blocks of 256 keys masked for every query: the fused kernel
// skips those), and holds softmax(Q Kᵀ / √dk ...) V in every form to the laws
// (tests/laws.hpp): naive and fused within attention_bound, the fused error
// at most twice the naive one, eval(e) and thread counts alike.
//
// `only`, when not empty, names the forms to check ("plain", "causal",
// "bias", "bias + causal", "mask", "rows masked whole", "block-sparse mask").
template <class T>
void check_attention(std::size_t n, std::size_t m, std::size_t dk, std::size_t dv, double score_range,
                     std::uint32_t seed, std::initializer_list<std::string_view> only = {}) {
  if (test::emulation_skips(n, m, dk, dv)) return;
  ref::rng rng(seed);
  matrix<T, dyn, dyn> Q(n, dk), K(m, dk), V(m, dv), B(n, m);
  // Entries of size a give scores of size about a²·√dk; pick a for the range.
  const double a = std::sqrt(score_range / std::sqrt(double(dk)));
  rng.fill(Q, -a, a);
  rng.fill(K, -a, a);
  rng.fill(V);
  rng.fill(B, -2, 2);
  matrix<bool, dyn, dyn> M(n, m), Mempty(n, m), Msparse(n, m);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) {
      M(i, j) = rng.coin(0.7);
      Mempty(i, j) = i % 3 != 1 && rng.coin(0.5);
      Msparse(i, j) = (j / 256) % 2 == 1 || (i % 7 == 0 && j % 256 == 255);
    }

  const T root = qkv::sqrt(T(dk));
  using R = ref::real_for<T>;
  using rm = const ref::mat_for<T>&;
  const R rscale = 1 / static_cast<R>(root);
  auto scores = [&](rm q, rm k) { return ref::scale(ref::matmul(q, ref::transpose(k)), rscale); };
  auto plus = [](ref::mat_for<T> s, rm b) {
    for (std::size_t x = 0; x < s.v.size(); ++x) s.v[x] += b.v[x];
    return s;
  };
  auto expect = [&](rm q, rm k, rm v, rm s) {
    const ref::mat_for<T> p = ref::softmax(s);
    return test::expected{ref::matmul(p, v), ref::attention_bound<T>(q, k, v, rscale, s, p)};
  };
  INFO("n = " << n << ", m = " << m << ", dk = " << dk << ", dv = " << dv << ", scores ~" << score_range << ", "
              << (sizeof(T) == 4 ? "float" : "double"));
  auto wanted = [&](std::string_view form) {
    return only.size() == 0 || std::find(only.begin(), only.end(), form) != only.end();
  };
  const auto forms = std::tuple{
          test::law{"plain", [&](auto& q, auto& k, auto& v, auto&, auto&) { return softmax(q * transpose(k) / root) * v; },
                    [&](rm q, rm k, rm v, rm, rm) { return expect(q, k, v, scores(q, k)); }},
          test::law{"causal",
                    [&](auto& q, auto& k, auto& v, auto&, auto&) { return softmax(causal(q * transpose(k) / root)) * v; },
                    [&](rm q, rm k, rm v, rm, rm) { return expect(q, k, v, ref::causal(scores(q, k))); }},
          test::law{"bias",
                    [&](auto& q, auto& k, auto& v, auto& b, auto&) { return softmax(q * transpose(k) / root + b) * v; },
                    [&](rm q, rm k, rm v, rm b, rm) { return expect(q, k, v, plus(scores(q, k), b)); }},
          test::law{"bias + causal",
                    [&](auto& q, auto& k, auto& v, auto& b, auto&) {
                      return softmax(causal(b + q * transpose(k) / root)) * v;
                    },
                    [&](rm q, rm k, rm v, rm b, rm) { return expect(q, k, v, ref::causal(plus(scores(q, k), b))); }},
          test::law{"mask",
                    [&](auto& q, auto& k, auto& v, auto&, auto& mask) {
                      return softmax(masked(q * transpose(k) / root, mask)) * v;
                    },
                    [&](rm q, rm k, rm v, rm, rm mask) { return expect(q, k, v, ref::masked(scores(q, k), mask)); }},
  };
  std::apply([&](const auto&... law) { ((wanted(law.name) ? test::check_laws<T>(law, Q, K, V, B, M) : void()), ...); },
             forms);
  // The masks with rows or key blocks masked whole, by the same "mask" law.
  for (const auto* mask : {&Mempty, &Msparse}) {
    const char* form = mask == &Mempty ? "rows masked whole" : "block-sparse mask";
    if (!wanted(form)) continue;
    INFO(form);
    test::check_laws<T>(
        test::law{"mask", [&](auto& q, auto& k, auto& v, auto& mk) { return softmax(masked(q * transpose(k) / root, mk)) * v; },
                  [&](rm q, rm k, rm v, rm mk) { return expect(q, k, v, ref::masked(scores(q, k), mk)); }},
        Q, K, V, *mask);
  }
  // Rows masked whole give zeros.
  if (!wanted("rows masked whole")) return;
  const auto empty = eval(softmax(masked(Q * transpose(K) / root, Mempty)) * V, fused);
  for (std::size_t i = 1; i < n; i += 3)
    for (std::size_t l = 0; l < dv; ++l) CHECK(empty(i, l) == T(0));
}

}  // namespace

TEST_CASE("attention matches the reference over tails and n ≠ m and dk ≠ dv and masks", "[attention]") {
  // Sizes around the vector width (4 to 16), the register tile (MR = 4 to 8,
  // NR = 8 to 32), the query block (64 or 66) and the key block (256); n ≤ 4
  // takes the decoding path.
  const auto [n, m, dk, dv] = GENERATE(table<std::size_t, std::size_t, std::size_t, std::size_t>({
      {1, 1, 1, 1},     {1, 3, 2, 2},     {3, 1, 2, 5},       {4, 300, 64, 64},    {5, 7, 3, 3},
      {17, 17, 16, 16}, {63, 65, 64, 64}, {65, 63, 64, 17},   {1, 129, 64, 64},    {129, 3, 17, 65},
      {33, 129, 63, 1}, {7, 300, 5, 129}, {129, 129, 128, 64}, {2, 1000, 64, 32},  {67, 257, 33, 40},
      {130, 513, 64, 64}, {200, 100, 8, 8}, {20, 300, 600, 40}, {5, 200, 600, 8},  // large head: key blocks of 96
  }));
  check_attention<float>(n, m, dk, dv, 3.0, std::uint32_t(n * 7 + m));
  check_attention<double>(n, m, dk, dv, 3.0, std::uint32_t(n * 11 + m));
}

TEST_CASE("attention with extreme scores stays finite and accurate", "[attention]") {
  for (double range : {30.0, 300.0, 1e4}) {
    check_attention<float>(70, 300, 64, 19, range, 9, {"plain", "causal"});
    check_attention<float>(3, 300, 64, 19, range, 12, {"plain"});
    check_attention<double>(70, 300, 64, 19, range, 11, {"mask"});
  }
}

TEST_CASE("causal masking is bottom-right aligned", "[attention][mask]") {
  // n = 2 queries against m = 4 keys: query 0 sees keys 0..2, query 1 all four.
  matrix<float, 2, 4> S;
  const auto C = eval(causal(S));
  constexpr float inf = std::numeric_limits<float>::infinity();
  CHECK(C(0, 2) == 0.0f);
  CHECK(C(0, 3) == -inf);
  CHECK(C(1, 3) == 0.0f);
  // n = m: the usual lower triangle.
  matrix<float, 3, 3> T;
  const auto Ct = eval(causal(T));
  CHECK(Ct(0, 1) == -inf);
  CHECK(Ct(1, 1) == 0.0f);
  CHECK(Ct(2, 0) == 0.0f);
  // n > m: the first n − m queries see no key, and their output is zero.
  matrix<float, 4, 2> Q;
  matrix<float, 2, 2> K, V;
  ref::rng rng(5);
  rng.fill(Q);
  rng.fill(K);
  rng.fill(V);
  const auto O = eval(softmax(causal(Q * transpose(K))) * V);
  CHECK(O(0, 0) == 0.0f);
  CHECK(O(1, 1) == 0.0f);
  CHECK(O(2, 0) == V(0, 0));  // sees key 0 only
  CHECK(O(3, 0) != 0.0f);
}

TEST_CASE("attention over strided views of user memory into a strided view", "[attention][storage]") {
  // Q, K, V as column blocks of one interleaved [T, 3·d] buffer, as a fused
  // QKV projection leaves them.
  constexpr std::size_t T = 37, d = 24;
  std::vector<float> qkv(T * 3 * d);
  ref::rng rng(6);
  for (float& x : qkv) x = float(rng.uniform(-1, 1));
  matrix_view<const float, dyn, d> Q(qkv.data(), T, d, 3 * d);
  matrix_view<const float, dyn, d> K(qkv.data() + d, T, d, 3 * d);
  matrix_view<const float, dyn, d> V(qkv.data() + 2 * d, T, d, 3 * d);
  std::vector<float> out(T * 2 * d, 42.0f);
  matrix_view<float, dyn, d> O(out.data(), T, d, 2 * d);
  eval_into(O, softmax(causal(Q * transpose(K) / sqrt(dim<d>))) * V);

  const auto q = ref::from(Q), k = ref::from(K), v = ref::from(V);
  const ref::real rs = 1 / static_cast<ref::real>(static_cast<float>(sqrt(dim<d>)));
  const auto s = ref::causal(ref::scale(ref::matmul(q, ref::transpose(k)), rs));
  const auto p = ref::softmax(s);
  CHECK(ref::worst_ratio(O, ref::matmul(p, v), ref::attention_bound<float>(q, k, v, rs, s, p)) <= 1);
  for (std::size_t i = 0; i < T; ++i)
    for (std::size_t j = d; j < 2 * d; ++j) REQUIRE(out[i * 2 * d + j] == 42.0f);
}

TEST_CASE("static and dynamic shapes give identical results with either strategy", "[attention]") {
  matrix<float, 20, 16> Q;
  matrix<float, 30, 16> K;
  matrix<float, 30, 8> V;
  ref::rng rng(7);
  rng.fill(Q);
  rng.fill(K);
  rng.fill(V);
  matrix<float, dyn, dyn> Qd = Q, Kd = K, Vd = V;
  const matrix<float, 20, 8> Os = softmax(Q * transpose(K) / sqrt(dim<16>)) * V;
  const auto Od = eval(softmax(Qd * transpose(Kd) / sqrt(16.0f)) * Vd);
  const auto Osn = eval(softmax(Q * transpose(K) / sqrt(dim<16>)) * V, naive);
  const auto Odn = eval(softmax(Qd * transpose(Kd) / sqrt(16.0f)) * Vd, naive);
  for (std::size_t i = 0; i < 20; ++i)
    for (std::size_t j = 0; j < 8; ++j) {
      REQUIRE(Os(i, j) == Od(i, j));
      REQUIRE(Osn(i, j) == Odn(i, j));
    }
  // The laws on the static shapes, static_cost against cost among them.
  const ref::real_for<float> rs = 1 / static_cast<ref::real_for<float>>(static_cast<float>(sqrt(dim<16>)));
  test::check_laws<float>(
      test::law{"static shapes", [](auto& q, auto& k, auto& v) { return softmax(q * transpose(k) / sqrt(dim<16>)) * v; },
                [&](const ref::mat_for<float>& q, const ref::mat_for<float>& k, const ref::mat_for<float>& v) {
                  const ref::mat_for<float> s = ref::scale(ref::matmul(q, ref::transpose(k)), rs), p = ref::softmax(s);
                  return test::expected{ref::matmul(p, v), ref::attention_bound<float>(q, k, v, rs, s, p)};
                }},
      Q, K, V);
}

TEST_CASE("NaN in one query row poisons only that output row", "[attention]") {
  matrix<float, 4, 8> Q, K, V;
  ref::rng rng(8);
  rng.fill(Q);
  rng.fill(K);
  rng.fill(V);
  Q(2, 5) = std::numeric_limits<float>::quiet_NaN();
  const auto O = eval(softmax(Q * transpose(K) / sqrt(dim<8>)) * V);
  for (std::size_t i = 0; i < 4; ++i)
    for (std::size_t j = 0; j < 8; ++j) CHECK(std::isnan(O(i, j)) == (i == 2));
}

TEST_CASE("empty extents: no keys, no queries, zero-width heads", "[attention]") {
  const auto [n, m, dk, dv] = GENERATE(table<std::size_t, std::size_t, std::size_t, std::size_t>({
      {0, 5, 4, 3}, {5, 0, 4, 3}, {5, 7, 0, 3}, {5, 7, 4, 0}, {2, 0, 4, 3}, {2, 7, 0, 3}, {70, 7, 0, 3}, {70, 0, 8, 8},
  }));
  INFO("n = " << n << ", m = " << m << ", dk = " << dk << ", dv = " << dv);
  ref::rng rng(31);
  matrix<float, dyn, dyn> Q(n, dk), K(m, dk), V(m, dv);
  rng.fill(Q);
  rng.fill(K);
  rng.fill(V);
  for (const auto& O : {eval(softmax(Q * transpose(K)) * V, naive), eval(softmax(Q * transpose(K)) * V, fused),
                        eval(softmax(causal(Q * transpose(K))) * V, fused)}) {
    REQUIRE(O.rows() == n);
    REQUIRE(O.cols() == dv);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t l = 0; l < dv; ++l) {
        if (m == 0) {
          CHECK(O(i, l) == 0.0f);  // no key to attend to: as a fully masked row
        } else if (dk == 0) {
          // Every score is 0: uniform weights (or a causal prefix of them), so a mean of value rows.
          CHECK(std::isfinite(O(i, l)));
        }
      }
  }
  if (dk == 0 && m > 0 && n > 0) {
    const auto O = eval(softmax(Q * transpose(K)) * V, fused);
    for (std::size_t l = 0; l < dv; ++l) {
      double mean = 0;
      for (std::size_t j = 0; j < m; ++j) mean += V(j, l);
      CHECK(O(0, l) == Approx(mean / double(m)).margin(1e-6));
    }
  }
}
