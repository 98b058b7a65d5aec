// window(S, w) and window(S, left, right): against the long-double
// reference, naive and fused, float and double, at every alignment (n = m,
// a decode or a prefill against a cache, n > m, windows wider than m, rows
// whose window is empty), with causal, a mask matrix, a predicate and a
// modifier around or inside it; 2-byte inputs; tensors with grouped-query
// heads as their matrices; the equivalent predicate; errors, cost, explain.
// Tolerances: extension_support.hpp's check_pair (the reference's bound from
// each score's error, and the fused error within twice the naive one).
#include <catch2/catch.hpp>

#include "extension_support.hpp"

#include <qkv/qkv.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

using namespace qkv;
using namespace test::ext;

namespace {

// Whether key j is in row i's window [i' − left, i' + right], i' = i + m − n.
struct in_window {
  std::size_t n, m, left, right;
  bool operator()(std::size_t i, std::size_t j) const {
    const long long ip = static_cast<long long>(i + m) - static_cast<long long>(n), jj = static_cast<long long>(j);
    return jj >= ip - static_cast<long long>(left) && jj <= ip + static_cast<long long>(right);
  }
};

template <class T>
void check_window(std::size_t n, std::size_t m, std::size_t d, std::size_t dv, std::size_t left, std::size_t right,
                  std::uint32_t seed) {
  if (test::emulation_skips(n, m, d, dv)) return;
  INFO("n = " << n << ", m = " << m << ", d = " << d << ", dv = " << dv << ", left = " << left << ", right = " << right
              << ", " << type_name(T()) << ", kernels " << active_arch());
  inputs<T> in(n, m, d, d, dv, seed, 2);
  const T root = qkv::sqrt(T(d));
  const auto q = ref::from(in.Q), k = ref::from(in.K), v = ref::from(in.V);
  const in_window keep{n, m, left, right};
  scores sc = scaled<T>(dot_scores<T>(q, k), 1 / static_cast<real>(root));
  sc.s = masked_by(sc.s, keep);
  const auto e = softmax(window(in.Q * transpose(in.K) / root, left, right)) * in.V;
  const auto got_naive = eval(e, naive), got_fused = eval(e, fused);
  check_pair<T>(got_naive, got_fused, sc, v);
  // A row whose window holds no key gives zeros.
  for (std::size_t i = 0; i < n; ++i) {
    bool any = false;
    for (std::size_t j = 0; j < m; ++j) any = any || keep(i, j);
    if (!any) {
      INFO("row " << i << " sees nothing");
      CHECK(zero_row(got_naive, i));
      CHECK(zero_row(got_fused, i));
    }
  }
  // The equivalent predicate (key_aligned) masks the same scores: node by
  // node the same bits.
  const auto pred = key_aligned([left, right](std::ptrdiff_t i, std::ptrdiff_t j) {
    return j >= i - std::ptrdiff_t(left) && j <= i + std::ptrdiff_t(right);
  });
  CHECK(same_bits(got_naive, eval(softmax(masked(in.Q * transpose(in.K) / root, pred)) * in.V, naive)));
}

}  // namespace

TEMPLATE_TEST_CASE("window(S, left, right) at every alignment, naive and fused", "[window]", float, double) {
  using T = TestType;
  // {n, m}: n = m, decodes (1, 4) and a prefill (37) against a cache, n > m.
  const auto [n, m] = GENERATE(table<std::size_t, std::size_t>(
      {{37, 37}, {130, 130}, {1, 300}, {4, 300}, {37, 300}, {300, 37}, {67, 20}, {1, 1}}));
  // {left, right}: a point, narrow, one-sided either way, wider than m.
  const auto [left, right] = GENERATE(table<std::size_t, std::size_t>(
      {{0, 0}, {3, 0}, {40, 5}, {0, 17}, {255, 0}, {1000, 1000}, {2, 3000}}));
  check_window<T>(n, m, 24, 17, left, right, static_cast<std::uint32_t>(n * 31 + m + left * 7 + right));
}

TEST_CASE("window: key blocks and the decoding parts it spans or skips", "[window]") {
  // Windows across the kernels' key blocks (256 keys) and decoding parts.
  check_window<float>(200, 4096, 64, 64, 255, 0, 11);
  check_window<float>(1, 5000, 64, 64, 99, 0, 12);
  check_window<float>(4, 5000, 64, 64, 2500, 0, 13);
  check_window<float>(3, 5000, 64, 64, 0, 0, 14);
  check_window<double>(70, 1500, 32, 40, 300, 20, 15);
}

TEST_CASE("window(S, w) is window(S, w - 1, 0); causal clips its right side; errors", "[window]") {
  inputs<float> in(50, 90, 16, 16, 8, 3);
  const float root = qkv::sqrt(16.0f);
  const auto S = in.Q * transpose(in.K) / root;
  const auto a = eval(softmax(window(S, 12)) * in.V);
  CHECK(same_bits(a, eval(softmax(window(S, 11, 0)) * in.V)));
  // causal(window(S, l, r)) = window(S, l, 0), either order; windows intersect.
  CHECK(same_bits(eval(softmax(causal(window(S, 11, 30))) * in.V), a));
  CHECK(same_bits(eval(softmax(window(causal(S), 11, 30)) * in.V), a));
  CHECK(same_bits(eval(softmax(window(window(S, 40, 0), 11, 9)) * in.V), a));
  CHECK(same_bits(eval(softmax(causal(window(S, 11, 30))) * in.V, naive), eval(softmax(window(S, 12)) * in.V, naive)));
  // A window of one key: each row is its own position's value.
  const auto one = eval(softmax(window(S, 1)) * in.V);
  for (std::size_t i = 0; i < 50; ++i)
    for (std::size_t c = 0; c < 8; ++c) CHECK(one(i, c) == in.V(i + 40, c));
  CHECK_THROWS_AS(window(S, 0), std::invalid_argument);
  CHECK_THROWS_AS(window(S, -3), std::invalid_argument);
  CHECK_THROWS_AS(window(S, -1, 2), std::invalid_argument);
  CHECK_THROWS_AS(window(S, 1, -2), std::invalid_argument);
  try {
    (void)window(S, 0);
  } catch (const std::invalid_argument& x) {
    CHECK(std::string_view(x.what()).substr(0, 4) == "qkv:");
  }
}

TEMPLATE_TEST_CASE("window with a mask matrix, a predicate, a modifier and a bias", "[window]", float, double) {
  using T = TestType;
  const auto [n, m] = GENERATE(table<std::size_t, std::size_t>({{70, 70}, {4, 200}, {37, 200}, {90, 33}}));
  if (test::emulation_skips(n, m, 24, 24)) return;
  INFO("n = " << n << ", m = " << m << ", " << type_name(T()));
  inputs<T> in(n, m, 24, 24, 24, static_cast<std::uint32_t>(n + 5 * m), 2);
  const T root = qkv::sqrt(T(24));
  const auto q = ref::from(in.Q), k = ref::from(in.K), v = ref::from(in.V);
  const in_window keep{n, m, 30, 2};
  const auto every_third = [](std::size_t i, std::size_t j) { return (i + j) % 3 != 0; };
  const alibi_t<T> alibi{T(0.25)};
  const scores raw = scaled<T>(dot_scores<T>(q, k), 1 / static_cast<real>(root));
  {
    INFO("window(masked(S, M))");
    scores sc = raw;
    sc.s = masked_by(masked_by(sc.s, keep), [&](std::size_t i, std::size_t j) { return bool(in.M(i, j)); });
    const auto e = softmax(window(masked(in.Q * transpose(in.K) / root, in.M), 30, 2)) * in.V;
    check_pair<T>(eval(e, naive), eval(e, fused), sc, v);
  }
  {
    INFO("masked(window(S), pred)");
    scores sc = raw;
    sc.s = masked_by(masked_by(sc.s, keep), every_third);
    const auto e = softmax(masked(window(in.Q * transpose(in.K) / root, 30, 2), every_third)) * in.V;
    check_pair<T>(eval(e, naive), eval(e, fused), sc, v);
  }
  {
    INFO("window(score_mod(S + B, alibi))");
    const ref::mat b = ref::from(in.B);
    scores sc = modified(scaled<T>(dot_scores<T>(q, k), 1 / static_cast<real>(root), &b), alibi);
    sc.s = masked_by(sc.s, keep);
    const auto e = softmax(window(score_mod(in.Q * transpose(in.K) / root + in.B, alibi), 30, 2)) * in.V;
    check_pair<T>(eval(e, naive), eval(e, fused), sc, v);
  }
}

TEST_CASE("window on 2-byte inputs: the float result on the same values, or the pair kernel's bound", "[window][half]") {
  const std::size_t n = 150, m = 700, d = 64;
  matrix<bf16, dyn, dyn> Q(n, d), K(m, d), V(m, d);
  matrix<float, dyn, dyn> Qf(n, d), Kf(m, d), Vf(m, d);
  ref::rng rng(21);
  rng.fill(Q, -2, 2), rng.fill(K, -2, 2), rng.fill(V);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t c = 0; c < d; ++c) Qf(i, c) = float(Q(i, c));
  for (std::size_t j = 0; j < m; ++j)
    for (std::size_t c = 0; c < d; ++c) Kf(j, c) = float(K(j, c)), Vf(j, c) = float(V(j, c));
  const float scale = 0.125f;
  matrix<float, dyn, dyn> got(n, d);
  eval_into(got, softmax(window(Q * transpose(K) * scale, 100, 3)) * V);
  const auto wide = eval(softmax(window(Qf * transpose(Kf) * scale, 100, 3)) * Vf);
  const bool pairs = kernels::bf16_pairs_active();
  if (!pairs) {
    CHECK(same_bits(got, wide));  // K and V converted as they are packed: the float kernel's bits
  } else if (!test::emulation_skips(n, m, d, d)) {
    const ref::mat q = ref::from(Q), k = ref::from(K), v = ref::from(V);
    const ref::mat s = masked_by(ref::scale(ref::matmul(q, ref::transpose(k)), scale), in_window{n, m, 100, 3});
    const ref::mat p = ref::softmax(s);
    CHECK(ref::worst_ratio(got, ref::matmul(p, v), ref::attention_bound_bf16_pairs(q, k, v, scale, s, p)) <= 1);
  }
}

TEST_CASE("window on rank-4 tensors with grouped-query heads equals each head alone", "[window][tensor]") {
  constexpr std::size_t d = 16;
  const std::size_t B = 2, H = 4, Hk = 2, n = 70, m = 300;
  ref::rng rng(5);
  tensor<float, dyn, dyn, dyn, d> Q(B, H, n), K(B, Hk, m), V(B, Hk, m);
  fill(Q, rng), fill(K, rng), fill(V, rng);
  const auto O = eval(softmax(window(Q * transpose(K), 40, 1)) * V);
  const auto On = eval(softmax(window(Q * transpose(K), 40, 1)) * V, naive);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h) {
      INFO("b = " << b << ", h = " << h);
      const auto q = Q.matrix_at(b, h), k = K.matrix_at(b, h / 2), v = V.matrix_at(b, h / 2);
      CHECK(same_bits(O.matrix_at(b, h), eval(softmax(window(q * transpose(k), 40, 1)) * v)));
      CHECK(same_bits(On.matrix_at(b, h), eval(softmax(window(q * transpose(k), 40, 1)) * v, naive)));
    }
}

TEST_CASE("window: cost counts the visible pairs; explain names it", "[window][cost]") {
  matrix<float, dyn, 64> Q(4096), K(4096), V(4096);
  const auto full = cost(softmax(Q * transpose(K)) * V);
  const auto win = cost(softmax(window(Q * transpose(K), 256)) * V);
  // 4096 rows of 256 keys, less the 255·256/2 the first rows lack.
  const double visible = 4096.0 * 256 - 255.0 * 256 / 2;
  CHECK(double(win.flops) == Approx(double(full.flops) * visible / (4096.0 * 4096)).epsilon(1e-3));
  CHECK(win.exps == std::size_t(visible));
  CHECK(explain(softmax(window(Q * transpose(K), 256)) * V).find("window") != std::string::npos);
}

TEST_CASE("window: the same bits on 1, 2 and 3 threads", "[window][threads]") {
  inputs<float> in(300, 2000, 64, 64, 64, 17, 2);
  const auto e = softmax(window(in.Q * transpose(in.K) / 8.0f, 200, 3)) * in.V;
  test::threads_guard guard;
  set_threads(1);
  const auto one = eval(e);
  for (std::size_t t : {2, 3}) {
    set_threads(t);
    CHECK(same_bits(eval(e), one));
  }
}
