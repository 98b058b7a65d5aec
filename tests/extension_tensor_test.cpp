// The extension points on tensors: batched, grouped-query, strided views,
// expression operands, thread counts; each head equal to itself alone.
#include <catch2/catch.hpp>

#include "extension_support.hpp"

#include <qkv/qkv.hpp>

#include <cstddef>
#include <utility>
#include <vector>

using namespace qkv;
using namespace test::ext;

namespace {

// got(b, h) against the same formula on the matrices at (b, h), key head
// h / group: bit for bit.
template <class Out, class PerHead>
void check_per_head(const Out& got, std::size_t B, std::size_t H, const PerHead& one) {
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h) {
      INFO("b = " << b << ", h = " << h);
      CHECK(same_bits(got.matrix_at(b, h), one(b, h)));
    }
}

template <class Make>
void check_threads(const Make& make) {
  threads_guard guard;
  set_threads(1);
  const auto one = make();
  for (std::size_t t : {2, 3}) {
    set_threads(t);
    INFO("threads = " << t);
    CHECK(same_bits_tensor(one, make()));
  }
}

}  // namespace

TEST_CASE("batched similarity and score_mod and predicate equal each head alone", "[extension][tensor]") {
  constexpr std::size_t d = 16;
  const auto [Hk, n, m] = GENERATE(
      table<std::size_t, std::size_t, std::size_t>({{4, 70, 300}, {2, 70, 300}, {2, 3, 130}, {4, 130, 1}}));
  const std::size_t B = 2, H = 4, g = H / Hk;
  INFO("B = " << B << ", H = " << H << ", key heads = " << Hk << ", n = " << n << ", m = " << m);
  ref::rng rng(std::uint32_t(Hk * 100 + n + m));
  tensor<float, dyn, dyn, dyn, d> Q(B, H, n), K(B, Hk, m), V(B, Hk, m);
  fill(Q, rng);
  fill(K, rng);
  fill(V, rng);
  dmat<float> Wq(d, 8), Wk(d, 8), w(1, 8);
  rng.fill(Wq, -0.5, 0.5);
  rng.fill(Wk, -0.5, 0.5);
  rng.fill(w);
  const float root = qkv::sqrt(float(d));
  const alibi_t<float> alibi{0.125f};
  const softcap_t<float> cap{3.0f};
  const window_t win{std::ptrdiff_t(n), std::ptrdiff_t(m), 40};

  auto head = [&](std::size_t b, std::size_t h) { return std::pair{Q.matrix_at(b, h), K.matrix_at(b, h / g)}; };
  auto vh = [&](std::size_t b, std::size_t h) { return V.matrix_at(b, h / g); };

  // A user similarity.
  {
    auto e = [&](auto strategy) { return eval(softmax(similarity(Q, K, neg_l1_t{}) / root) * V, strategy); };
    check_per_head(e(fused), B, H, [&](std::size_t b, std::size_t h) {
      auto [q, k] = head(b, h);
      return eval(softmax(similarity(q, k, neg_l1_t{}) / root) * vh(b, h), fused);
    });
    check_per_head(e(naive), B, H, [&](std::size_t b, std::size_t h) {
      auto [q, k] = head(b, h);
      return eval(softmax(similarity(q, k, neg_l1_t{}) / root) * vh(b, h), naive);
    });
    check_threads([&] { return e(fused); });
  }
  // score_mod under causal, and a predicate mask.
  {
    auto e = [&](auto strategy) {
      return eval(softmax(masked(causal(score_mod(Q * transpose(K) / root, alibi)), win)) * V, strategy);
    };
    check_per_head(e(fused), B, H, [&](std::size_t b, std::size_t h) {
      auto [q, k] = head(b, h);
      return eval(softmax(masked(causal(score_mod(q * transpose(k) / root, alibi)), win)) * vh(b, h), fused);
    });
    check_per_head(e(naive), B, H, [&](std::size_t b, std::size_t h) {
      auto [q, k] = head(b, h);
      return eval(softmax(masked(causal(score_mod(q * transpose(k) / root, alibi)), win)) * vh(b, h), naive);
    });
    check_threads([&] { return e(fused); });
  }
  // The built-ins: neg_sq_l2 with soft-capping (its row term per head),
  // cosine, additive (projections of each head).
  {
    auto e = [&] { return eval(softmax(causal(score_mod(similarity(Q, K, neg_sq_l2) / root, cap))) * V, fused); };
    check_per_head(e(), B, H, [&](std::size_t b, std::size_t h) {
      auto [q, k] = head(b, h);
      return eval(softmax(causal(score_mod(similarity(q, k, neg_sq_l2) / root, cap))) * vh(b, h));
    });
    check_threads(e);
  }
  {
    auto e = [&] { return eval(softmax(masked(similarity(Q, K, neg_sq_l2) / root, win)) * V, fused); };
    check_per_head(e(), B, H, [&](std::size_t b, std::size_t h) {
      auto [q, k] = head(b, h);
      return eval(softmax(masked(similarity(q, k, neg_sq_l2) / root, win)) * vh(b, h), fused);
    });
    check_threads(e);
  }
  {
    auto e = [&] { return eval(softmax(similarity(Q, K, cosine) * 8.0f) * V, fused); };
    check_per_head(e(), B, H, [&](std::size_t b, std::size_t h) {
      auto [q, k] = head(b, h);
      return eval(softmax(similarity(q, k, cosine) * 8.0f) * vh(b, h), fused);
    });
    check_threads(e);
  }
  {
    auto e = [&] { return eval(softmax(causal(similarity(Q, K, additive(Wq, Wk, w)))) * V, fused); };
    check_per_head(e(), B, H, [&](std::size_t b, std::size_t h) {
      auto [q, k] = head(b, h);
      return eval(softmax(causal(similarity(q, k, additive(Wq, Wk, w)))) * vh(b, h), fused);
    });
    check_threads(e);
    // And against the reference, head (1, 3).
    auto [q, k] = head(1, 3);
    scores sc = scaled<float>(additive_scores<float>(ref::from(q), ref::from(Wq), ref::from(k), ref::from(Wk),
                                                     std::vector<real>(w.data(), w.data() + 8)),
                              1);
    sc.s = ref::causal(sc.s);
    const auto O = e();
    check_pair<float>(eval(softmax(causal(similarity(Q, K, additive(Wq, Wk, w)))) * V, naive).matrix_at(1, 3),
                      O.matrix_at(1, 3), sc, ref::from(vh(1, 3)));
  }
  {
    // A user similarity with queries() and keys() on tensors.
    auto e = [&] { return eval(softmax(similarity(Q, K, unit_dot_t{}) * 8.0f) * V, fused); };
    check_per_head(e(), B, H, [&](std::size_t b, std::size_t h) {
      auto [q, k] = head(b, h);
      return eval(softmax(similarity(q, k, unit_dot_t{}) * 8.0f) * vh(b, h), fused);
    });
    check_threads(e);
  }
}

TEST_CASE("extensions read strided tensor views and expression operands", "[extension][tensor]") {
  // [B, T, H, D] memory read as [B, H, T, D], against contiguous copies: the same bits.
  constexpr std::size_t B = 2, H = 4, Hk = 2, D = 16;
  const std::size_t n = 70, m = 300;
  ref::rng rng(60);
  std::vector<float> qraw(B * n * H * D), kraw(B * m * Hk * D), vraw(B * m * Hk * D);
  for (float& x : qraw) x = float(rng.uniform(-1, 1));
  for (float& x : kraw) x = float(rng.uniform(-1, 1));
  for (float& x : vraw) x = float(rng.uniform(-1, 1));
  using view = tensor_view<const float, dyn, dyn, dyn, D>;
  const view Qv(qraw.data(), {B, H, n, D}, {n * H * D, D, H * D, 1});
  const view Kv(kraw.data(), {B, Hk, m, D}, {m * Hk * D, D, Hk * D, 1});
  const view Vv(vraw.data(), {B, Hk, m, D}, {m * Hk * D, D, Hk * D, 1});
  tensor<float, dyn, dyn, dyn, D> Q(B, H, n), K(B, Hk, m), V(B, Hk, m);
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t c = 0; c < D; ++c) Q(b, h, i, c) = Qv(b, h, i, c);
    for (std::size_t h = 0; h < Hk; ++h)
      for (std::size_t j = 0; j < m; ++j)
        for (std::size_t c = 0; c < D; ++c) K(b, h, j, c) = Kv(b, h, j, c), V(b, h, j, c) = Vv(b, h, j, c);
  }
  const alibi_t<float> alibi{0.125f};
  const window_t win{70, 300, 90};
  CHECK(same_bits_tensor(eval(softmax(similarity(Qv, Kv, neg_l1_t{}) / 4.0f) * Vv, fused),
                         eval(softmax(similarity(Q, K, neg_l1_t{}) / 4.0f) * V, fused)));
  CHECK(same_bits_tensor(eval(softmax(masked(causal(score_mod(Qv * transpose(Kv) / 4.0f, alibi)), win)) * Vv, fused),
                         eval(softmax(masked(causal(score_mod(Q * transpose(K) / 4.0f, alibi)), win)) * V, fused)));
  CHECK(same_bits_tensor(eval(softmax(similarity(Qv, Kv, neg_sq_l2) / 4.0f) * Vv, naive),
                         eval(softmax(similarity(Q, K, neg_sq_l2) / 4.0f) * V, naive)));
  CHECK(same_bits_tensor(eval(softmax(similarity(Qv, Kv, unit_dot_t{}) * 8.0f) * Vv, fused),
                         eval(softmax(similarity(Q, K, unit_dot_t{}) * 8.0f) * V, fused)));

  // Operands that are expressions are evaluated first, by the same products.
  inputs<float> in(70, 300, 17, 17, 12, 61);
  dmat<float> X(300, 17), Wq(17, 17), Wk(17, 17);
  rng.fill(X);
  rng.fill(Wq, -0.3, 0.3);
  rng.fill(Wk, -0.3, 0.3);
  const dmat<float> Xq = eval(in.Q * Wq), Xk = eval(X * Wk);
  CHECK(same_bits(eval(softmax(similarity(in.Q * Wq, X * Wk, neg_l1_t{})) * in.V, fused),
                  eval(softmax(similarity(Xq, Xk, neg_l1_t{})) * in.V, fused)));
  CHECK(same_bits(eval(softmax(similarity(in.Q * Wq, X * Wk, neg_l1_t{})) * in.V, naive),
                  eval(softmax(similarity(Xq, Xk, neg_l1_t{})) * in.V, naive)));
  CHECK(same_bits(eval(softmax(similarity(in.Q * Wq, X * Wk, neg_sq_l2)) * in.V, fused),
                  eval(softmax(similarity(Xq, Xk, neg_sq_l2)) * in.V, fused)));
  CHECK(same_bits(eval(softmax(causal(score_mod(similarity(in.Q * Wq, X * Wk, cosine), alibi))) * in.V, fused),
                  eval(softmax(causal(score_mod(similarity(Xq, Xk, cosine), alibi))) * in.V, fused)));
}

TEST_CASE("batched extensions in double with static extents", "[extension][tensor]") {
  ref::rng rng(55);
  tensor<double, 2, 4, 33, 8> Q;
  tensor<double, 2, 2, 65, 8> K, V;
  fill(Q, rng);
  fill(K, rng);
  fill(V, rng);
  const bucket_t<double> bucket{-0.5};
  auto e = softmax(causal(score_mod(similarity(Q, K, neg_l1_t{}) / sqrt(dim<8>), bucket))) * V;
  STATIC_REQUIRE(std::is_same_v<result_t<decltype(e)>, tensor<double, 2, 4, 33, 8>>);
  const auto O = eval(e, fused);
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t h = 0; h < 4; ++h) {
      const auto q = Q.matrix_at(b, h);
      const auto k = K.matrix_at(b, h / 2), v = V.matrix_at(b, h / 2);
      const auto one = eval(softmax(causal(score_mod(similarity(q, k, neg_l1_t{}) / sqrt(dim<8>), bucket))) * v, fused);
      CHECK(same_bits(O.matrix_at(b, h), one));
      const real by_root = 1 / std::sqrt(real(8));
      scores sc = modified(scaled<double>(neg_l1_scores<double>(ref::from(q), ref::from(k)), by_root), bucket);
      sc.s = ref::causal(sc.s);
      check_pair<double>(eval(e, naive).matrix_at(b, h), O.matrix_at(b, h), sc, ref::from(v));
    }
}
