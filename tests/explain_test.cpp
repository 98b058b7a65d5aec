// What eval(e) will do, asked in advance: fuses<E>, fusion_rule_broken<E>
// (one value per rule of eval/fusion_rules.hpp) and explain(e).
#include <catch2/catch.hpp>

#include <qkv/qkv.hpp>

#include <cmath>
#include <cstddef>
#include <string>

using namespace qkv;

namespace {

struct softcap {
  template <class V>
  V operator()(const V& s, const V&, const V&) const {
    using std::tanh;
    return V(4) * tanh(s / V(4));
  }
};

struct sliding {
  bool operator()(std::size_t i, std::size_t j) const { return j <= i && i - j < 8; }
};

struct neg_l1 {
  template <class V>
  V operator()(const V& q, const V& k) const {
    return -xsimd::abs(q - k);
  }
};

struct fixture {
  matrix<float, 16, 8> Q;
  matrix<float, 24, 8> K;
  matrix<float, 24, 4> V;
  matrix<float, 16, 24> B;
  matrix<bool, 16, 24> M;
  matrix<float, 8, 8> W;
};

}  // namespace

TEST_CASE("fusion_rule_broken names the first rule a chain breaks", "[explain]") {
  const fixture x;
  const auto& [Q, K, V, B, M, W] = x;
  const auto S = Q * transpose(K);
  const softcap cap;
  const sliding win;
  STATIC_REQUIRE(fusion_rule_broken<decltype(softmax(causal(S / 2.0f) + B) * V)> == fusion_rule::none);
  STATIC_REQUIRE(fusion_rule_broken<decltype(softmax(S))> == fusion_rule::not_attention);
  STATIC_REQUIRE(fusion_rule_broken<decltype(softmax(S) * V * 2.0f)> == fusion_rule::not_attention);
  STATIC_REQUIRE(fusion_rule_broken<decltype(softmax(B) * V)> == fusion_rule::not_a_similarity);
  STATIC_REQUIRE(fusion_rule_broken<decltype(softmax(transpose(K * transpose(Q))) * V)> == fusion_rule::not_a_similarity);
  STATIC_REQUIRE(fusion_rule_broken<decltype(softmax(B - S) * V)> == fusion_rule::not_a_similarity);  // −S is no chain
  STATIC_REQUIRE(fusion_rule_broken<decltype(softmax(S + B + B) * V)> == fusion_rule::two_biases);
  STATIC_REQUIRE(fusion_rule_broken<decltype(softmax(B + (S - B)) * V)> == fusion_rule::two_biases);
  STATIC_REQUIRE(fusion_rule_broken<decltype(softmax(masked(causal(masked(S, M)), M)) * V)> == fusion_rule::two_mask_matrices);
  STATIC_REQUIRE(fusion_rule_broken<decltype(softmax(masked(masked(S, win), win)) * V)> == fusion_rule::two_predicates);
  STATIC_REQUIRE(fusion_rule_broken<decltype(softmax(score_mod(score_mod(S, cap), cap)) * V)> == fusion_rule::two_score_mods);
  STATIC_REQUIRE(fusion_rule_broken<decltype(softmax(score_mod(causal(S), cap)) * V)> == fusion_rule::score_mod_outside_mask);
  STATIC_REQUIRE(fusion_rule_broken<decltype(softmax(score_mod(masked(S, M), cap)) * V)> == fusion_rule::score_mod_outside_mask);
  STATIC_REQUIRE(fusion_rule_broken<decltype(softmax(score_mod(masked(S, win), cap)) * V)> == fusion_rule::score_mod_outside_mask);
  STATIC_REQUIRE(fusion_rule_broken<decltype(softmax(score_mod(S, cap) / 2.0f) * V)> == fusion_rule::scale_outside_score_mod);
  STATIC_REQUIRE(fusion_rule_broken<decltype(softmax(score_mod(S, cap) - B) * V)> == fusion_rule::bias_outside_score_mod);
  STATIC_REQUIRE(fusion_rule_broken<decltype(softmax(B + score_mod(S, cap)) * V)> == fusion_rule::bias_outside_score_mod);
  // The first rule from the core outwards: the bias inside breaks before the scaling outside.
  STATIC_REQUIRE(fusion_rule_broken<decltype(softmax(score_mod(S + B + B, cap) * 2.0f) * V)> == fusion_rule::two_biases);
  STATIC_REQUIRE(fusion_rule_broken<decltype(softmax(score_mod(score_mod(causal(S), cap), cap)) * V)> == fusion_rule::score_mod_outside_mask);
}

TEST_CASE("fuses<E> holds for every form of the contract, neg_sq_l2 under a score_mod included", "[explain]") {
  const fixture x;
  const auto& [Q, K, V, B, M, W] = x;
  const auto S = Q * transpose(K);
  const softcap cap;
  const sliding win;
  STATIC_REQUIRE(fuses<decltype(softmax(S) * V)>);
  STATIC_REQUIRE(fuses<const decltype(softmax(S) * V)&>);
  STATIC_REQUIRE(fuses<decltype(softmax(causal(causal(S))) * V)>);
  STATIC_REQUIRE(fuses<decltype(softmax(masked(masked(causal(score_mod(S / 2.0f + B, cap)), M), win)) * V)>);
  STATIC_REQUIRE(fuses<decltype(softmax(similarity(Q, K, neg_sq_l2)) * V)>);
  STATIC_REQUIRE(fuses<decltype(softmax(causal(score_mod(similarity(Q, K, neg_sq_l2) / 2.0f, cap))) * V)>);
  STATIC_REQUIRE(fuses<decltype(softmax(score_mod(similarity(Q, K, neg_l1{}) + B, cap)) * V)>);
  STATIC_REQUIRE(fuses<decltype(softmax(similarity(Q, K, bilinear(W)) * 2.0f) * V)>);
  STATIC_REQUIRE(!fuses<decltype(softmax(S))>);
  STATIC_REQUIRE(!fuses<decltype(softmax(S + B + B) * V)>);
  STATIC_REQUIRE(to_string(fusion_rule::none) == "fuses");
  STATIC_REQUIRE(to_string(fusion_rule_broken<decltype(softmax(S + B + B) * V)>) == "two biases in the scores");
}

namespace {
// explain(e) without its last line on the user's functors (which depends on
// the flags this test is built with; tested below).
template <class E>
std::string plan(const E& e) {
  std::string s = explain(e);
  const auto at = s.find("your functors: ");
  return at == std::string::npos ? s : s.substr(0, at);
}
}  // namespace

TEST_CASE("explain(e) says what eval(e) does with each node", "[explain]") {
  const fixture x;
  const auto& [Q, K, V, B, M, W] = x;
  const softcap cap;
  const sliding win;

  CHECK(explain(softmax(Q * transpose(K) / sqrt(dim<8>)) * V) == "fused: softmax(S) * V with similarity dot, scale\n");
  // Slots in the order the kernel applies them, whatever the order written.
  CHECK(plan(softmax(masked(causal(score_mod(B + Q * transpose(K) * 2.0f, cap)), win)) * V) ==
        "fused: softmax(S) * V with similarity dot, scale, bias, score_mod, causal, predicate\n");
  CHECK(plan(softmax(causal(score_mod(similarity(Q, K, neg_sq_l2), cap))) * V) ==
        "fused: softmax(S) * V with similarity neg_sq_l2, score_mod, causal\n");
  CHECK(plan(softmax(masked(similarity(Q, K, neg_l1{}), M)) * V) ==
        "fused: softmax(S) * V with similarity f, mask\n");
  // Operands that are not storage are evaluated first, under the node that reads them.
  CHECK(explain(softmax((Q * W) * transpose(K)) * (V * 2.0f)) ==
        "fused: softmax(S) * V with similarity dot\n"
        "  node by node: A * B\n"
        "  node by node: X * c\n");
  // Not fused: the product says why, its operands are evaluated node by node.
  CHECK(explain(softmax(score_mod(causal(Q * transpose(K)), cap)) * V) ==
        "node by node: A * B (not fused: score_mod outside a mask)\n"
        "  node by node: softmax(S)\n"
        "    node by node: score_mod(S, f)\n"
        "      node by node: causal(S)\n"
        "        node by node: A * B\n");
  CHECK(explain(softmax(Q * transpose(K) + B - B) * V) ==
        "node by node: A * B (not fused: two biases in the scores)\n"
        "  node by node: softmax(S)\n"
        "    node by node: A - B\n"
        "      node by node: A + B\n"
        "        node by node: A * B\n");
  // A fused attention inside a larger expression; storage alone evaluates nothing.
  const matrix<float, 4, 3> Wo;
  CHECK(explain((softmax(causal(Q * transpose(K))) * V) * Wo) ==
        "node by node: A * B\n"
        "  fused: softmax(S) * V with similarity dot, causal\n");
  CHECK(explain(Q).empty());
  CHECK(explain(transpose(Q)).empty());
}

TEST_CASE("explain says when the user's functors were compiled for less than the kernels run", "[explain]") {
  matrix<float, dyn, dyn> Q(4, 8), K(9, 8), V(9, 8);
  const auto cap = [](auto s, auto, auto) { return decltype(s)(10) * xsimd::tanh(s / decltype(s)(10)); };
  const std::string with_functor = explain(softmax(score_mod(Q * transpose(K), cap)) * V);
  const bool narrower = !kernels::runs_like_library<xsimd::default_arch>();
  CHECK((with_functor.find("your functors: compiled for ") != std::string::npos) == narrower);
  if (narrower) CHECK(with_functor.find("qkv::native") != std::string::npos);
  // The built-in forms run on the compiled kernels: nothing to say.
  CHECK(explain(softmax(Q * transpose(K)) * V).find("your functors") == std::string::npos);
}
