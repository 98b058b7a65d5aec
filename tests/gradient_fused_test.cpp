// The fused backward (kernels/attention_backward.hpp, through gradient and
// vjp): with block sizes far below the library's, so that every tail and
// skipped tile shows on small inputs, including key and value rows of NaN
// that the masks hide; the same bits whatever the thread count; the best
// strategy taking it where it applies, and leaving it where it cannot.
#include "gradient_reference.hpp"
#include "support.hpp"

#include <catch2/catch.hpp>

#include <qkv/kernels/attention.hpp>
#include <qkv/kernels/attention_backward.hpp>
#include <qkv/kernels/backward_schedule.hpp>
#include <qkv/qkv.hpp>

#include <cmath>
#include <cstddef>
#include <limits>

using namespace qkv;

namespace {

using arch = xsimd::default_arch;
using kernels::blocking;

// One tile row of queries, and keys in tiles of one register tile's width.
template <class T>
constexpr blocking tiny() {
  blocking b = kernels::blocking_of<arch, T>();
  b.query_rows = b.tile_rows;
  b.max_key_block = b.tile_cols();
  b.l2_elements = 1 << 20;
  b.sum_chunk = 8;
  b.decode_rows = 0;
  b.decode_split = 16;
  return b;
}

template <class T>
using tiny_forward = kernels::attention_kernel<arch, T, kernels::no_extension, tiny<T>()>;
template <class T>
using tiny_backward = kernels::attention_backward_kernel<arch, T, kernels::no_extension, tiny<T>()>;

template <class T>
kernels::strided<T> view(matrix<T, dyn, dyn>& x) {
  return {x.data(), x.rows(), x.cols(), static_cast<std::ptrdiff_t>(x.row_stride()), 1};
}
template <class T>
kernels::strided<const T> cview(const matrix<T, dyn, dyn>& x) {
  return {x.data(), x.rows(), x.cols(), static_cast<std::ptrdiff_t>(x.row_stride()), 1};
}

// The forward with its row statistics, then the backward, on one thread; in two
// passes (key blocks, then query blocks) when `split`.
template <class T>
void run(kernels::attention_problem<T> p, const kernels::attention_gradient<T>& g, T* stats, bool split) {
  using F = tiny_forward<T>;
  using Bw = tiny_backward<T>;
  using buffer = detail::aligned_buffer<T>;
  const std::size_t n = p.q.rows, m = p.k.rows, dk = p.q.cols, dv = p.v.cols;
  buffer packed(F::shared_size(n, m, dk, dv) + 1), scratch(F::scratch_size(n, m, dv) + 1);
  p.row_stats = stats;
  F::pack(p, packed.data());
  F::blocks(p, packed.data(), 0, (n + F::block_rows() - 1) / F::block_rows(), scratch.data());
  buffer shared(Bw::shared_size(n, m, dk, dv) + 1), tile(Bw::scratch_size());
  Bw::prepare(p, g, shared.data());
  for (std::size_t b = 0; b < Bw::key_groups(m, dk, dv); ++b)
    Bw::key_group(p, g, shared.data(), b, tile.data(), !split, kernels::no_extension{});
  if (split)
    for (std::size_t b = 0; b < Bw::query_blocks(n); ++b)
      Bw::query_block(p, g, shared.data(), b, tile.data(), kernels::no_extension{});
  Bw::finish(p, g, shared.data());
}

}  // namespace

TEMPLATE_TEST_CASE("fused backward, tiny blocks: every tail and skip, NaN behind masks, one pass or two",
                   "[gradient][blocking]", float, double) {
  using T = TestType;
  static_assert(tiny<T>().valid());
  ref::rng rng(23);
  const T nan = std::numeric_limits<T>::quiet_NaN();
  for (const std::size_t n : {1, 3, 5, 13})
    for (const std::size_t m : {1, 7, 9, 17, 33})
      for (const std::size_t dk : {3, 8})
        for (const std::size_t dv : {1, 5, 17})
          for (const int form : {0, 1, 2}) {  // plain, causal, a mask hiding a stripe of keys
            matrix<T, dyn, dyn> Q(n, dk), K(m, dk), V(m, dv), O(n, dv), dO(n, dv);
            matrix<bool, dyn, dyn> M(n, m);
            rng.fill(Q, -2, 2), rng.fill(K, -2, 2), rng.fill(V), rng.fill(dO);
            // As the forward's tiny-blocks test: the mask hides key 3 and
            // keys 8 to 15 from every row (their keys and values NaN, never
            // to reach a gradient), and a scattering elsewhere.
            for (std::size_t i = 0; i < n; ++i)
              for (std::size_t j = 0; j < m; ++j) M(i, j) = j / 8 != 1 && j != 3 && (i + j) % 5 != 0;
            if (form == 2)
              for (std::size_t j = 3; j < m && j < 16; ++j)
                if (j == 3 || j >= 8) K(j, 0) = V(j, 0) = nan;
            kernels::attention_problem<T> p;
            p.q = cview(Q), p.k = cview(K), p.v = cview(V), p.out = view(O);
            p.scale = T(0.5);
            p.bounds.causal = form == 1;
            if (form == 2) p.mask = {M.data(), n, m, static_cast<std::ptrdiff_t>(m), 1};
            matrix<T, dyn, dyn> dQ(n, dk), dK(m, dk), dV(m, dv), dQ2(n, dk), dK2(m, dk), dV2(m, dv);
            std::vector<T> stats(2 * n);
            run(p, {cview(dO), cview(O), stats.data(), view(dQ), view(dK), view(dV)}, stats.data(), false);
            run(p, {cview(dO), cview(O), stats.data(), view(dQ2), view(dK2), view(dV2)}, stats.data(), true);

            // What a hidden key holds does not enter the exact gradients: 0 here.
            ref::mat k = ref::from(K), v = ref::from(V);
            for (ref::real& x : k.v) x = std::isnan(x) ? 0 : x;
            for (ref::real& x : v.v) x = std::isnan(x) ? 0 : x;
            const auto f = form == 1 ? ref::attention_form::causal : form == 2 ? ref::attention_form::mask
                                                                                : ref::attention_form::plain;
            const ref::gradient_reference<> r =
                ref::attention_backward<T>(ref::from(Q), k, v, ref::from(dO), 0.5L, f, M, nullptr, true);
            INFO("n = " << n << ", m = " << m << ", dk = " << dk << ", dv = " << dv << ", form " << form);
            REQUIRE(ref::worst_ratio(dQ, r.dq, r.bq) <= 1);  // (NaN: a ratio that is not ≤ 1)
            for (std::size_t j = 0; j < m; ++j) {
              if (form == 2 && (j == 3 || (j >= 8 && j < 16))) {
                // A key no row sees: exactly zero gradients, whatever it holds.
                for (std::size_t c = 0; c < dk; ++c) REQUIRE(dK(j, c) == T(0));
                for (std::size_t c = 0; c < dv; ++c) REQUIRE(dV(j, c) == T(0));
              }
            }
            REQUIRE(ref::worst_ratio(dK, r.dk, r.bk) <= 1);
            REQUIRE(ref::worst_ratio(dV, r.dv, r.bv) <= 1);
            REQUIRE(test::same_bits(dQ, dQ2));
            REQUIRE(test::same_bits(dK, dK2));
            REQUIRE(test::same_bits(dV, dV2));
          }
}

TEST_CASE("fused backward: the same bits on 1, 2 and 3 threads", "[gradient][threads]") {
  test::threads_guard guard;
  const std::size_t n = 300, m = 333, d = 40;
  ref::rng rng(5);
  matrix<float, dyn, dyn> Q(n, d), K(m, d), V(m, d), dO(n, d);
  rng.fill(Q, -2, 2), rng.fill(K, -2, 2), rng.fill(V), rng.fill(dO);
  const auto e = softmax(causal(Q * transpose(K)) / sqrt(dim<40>)) * V;
  set_threads(1);
  const auto [dQ, dK, dV] = gradient(e, dO, wrt(Q, K, V), qkv::fused);
  for (const std::size_t t : {2, 3}) {
    set_threads(t);
    const auto [dQt, dKt, dVt] = gradient(e, dO, wrt(Q, K, V), qkv::fused);
    INFO(t << " threads");
    CHECK(test::same_bits(dQt, dQ));
    CHECK(test::same_bits(dKt, dK));
    CHECK(test::same_bits(dVt, dV));
  }
}

TEST_CASE("gradient: the best strategy fuses the attention, a bias it differentiates included", "[gradient]") {
  const std::size_t n = 70, m = 90, d = 12;
  ref::rng rng(8);
  matrix<double, dyn, dyn> X(n, d), Wq(d, d), K(m, d), V(m, d), dO(n, d), B(n, m);
  rng.fill(X), rng.fill(Wq), rng.fill(K), rng.fill(V), rng.fill(dO), rng.fill(B);
  // Through a projection: the fused backward's dQ goes on into X and Wq.
  const auto e = softmax(causal((X * Wq) * transpose(K)) * 0.25) * V;
  const auto [dX, dWq, dV] = gradient(e, dO, wrt(X, Wq, V));
  const auto [fX, fWq, fV] = gradient(e, dO, wrt(X, Wq, V), qkv::fused);
  const auto [nX, nWq, nV] = gradient(e, dO, wrt(X, Wq, V), naive);
  CHECK(test::same_bits(dX, fX));
  CHECK(test::same_bits(dWq, fWq));
  CHECK(test::same_bits(dV, fV));
  // Fused and node by node agree to double's rounding (entries of order 1).
  CHECK(ref::max_error(fX, ref::from(nX)) < 1e-12);
  CHECK(ref::max_error(fWq, ref::from(nWq)) < 1e-12);
  CHECK(ref::max_error(fV, ref::from(nV)) < 1e-12);

  // A bias that is differentiated: the fused kernel writes its gradient,
  // bias_scale·f′·P ∘ (dP − D), tile by tile; the best strategy is fused.
  // Against node by node, to double's rounding (entries of order 1), with a
  // modifier, a subtracted and scaled bias, causal and a tensor's heads.
  const auto eb = softmax(X * transpose(K) * 0.25 + B) * V;
  const auto [dB, dK] = gradient(eb, dO, wrt(B, K));
  const auto [fB, fK] = gradient(eb, dO, wrt(B, K), qkv::fused);
  const auto [nB, nK] = gradient(eb, dO, wrt(B, K), naive);
  CHECK(test::same_bits(dB, fB));
  CHECK(test::same_bits(dK, fK));
  CHECK(ref::max_error(fB, ref::from(nB)) < 1e-12);
  CHECK(ref::max_error(fK, ref::from(nK)) < 1e-12);
  const auto cap = [](auto s, auto, auto) { return decltype(s)(3) * tanh(s / decltype(s)(3)); };
  const auto em = softmax(causal(score_mod((X * transpose(K) - B) * 0.5, cap))) * V;
  const auto [mB, mX] = gradient(em, dO, wrt(B, X), qkv::fused);
  const auto [mnB, mnX] = gradient(em, dO, wrt(B, X), naive);
  CHECK(ref::max_error(mB, ref::from(mnB)) < 1e-12);
  CHECK(ref::max_error(mX, ref::from(mnX)) < 1e-12);
  for (std::size_t i = 0; i < n; ++i)  // keys past the causal bound: exactly 0
    for (std::size_t j = i + (m - n) + 1; j < m; ++j) CHECK(mB(i, j) == 0.0);
  tensor<double, dyn, dyn, dyn, dyn> Xt(2, 4, n, d), Kt(2, 2, m, d), Vt(2, 2, m, d), dOt(2, 4, n, d);
  ref::rng trng(9);
  test::fill(Xt, trng), test::fill(Kt, trng), test::fill(Vt, trng), test::fill(dOt, trng);
  const auto et = softmax(causal(Xt * transpose(Kt) * 0.25 + B)) * Vt;  // B shared by every head
  const auto [tB] = gradient(et, dOt, wrt(B), qkv::fused);
  const auto [tnB] = gradient(et, dOt, wrt(B), naive);
  CHECK(ref::max_error(tB, ref::from(tnB)) < 1e-12);
}

TEST_CASE("vjp of a fused attention keeps its forward: the pullback's bits are gradient's", "[gradient]") {
  const std::size_t n = 77, m = 90, d = 20;
  ref::rng rng(31);
  matrix<float, dyn, dyn> Q(n, d), K(m, d), V(m, d), dO(n, d);
  rng.fill(Q), rng.fill(K), rng.fill(V), rng.fill(dO);
  const auto e = softmax(causal(Q * transpose(K)) / 4.0f) * V;
  const auto [O, back] = vjp(e);
  CHECK(test::same_bits(O, eval(e)));
  const auto [dQ, dK, dV] = gradient(e, dO, wrt(Q, K, V));
  for (int twice = 0; twice < 2; ++twice) {
    const auto [dQ2, dK2, dV2] = back(dO, wrt(Q, K, V));
    CHECK(test::same_bits(dQ2, dQ));
    CHECK(test::same_bits(dK2, dK));
    CHECK(test::same_bits(dV2, dV));
  }
}

TEST_CASE("fused backward: scores past 2^24 still weigh as the forward does", "[gradient]") {
  // Two keys tie at a score of 10⁸, a third trails by 5·10⁷: the weights are
  // ½, ½ and 0, and dV's rows are ½ dO, ½ dO and 0. (The log-sum-exp of
  // such a row, 10⁸ + log 2, is 10⁸ in float: weights from it would be 1.)
  matrix<float, dyn, dyn> Q(2, 1), K(3, 1), V(3, 2), dO(2, 2);
  Q(0, 0) = 1e8f, Q(1, 0) = 1e8f;
  K(0, 0) = 1, K(1, 0) = 1, K(2, 0) = 0.5f;
  ref::rng rng(2);
  rng.fill(V), rng.fill(dO);
  const auto e = softmax(Q * transpose(K)) * V;
  const auto [dV] = gradient(e, dO, wrt(V), qkv::fused);
  for (std::size_t c = 0; c < 2; ++c) {
    const float half = 0.5f * (dO(0, c) + dO(1, c));
    CHECK(std::fabs(dV(0, c) - half) <= 4 * std::numeric_limits<float>::epsilon() * std::fabs(half) + 1e-30f);
    CHECK(std::fabs(dV(1, c) - half) <= 4 * std::numeric_limits<float>::epsilon() * std::fabs(half) + 1e-30f);
    CHECK(dV(2, c) == 0.0f);
  }
}

TEST_CASE("one head is split over threads only where the two passes can pay", "[gradient][threads]") {
  using kernels::backward_detail::busiest;
  using kernels::backward_detail::split_pays;
  // In order to whichever thread is free first: 3 + 1 blocks on two threads
  // leave one with 3; five groups of 11 and one of 3 on two threads, 33.
  CHECK(busiest(2, 3, 1, 2) == 3);
  CHECK(busiest(6, 11, 3, 2) == 33);
  CHECK(busiest(5, 11, 3, 2) == 25);
  CHECK(busiest(4, 1, 1, 3) == 2);
  CHECK(busiest(1, 5, 2, 4) == 2);
  CHECK(busiest(0, 5, 2, 4) == 0);
  // One head of T = 256 (4 key blocks of 64) at d = 64: key groups of 3 and 1
  // blocks, 4 query blocks; 2 threads took 1.05 times one thread's time.
  CHECK_FALSE(split_pays(4, 3, 4, 2));
  // At d = 128 four groups of one block (0.84 of one thread's time), and at
  // T = 1024, d = 64 four groups of four (0.75): both split.
  CHECK(split_pays(4, 1, 4, 2));
  CHECK(split_pays(16, 4, 16, 2));
  CHECK(split_pays(4, 3, 4, 4));  // more threads: each pass is one piece long
}
