// Scores whose row maximum grows from one key block to the next. After a
// row's first key block the fused kernel exponentiates scores in the
// register tile against the maximum it has so far; a later block's larger
// scores then scale its weights down (growth up to 64), or send it back to
// the pass that finds the maximum first (more, or not finite).
// kernels/weights_tile.hpp says why.
#include <catch2/catch.hpp>

#include "reference.hpp"
#include "support.hpp"

#include <qkv/qkv.hpp>

#include <cmath>
#include <cstddef>
#include <limits>

using namespace qkv;

namespace {

// Q and K whose scaled scores are growth·(j / per) plus terms of size about
// 1: each `per` keys (a block of 256 by default) add `growth` to a row's
// maximum (dk = 16, so the scale is exactly 1/4 and K(j, 0) is exact).
template <class T>
struct growing {
  matrix<T, dyn, dyn> Q, K, V;
  growing(std::size_t n, std::size_t m, double growth, std::uint32_t seed, std::size_t per = 256)
      : Q(n, 16), K(m, 16), V(m, 8) {
    ref::rng rng(seed);
    rng.fill(Q, -0.5, 0.5);
    rng.fill(K, -0.5, 0.5);
    rng.fill(V);
    for (std::size_t i = 0; i < n; ++i) Q(i, 0) = T(1);
    for (std::size_t j = 0; j < m; ++j) K(j, 0) = static_cast<T>(4 * growth * static_cast<double>(j / per));
  }
};

template <class T>
void check_growing(std::size_t n, std::size_t m, double growth, bool is_causal, std::size_t per = 256) {
  if (test::emulation_skips(n, m, 16, 8)) return;
  using R = ref::real_for<T>;
  const growing<T> in(n, m, growth, static_cast<std::uint32_t>(n + m), per);
  const auto q = ref::from<R>(in.Q), k = ref::from<R>(in.K), v = ref::from<R>(in.V);
  const R rs = 0.25;
  ref::basic_mat<R> s = ref::scale(ref::matmul(q, ref::transpose(k)), rs);
  if (is_causal) s = ref::causal(s);
  const ref::basic_mat<R> p = ref::softmax(s);
  const ref::basic_mat<R> want = ref::matmul(p, v), bound = ref::attention_bound<T>(q, k, v, rs, s, p);
  INFO("n = " << n << ", m = " << m << ", growth " << growth << " per " << per << " keys" << (is_causal ? ", causal" : "")
              << ", " << (sizeof(T) == 4 ? "float" : "double"));
  const T root = qkv::sqrt(T(16));
  const auto check = [&](const auto& e) {
    CHECK(ref::worst_ratio(eval(e, naive), want, bound) <= 1);
    CHECK(ref::worst_ratio(eval(e, fused), want, bound) <= 1);
  };
  if (is_causal) check(softmax(causal(in.Q * transpose(in.K) / root)) * in.V);
  else check(softmax(in.Q * transpose(in.K) / root) * in.V);
}

}  // namespace

TEST_CASE("a row maximum that grows from key block to key block, by less and more than weights may pass it",
          "[attention][growth]") {
  // 0.5 and 8: weights scaled down; 63: near the limit of 64; 70 and 500:
  // past it (500 would overflow the weights), the scores again. −8: never
  // grows after the first block. n = 70: a query block and a few rows;
  // m = 4·256 + 64: whole panels in every block.
  for (const double growth : {0.5, 8.0, 63.0, 70.0, 500.0, -8.0}) {
    for (const bool is_causal : {false, true}) {
      check_growing<float>(70, 4 * 256 + 64, growth, is_causal);
      check_growing<double>(70, 4 * 256 + 64, growth, is_causal);
    }
  }
  // A tail of keys and rows that fill no panel.
  check_growing<float>(67, 3 * 256 + 5, 8.0, false);
  // Growth within each block rather than from one to the next: 6 per 32
  // keys is 48 per block, 70 per 32 is 560. With 256 keys (float) a row's
  // one block goes through the pass over the scores; the double rows'
  // later blocks go through the tiles, whose weights are then scaled down
  // (48) or their scores computed again (560, past weights_tile's limit).
  for (const double growth : {6.0, 70.0}) {
    for (const bool is_causal : {false, true}) {
      check_growing<float>(70, 256, growth, is_causal, 32);
      check_growing<double>(70, 2 * 256 + 64, growth, is_causal, 32);
    }
  }
}

TEST_CASE("+inf and NaN scores in the first or a later key block give NaN rows", "[attention][growth][nonfinite]") {
  const std::size_t n = 70, m = 4 * 256 + 64;
  for (const std::size_t key : {std::size_t{600}, std::size_t{40}}) {
    for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      growing<float> in(n, m, 8.0, 5);
      // Key 600 (the third block: the tiles) and key 40 (the first block:
      // the pass over the scores): +inf or NaN for odd rows; even rows give
      // −inf (+inf·−1) and weigh it 0, or NaN.
      for (std::size_t i = 0; i < n; ++i) in.Q(i, 1) = i % 2 ? 1.f : -1.f;
      in.K(key, 1) = bad;
      for (const auto& got : {eval(softmax(in.Q * transpose(in.K) / qkv::sqrt(16.f)) * in.V, fused),
                              eval(softmax(in.Q * transpose(in.K) / qkv::sqrt(16.f)) * in.V, naive)}) {
        for (std::size_t i = 0; i < n; ++i) {
          INFO("bad = " << bad << " at key " << key << ", row " << i);
          const bool nan_row = i % 2 == 1 || std::isnan(bad);
          for (std::size_t c = 0; c < 8; ++c) REQUIRE(std::isnan(got(i, c)) == nan_row);
        }
      }
    }
  }
}

TEMPLATE_TEST_CASE("a block whose maximum does not grow: the bits of the pass over the scores", "[attention][growth]",
                   float, double) {
  // A mask that keeps every key sends every block through the pass that
  // finds the maximum first; without it the tiles weigh the blocks after a
  // row's first, or all of them with a sink. With growth −8 no later block
  // raises a row's maximum, and a sink of 4 is above every score (they stay
  // below 1), so the two must agree bit for bit, outputs and log-sum-exps.
  using T = TestType;
  const std::size_t n = 70, m = 4 * 256 + 64;
  if (test::emulation_skips(n, m, 16, 8)) return;
  const growing<T> in(n, m, -8.0, 3);
  matrix<bool, dyn, dyn> all(n, m);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) all(i, j) = true;
  const T root = qkv::sqrt(T(16));
  {
    const auto [O, L] = eval_with_lse(softmax(in.Q * transpose(in.K) / root) * in.V);
    const auto [Om, Lm] = eval_with_lse(softmax(masked(in.Q * transpose(in.K) / root, all)) * in.V);
    CHECK(test::same_bits(O, Om));
    CHECK(test::same_bits(L, Lm));
  }
  const T sink(4);
  const auto [O, L] = eval_with_lse(softmax(in.Q * transpose(in.K) / root, sink) * in.V);
  const auto [Om, Lm] = eval_with_lse(softmax(masked(in.Q * transpose(in.K) / root, all), sink) * in.V);
  CHECK(test::same_bits(O, Om));
  CHECK(test::same_bits(L, Lm));
}
