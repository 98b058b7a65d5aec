// The user's similarities (component-wise terms, queries() and keys(),
// projections) against the reference, and against their built-in twins; on
// static shapes and views.
#include <catch2/catch.hpp>

#include "extension_support.hpp"

#include <qkv/qkv.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

using namespace qkv;
using namespace test::ext;

TEST_CASE("user similarities in attention match the reference naive and fused", "[extension][similarity]") {
  const auto [n, m, d, dv] = GENERATE(extension_sizes());
  for (kind k : {kind::neg_l1, kind::weighted, kind::two_sided}) {
    check_similarity<float>(k, n, m, d, dv, all_variants, std::uint32_t(n * 41 + m + d));
    check_similarity<double>(k, n, m, d, dv, some_variants, std::uint32_t(n * 43 + m + d));
  }
}

TEST_CASE("a user similarity equal to a built-in one gives its results within its bound", "[extension][similarity]") {
  const auto [n, m, d, dv] = GENERATE(extension_sizes());
  // user dot = dot, projected dot = bilinear(W), unit dot = cosine: each
  // against the reference (and so the bound) of the built-in.
  for (kind k : {kind::user_dot, kind::projected, kind::unit_dot, kind::unit_dot_by_value}) {
    check_similarity<float>(k, n, m, d, dv, {variant::scaled, variant::causal, variant::bias}, std::uint32_t(n + m + d));
    check_similarity<double>(k, n, m, d, dv, {variant::bias_causal}, std::uint32_t(n + m + d + 1));
  }
}

namespace {

// |a − b| within the sum of their bounds (each twice the first-order bound
// of the same scores), elementwise.
template <class T, class A, class B>
void check_twins(const A& a, const B& b, const scores& sc, const ref::mat& v) {
  const ref::mat p = ref::softmax(sc.s);
  const ref::mat bound = ref::attention_bound_from_scores<T>(sc.err, v, sc.s, p);
  REQUIRE(a.rows() == b.rows());
  REQUIRE(a.cols() == b.cols());
  real worst = 0;
  for (std::size_t i = 0; i < a.rows(); ++i)
    for (std::size_t l = 0; l < a.cols(); ++l) {
      const real e = std::fabs(real(a(i, l)) - real(b(i, l)));
      if (e != 0) worst = std::fmax(worst, e / (2 * bound(i, l)));
    }
  CHECK(worst <= 1);
}

}  // namespace

TEST_CASE("a user similarity and its built-in twin agree with each other", "[extension][similarity]") {
  const float root = qkv::sqrt(17.0f);
  const real by_root = 1 / static_cast<real>(root);
  {
    inputs<float> in(70, 300, 17, 17, 24, 78);
    const scores sc = scaled<float>(dot_scores<float>(ref::from(in.Q), ref::from(in.K)), by_root);
    const ref::mat v = ref::from(in.V);
    check_twins<float>(eval(softmax(similarity(in.Q, in.K, user_dot_t{}) / root) * in.V, fused),
                       eval(softmax(in.Q * transpose(in.K) / root) * in.V, fused), sc, v);
    check_twins<float>(eval(softmax(similarity(in.Q, in.K, user_dot_t{}) / root) * in.V, naive),
                       eval(softmax(in.Q * transpose(in.K) / root) * in.V, naive), sc, v);
    const scores sq = scaled<float>(cosine_scores<float>(ref::from(in.Q), ref::from(in.K)), 8);
    check_twins<float>(eval(softmax(similarity(in.Q, in.K, unit_dot_t{}) * 8.0f) * in.V, fused),
                       eval(softmax(similarity(in.Q, in.K, cosine) * 8.0f) * in.V, fused), sq, v);
    check_twins<float>(eval(softmax(similarity(in.Q, in.K, unit_dot_by_value_t{}) * 8.0f) * in.V, naive),
                       eval(softmax(similarity(in.Q, in.K, cosine) * 8.0f) * in.V, naive), sq, v);

    // similarity(Q, K, dot) is the node Q * transpose(K): the same type, the same bits.
    STATIC_REQUIRE(std::is_same_v<decltype(similarity(in.Q, in.K, qkv::dot)), decltype(in.Q * transpose(in.K))>);
    CHECK(same_bits(eval(softmax(similarity(in.Q, in.K, qkv::dot) / root) * in.V),
                    eval(softmax(in.Q * transpose(in.K) / root) * in.V)));
  }
  {
    inputs<float> in(70, 300, 17, 20, 24, 77);
    const scores sc = scaled<float>(bilinear_scores<float>(ref::from(in.Q), ref::from(in.W), ref::from(in.K)), by_root);
    const ref::mat v = ref::from(in.V);
    check_twins<float>(eval(softmax(similarity(in.Q, in.K, projected_dot_t<dmat<float>>{&in.W}) / root) * in.V, fused),
                       eval(softmax(similarity(in.Q, in.K, bilinear(in.W)) / root) * in.V, fused), sc, v);
    check_twins<float>(eval(softmax(similarity(in.Q, in.K, projected_dot_t<dmat<float>>{&in.W}) / root) * in.V, naive),
                       eval(softmax(similarity(in.Q, in.K, bilinear(in.W)) / root) * in.V, naive), sc, v);
  }
}

TEST_CASE("similarities on static shapes and views", "[extension][similarity]") {
  ref::rng rng(21);
  matrix<float, 70, 16> Q;
  matrix<float, 130, 16> K;
  matrix<float, 130, 12> V;
  rng.fill(Q);
  rng.fill(K);
  rng.fill(V);
  auto e = softmax(causal(similarity(Q, K, neg_l1_t{}) / sqrt(dim<16>))) * V;
  STATIC_REQUIRE(std::is_same_v<result_t<decltype(e)>, matrix<float, 70, 12>>);
  const auto a = eval(e, fused), b = eval(e, naive);
  scores sc = scaled<float>(neg_l1_scores<float>(ref::from(Q), ref::from(K)), 1 / static_cast<real>(qkv::sqrt(16.0f)));
  sc.s = ref::causal(sc.s);
  check_pair<float>(b, a, sc, ref::from(V));

  // Views with a row stride (column blocks of one buffer) read alike.
  std::vector<float> buf(130 * 32);
  for (float& x : buf) x = float(rng.uniform(-1, 1));
  matrix_view<const float, dyn, 16> Kv(buf.data(), 130, 16, 32), Vv(buf.data() + 16, 130, 16, 32);
  const dmat<float> Kc = Kv, Vc = Vv;
  CHECK(same_bits(eval(softmax(similarity(Q, Kv, neg_l1_t{})) * Vv, fused),
                  eval(softmax(similarity(Q, Kc, neg_l1_t{})) * Vc, fused)));
  CHECK(same_bits(eval(softmax(similarity(Q, Kv, cosine)) * Vv, fused),
                  eval(softmax(similarity(Q, Kc, cosine)) * Vc, fused)));
  CHECK(same_bits(eval(softmax(similarity(Q, Kv, neg_sq_l2)) * Vv, naive),
                  eval(softmax(similarity(Q, Kc, neg_sq_l2)) * Vc, naive)));

  // eval_into a view, and assignment.
  matrix<float, 70, 12> O;
  eval_into(O, softmax(similarity(Q, K, neg_l1_t{}) / sqrt(dim<16>)) * V);
  CHECK(same_bits(O, eval(softmax(similarity(Q, K, neg_l1_t{}) / sqrt(dim<16>)) * V, fused)));
}
