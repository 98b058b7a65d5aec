// Which expressions the fused strategy recognises, and that eval(e) fuses
// the recognised parts of a larger expression.
#include <catch2/catch.hpp>

#include "reference.hpp"

#include <qkv/qkv.hpp>

using namespace qkv;

namespace {
template <class E>
constexpr bool recognised(const E&) {
  return fuses<E>;
}
}  // namespace

TEST_CASE("softmax(S) * V fuses for every score chain of the contract", "[fused]") {
  matrix<float, 16, 8> Q;
  matrix<float, 24, 8> K;
  matrix<float, 24, 4> V;
  matrix<float, 16, 24> B;
  matrix<bool, 16, 24> M;
  matrix_view<const float, dyn, 8> Qv = Q;
  const float s = 3;
  CHECK(recognised(softmax(Q * transpose(K)) * V));
  CHECK(recognised(softmax(Q * transpose(K) / sqrt(dim<8>)) * V));
  CHECK(recognised(softmax(Q * transpose(K) * s) * V));
  CHECK(recognised(softmax(s * (Q * transpose(K))) * V));
  CHECK(recognised(softmax(causal(Q * transpose(K) / s)) * V));
  CHECK(recognised(softmax(causal(Q * transpose(K)) / s) * V));
  CHECK(recognised(softmax(masked(Q * transpose(K) / s, M)) * V));
  CHECK(recognised(softmax(masked(causal(Q * transpose(K)), M) / sqrt(dim<8>)) * V));
  CHECK(recognised(softmax(Q * transpose(K) / s + B) * V));
  CHECK(recognised(softmax(B + Q * transpose(K)) * V));
  CHECK(recognised(softmax(Q * transpose(K) - B) * V));
  CHECK(recognised(softmax(causal((Q * transpose(K) + B) / s)) * V));
  CHECK(recognised(softmax(Qv * transpose(K)) * V));
  // Operands that are expressions themselves are evaluated, then fused.
  CHECK(recognised(softmax((Q * 2.0f) * transpose(K)) * V));
  CHECK(recognised(softmax(Q * transpose(transpose(transpose(K)))) * V));

  CHECK(!recognised(softmax(Q * transpose(K))));           // no * V
  CHECK(!recognised(softmax(Q * transpose(K)) * V * 2.0f)); // scaled after the product
  CHECK(!recognised(softmax(transpose(K * transpose(Q))) * V));  // scores as (K Qᵀ)ᵀ: not recognised
  CHECK(!recognised(softmax(masked(masked(Q * transpose(K), M), M)) * V));  // one mask at most
  CHECK(!recognised(softmax(Q * transpose(K) + B + B) * V));                // one bias at most
  CHECK(!recognised(softmax(B - Q * transpose(K)) * V));                    // −S is not a score chain
}

TEST_CASE("eval fuses the attention inside a larger expression", "[fused]") {
  // A head's output projected by Wo: (softmax(Q Kᵀ/√d) V) Wo.
  ref::rng rng(21);
  matrix<float, dyn, dyn> Q(70, 16), K(90, 16), V(90, 12), Wo(12, 5), Wq(16, 16);
  rng.fill(Q);
  rng.fill(K);
  rng.fill(V);
  rng.fill(Wo);
  rng.fill(Wq);
  const auto best = eval((softmax((Q * Wq) * transpose(K) / sqrt(dim<16>)) * V) * Wo);
  const auto node_by_node = eval((softmax((Q * Wq) * transpose(K) / sqrt(dim<16>)) * V) * Wo, naive);
  // Both are float evaluations of the same formula; they differ by rounding
  // only: within a few ulps of the largest entry, given the well-conditioned
  // inputs (softmax rows are averages, Wo has 12 terms per entry).
  float largest = 0, diff = 0;
  for (std::size_t i = 0; i < 70; ++i)
    for (std::size_t j = 0; j < 5; ++j) {
      largest = std::max(largest, std::abs(node_by_node(i, j)));
      diff = std::max(diff, std::abs(best(i, j) - node_by_node(i, j)));
    }
  CHECK(diff > 0.0f);  // different code paths ran
  CHECK(diff <= 64 * std::numeric_limits<float>::epsilon() * largest);
}

TEST_CASE("fused evaluation accepts transposed and computed operands", "[fused]") {
  ref::rng rng(22);
  matrix<double, dyn, dyn> Qt(16, 40), K(50, 16), V(50, 7);
  rng.fill(Qt);
  rng.fill(K);
  rng.fill(V);
  // Q = transpose(Qt) has a column stride: it is copied to rows first.
  const auto got = eval(softmax(transpose(Qt) * transpose(K) / 4.0) * V, fused);
  const auto q = ref::transpose(ref::from(Qt)), k = ref::from(K), v = ref::from(V);
  const auto s = ref::scale(ref::matmul(q, ref::transpose(k)), 0.25L);
  const auto p = ref::softmax(s);
  CHECK(ref::worst_ratio(got, ref::matmul(p, v), ref::attention_bound<double>(q, k, v, 0.25L, s, p)) <= 1);
}

TEST_CASE("fused evaluation into an input is evaluated aside", "[fused]") {
  ref::rng rng(23);
  matrix<float, dyn, dyn> X(30, 30), Y(30, 30);
  rng.fill(X);
  Y = X;
  eval_into(X, softmax(X * transpose(X)) * X, fused);  // X is read and written
  const auto want = eval(softmax(Y * transpose(Y)) * Y, fused);
  for (std::size_t i = 0; i < 30; ++i)
    for (std::size_t j = 0; j < 30; ++j) REQUIRE(X(i, j) == want(i, j));
}
