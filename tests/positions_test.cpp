// positions(S, q0, k0): causal and windows at the positions it gives
// (top-left causal when n ≠ m, negative origins, the parts of a split cache
// merged into the whole), against the long-double reference, naive and
// fused, float and double; the node placed wherever it is written;
// key_aligned functors at (q0 + i, k0 + j); gradients; tensors with grouped
// heads; bf16; cost; explain.
// Tolerances: extension_support.hpp's check_pair (the reference's bound from
// each score's error, and the fused error within twice the naive one); a
// merge of two parts against the whole within a few units of roundoff of the
// output (two extra roundings per element, merge_rows).
#include <catch2/catch.hpp>

#include "extension_support.hpp"

#include <qkv/qkv.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

using namespace qkv;
using namespace test::ext;

namespace {

// Whether key j is seen by row i, row i at q0 + i and key j at k0 + j.
struct seen_at {
  std::ptrdiff_t q0, k0;
  bool causal;
  std::size_t left, right;  // (no_bound: none)
  bool operator()(std::size_t i, std::size_t j) const {
    const long long p = q0 + static_cast<long long>(i), k = k0 + static_cast<long long>(j);
    if (causal && k > p) return false;
    if (left != kernels::key_bounds::no_bound && k < p - static_cast<long long>(left)) return false;
    if (right != kernels::key_bounds::no_bound && k > p + static_cast<long long>(right)) return false;
    return true;
  }
};

template <class T>
void check_positions(std::size_t n, std::size_t m, std::ptrdiff_t q0, std::ptrdiff_t k0, std::size_t left,
                     std::size_t right, std::uint32_t seed) {
  if (test::emulation_skips(n, m, 24, 17)) return;
  INFO("n = " << n << ", m = " << m << ", q0 = " << q0 << ", k0 = " << k0 << ", left = " << left << ", right = " << right
              << ", " << type_name(T()) << ", kernels " << active_arch());
  inputs<T> in(n, m, 24, 24, 17, seed, 2);
  const T root = qkv::sqrt(T(24));
  const auto q = ref::from(in.Q), k = ref::from(in.K), v = ref::from(in.V);
  const scores raw = scaled<T>(dot_scores<T>(q, k), 1 / static_cast<real>(root));
  const auto S = in.Q * transpose(in.K) / root;
  {
    INFO("causal(positions(S, q0, k0))");
    scores sc = raw;
    sc.s = masked_by(sc.s, seen_at{q0, k0, true, kernels::key_bounds::no_bound, kernels::key_bounds::no_bound});
    const auto e = softmax(causal(positions(S, q0, k0))) * in.V;
    const auto got = eval(e, naive);
    check_pair<T>(got, eval(e, fused), sc, v);
    // Written outside causal: the same node, the same bits.
    CHECK(same_bits(got, eval(softmax(positions(causal(S), q0, k0)) * in.V, naive)));
    CHECK(same_bits(eval(e, fused), eval(softmax(positions(causal(S), q0, k0)) * in.V, fused)));
    // A key_aligned predicate gets (q0 + i, k0 + j): j ≤ i is causal there.
    const auto pred = key_aligned([](std::ptrdiff_t i, std::ptrdiff_t j) { return j <= i; });
    CHECK(same_bits(got, eval(softmax(masked(positions(S, q0, k0), pred)) * in.V, naive)));
  }
  {
    INFO("window(positions(S, q0, k0), left, right)");
    scores sc = raw;
    sc.s = masked_by(sc.s, seen_at{q0, k0, false, left, right});
    const auto e = softmax(window(positions(S, q0, k0), left, right)) * in.V;
    check_pair<T>(eval(e, naive), eval(e, fused), sc, v);
    CHECK(same_bits(eval(e, fused), eval(softmax(positions(window(S, left, right), q0, k0)) * in.V, fused)));
  }
}

}  // namespace

TEMPLATE_TEST_CASE("causal and windows at the positions positions(S, q0, k0) gives", "[positions]", float, double) {
  using T = TestType;
  // {n, m}: n = m, decodes and a prefill against a cache, n > m, across key blocks.
  const auto [n, m] = GENERATE(table<std::size_t, std::size_t>({{37, 37}, {1, 300}, {4, 300}, {37, 300}, {300, 37}, {70, 1100}}));
  // {q0, k0}: top-left, bottom-right, the second part of a split cache, negative origins.
  const auto [q0, k0] = GENERATE(table<std::ptrdiff_t, std::ptrdiff_t>({{0, 0}, {263, 0}, {300, 150}, {-5, -20}, {10, 40}}));
  check_positions<T>(n, m, q0, k0, 40, 3, static_cast<std::uint32_t>(n * 31 + m + static_cast<std::size_t>(q0 + 50)));
}

TEST_CASE("causal(positions(S, 0, 0)) is top-left causal: row i sees keys 0 … i", "[positions]") {
  inputs<double> in(5, 9, 8, 8, 3, 7);
  const auto S = in.Q * transpose(in.K);
  const auto top_left = [](std::size_t i, std::size_t j) { return j <= i; };
  const auto want = eval(softmax(masked(S, top_left)) * in.V, naive);
  CHECK(same_bits(eval(softmax(causal(positions(S, 0, 0))) * in.V, naive), want));
  const auto fused_out = eval(softmax(causal(positions(S, 0, 0))) * in.V, fused);
  for (std::size_t i = 0; i < 5; ++i)
    for (std::size_t c = 0; c < 3; ++c) CHECK(fused_out(i, c) == Approx(want(i, c)).epsilon(1e-14));
  // Without positions, causal aligns the last query with the last key.
  CHECK(!same_bits(eval(softmax(causal(S)) * in.V, naive), want));
  // Row 0 sees key 0 alone.
  for (std::size_t c = 0; c < 3; ++c) CHECK(fused_out(0, c) == Approx(in.V(0, c)).epsilon(1e-15));
}

TEMPLATE_TEST_CASE("a window over a cache split in two parts, merged, is the window over the whole", "[positions]", float,
                   double) {
  using T = TestType;
  const std::size_t n = GENERATE(std::size_t{1}, std::size_t{4}, std::size_t{200});
  const std::size_t m1 = 700, m2 = 330, m = m1 + m2, w = 500;
  if (test::emulation_skips(n, m, 32, 32)) return;
  INFO("n = " << n << ", " << type_name(T()));
  inputs<T> in(n, m, 32, 32, 16, static_cast<std::uint32_t>(n + 3), 2);
  const T root = qkv::sqrt(T(32));
  const matrix_view<const T, dyn, dyn> K1(in.K.data(), m1, 32), K2(in.K.data() + m1 * 32, m2, 32);
  const matrix_view<const T, dyn, dyn> V1(in.V.data(), m1, 16), V2(in.V.data() + m1 * 16, m2, 16);
  const auto whole = eval_with_lse(softmax(window(in.Q * transpose(in.K) / root, w)) * in.V);
  // The queries are the sequence's last n positions: row i at m − n + i.
  const auto q0 = static_cast<std::ptrdiff_t>(m - n);
  const auto a = eval_with_lse(softmax(window(positions(in.Q * transpose(K1) / root, q0, 0), w)) * V1);
  const auto b = eval_with_lse(softmax(window(positions(in.Q * transpose(K2) / root, q0, m1), w)) * V2);
  const auto merged = merge(a.first, a.second, b.first, b.second);
  const real u = ref::unit_roundoff<T>;
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t c = 0; c < 16; ++c)
      CHECK(std::fabs(real(merged.first(i, c)) - real(whole.first(i, c))) <= 64 * u * (1 + std::fabs(real(whole.first(i, c)))));
    CHECK(std::fabs(real(merged.second(i, 0)) - real(whole.second(i, 0))) <= 64 * u * (1 + std::fabs(real(whole.second(i, 0)))));
  }
}

TEMPLATE_TEST_CASE("key_aligned functors get (q0 + i, k0 + j) under positions", "[positions]", float, double) {
  using T = TestType;
  inputs<T> in(30, 90, 16, 16, 8, 5, 2);
  const auto S = in.Q * transpose(in.K);
  const std::ptrdiff_t q0 = 1000, k0 = 990;
  // ALiBi at the positions, against the same bias written with explicit positions.
  const auto aligned = key_aligned([](auto s, auto i, auto j) { return s - decltype(s)(0.03) * (i - j); });
  const auto explicit_pos = [](auto s, auto i, auto j) {
    return s - decltype(s)(0.03) * ((i + decltype(s)(1000)) - (j + decltype(s)(990)));
  };
  const auto want = eval(softmax(score_mod(S, explicit_pos)) * in.V, naive);
  const auto e = softmax(score_mod(positions(S, q0, k0), aligned)) * in.V;
  const real u = ref::unit_roundoff<T>;
  const auto got_naive = eval(e, naive), got_fused = eval(e, fused);
  const auto outside = eval(softmax(positions(score_mod(S, aligned), q0, k0)) * in.V, naive);
  CHECK(same_bits(got_naive, outside));
  for (std::size_t i = 0; i < 30; ++i)
    for (std::size_t c = 0; c < 8; ++c) {
      CHECK(std::fabs(real(got_naive(i, c)) - real(want(i, c))) <= 64 * u);
      CHECK(std::fabs(real(got_fused(i, c)) - real(want(i, c))) <= 64 * u);
    }
  // Other functors still get the row and column of S.
  const auto plain = [](auto s, auto i, auto j) { return s - decltype(s)(0.03) * (i - j); };
  CHECK(same_bits(eval(softmax(score_mod(positions(S, q0, k0), plain)) * in.V, naive),
                  eval(softmax(score_mod(S, plain)) * in.V, naive)));
}

TEST_CASE("positions: gradients fused and naive, tensors with grouped heads, bf16, cost, explain", "[positions]") {
  SECTION("gradients") {
    inputs<double> in(23, 61, 12, 12, 7, 9, 2);
    const auto e = softmax(window(causal(positions(in.Q * transpose(in.K), 4, 10)), 20, 0)) * in.V;
    dmat<double> dO(23, 7);
    ref::rng(17).fill(dO);
    const auto [fq, fk, fv] = gradient(e, dO, wrt(in.Q, in.K, in.V), fused);
    const auto [nq, nk, nv] = gradient(e, dO, wrt(in.Q, in.K, in.V), naive);
    // The same gradient through an explicit predicate, node by node.
    const auto pred = [](std::size_t i, std::size_t j) { return j + 10 <= i + 4 && j + 10 + 20 >= i + 4; };
    const auto [pq, pk, pv] = gradient(softmax(masked(in.Q * transpose(in.K), pred)) * in.V, dO, wrt(in.Q, in.K, in.V), naive);
    CHECK(same_bits(nq, pq));
    CHECK(same_bits(nk, pk));
    CHECK(same_bits(nv, pv));
    for (std::size_t i = 0; i < 23; ++i)
      for (std::size_t c = 0; c < 12; ++c) CHECK(fq(i, c) == Approx(nq(i, c)).margin(1e-12));
    for (std::size_t j = 0; j < 61; ++j) {
      for (std::size_t c = 0; c < 12; ++c) CHECK(fk(j, c) == Approx(nk(j, c)).margin(1e-12));
      for (std::size_t c = 0; c < 7; ++c) CHECK(fv(j, c) == Approx(nv(j, c)).margin(1e-12));
    }
    // Keys before position q0 − 20 and after the last row's position get nothing.
    for (std::size_t c = 0; c < 7; ++c) CHECK(fv(60, c) == 0.0);
  }
  SECTION("tensors with grouped heads") {
    tensor<float, dyn, dyn, dyn, dyn> Q(2, 4, 9, 16), K(2, 2, 40, 16), V(2, 2, 40, 8);
    ref::rng rng(1);
    test::fill(Q, rng), test::fill(K, rng), test::fill(V, rng);
    const auto e = softmax(causal(positions(Q * transpose(K), 0, 0))) * V;
    const auto a = eval(e, naive), b = eval(e, fused);
    for (std::size_t x = 0; x < 2; ++x)
      for (std::size_t h = 0; h < 4; ++h)
        for (std::size_t i = 0; i < 9; ++i)
          for (std::size_t c = 0; c < 8; ++c) CHECK(b(x, h, i, c) == Approx(a(x, h, i, c)).margin(2e-6));
  }
  SECTION("bf16") {
    matrix<bf16, dyn, dyn> Q(6, 32), K(50, 32), V(50, 32);
    dmat<float> Qf(6, 32), Kf(50, 32), Vf(50, 32);
    ref::rng rng(4);
    rng.fill(Qf, -2, 2), rng.fill(Kf, -2, 2), rng.fill(Vf);
    for (std::size_t i = 0; i < 6; ++i)
      for (std::size_t c = 0; c < 32; ++c) Q(i, c) = bf16(Qf(i, c)), Qf(i, c) = float(Q(i, c));
    for (std::size_t j = 0; j < 50; ++j)
      for (std::size_t c = 0; c < 32; ++c) K(j, c) = bf16(Kf(j, c)), Kf(j, c) = float(K(j, c)), V(j, c) = bf16(Vf(j, c)), Vf(j, c) = float(V(j, c));
    // The same values in float; the fused bf16 kernel may hold the weights in bf16 (2⁻⁸ relative).
    const auto a = eval(softmax(causal(positions(Qf * transpose(Kf), 0, 0))) * Vf, naive);
    matrix<float, dyn, dyn> b(6, 32);
    eval_into(b, softmax(causal(positions(Q * transpose(K), 0, 0))) * V);
    for (std::size_t i = 0; i < 6; ++i)
      for (std::size_t c = 0; c < 32; ++c) CHECK(b(i, c) == Approx(a(i, c)).margin(1.0 / 128));
  }
  SECTION("cost and explain") {
    inputs<double> in(5, 9, 8, 8, 3, 7);
    const auto S = in.Q * transpose(in.K);
    // Top-left over 5 × 9: rows see 1 … 5 keys, 15 pairs; bottom-right sees 5 … 9, 35.
    const auto tl = cost(softmax(causal(positions(S, 0, 0))) * in.V), br = cost(softmax(causal(S)) * in.V);
    CHECK(tl.exps * 35 == br.exps * 15);
    CHECK(explain(softmax(causal(positions(S, 0, 0))) * in.V).find("positions") != std::string::npos);
  }
}

TEST_CASE("decoding with the user's modifier and predicate: the decode parts, against node by node", "[positions][decode]") {
  // One and four queries per head over 5000 keys (several decode parts), per-sequence lengths as a
  // predicate with a block hint, and per-head ALiBi: fused within the bound of naive, the same bits on
  // 1 and 2 threads, and the lengths as a bool mask agreeing.
  const std::size_t B = 2, H = 2, m = 5000, d = 40;
  const std::size_t n = GENERATE(std::size_t{1}, std::size_t{4});
  tensor<float, dyn, dyn, dyn, dyn> Q(B, H, n, d), K(B, H, m, d), V(B, H, m, d);
  ref::rng rng(static_cast<std::uint32_t>(n));
  test::fill(Q, rng), test::fill(K, rng), test::fill(V, rng);
  const std::size_t len[B] = {3100, 777};
  struct lengths {
    const std::size_t* len;
    bool operator()(std::size_t b, std::size_t, std::size_t, std::size_t j) const { return j < len[b]; }
    bool any(std::size_t b, std::size_t, std::size_t, std::size_t, std::size_t j0, std::size_t) const { return j0 < len[b]; }
  };
  const auto alibi = [](auto s, std::size_t, std::size_t h, auto i, auto j) {
    return s - decltype(s)(0.01f * float(h + 1)) * (i - j);
  };
  const auto e = softmax(masked(score_mod(Q * transpose(K) / 6.0f, alibi), lengths{len})) * V;
  const auto naive_out = eval(e, naive);
  tensor<bool, dyn, dyn, dyn, dyn> M(B, 1, n, m);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < m; ++j) M(b, 0, i, j) = j < len[b];
  const auto by_mask = eval(softmax(masked(score_mod(Q * transpose(K) / 6.0f, alibi), M)) * V);
  tensor<float, dyn, dyn, dyn, dyn> one(B, H, n, d), two(B, H, n, d);
  {
    test::threads_guard t;
    set_threads(1);
    eval_into(one, e);
    set_threads(2);
    eval_into(two, e);
  }
  CHECK(same_bits_tensor(one, two));
  for (std::size_t x = 0; x < one.size(); ++x) {
    CHECK(std::fabs(one.data()[x] - naive_out.data()[x]) <= 1e-5f);
    CHECK(std::fabs(one.data()[x] - by_mask.data()[x]) <= 1e-5f);
  }
}
