// Attention on bf16 and f16 inputs. The contract: the float result of the
// same expression on the inputs converted to float (which is exact), rounded
// once to the 2-byte type, or unrounded into a float destination. So each
// case checks the 2-byte evaluation bit for bit against the float one on
// float copies, for both strategies, and the float result against the
// long-double reference on the same rounded inputs with the float bound of
// tests/reference.hpp, plus one rounding of the output for a 2-byte result.
// One exception: on AVX512-BF16 the fused attention of all-bf16 inputs with
// more queries than decoding takes multiplies bf16 pairs and rounds the
// weights to bf16; it is held to that kernel's bound instead.
#include "reference.hpp"
#include "support.hpp"

#include <qkv/kernels/api.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <string_view>
#include <vector>

using namespace qkv;
using test::fill;
using test::same_bits;

namespace {

template <class To, class M>
matrix<To, dyn, dyn> copy_as(const M& x) {
  matrix<To, dyn, dyn> r(x.rows(), x.cols());
  for (std::size_t i = 0; i < x.rows(); ++i)
    for (std::size_t j = 0; j < x.cols(); ++j) r(i, j) = To(static_cast<float>(x(i, j)));
  return r;
}

template <class T, class M>
bool rounded_from(const M& narrow, const matrix<float, dyn, dyn>& wide) {
  for (std::size_t i = 0; i < wide.rows(); ++i)
    for (std::size_t j = 0; j < wide.cols(); ++j) {
      const T want(wide(i, j));
      if (std::memcmp(&want, &narrow(i, j), sizeof(T)) != 0) return false;
    }
  return true;
}

// |O − O_ref| ≤ the float bound, and for the rounded result that plus the
// rounding: u₂·(|O_ref| + bound), u₂ the 2-byte type's unit roundoff.
template <class T>
void check_against_reference(const matrix<float, dyn, dyn>& wide, const matrix<T, dyn, dyn>& narrow, const ref::mat& q,
                             const ref::mat& k, const ref::mat& v, ref::real scale, bool causal) {
  ref::mat s = ref::scale(ref::matmul(q, ref::transpose(k)), scale);
  if (causal) s = ref::causal(s);
  const ref::mat p = ref::softmax(s), want = ref::matmul(p, v);
  const ref::mat bound = ref::attention_bound<float>(q, k, v, scale, s, p);
  const ref::real u2 = ref::unit_roundoff<T>;
  for (std::size_t i = 0; i < want.rows; ++i)
    for (std::size_t j = 0; j < want.cols; ++j) {
      const ref::real err = std::fabs(static_cast<ref::real>(wide(i, j)) - want(i, j));
      if (!(err <= bound(i, j))) FAIL("float result (" << i << ", " << j << "): error " << double(err) << " > " << double(bound(i, j)));
      const ref::real err2 = std::fabs(static_cast<ref::real>(static_cast<float>(narrow(i, j))) - want(i, j));
      const ref::real bound2 = bound(i, j) + u2 * (std::fabs(want(i, j)) + bound(i, j));
      if (!(err2 <= bound2)) FAIL("rounded result (" << i << ", " << j << "): error " << double(err2) << " > " << double(bound2));
    }
}

// Whether the fused attention of n queries on all-T inputs runs on bf16 pairs.
template <class T>
bool pair_products(std::size_t n) {
  return std::is_same_v<T, bf16> && kernels::bf16_pairs_active() &&
         !kernels::active_blocking(sizeof(float)).decodes(n);
}

// The pair kernel's result against the reference: its bound, plus one
// rounding of the output for a 2-byte result.
template <class M>
void check_pair_result(const M& got, const ref::mat& q, const ref::mat& k, const ref::mat& v, ref::real scale,
                       bool causal, ref::real output_rounding) {
  ref::mat s = ref::scale(ref::matmul(q, ref::transpose(k)), scale);
  if (causal) s = ref::causal(s);
  const ref::mat p = ref::softmax(s), want = ref::matmul(p, v);
  const ref::mat bound = ref::attention_bound_bf16_pairs(q, k, v, scale, s, p);
  for (std::size_t i = 0; i < want.rows; ++i)
    for (std::size_t j = 0; j < want.cols; ++j) {
      const ref::real err = std::fabs(static_cast<ref::real>(static_cast<float>(got(i, j))) - want(i, j));
      const ref::real b = bound(i, j) + output_rounding * (std::fabs(want(i, j)) + bound(i, j));
      if (!(err <= b)) FAIL("pair result (" << i << ", " << j << "): error " << double(err) << " > " << double(b));
    }
}

}  // namespace

TEMPLATE_TEST_CASE("attention on 2-byte inputs: the float result, rounded once", "[half][attention]", bf16, f16) {
  using T = TestType;
  const auto [n, m, dk, dv] = GENERATE(table<std::size_t, std::size_t, std::size_t, std::size_t>(
      {{1, 1, 1, 1}, {3, 50, 16, 8}, {37, 53, 24, 40}, {130, 257, 33, 17}, {70, 300, 64, 64}}));
  const bool causal_mask = GENERATE(false, true);
  INFO("n = " << n << ", m = " << m << ", dk = " << dk << ", dv = " << dv << ", causal = " << causal_mask);
  ref::rng rng(static_cast<std::uint32_t>(n * 7 + m + dk));
  matrix<T, dyn, dyn> Q(n, dk), K(m, dk), V(m, dv);
  rng.fill(Q, -2, 2);
  rng.fill(K, -2, 2);
  rng.fill(V);
  const auto Qf = copy_as<float>(Q), Kf = copy_as<float>(K), Vf = copy_as<float>(V);
  const float c = 1.0f / std::sqrt(static_cast<float>(dk));

  auto attention = [&](const auto& q, const auto& k, const auto& v) {
    return causal_mask ? eval(softmax(causal(q * transpose(k)) * c) * v, naive) : eval(softmax(q * transpose(k) * c) * v, naive);
  };
  auto attention_fused = [&](const auto& q, const auto& k, const auto& v) {
    return causal_mask ? eval(softmax(causal(q * transpose(k)) * c) * v, fused) : eval(softmax(q * transpose(k) * c) * v, fused);
  };
  // Both strategies: the 2-byte result is the float one on float copies, rounded.
  const matrix<float, dyn, dyn> wide_naive = attention(Qf, Kf, Vf), wide_fused = attention_fused(Qf, Kf, Vf);
  const matrix<T, dyn, dyn> narrow_naive = attention(Q, K, V), narrow_fused = attention_fused(Q, K, V);
  CHECK(rounded_from<T>(narrow_naive, wide_naive));
  // A float destination gets the float result, unrounded.
  matrix<float, dyn, dyn> into(n, dv);
  if (causal_mask) eval_into(into, softmax(causal(Q * transpose(K)) * c) * V, fused);
  else eval_into(into, softmax(Q * transpose(K) * c) * V, fused);
  if (pair_products<T>(n)) {
    const ref::mat q = ref::from(Q), k = ref::from(K), v = ref::from(V);
    check_pair_result(narrow_fused, q, k, v, c, causal_mask, ref::unit_roundoff<T>);
    check_pair_result(into, q, k, v, c, causal_mask, 0);
    CHECK(rounded_from<T>(narrow_fused, into));
  } else {
    CHECK(rounded_from<T>(narrow_fused, wide_fused));
    CHECK(same_bits(into, wide_fused));
  }
  // Float queries over a 2-byte cache: the float result.
  const matrix<float, dyn, dyn> mixed = attention_fused(Qf, K, V);
  CHECK(same_bits(mixed, wide_fused));
  if (!test::emulation_skips(n, m, dk, dv)) {
    const ref::mat q = ref::from(Q), k = ref::from(K), v = ref::from(V);
    check_against_reference<T>(wide_naive, narrow_naive, q, k, v, c, causal_mask);
    if (!pair_products<T>(n)) check_against_reference<T>(wide_fused, narrow_fused, q, k, v, c, causal_mask);
  }
}

TEMPLATE_TEST_CASE("2-byte tensors: [B, T, H, D] read in place, grouped-query heads", "[half][tensor]", bf16, f16) {
  using T = TestType;
  const std::size_t B = 2, n = 45, m = 70, Hq = 4, Hkv = 2, D = 20;
  ref::rng rng(21);
  // Q as [B, T, H, D] memory read as [B, H, T, D]; K, V grouped, contiguous.
  std::vector<T> q(B * n * Hq * D);
  for (auto& x : q) x = T(rng.uniform(-1, 1));
  tensor_view<const T, dyn, dyn, dyn, dyn> Qv(q.data(), {B, Hq, n, D}, {n * Hq * D, D, Hq * D, 1});
  tensor<T, dyn, dyn, dyn, dyn> K(B, Hkv, m, D), V(B, Hkv, m, D);
  fill(K, rng);
  fill(V, rng);
  tensor<float, dyn, dyn, dyn, dyn> Qf(B, Hq, n, D), Kf(B, Hkv, m, D), Vf(B, Hkv, m, D);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < Hq; ++h)
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < D; ++j) Qf(b, h, i, j) = Qv(b, h, i, j);
  for (std::size_t x = 0; x < K.size(); ++x) Kf.data()[x] = K.data()[x], Vf.data()[x] = V.data()[x];

  const float c = 1.0f / std::sqrt(float(D));
  const auto wide = eval(softmax(causal(Qf * transpose(Kf)) * c) * Vf);
  const auto narrow = eval(softmax(causal(Qv * transpose(K)) * c) * V);
  static_assert(std::is_same_v<typename decltype(narrow)::value_type, T>);
  REQUIRE(narrow.extents() == wide.extents());
  // On bf16 pairs each head is the pair kernel's result on that head's
  // matrices (whose bound the first case checks), not the float one.
  tensor<float, dyn, dyn, dyn, dyn> heads = wide;
  if (pair_products<T>(n)) {
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < Hq; ++h) {
        matrix<T, dyn, dyn> q1(n, D), k1(m, D), v1(m, D);
        for (std::size_t i = 0; i < n; ++i)
          for (std::size_t j = 0; j < D; ++j) q1(i, j) = Qv(b, h, i, j);
        for (std::size_t i = 0; i < m; ++i)
          for (std::size_t j = 0; j < D; ++j) k1(i, j) = K(b, h / (Hq / Hkv), i, j), v1(i, j) = V(b, h / (Hq / Hkv), i, j);
        matrix<float, dyn, dyn> o1(n, D);
        eval_into(o1, softmax(causal(q1 * transpose(k1)) * c) * v1);
        for (std::size_t i = 0; i < n; ++i)
          for (std::size_t j = 0; j < D; ++j) heads(b, h, i, j) = o1(i, j);
      }
  }
  bool all = true;
  for (std::size_t x = 0; x < heads.size(); ++x) all = all && T(heads.data()[x]).bits() == narrow.data()[x].bits();
  CHECK(all);
  // Into a [B, T, H, D] float destination, in place.
  std::vector<float> out(B * n * Hq * D);
  tensor_view<float, dyn, dyn, dyn, dyn> Ov(out.data(), {B, Hq, n, D}, {n * Hq * D, D, Hq * D, 1});
  eval_into(Ov, softmax(causal(Qv * transpose(K)) * c) * V);
  all = true;
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < Hq; ++h)
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < D; ++j) all = all && Ov(b, h, i, j) == heads(b, h, i, j);
  CHECK(all);
}

TEST_CASE("2-byte inputs: masks, an empty row, NaN confined to its row", "[half][mask][nonfinite]") {
  const std::size_t n = 9, m = 40, d = 16;
  ref::rng rng(5);
  matrix<bf16, dyn, dyn> Q(n, d), K(m, d), V(m, d);
  rng.fill(Q);
  rng.fill(K);
  rng.fill(V);
  matrix<bool, dyn, dyn> keep(n, m);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) keep(i, j) = i != 4 && (i + j) % 3 != 0;  // row 4 sees nothing
  Q(6, 3) = std::numeric_limits<bf16>::quiet_NaN();
  const auto O = eval(softmax(masked(Q * transpose(K) * 0.25f, keep)) * V, fused);
  const auto On = eval(softmax(masked(Q * transpose(K) * 0.25f, keep)) * V, naive);
  for (const auto* o : {&O, &On}) {
    for (std::size_t j = 0; j < d; ++j) {
      CHECK(float((*o)(4, j)) == 0.0f);
      CHECK(std::isnan(float((*o)(6, j))));
    }
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < d; ++j)
        if (i != 6) CHECK(std::isfinite(float((*o)(i, j))));
  }
}

TEST_CASE("2-byte inputs: similarities, modifiers, predicates, bias, decoding", "[half][similarity]") {
  const std::size_t n = 23, m = 77, d = 12;
  ref::rng rng(8);
  matrix<f16, dyn, dyn> Q(n, d), K(m, d), V(m, d), W(d, d), Bias(n, m);
  rng.fill(Q);
  rng.fill(K);
  rng.fill(V);
  rng.fill(W, -0.3, 0.3);
  rng.fill(Bias);
  const auto Qf = copy_as<float>(Q), Kf = copy_as<float>(K), Vf = copy_as<float>(V), Wf = copy_as<float>(W),
             Bf = copy_as<float>(Bias);
  auto cap = [](auto s, auto, auto) { return decltype(s)(30) * xsimd::tanh(s / decltype(s)(30)); };
  auto band = [](std::size_t i, std::size_t j) { return j + 20 >= i && j <= i + 40; };
  auto l1 = [](auto q, auto k) { return -xsimd::abs(q - k); };
  auto same = [](const auto& narrow, const auto& wide) { return rounded_from<f16>(narrow, wide); };
  CHECK(same(eval(softmax(similarity(Q, K, cosine) * 3.0f) * V), eval(softmax(similarity(Qf, Kf, cosine) * 3.0f) * Vf)));
  CHECK(same(eval(softmax(similarity(Q, K, neg_sq_l2)) * V), eval(softmax(similarity(Qf, Kf, neg_sq_l2)) * Vf)));
  CHECK(same(eval(softmax(similarity(Q, K, bilinear(W))) * V), eval(softmax(similarity(Qf, Kf, bilinear(Wf))) * Vf)));
  CHECK(same(eval(softmax(similarity(Q, K, l1)) * V), eval(softmax(similarity(Qf, Kf, l1)) * Vf)));
  matrix<float, dyn, dyn> Wq(d, 5), Wk(d, 5), w(1, 5);
  rng.fill(Wq);
  rng.fill(Wk);
  rng.fill(w);
  CHECK(same(eval(softmax(similarity(Q, K, additive(Wq, Wk, w))) * V),
             eval(softmax(similarity(Qf, Kf, additive(Wq, Wk, w))) * Vf)));
  CHECK(same(eval(softmax(masked(score_mod(Q * transpose(K) + Bias, cap), band)) * V, fused),
             eval(softmax(masked(score_mod(Qf * transpose(Kf) + Bf, cap), band)) * Vf, fused)));
  // Decoding (n ≤ 4) and a long cache split in parts.
  matrix<f16, dyn, dyn> q1(2, d), Kl(3000, d), Vl(3000, d);
  rng.fill(q1);
  rng.fill(Kl);
  rng.fill(Vl);
  CHECK(same(eval(softmax(q1 * transpose(Kl)) * Vl, fused),
             eval(softmax(copy_as<float>(q1) * transpose(copy_as<float>(Kl))) * copy_as<float>(Vl), fused)));
  // Node by node, any expression: a product, a sum, a transpose.
  CHECK(same(eval(Q * transpose(K) + Bias), eval(Qf * transpose(Kf) + Bf)));
}

TEMPLATE_TEST_CASE("float queries over a 2-byte cache: the bits of the same values in float, every decode path",
                   "[half][decode]", bf16, f16) {
  // Tails of every length (d, dv from 1 to 20 against vectors of 4 to 16), key tails, causal and
  // windowed ranges, a strided K (a [T, H, D] cache read as [H, T, D]), the user's modifier: the
  // kernels convert K and V as they read them, and then compute as on float.
  using S = TestType;
  ref::rng rng(12);
  const auto alibi = [](auto s, auto i, auto j) { return s - decltype(s)(0.125f) * (i - j); };
  for (std::size_t trial = 0; trial < 120; ++trial) {
    const std::size_t n = 1 + trial % 4, m = 1 + (trial * 7) % 41, d = 1 + (trial * 5) % 20, dv = 1 + (trial * 3) % 20;
    INFO("n = " << n << ", m = " << m << ", d = " << d << ", dv = " << dv);
    matrix<float, dyn, dyn> q(n, d);
    matrix<S, dyn, dyn> K(m, d), V(m, dv);
    rng.fill(q), rng.fill(K), rng.fill(V);
    const auto Kf = copy_as<float>(K), Vf = copy_as<float>(V);
    CHECK(same_bits(eval(softmax(q * transpose(K)) * V), eval(softmax(q * transpose(Kf)) * Vf)));
    CHECK(same_bits(eval(softmax(causal(q * transpose(K))) * V), eval(softmax(causal(q * transpose(Kf))) * Vf)));
    CHECK(same_bits(eval(softmax(window(q * transpose(K), 5)) * V), eval(softmax(window(q * transpose(Kf), 5)) * Vf)));
    CHECK(same_bits(eval(softmax(score_mod(q * transpose(K), alibi)) * V), eval(softmax(score_mod(q * transpose(Kf), alibi)) * Vf)));
  }
  // Strided: two heads of a [T, H, D] cache.
  const std::size_t m = 37, d = 13, H = 2;
  std::vector<S> cache(m * H * d);
  std::vector<float> cache_f(m * H * d);
  for (std::size_t x = 0; x < cache.size(); ++x) cache[x] = S(float(rng.uniform(-1, 1))), cache_f[x] = float(cache[x]);
  const tensor_view<const S, 1, dyn, dyn, dyn> Ks(cache.data(), {1, H, m, d}, {m * H * d, d, H * d, 1});
  const tensor_view<const float, 1, dyn, dyn, dyn> Kfs(cache_f.data(), {1, H, m, d}, {m * H * d, d, H * d, 1});
  tensor<float, 1, dyn, dyn, dyn> q(H, 3, d);
  test::fill(q, rng);
  CHECK(test::same_bits_tensor(eval(softmax(q * transpose(Ks)) * Ks), eval(softmax(q * transpose(Kfs)) * Kfs)));
}

TEST_CASE("2-byte inputs: cost counts their float copies and the float result", "[half][cost]") {
  matrix<bf16, 64, 32> Q, K, V;
  matrix<float, 64, 32> Qf, Kf, Vf;
  constexpr auto c16 = static_cost<decltype(softmax(Q * transpose(K)) * V)>();
  constexpr auto c32 = static_cost<decltype(softmax(Qf * transpose(Kf)) * Vf)>();
  constexpr std::size_t one = 64 * 32 * sizeof(float);  // one input or the result, in float
  static_assert(c16.flops == c32.flops && c16.exps == c32.exps);
  // Node by node: three inputs and the result held in float beside the
  // evaluation. Fused: the kernel reads K and V as stored; Q and the result.
  static_assert(c16.naive_bytes == c32.naive_bytes + 4 * one);
  static_assert(c16.fused_bytes == c32.fused_bytes + 2 * one);
  // Float queries: the result is float, and fused nothing is copied.
  // (At run time, with the blocks of the set that runs.)
  const auto r32 = cost(softmax(Qf * transpose(Kf)) * Vf), mixed = cost(softmax(Qf * transpose(K)) * V);
  CHECK(mixed.naive_bytes == r32.naive_bytes + 2 * one);
  CHECK(mixed.fused_bytes == r32.fused_bytes);
  // K and V of different 2-byte types, or a similarity other than the dot
  // product: every 2-byte input is copied, fused too.
  matrix<f16, 64, 32> Vh;
  const auto two_types = cost(softmax(Qf * transpose(K)) * Vh);
  CHECK(two_types.fused_bytes == r32.fused_bytes + 2 * one);
  const auto l2 = cost(softmax(similarity(Qf, K, neg_sq_l2)) * V), l2f = cost(softmax(similarity(Qf, Kf, neg_sq_l2)) * Vf);
  CHECK(l2.fused_bytes == l2f.fused_bytes + 2 * one);
}

TEST_CASE("2-byte inputs: explain says they are evaluated in float, K and V read as stored", "[half]") {
  matrix<bf16, 8, 16> Q, K, V;
  matrix<float, 8, 16> Qf;
  CHECK(explain(softmax(Q * transpose(K)) * V) ==
        "in float: K and V read as stored, the other 2-byte inputs converted, the result rounded once\n"
        "fused: softmax(S) * V with similarity dot\n");
  CHECK(explain(softmax(Qf * transpose(K)) * V) == "in float: K and V read as stored\nfused: softmax(S) * V with similarity dot\n");
  // Cosine is the dot product of normalised rows: K's are evaluated in float.
  CHECK(explain(softmax(similarity(Qf, K, cosine)) * V) ==
        "in float: the 2-byte inputs converted\nfused: softmax(S) * V with similarity dot\n"
        "  node by node: normalize_rows(X)\n  node by node: normalize_rows(X)\n");
  CHECK(explain(Q * transpose(K)) == "in float: the 2-byte inputs converted, the result rounded once\nnode by node: A * B\n");
}

TEMPLATE_TEST_CASE("eval_into a 2-byte destination: eval(e)'s bits, matrices and tensors", "[half]", bf16, f16) {
  using T = TestType;
  ref::rng rng(31);
  matrix<T, dyn, dyn> Q(37, 16), K(50, 16), V(50, 8);
  rng.fill(Q, -2, 2), rng.fill(K, -2, 2), rng.fill(V);
  const auto e = softmax(causal(Q * transpose(K)) * 0.25f) * V;
  matrix<T, dyn, dyn> into(37, 8);
  eval_into(into, e);
  CHECK(same_bits(into, eval(e)));
  eval_into(into, e, naive);
  CHECK(same_bits(into, eval(e, naive)));
  tensor<T, 2, 2, dyn, 16> TQ(37), TK(50);
  tensor<T, 2, 2, dyn, 8> TV(50), TO(37);
  for (std::size_t x = 0; x < TQ.size(); ++x) TQ.data()[x] = T(float(x % 11) / 11);
  for (std::size_t x = 0; x < TK.size(); ++x) TK.data()[x] = T(float(x % 7) / 7);
  for (std::size_t x = 0; x < TV.size(); ++x) TV.data()[x] = T(float(x % 5) / 5);
  const auto te = softmax(TQ * transpose(TK)) * TV;
  eval_into(TO, te);
  const auto want = eval(te);
  CHECK(test::same_bits_tensor(TO, want));
}

TEMPLATE_TEST_CASE("eval_into a float destination from 2-byte inputs: written in place, or through a copy",
                   "[half]", bf16, f16) {
  using T = TestType;
  ref::rng rng(37);
  const std::size_t n = 9, m = 40, dk = 16, dv = 8;
  matrix<T, dyn, dyn> Q(n, dk), K(m, dk), V(m, dv);
  rng.fill(Q, -2, 2), rng.fill(K, -2, 2), rng.fill(V);
  const auto e = softmax(causal(Q * transpose(K)) * 0.25f) * V;
  matrix<float, dyn, dyn> want(n, dv);
  eval_into(want, e);
  // Rows of unit column stride, padded: the kernel writes them, and nothing else.
  std::vector<float> padded(n * (dv + 3), -7.0f);
  eval_into(matrix_view<float, dyn, dyn>(padded.data(), n, dv, dv + 3), e);
  bool same = true, untouched = true;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < dv + 3; ++j) {
      if (j < dv) same = same && padded[i * (dv + 3) + j] == want(i, j);
      else untouched = untouched && padded[i * (dv + 3) + j] == -7.0f;
    }
  CHECK(same);
  CHECK(untouched);
  // A transposed destination (column stride n): through a copy.
  std::vector<float> across(n * dv);
  eval_into(matrix_view<float, dyn, dyn>(across.data(), n, dv, 1, n), e);
  same = true;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < dv; ++j) same = same && across[j * n + i] == want(i, j);
  CHECK(same);
  // A destination of the wrong shape: the shape error, nothing written.
  matrix<float, dyn, dyn> wrong(n + 1, dv);
  CHECK_THROWS_AS(eval_into(wrong, e), shape_error);
}
