// The extension points' shape errors (shape_error naming the node) and cost.
#include <catch2/catch.hpp>

#include "extension_support.hpp"

#include <qkv/qkv.hpp>

#include <cstddef>
#include <utility>

using namespace qkv;
using namespace test::ext;

TEST_CASE("similarity shape errors throw shape_error naming the node", "[extension][shape]") {
  dmat<float> Q(5, 8), K(7, 9), K8(7, 8), V(7, 4);
  CHECK_THROWS_AS(similarity(Q, K, neg_l1_t{}), shape_error);
  CHECK_THROWS_WITH(similarity(Q, K, neg_l1_t{}), Catch::Contains("qkv: similarity(Q, K, f)") &&
                                                      Catch::Contains("5x8") && Catch::Contains("7x9"));
  CHECK_THROWS_WITH(similarity(Q, K, neg_sq_l2), Catch::Contains("qkv: similarity(Q, K, neg_sq_l2)"));
  CHECK_THROWS_AS(similarity(Q, K, neg_sq_l2), shape_error);
  CHECK_THROWS_AS(similarity(Q, K, cosine), shape_error);
  CHECK_THROWS_WITH(similarity(Q, K, cosine), Catch::Contains("qkv: similarity(Q, K, cosine)"));
  // dot is the node Q * transpose(K), and says so.
  CHECK_THROWS_WITH(similarity(Q, K, qkv::dot), Catch::Contains("qkv: A * B"));
  CHECK_NOTHROW(similarity(Q, K8, neg_l1_t{}));
  // After the projections: q·W is 5×6, K 7×8.
  dmat<float> W(8, 6);
  CHECK_THROWS_WITH(similarity(Q, K8, projected_dot_t<dmat<float>>{&W}),
                    Catch::Contains("qkv: similarity(Q, K, f)") && Catch::Contains("after f's queries and keys"));
  CHECK_THROWS_AS(similarity(Q, K8, bilinear(W)), shape_error);
  CHECK_THROWS_WITH(similarity(Q, K8, bilinear(W)), Catch::Contains("qkv: similarity(Q, K, bilinear(W))"));
  dmat<float> W89(8, 9), W98(9, 8);
  CHECK_NOTHROW(similarity(Q, K, bilinear(W89)));
  CHECK_THROWS_WITH(similarity(Q, K, bilinear(W98)), Catch::Contains("qkv: similarity(Q, K, bilinear(W))") &&
                                                          Catch::Contains("5x8 vs 9x8"));

  // additive: w of the wrong size, Wq and Wk of different widths, Q against Wq.
  dmat<float> Wq(8, 6), Wk(9, 6), Wk5(9, 5), w6(1, 6), w6c(6, 1), w5(1, 5), w66(6, 6);
  CHECK_NOTHROW(similarity(Q, K, additive(Wq, Wk, w6)));
  CHECK_NOTHROW(similarity(Q, K, additive(Wq, Wk, w6c)));
  CHECK_THROWS_AS(additive(Wq, Wk, w5), shape_error);
  CHECK_THROWS_WITH(additive(Wq, Wk, w5), Catch::Contains("qkv: additive(Wq, Wk, w)") && Catch::Contains("1x5"));
  CHECK_THROWS_AS(additive(Wq, Wk, w66), shape_error);
  CHECK_THROWS_AS(additive(Wq, Wk5, w6), shape_error);
  CHECK_THROWS_AS(similarity(K, Q, additive(Wq, Wk, w6)), shape_error);

  // Batch extents: 4 query heads against 3 key heads.
  tensor<float, dyn, dyn, dyn, 8> Qt(2, 4, 5), Kt(2, 3, 7), Kg(2, 2, 7);
  CHECK_THROWS_AS(similarity(Qt, Kt, neg_l1_t{}), shape_error);
  CHECK_THROWS_WITH(similarity(Qt, Kt, neg_l1_t{}), Catch::Contains("qkv: similarity(Q, K, f)") &&
                                                        Catch::Contains("[2, 4] vs [2, 3]"));
  CHECK_NOTHROW(similarity(Qt, Kg, neg_l1_t{}));
  CHECK_THROWS_AS(similarity(Qt, Kt, neg_sq_l2), shape_error);
  (void)V;
}

TEST_CASE("cost of similarity expressions", "[extension][cost]") {
  const std::size_t n = 70, m = 300, d = 17, dv = 12;
  dmat<float> Q(n, d), K(m, d), V(m, dv), Wq(d, 8), Wk(d, 8), w(1, 8);
  auto at_least = [&](const cost_estimate& c, std::size_t width) {
    CHECK(c.flops >= 2 * n * m * width);
  };
  at_least(cost(similarity(Q, K, neg_l1_t{})), d);
  at_least(cost(similarity(Q, K, neg_sq_l2)), d);
  at_least(cost(similarity(Q, K, cosine)), d);
  at_least(cost(similarity(Q, K, additive(Wq, Wk, w))), 8);
  // The projections count: 2·n·d·da and 2·m·d·da more.
  CHECK(cost(similarity(Q, K, additive(Wq, Wk, w))).flops >= 2 * n * m * 8 + 2 * (n + m) * d * 8);
  CHECK(cost(similarity(Q, K, weighted_dot_t<float>{nullptr})).flops == 2 * n * m * d);
  // In attention: the product with V as well; a naive evaluation holds the
  // n×m scores, a fused one does not.
  // Causal: the visible pairs, m − n + 1 to m keys for the n rows.
  const std::size_t pairs = (m - n + 1 + m) * n / 2;
  const auto c = cost(softmax(causal(score_mod(similarity(Q, K, neg_l1_t{}) / 4.0f, alibi_t<float>{0.5f}))) * V);
  CHECK(c.flops >= 2 * pairs * d + 2 * pairs * dv);
  CHECK(c.exps == pairs);
  CHECK(c.naive_bytes >= n * m * sizeof(float));
  // Long sequences: the fused evaluation's buffers (packed K and V, blocks of
  // scores) are far below the n×m scores a naive one holds.
  dmat<float> Ql(4096, d), Kl(4096, d), Vl(4096, dv);
  const auto cl = cost(softmax(causal(score_mod(similarity(Ql, Kl, neg_l1_t{}), alibi_t<float>{0.5f}))) * Vl);
  CHECK(cl.naive_bytes >= 4096 * 4096 * sizeof(float));
  CHECK(cl.fused_bytes * 8 < cl.naive_bytes);
  const auto cm = cost(softmax(masked(similarity(Q, K, neg_sq_l2), window_t{70, 300, 10})) * V);
  CHECK(cm.flops >= 2 * n * m * d + 2 * n * m * dv);
  // Under a score_mod, neg_sq_l2 keeps the queries' n norms as well.
  CHECK(cost(softmax(score_mod(similarity(Q, K, neg_sq_l2) / 4.0f, alibi_t<float>{0.5f})) * V).fused_bytes ==
        cost(softmax(similarity(Q, K, neg_sq_l2) / 4.0f) * V).fused_bytes + n * sizeof(float));
  // Static shapes: a constant expression.
  using E = decltype(softmax(similarity(std::declval<const matrix<float, 1024, 16>&>(),
                                        std::declval<const matrix<float, 1024, 16>&>(), neg_l1_t{})) *
                     std::declval<const matrix<float, 1024, 8>&>());
  constexpr cost_estimate sc = static_cost<E>();
  STATIC_REQUIRE(sc.flops >= 2 * 1024 * 1024 * 16 + 2 * 1024 * 1024 * 8);
  STATIC_REQUIRE(sc.fused_bytes < sc.naive_bytes);
}
