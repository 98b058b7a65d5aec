// Ragged batches: B sequences of different lengths packed end to end. Each
// sequence attends within itself, so its output must be bit for bit the
// same expression on that sequence alone as a tensor of batch 1 (batch
// invariance), whatever the other sequences, their order or the thread
// count; the tensor path is checked against the float64 reference
// elsewhere, and one ragged shape is checked against it here directly.
#include <catch2/catch.hpp>

#include "reference.hpp"
#include "support.hpp"

#include <qkv/qkv.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

using namespace qkv;
using test::same_bits;

namespace {

std::vector<std::int32_t> offsets_of(const std::vector<std::size_t>& lengths) {
  std::vector<std::int32_t> o{0};
  for (std::size_t n : lengths) o.push_back(o.back() + static_cast<std::int32_t>(n));
  return o;
}

template <class T>
ragged<T, dyn, dyn> random_ragged(const std::vector<std::size_t>& lengths, std::size_t heads, std::size_t dim,
                                  ref::rng& rng) {
  ragged<T, dyn, dyn> r(offsets_of(lengths), {heads, dim});
  for (std::size_t k = 0; k < r.size(); ++k) r.data()[k] = static_cast<T>(rng.uniform(-1, 1));
  return r;
}

// Sequence b of r alone, as a [1, H, n, D] tensor.
template <class R>
auto alone(const R& r, std::size_t b) {
  using T = typename R::value_type;
  tensor<T, 1, dyn, dyn, dyn> t(std::size_t(1), r.heads(), r.length(b), r.cols());
  const std::size_t t0 = static_cast<std::size_t>(r.offsets()[b]);
  for (std::size_t i = 0; i < r.length(b); ++i)
    for (std::size_t h = 0; h < r.heads(); ++h)
      for (std::size_t c = 0; c < r.cols(); ++c) t(0, h, i, c) = r(t0 + i, h, c);
  return t;
}

// The same sequences in the order `order` (a permutation of 0..B-1).
template <class R>
R reordered(const R& r, const std::vector<std::size_t>& order) {
  std::vector<std::size_t> lengths;
  for (std::size_t b : order) lengths.push_back(r.length(b));
  R out(offsets_of(lengths), {r.heads(), r.cols()});
  std::size_t t = 0;
  for (std::size_t b : order)
    for (std::size_t i = 0; i < r.length(b); ++i, ++t)
      for (std::size_t h = 0; h < r.heads(); ++h)
        for (std::size_t c = 0; c < r.cols(); ++c) out(t, h, c) = r(static_cast<std::size_t>(r.offsets()[b]) + i, h, c);
  return out;
}

// Every sequence and head of got has the bits of want(b)'s head h.
template <class Got, class Want>
void check_sequences(const Got& got, Want want) {
  for (std::size_t b = 0; b < got.batch(); ++b) {
    const auto w = want(b);
    for (std::size_t h = 0; h < got.heads(); ++h) {
      INFO("sequence " << b << ", head " << h);
      CHECK(same_bits(got.matrix_at(b, h), w.matrix_at(0, h)));
    }
  }
}

// ALiBi whose slope depends on the sequence: b must be the sequence's index.
struct per_sequence_alibi {
  std::size_t first = 0;  // the sequence b = 0 stands for
  template <class V>
  V operator()(const V& s, std::size_t b, std::size_t h, const V& i, const V& j) const {
    return s - V(0.125f * float(b + first + 1) + 0.0625f * float(h)) * (i - j);
  }
};

}  // namespace

TEST_CASE("ragged and ragged_view: layout, offsets and errors", "[ragged][storage]") {
  const std::vector<std::int32_t> off{0, 3, 3, 7};
  ragged<float, 2, 5> r(off, {2, 5});
  CHECK(r.batch() == 3);
  CHECK(r.tokens() == 7);
  CHECK(r.length(0) == 3);
  CHECK(r.length(1) == 0);
  CHECK(r.length(2) == 4);
  CHECK(std::equal(r.offsets().begin(), r.offsets().end(), off.begin(), off.end()));
  CHECK(r.size() == 70);
  for (std::size_t k = 0; k < r.size(); ++k) CHECK(r.data()[k] == 0.0f);
  r(4, 1, 3) = 2.5f;
  CHECK(r.data()[(4 * 2 + 1) * 5 + 3] == 2.5f);  // token-major: [tokens, H, D]
  CHECK(r.matrix_at(2, 1)(1, 3) == 2.5f);        // sequence 2's second token
  CHECK(r.matrix_at(2, 1).row_stride() == 10);
  CHECK_THROWS_AS(r.at(7, 0, 0), std::out_of_range);
  CHECK_THROWS_AS(r.at(0, 2, 0), std::out_of_range);
  CHECK_THROWS_AS(r.matrix_at(3, 0), std::out_of_range);
  CHECK_THROWS_AS(r.length(3), std::out_of_range);

  ragged_view<const float, dyn, 5> v = r;
  CHECK(v(4, 1, 3) == 2.5f);
  CHECK(v.data() == r.data());
  std::vector<float> memory(7 * 2 * 5, 1.0f);
  ragged_view<float, 2, dyn> u(memory.data(), off, {2, 5});
  CHECK(u.length(2) == 4);
  CHECK(u.cols() == 5);

  using bad = std::vector<std::int32_t>;
  CHECK_THROWS_AS((ragged<float, 2, 5>(bad{}, {2, 5})), std::invalid_argument);
  CHECK_THROWS_AS((ragged<float, 2, 5>(bad{1, 3}, {2, 5})), std::invalid_argument);
  CHECK_THROWS_AS((ragged<float, 2, 5>(bad{0, 3, 2}, {2, 5})), std::invalid_argument);
  CHECK_THROWS_AS((ragged<float, 2, 5>(bad{0, -1}, {2, 5})), std::invalid_argument);
  CHECK_THROWS_AS((ragged<float, 2, 5>(off, {3, 5})), shape_error);  // static H
  CHECK_THROWS_AS((ragged_view<float, 2, 5>(memory.data(), off, {2, 4})), shape_error);  // static D
  CHECK_THROWS_AS((ragged_view<float, 2, 5>(nullptr, off, {2, 5})), std::invalid_argument);
  const ragged<float, 2, 5> none(bad{0}, {2, 5});  // an empty batch
  CHECK(none.batch() == 0);
  CHECK(none.tokens() == 0);
}

TEST_CASE("ragged attention: each sequence bit for bit as a tensor of batch 1, in any batch", "[ragged]") {
  // Lengths across the vector width, the register tile and the query and
  // key blocks; a sequence of length 0; queries at the end of their keys
  // (chunked prefill and decode: n_b ≤ m_b); grouped heads; dk ≠ dv.
  const std::vector<std::size_t> nq{37, 0, 1, 130, 5, 1};
  const std::vector<std::size_t> nk{37, 0, 300, 130, 69, 1};
  const std::size_t H = 4, Hk = 2, dk = 24, dv = 40;
  ref::rng rng(50);
  const auto Q = random_ragged<float>(nq, H, dk, rng);
  const auto K = random_ragged<float>(nk, Hk, dk, rng);
  const auto V = random_ragged<float>(nk, Hk, dv, rng);
  const auto root = qkv::sqrt(float(dk));
  const auto each = [&](auto form) {
    const auto got = eval(form(Q, K, V));
    REQUIRE(got.batch() == nq.size());
    for (std::size_t b = 0; b < nq.size(); ++b) REQUIRE(got.length(b) == nq[b]);
    check_sequences(got, [&](std::size_t b) { return eval(form(alone(Q, b), alone(K, b), alone(V, b))); });
    // Reversed, the sequences keep their bits.
    std::vector<std::size_t> order(nq.size());
    for (std::size_t b = 0; b < order.size(); ++b) order[b] = order.size() - 1 - b;
    const auto back = eval(form(reordered(Q, order), reordered(K, order), reordered(V, order)));
    for (std::size_t b = 0; b < order.size(); ++b)
      for (std::size_t h = 0; h < H; ++h) CHECK(same_bits(back.matrix_at(b, h), got.matrix_at(order[b], h)));
    // The node-by-node evaluation slices the same way: each sequence as
    // the naive evaluation of that sequence alone. (Fused against the exact
    // result: the float64 reference test below.)
    check_sequences(eval(form(Q, K, V), naive),
                    [&](std::size_t b) { return eval(form(alone(Q, b), alone(K, b), alone(V, b)), naive); });
  };
  test::threads_guard guard;
  for (std::size_t threads : {1, 2}) {
    set_threads(threads);
    INFO(threads << " threads");
    SECTION("plain") { each([&](const auto& q, const auto& k, const auto& v) { return softmax(q * transpose(k) / root) * v; }); }
    SECTION("causal") {
      each([&](const auto& q, const auto& k, const auto& v) { return softmax(causal(q * transpose(k) / root)) * v; });
    }
    SECTION("window") {
      each([&](const auto& q, const auto& k, const auto& v) { return softmax(window(q * transpose(k) / root, 16)) * v; });
    }
    SECTION("score_mod f(s, b, h, i, j): b is the sequence") {
      const auto got = eval(softmax(causal(score_mod(Q * transpose(K) / root, per_sequence_alibi{}))) * V);
      check_sequences(got, [&](std::size_t b) {
        return eval(softmax(causal(score_mod(alone(Q, b) * transpose(alone(K, b)) / root, per_sequence_alibi{b}))) *
                    alone(V, b));
      });
    }
  }
}

TEST_CASE("ragged attention against the float64 reference", "[ragged]") {
  const std::vector<std::size_t> n{19, 64, 3}, m{19, 200, 70};
  const std::size_t H = 2, dk = 32, dv = 17;
  ref::rng rng(51);
  const auto Q = random_ragged<float>(n, H, dk, rng);
  const auto K = random_ragged<float>(m, H, dk, rng);
  const auto V = random_ragged<float>(m, H, dv, rng);
  const float root = qkv::sqrt(float(dk));
  const auto O = eval(softmax(causal(Q * transpose(K) / root)) * V);
  using R = ref::real_for<float>;
  const R rscale = 1 / static_cast<R>(root);
  for (std::size_t b = 0; b < n.size(); ++b)
    for (std::size_t h = 0; h < H; ++h) {
      const auto q = ref::from<R>(Q.matrix_at(b, h)), k = ref::from<R>(K.matrix_at(b, h)), v = ref::from<R>(V.matrix_at(b, h));
      const auto s = ref::causal(ref::scale(ref::matmul(q, ref::transpose(k)), rscale));
      const auto p = ref::softmax(s);
      INFO("sequence " << b << ", head " << h);
      // Within the rounding bound of one float attention of this shape.
      CHECK(ref::worst_ratio(O.matrix_at(b, h), ref::matmul(p, v), ref::attention_bound<float>(q, k, v, rscale, s, p)) <= 1);
    }
}

TEST_CASE("ragged eval_with_lse and merge: per sequence as tensors, bit for bit", "[ragged][lse]") {
  const std::vector<std::size_t> n{9, 0, 40}, m1{30, 4, 17}, m2{5, 0, 64};
  const std::size_t H = 2, d = 16;
  ref::rng rng(52);
  const auto Q = random_ragged<float>(n, H, d, rng);
  const auto K1 = random_ragged<float>(m1, H, d, rng), V1 = random_ragged<float>(m1, H, d, rng);
  const auto K2 = random_ragged<float>(m2, H, d, rng), V2 = random_ragged<float>(m2, H, d, rng);
  const auto [O1, L1] = eval_with_lse(softmax(Q * transpose(K1)) * V1);
  const auto [O2, L2] = eval_with_lse(softmax(Q * transpose(K2)) * V2);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(L1)>, ragged<float, dyn, 1>>);
  REQUIRE(L1.batch() == 3);
  const auto [O, L] = merge(O1, L1, O2, L2);
  for (std::size_t b = 0; b < n.size(); ++b) {
    const auto q = alone(Q, b);
    const auto [o1, l1] = eval_with_lse(softmax(q * transpose(alone(K1, b))) * alone(V1, b));
    const auto [o2, l2] = eval_with_lse(softmax(q * transpose(alone(K2, b))) * alone(V2, b));
    const auto [o, l] = merge(o1, l1, o2, l2);
    for (std::size_t h = 0; h < H; ++h) {
      INFO("sequence " << b << ", head " << h);
      CHECK(same_bits(O1.matrix_at(b, h), o1.matrix_at(0, h)));
      CHECK(same_bits(L1.matrix_at(b, h), l1.matrix_at(0, h)));
      CHECK(same_bits(O.matrix_at(b, h), o.matrix_at(0, h)));
      CHECK(same_bits(L.matrix_at(b, h), l.matrix_at(0, h)));
    }
  }
  const auto other = random_ragged<float>({9, 1, 39}, H, 1, rng);  // the same tokens, other offsets
  CHECK_THROWS_AS(merge(O1, L1, O2, other), shape_error);
}

TEST_CASE("ragged gradient: per sequence as tensors, bit for bit, fused and naive", "[ragged][gradient]") {
  const std::vector<std::size_t> n{33, 0, 1, 70}, m{33, 5, 40, 70};
  const std::size_t H = 4, Hk = 2, dk = 16, dv = 24;
  ref::rng rng(53);
  const auto Q = random_ragged<float>(n, H, dk, rng);
  const auto K = random_ragged<float>(m, Hk, dk, rng);
  const auto V = random_ragged<float>(m, Hk, dv, rng);
  const auto dO = random_ragged<float>(n, H, dv, rng);
  const float root = qkv::sqrt(float(dk));
  const auto form = [&](const auto& q, const auto& k, const auto& v) { return softmax(causal(q * transpose(k) / root)) * v; };
  test::threads_guard guard;
  for (std::size_t threads : {1, 2}) {
    set_threads(threads);
    INFO(threads << " threads");
    const auto [dQ, dK, dV] = gradient(form(Q, K, V), dO, wrt(Q, K, V));
    REQUIRE(dK.batch() == m.size());
    check_sequences(dQ, [&](std::size_t b) {
      const auto q = alone(Q, b), k = alone(K, b), v = alone(V, b);
      return std::get<0>(gradient(form(q, k, v), alone(dO, b), wrt(q, k, v)));
    });
    check_sequences(dK, [&](std::size_t b) {
      const auto q = alone(Q, b), k = alone(K, b), v = alone(V, b);
      return std::get<1>(gradient(form(q, k, v), alone(dO, b), wrt(q, k, v)));
    });
    check_sequences(dV, [&](std::size_t b) {
      const auto q = alone(Q, b), k = alone(K, b), v = alone(V, b);
      return std::get<2>(gradient(form(q, k, v), alone(dO, b), wrt(q, k, v)));
    });
    // Node by node, each sequence as the node-by-node gradient of that
    // sequence alone.
    const auto [nQ, nK, nV] = gradient(form(Q, K, V), dO, wrt(Q, K, V), naive);
    const auto naive_alone = [&](std::size_t b) {
      const auto q = alone(Q, b), k = alone(K, b), v = alone(V, b);
      return gradient(form(q, k, v), alone(dO, b), wrt(q, k, v), naive);
    };
    check_sequences(nQ, [&](std::size_t b) { return std::get<0>(naive_alone(b)); });
    check_sequences(nK, [&](std::size_t b) { return std::get<1>(naive_alone(b)); });
    check_sequences(nV, [&](std::size_t b) { return std::get<2>(naive_alone(b)); });
  }
}

TEST_CASE("ragged bf16 caches and float queries: per sequence as tensors, bit for bit", "[ragged][bf16]") {
  const std::vector<std::size_t> n{1, 16, 3}, m{100, 16, 257};
  ref::rng rng(54);
  const auto Q = random_ragged<float>(n, 8, 64, rng);
  const auto K = random_ragged<bf16>(m, 2, 64, rng);
  const auto V = random_ragged<bf16>(m, 2, 64, rng);
  const auto got = eval(softmax(causal(Q * transpose(K) / 8.0f)) * V);
  check_sequences(got, [&](std::size_t b) { return eval(softmax(causal(alone(Q, b) * transpose(alone(K, b)) / 8.0f)) * alone(V, b)); });
  const auto Qb = random_ragged<bf16>(n, 8, 64, rng);
  const auto all = eval(softmax(Qb * transpose(K)) * V);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(all)>, ragged<bf16, dyn, dyn>>);
  check_sequences(all, [&](std::size_t b) { return eval(softmax(alone(Qb, b) * transpose(alone(K, b))) * alone(V, b)); });
}

TEST_CASE("ragged operands that do not fit throw before any work", "[ragged][errors]") {
  ref::rng rng(55);
  const auto Q = random_ragged<float>({4, 5}, 2, 8, rng);
  const auto K = random_ragged<float>({6, 5}, 2, 8, rng);
  const auto V = random_ragged<float>({6, 5}, 2, 8, rng);
  const auto K3 = random_ragged<float>({6, 5, 1}, 2, 8, rng);
  const auto V_other = random_ragged<float>({5, 6}, 2, 8, rng);  // the same tokens, other lengths
  CHECK_THROWS_AS(eval(softmax(Q * transpose(K3)) * V), shape_error);  // B differs
  CHECK_THROWS_WITH(eval(softmax(Q * transpose(K)) * V_other), Catch::Contains("in sequence 0"));
  CHECK_THROWS_AS(eval(softmax(Q * transpose(K)) * V_other), std::invalid_argument);
  ragged<float, dyn, dyn> wrong(offsets_of({5, 4}), {2, 8});
  CHECK_THROWS_AS(eval_into(wrong, softmax(Q * transpose(K)) * V), shape_error);
  ragged<float, dyn, dyn> right(offsets_of({4, 5}), {2, 8});
  eval_into(right, softmax(Q * transpose(K)) * V);
  CHECK(same_bits(right.matrix_at(1, 1), eval(softmax(Q * transpose(K)) * V).matrix_at(1, 1)));
  CHECK_THROWS_AS(gradient(softmax(Q * transpose(K)) * V, wrong, wrt(Q)), shape_error);
  // The cost model counts each sequence's own pairs.
  const auto e = softmax(causal(Q * transpose(K))) * V;
  const cost_estimate c = cost(e);
  const cost_estimate c0 = cost(softmax(causal(alone(Q, 0) * transpose(alone(K, 0)))) * alone(V, 0));
  const cost_estimate c1 = cost(softmax(causal(alone(Q, 1) * transpose(alone(K, 1)))) * alone(V, 1));
  CHECK(c.flops == c0.flops + c1.flops);
  CHECK(c.exps == c0.exps + c1.exps);
  const auto empty = random_ragged<float>({}, 2, 8, rng);
  CHECK(eval(softmax(empty * transpose(empty)) * empty).batch() == 0);
}
