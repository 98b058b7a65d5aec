// softmax and whole attention expressions, naive strategy, against the
// reference and against the lecture's worked example.
#include <catch2/catch.hpp>

#include "reference.hpp"

#include <qkv/qkv.hpp>

#include <cmath>
#include <limits>
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

enum class mask_kind { none, causal, random, empty_rows };

// Builds Q, K, V (and a mask), evaluates softmax(Q Kᵀ / √dk [masked]) V
// naively, and compares with the reference within attention_bound.
template <class T>
void check_attention(std::size_t n, std::size_t m, std::size_t dk, std::size_t dv, mask_kind mk, double score_range,
                     std::uint32_t seed) {
  ref::rng rng(seed);
  matrix<T, dyn, dyn> Q(n, dk), K(m, dk), V(m, dv);
  // Entries of size a give scores of size about a²·√dk; pick a for the range.
  const double a = std::sqrt(score_range / std::sqrt(double(dk)));
  rng.fill(Q, -a, a);
  rng.fill(K, -a, a);
  rng.fill(V);
  matrix<bool, dyn, dyn> M(n, m);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) M(i, j) = mk == mask_kind::empty_rows ? (i % 3 != 1 && rng.coin(0.5)) : rng.coin(0.7);

  const auto q = ref::from(Q), k = ref::from(K), v = ref::from(V);
  const ref::real rscale = 1 / std::sqrt(static_cast<ref::real>(static_cast<T>(dk)));
  ref::mat s = ref::scale(ref::matmul(q, ref::transpose(k)), rscale);
  if (mk == mask_kind::causal) s = ref::causal(s);
  if (mk == mask_kind::random || mk == mask_kind::empty_rows) s = ref::masked(s, M);
  const ref::mat p = ref::softmax(s);
  const ref::mat want = ref::matmul(p, v);
  const ref::mat bound = ref::attention_bound<T>(q, k, v, rscale, s, p);

  const T dkt = T(dk);
  matrix<T, dyn, dyn> got;
  switch (mk) {
    case mask_kind::none: got = softmax(Q * transpose(K) / sqrt(dkt)) * V; break;
    case mask_kind::causal: got = softmax(causal(Q * transpose(K) / sqrt(dkt))) * V; break;
    default: got = softmax(masked(Q * transpose(K) / sqrt(dkt), M)) * V; break;
  }
  INFO("n = " << n << ", m = " << m << ", dk = " << dk << ", dv = " << dv << ", mask " << int(mk) << ", scores ~"
              << score_range << ", kernels " << active_arch());
  REQUIRE(got.rows() == n);
  REQUIRE(got.cols() == dv);
  CHECK(ref::worst_ratio(got, want, bound) <= 1);
  if (mk == mask_kind::empty_rows) {
    for (std::size_t i = 1; i < n; i += 3)
      for (std::size_t l = 0; l < dv; ++l) CHECK(got(i, l) == T(0));
  }
}

}  // namespace

TEST_CASE("attention matches the reference over tails and n ≠ m and dk ≠ dv and masks", "[attention]") {
  const auto [n, m, dk, dv] = GENERATE(table<std::size_t, std::size_t, std::size_t, std::size_t>({
      {1, 1, 1, 1},     {1, 3, 2, 2},     {3, 1, 2, 5},      {17, 17, 16, 16},  {63, 65, 64, 64},  {65, 63, 64, 17},
      {1, 129, 64, 64}, {129, 3, 17, 65}, {33, 129, 63, 1},  {7, 300, 5, 129},  {129, 129, 128, 64}, {2, 1000, 64, 32},
  }));
  for (mask_kind mk : {mask_kind::none, mask_kind::causal, mask_kind::random, mask_kind::empty_rows}) {
    check_attention<float>(n, m, dk, dv, mk, 3.0, std::uint32_t(n * 7 + m));
    check_attention<double>(n, m, dk, dv, mk, 3.0, std::uint32_t(n * 11 + m));
  }
}

TEST_CASE("attention with extreme scores stays finite and accurate", "[attention]") {
  for (double range : {30.0, 300.0, 1e4}) {
    check_attention<float>(33, 70, 64, 19, mask_kind::none, range, 9);
    check_attention<float>(33, 70, 64, 19, mask_kind::causal, range, 10);
    check_attention<double>(33, 70, 64, 19, mask_kind::random, range, 11);
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

TEST_CASE("static and dynamic shapes give identical results", "[attention]") {
  matrix<float, 20, 16> Q;
  matrix<float, 30, 16> K;
  matrix<float, 30, 8> V;
  ref::rng rng(7);
  rng.fill(Q);
  rng.fill(K);
  rng.fill(V);
  const matrix<float, 20, 8> Os = softmax(Q * transpose(K) / sqrt(dim<16>)) * V;
  matrix<float, dyn, dyn> Qd = Q, Kd = K, Vd = V;
  const auto Od = eval(softmax(Qd * transpose(Kd) / sqrt(16.0f)) * Vd, naive);
  for (std::size_t i = 0; i < 20; ++i)
    for (std::size_t j = 0; j < 8; ++j) REQUIRE(Os(i, j) == Od(i, j));
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
