// The batch and head forms score_mod(S, f(s, b, h, i, j)) and
// masked(S, pred(b, h, i, j)): on rank-4 tensors with grouped-query heads,
// each slice equals its matrix with b and h fixed in the functor, naive and
// fused, on every thread count; block hints that depend on b and h; a matrix
// sees b = h = 0. key_aligned(f): the query's position among the keys, for
// n < m (a decode against a cache) and n > m.
#include <catch2/catch.hpp>

#include "extension_support.hpp"

#include <qkv/qkv.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

using namespace qkv;
using namespace test::ext;

namespace {

// ALiBi with one slope per head, 2^(−(h + 1)).
struct per_head_alibi {
  template <class V>
  V operator()(const V& s, std::size_t, std::size_t h, const V& i, const V& j) const {
    return s - V(slope(h)) * (i - j);
  }
  static float slope(std::size_t h) { return 1.0f / float(std::size_t(2) << h); }
};
// The same with the head fixed, as a three-argument modifier.
struct one_head_alibi {
  float slope;
  template <class V>
  V operator()(const V& s, const V& i, const V& j) const {
    return s - V(slope) * (i - j);
  }
};

// Each sequence of the batch has its own length: keys past it are padding.
struct lengths_mask {
  const std::vector<std::size_t>* len;
  bool operator()(std::size_t b, std::size_t, std::size_t, std::size_t j) const { return j < (*len)[b]; }
};
// With a block hint that depends on b; and counts how often it is asked.
struct hinted_lengths {
  const std::vector<std::size_t>* len;
  bool operator()(std::size_t b, std::size_t, std::size_t, std::size_t j) const { return j < (*len)[b]; }
  bool any(std::size_t b, std::size_t, std::size_t, std::size_t, std::size_t j0, std::size_t) const {
    return j0 < (*len)[b];
  }
};

template <class Tensor, class Slice>
void check_slices(const Tensor& got, std::size_t B, std::size_t H, Slice slice) {
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h) {
      INFO("b = " << b << ", h = " << h);
      CHECK(same_bits(got.matrix_at(b, h), slice(b, h)));
    }
}

}  // namespace

TEST_CASE("score_mod f(s, b, h, i, j) and masked pred(b, h, i, j) per slice of a grouped-query tensor", "[head][tensor]") {
  constexpr std::size_t d = 16;
  const auto [n, m] = GENERATE(table<std::size_t, std::size_t>({{70, 300}, {4, 300}, {130, 130}, {1, 20}}));
  const std::size_t B = 3, H = 4, Hk = 2;
  INFO("n = " << n << ", m = " << m);
  ref::rng rng(std::uint32_t(n * 3 + m));
  tensor<float, dyn, dyn, dyn, d> Q(B, H, n), K(B, Hk, m), V(B, Hk, m);
  fill(Q, rng), fill(K, rng), fill(V, rng);
  const std::vector<std::size_t> len{m, m / 2 + 1, m / 3 + 1};
  auto q_of = [&](std::size_t b, std::size_t h) { return Q.matrix_at(b, h); };
  auto k_of = [&](std::size_t b, std::size_t h) { return K.matrix_at(b, h / 2); };
  auto v_of = [&](std::size_t b, std::size_t h) { return V.matrix_at(b, h / 2); };
  const auto root = qkv::sqrt(float(d));
  test::threads_guard guard;
  for (std::size_t threads : {1, 3}) {
    set_threads(threads);
    INFO(threads << " threads");
    for (auto strategy : {0, 1}) {
      INFO((strategy ? "naive" : "fused"));
      auto run = [&](const auto& e) {
        if (strategy) return eval(e, naive);
        return eval(e, fused);
      };
      check_slices(run(softmax(causal(score_mod(Q * transpose(K) / root, per_head_alibi{}))) * V), B, H,
                   [&](std::size_t b, std::size_t h) {
                     return run(softmax(causal(score_mod(q_of(b, h) * transpose(k_of(b, h)) / root,
                                                         one_head_alibi{per_head_alibi::slope(h)}))) *
                                v_of(b, h));
                   });
      for (const bool hinted : {false, true}) {
        INFO((hinted ? "with a hint" : "without a hint"));
        auto lengths = [&](std::size_t b) {
          return [&len, b](std::size_t, std::size_t j) { return j < len[b]; };
        };
        auto slice = [&](std::size_t b, std::size_t h) {
          return run(softmax(masked(q_of(b, h) * transpose(k_of(b, h)) / root, lengths(b))) * v_of(b, h));
        };
        if (hinted) check_slices(run(softmax(masked(Q * transpose(K) / root, hinted_lengths{&len})) * V), B, H, slice);
        else check_slices(run(softmax(masked(Q * transpose(K) / root, lengths_mask{&len})) * V), B, H, slice);
      }
    }
  }
}

TEST_CASE("the batch and head forms against the reference on a matrix: b = h = 0", "[head]") {
  const std::size_t n = 37, m = 90;
  inputs<float> in(n, m, 24, 24, 16, 8, 2);
  const float root = qkv::sqrt(24.0f);
  const auto q = ref::from(in.Q), k = ref::from(in.K), v = ref::from(in.V);
  const alibi_t<float> ref_alibi{per_head_alibi::slope(0)};
  const std::vector<std::size_t> len{50};
  scores sc = modified(scaled<float>(dot_scores<float>(q, k), 1 / static_cast<real>(root)), ref_alibi);
  sc.s = masked_by(sc.s, [](std::size_t, std::size_t j) { return j < 50; });
  const auto e = softmax(masked(score_mod(in.Q * transpose(in.K) / root, per_head_alibi{}), lengths_mask{&len})) * in.V;
  check_pair<float>(eval(e, naive), eval(e, fused), sc, v);
}

TEST_CASE("key_aligned(f): the query's position among the keys, for n < m and n > m", "[head][key_aligned]") {
  const auto [n, m] = GENERATE(table<std::size_t, std::size_t>({{4, 300}, {37, 300}, {300, 37}, {50, 50}}));
  INFO("n = " << n << ", m = " << m);
  inputs<float> in(n, m, 16, 16, 16, std::uint32_t(n + m), 2);
  const auto S = in.Q * transpose(in.K) / 4.0f;
  const float shift = float(m) - float(n);
  // ALiBi at key positions: the same as writing i + (m − n) by hand.
  const auto aligned = key_aligned([](auto s, auto i, auto j) { return s - 0.25f * (i - j); });
  const auto by_hand = [shift](auto s, auto i, auto j) { return s - 0.25f * ((i + decltype(i)(shift)) - j); };
  CHECK(same_bits(eval(softmax(causal(score_mod(S, aligned))) * in.V), eval(softmax(causal(score_mod(S, by_hand))) * in.V)));
  CHECK(same_bits(eval(softmax(causal(score_mod(S, aligned))) * in.V, naive),
                  eval(softmax(causal(score_mod(S, by_hand))) * in.V, naive)));
  // A window predicate at key positions (signed: i' < 0 when n > m) is window(S, 40).
  const auto pred = key_aligned([](std::ptrdiff_t i, std::ptrdiff_t j) { return j <= i && i - j < 40; });
  CHECK(same_bits(eval(softmax(masked(S, pred)) * in.V, naive), eval(softmax(window(S, 40)) * in.V, naive)));
  const ref::mat want = ref::matmul(ref::softmax(ref::from(eval(window(S, 40), naive))), ref::from(in.V));
  CHECK(ref::max_error(eval(softmax(masked(S, pred)) * in.V, fused), want) <= 1e-5);
  // With its block hint, in the same coordinates.
  struct hinted {
    bool operator()(std::ptrdiff_t i, std::ptrdiff_t j) const { return j <= i && i - j < 40; }
    bool any(std::ptrdiff_t i0, std::ptrdiff_t i1, std::ptrdiff_t j0, std::ptrdiff_t j1) const {
      return j0 < i1 && j1 + 40 > i0 + 1;
    }
  };
  CHECK(same_bits(eval(softmax(masked(S, key_aligned(hinted{}))) * in.V), eval(softmax(masked(S, pred)) * in.V)));
}
