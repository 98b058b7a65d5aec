// Gradients of attention over tensors: each batch index's gradients, added
// into the targets at the index each reads. A key/value head of grouped-query
// attention sums the query heads that read it, an operand broadcast over the
// batch sums the batch; node by node and fused, against the long-double
// reference (per head, the bounds of the heads summed).
#include "gradient_reference.hpp"
#include "support.hpp"

#include <catch2/catch.hpp>

#include <qkv/qkv.hpp>

#include <cmath>
#include <cstddef>

using namespace qkv;

namespace {

// The matrix at (b, h) of a [B, H, T, D] tensor, in long double.
template <class X>
ref::mat head(const X& x, std::size_t b, std::size_t h) {
  ref::mat r(x.extent(2), x.extent(3));
  for (std::size_t i = 0; i < r.rows; ++i)
    for (std::size_t j = 0; j < r.cols; ++j) r(i, j) = x(b, h, i, j);
  return r;
}

// Largest |got − want| / bound over a head's matrix.
template <class X>
ref::real head_ratio(const X& got, std::size_t b, std::size_t h, const ref::mat& want, const ref::mat& bound) {
  ref::real worst = 0;
  for (std::size_t i = 0; i < want.rows; ++i)
    for (std::size_t j = 0; j < want.cols; ++j) {
      const ref::real err = std::fabs(static_cast<ref::real>(got(b, h, i, j)) - want(i, j));
      worst = std::fmax(worst, err == 0 ? 0 : err / bound(i, j));
    }
  return worst;
}

}  // namespace

TEMPLATE_TEST_CASE("gradients of grouped-query attention on [B, H, T, D] tensors, against the reference", "[gradient][tensor]",
                   float, double) {
  using T = TestType;
  const std::size_t B = 2, H = 4, G = 2, n = 37, m = 70, dk = 12, dv = 9;
  ref::rng rng(17);
  tensor<T, dyn, dyn, dyn, dyn> Q(B, H, n, dk), K(B, H / G, m, dk), V(B, H / G, m, dv), dO(B, H, n, dv);
  test::fill(Q, rng, -2, 2), test::fill(K, rng, -2, 2), test::fill(V, rng), test::fill(dO, rng);
  const T c = T(1) / std::sqrt(T(dk));
  const auto e = softmax(causal(Q * transpose(K)) * c) * V;
  for (const bool fused_pass : {false, true}) {
    INFO((fused_pass ? "fused" : "node by node"));
    const auto [dQ, dK, dV] = fused_pass ? gradient(e, dO, wrt(Q, K, V)) : gradient(e, dO, wrt(Q, K, V), naive);
    static_assert(std::is_same_v<std::remove_cvref_t<decltype(dK)>, tensor<T, dyn, dyn, dyn, dyn>>);
    REQUIRE(dK.extents() == K.extents());
    const matrix<bool, dyn, dyn> none(n, m);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t kh = 0; kh < H / G; ++kh) {
        ref::mat want_k(m, dk), bound_k(m, dk), want_v(m, dv), bound_v(m, dv);
        for (std::size_t h = kh * G; h < (kh + 1) * G; ++h) {
          const ref::gradient_reference r =
              ref::attention_backward<T>(head(Q, b, h), head(K, b, kh), head(V, b, kh), head(dO, b, h), c,
                                         ref::attention_form::causal, none, nullptr, fused_pass);
          CHECK(head_ratio(dQ, b, h, r.dq, r.bq) <= 1);
          // A key/value head's gradient: its query heads' sum (one more
          // rounding per head added, within the bounds' doubling).
          for (std::size_t x = 0; x < want_k.v.size(); ++x) want_k.v[x] += r.dk.v[x], bound_k.v[x] += r.bk.v[x];
          for (std::size_t x = 0; x < want_v.v.size(); ++x) want_v.v[x] += r.dv.v[x], bound_v.v[x] += r.bv.v[x];
        }
        CHECK(head_ratio(dK, b, kh, want_k, bound_k) <= 1);
        CHECK(head_ratio(dV, b, kh, want_v, bound_v) <= 1);
      }
  }
}

TEST_CASE("gradients on tensors: a head's matrix gradients, summed in batch order where an operand is shared",
          "[gradient][tensor]") {
  // Q per head, K and V one matrix broadcast over the heads, a projection
  // shared by all: dK, dV and dW are the per-head gradients summed in head
  // order, to the bit.
  const std::size_t H = 3, n = 20, m = 25, d = 6;
  ref::rng rng(3);
  tensor<double, dyn, dyn, dyn> X(H, n, d), dO(H, n, d);
  matrix<double, dyn, dyn> W(d, d), K(m, d), V(m, d);
  test::fill(X, rng), test::fill(dO, rng), rng.fill(W), rng.fill(K), rng.fill(V);
  const auto [dX, dW, dK, dV] = gradient(softmax((X * W) * transpose(K) * 0.4) * V, dO, wrt(X, W, K, V));
  matrix<double, dyn, dyn> sW(d, d), sK(m, d), sV(m, d);
  for (std::size_t h = 0; h < H; ++h) {
    const auto x = X.matrix_at(h);
    const auto o = dO.matrix_at(h);
    const auto [gX, gW, gK, gV] = gradient(softmax((x * W) * transpose(K) * 0.4) * V, o, wrt(x, W, K, V));
    CHECK(test::same_bits(dX.matrix_at(h), gX));
    for (std::size_t i = 0; i < d; ++i)
      for (std::size_t j = 0; j < d; ++j) sW(i, j) += gW(i, j);
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < d; ++j) sK(i, j) += gK(i, j), sV(i, j) += gV(i, j);
  }
  CHECK(test::same_bits(dW, sW));
  CHECK(test::same_bits(dK, sK));
  CHECK(test::same_bits(dV, sV));
}

TEST_CASE("gradients on tensors: dO of another shape is a shape_error", "[gradient][tensor]") {
  tensor<float, dyn, dyn, dyn> Q(2, 4, 3), K(2, 5, 3), V(2, 5, 2), dO(3, 4, 2);
  CHECK_THROWS_AS(gradient(softmax(Q * transpose(K)) * V, dO, wrt(Q)), shape_error);
}

TEST_CASE("gradients on tensors: the same bits on 1, 2 and 3 threads, heads spread or not", "[gradient][tensor][threads]") {
  test::threads_guard guard;
  const std::size_t H = 8, n = 150, d = 16;
  ref::rng rng(12);
  tensor<float, dyn, dyn, dyn> Q(H, n, d), K(2, n, d), V(2, n, d), dO(H, n, d);
  test::fill(Q, rng, -2, 2), test::fill(K, rng, -2, 2), test::fill(V, rng), test::fill(dO, rng);
  const auto e = softmax(causal(Q * transpose(K)) / 4.0f) * V;
  set_threads(1);
  const auto [dQ, dK, dV] = gradient(e, dO, wrt(Q, K, V));
  for (const std::size_t t : {2, 3}) {
    set_threads(t);
    const auto [dQt, dKt, dVt] = gradient(e, dO, wrt(Q, K, V));
    INFO(t << " threads");
    CHECK(test::same_bits_tensor(dQt, dQ));
    CHECK(test::same_bits_tensor(dKt, dK));
    CHECK(test::same_bits_tensor(dVt, dV));
  }
  // One head at a time (its matrix), spread over the threads inside it.
  set_threads(2);
  const auto q0 = Q.matrix_at(0);
  const auto k0 = K.matrix_at(0), v0 = V.matrix_at(0), o0 = dO.matrix_at(0);
  const auto [dq0] = gradient(softmax(causal(q0 * transpose(k0)) / 4.0f) * v0, o0, wrt(q0));
  CHECK(test::same_bits(dq0, dQ.matrix_at(0)));
}

TEST_CASE("gradients on tensors: float queries over a bf16 cache, the cache's gradients rounded once",
          "[gradient][tensor][half]") {
  ref::rng rng(21);
  tensor<float, dyn, dyn, dyn> Q(4, 20, 8), dO(4, 20, 8), Kf(2, 30, 8), Vf(2, 30, 8);
  tensor<bf16, dyn, dyn, dyn> K(2, 30, 8), V(2, 30, 8);
  test::fill(Q, rng), test::fill(dO, rng), test::fill(K, rng), test::fill(V, rng);
  for (std::size_t k = 0; k < K.size(); ++k) Kf.data()[k] = float(K.data()[k]), Vf.data()[k] = float(V.data()[k]);
  const auto [dQ, dK, dV] = gradient(softmax(causal(Q * transpose(K)) / 3.0f) * V, dO, wrt(Q, K, V));
  const auto [fQ, fK, fV] = gradient(softmax(causal(Q * transpose(Kf)) / 3.0f) * Vf, dO, wrt(Q, Kf, Vf));
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(dK)>, tensor<bf16, dyn, dyn, dyn>>);
  CHECK(test::same_bits_tensor(dQ, fQ));
  bool rounded = true;
  for (std::size_t k = 0; k < dK.size(); ++k)
    rounded = rounded && float(dK.data()[k]) == float(bf16(fK.data()[k])) && float(dV.data()[k]) == float(bf16(fV.data()[k]));
  CHECK(rounded);
}

TEST_CASE("gradients on tensors of bf16 alone: the float gradients of the same values, rounded once",
          "[gradient][tensor][half]") {
  ref::rng rng(22);
  tensor<bf16, dyn, dyn, dyn> Q(4, 20, 8), dO(4, 20, 8), K(2, 30, 8), V(2, 30, 8);
  tensor<float, dyn, dyn, dyn> Qf(4, 20, 8), dOf(4, 20, 8), Kf(2, 30, 8), Vf(2, 30, 8);
  test::fill(Q, rng), test::fill(dO, rng), test::fill(K, rng), test::fill(V, rng);
  for (std::size_t k = 0; k < Q.size(); ++k) Qf.data()[k] = float(Q.data()[k]), dOf.data()[k] = float(dO.data()[k]);
  for (std::size_t k = 0; k < K.size(); ++k) Kf.data()[k] = float(K.data()[k]), Vf.data()[k] = float(V.data()[k]);
  const auto [dQ, dK, dV] = gradient(softmax(causal(Q * transpose(K)) / 3.0f) * V, dO, wrt(Q, K, V));
  const auto [fQ, fK, fV] = gradient(softmax(causal(Qf * transpose(Kf)) / 3.0f) * Vf, dOf, wrt(Qf, Kf, Vf));
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(dQ)>, tensor<bf16, dyn, dyn, dyn>>);
  bool rounded = true;
  for (std::size_t k = 0; k < dQ.size(); ++k) rounded = rounded && dQ.data()[k].bits() == bf16(fQ.data()[k]).bits();
  for (std::size_t k = 0; k < dK.size(); ++k)
    rounded = rounded && dK.data()[k].bits() == bf16(fK.data()[k]).bits() && dV.data()[k].bits() == bf16(fV.data()[k]).bits();
  CHECK(rounded);
}
