// Tensors, tensor views and the notation on them: batch and head extents
// (static and dynamic), both memory layouts, grouped-query attention, masks
// and biases per batch, per head or broadcast, and bit-identical results
// over thread counts.
#include <catch2/catch.hpp>

#include "laws.hpp"
#include "support.hpp"

#include <qkv/qkv.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

using namespace qkv;
using test::fill;
using test::same_bits;
using test::same_bits_tensor;
using test::threads_guard;

TEST_CASE("tensor: extents, element access, zero fill", "[tensor][storage]") {
  tensor<float, dyn, dyn, dyn, 8> t(2, 3, 5);  // the dynamic extents, in order
  CHECK(t.extent(0) == 2);
  CHECK(t.extent(1) == 3);
  CHECK(t.extent(2) == 5);
  CHECK(t.extent(3) == 8);
  CHECK(t.rows() == 5);
  CHECK(t.cols() == 8);
  CHECK(t.size() == 2 * 3 * 5 * 8);
  CHECK(t.batch() == batch_extents{2, 3});
  for (std::size_t i = 0; i < t.size(); ++i) REQUIRE(t.data()[i] == 0.0f);
  t(1, 2, 4, 7) = 3.5f;
  CHECK(t.data()[((1 * 3 + 2) * 5 + 4) * 8 + 7] == 3.5f);
  CHECK(t.at(1, 2, 4, 7) == 3.5f);
  CHECK_THROWS_AS(t.at(2, 0, 0, 0), std::out_of_range);
  CHECK_THROWS_AS(t.at(0, 0, 0, 8), std::out_of_range);
  CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % 64 == 0);

  tensor<float, dyn, dyn, dyn, 8> all(2, 3, 5, 8);  // every extent
  CHECK(all.extents() == t.extents());
  CHECK_THROWS_AS((tensor<float, dyn, dyn, dyn, 8>(2, 3, 5, 9)), shape_error);

  tensor<double, 4, 3, 2> r3;  // rank 3, static: zero-filled
  CHECK(r3.batch() == batch_extents{1, 4});
  CHECK(r3(3, 2, 1) == 0.0);
  STATIC_REQUIRE(decltype(r3)::static_rank == 3);

  // The matrix at a batch index is a view of the tensor's memory.
  auto m = t.matrix_at(1, 2);
  CHECK(m(4, 7) == 3.5f);
  CHECK(m.rows() == 5);
  CHECK_THROWS_AS(t.matrix_at(2, 0), std::out_of_range);
}

TEST_CASE("tensor_view: strides read [B T H D] memory as [B H T D]", "[tensor][storage]") {
  const std::size_t B = 2, T = 5, H = 3, D = 4;
  std::vector<float> raw(B * T * H * D);
  for (std::size_t x = 0; x < raw.size(); ++x) raw[x] = float(x);
  tensor_view<const float, dyn, dyn, dyn, 4> v(raw.data(), {B, H, T, D}, {T * H * D, D, H * D, 1});
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t d = 0; d < D; ++d) REQUIRE(v(b, h, t, d) == raw[((b * T + t) * H + h) * D + d]);
  const auto m = v.matrix_at(1, 2);
  CHECK(m.row_stride() == H * D);
  CHECK(m(3, 1) == raw[((1 * T + 3) * H + 2) * D + 1]);

  CHECK_THROWS_AS((tensor_view<const float, dyn, dyn, dyn, 4>(raw.data(), {B, H, T, 5}, {1, 1, 1, 1})), shape_error);
  CHECK_THROWS_AS((tensor_view<const float, dyn, dyn, dyn, 4>(nullptr, {B, H, T, D})), std::invalid_argument);
  CHECK_NOTHROW((tensor_view<const float, dyn, dyn, dyn, 4>(nullptr, {0, H, T, D})));

  // Contiguous by default, and from a tensor.
  tensor<float, 2, 3, 4> t;
  tensor_view<float, 2, 3, 4> tv = t;
  tv(1, 2, 3) = 7;
  CHECK(t(1, 2, 3) == 7);
  CHECK(tv.stride(0) == 12);
}

TEST_CASE("batch extents of nodes: broadcast and grouped, static and dynamic", "[tensor][shape]") {
  tensor<float, 2, 8, 16, 64> Q;
  tensor<float, 2, 2, 16, 64> K;  // grouped: 8 query heads over 2 key heads
  matrix<float, 16, 16> B;
  auto s = Q * transpose(K) / sqrt(dim<64>) + B;
  using S = decltype(s);
  STATIC_REQUIRE(S::static_rank == 4);
  STATIC_REQUIRE(S::static_batch == batch_extents{2, 8});
  CHECK(s.batch() == batch_extents{2, 8});
  STATIC_REQUIRE(std::is_same_v<result_t<decltype(softmax(s) * K)>, tensor<float, 2, 8, 16, 64>>);

  tensor<float, dyn, dyn, 16, 64> Qd(2, 6), Kd(2, 4);
  CHECK_THROWS_WITH(Qd * transpose(Kd), Catch::Contains("qkv: A * B: the batch extents of A and B differ") &&
                                            Catch::Contains("[2, 6] vs [2, 4]"));
  tensor<float, dyn, dyn, 16, 16> Bd(1, 3);  // a bias must match or broadcast, not group
  tensor<float, dyn, dyn, 16, 64> Kg(2, 3);
  CHECK_NOTHROW(Qd * transpose(Kg));
  CHECK_THROWS_AS(Qd * transpose(Kg) + Bd, shape_error);
  // Fewer query heads than key heads, and K and V with different heads, are mistakes.
  tensor<float, dyn, dyn, 16, 64> Q4(2, 4), K8(2, 8), V6(2, 6), V1(2, 1);
  CHECK_THROWS_WITH(Q4 * transpose(K8), Catch::Contains("[2, 4] vs [2, 8]") &&
                                            Catch::Contains("grouped-query attention needs Q's heads a multiple"));
  CHECK_THROWS_WITH(softmax(Qd * transpose(Kg)) * V6, Catch::Contains("qkv: softmax(S) * V: K and V have different heads") &&
                                                          Catch::Contains("K [2, 3], V [2, 6]"));
  CHECK_THROWS_AS(softmax(causal(Qd * transpose(Kg) / 8.0f)) * V1, shape_error);
  CHECK_NOTHROW(softmax(causal(Qd * transpose(Kg) / 8.0f)) * Kg);

  // Rank 3 and rank 4 operands combine right-aligned: [H, T, D] broadcasts over B.
  tensor<float, 8, 16, 64> K3;
  auto s3 = Q * transpose(K3);
  STATIC_REQUIRE(decltype(s3)::static_rank == 4);
  CHECK(s3.batch() == batch_extents{2, 8});
}

namespace {

// Per (b, h): the single-head evaluation of the same formula on the matrices
// at that index, and the reference within the bound of attention_test.cpp.
// `root` is the √dk the batched formula divided by (a number or sqrt(dim<N>)).
template <class T, class Out, class Qt, class Kt, class Vt, class Root>
void check_heads(const Out& got, const Qt& Q, const Kt& K, const Vt& V, std::size_t kv_group, bool is_causal,
                 Root root) {
  const ref::real rscale = 1 / static_cast<ref::real>(scalar_value<T>(root));
  for (std::size_t b = 0; b < got.batch()[0]; ++b)
    for (std::size_t h = 0; h < got.batch()[1]; ++h) {
      INFO("b = " << b << ", h = " << h);
      const auto qm = Q.batch_matrix({b, h});
      const auto km = K.batch_matrix({b, h / kv_group});
      const auto vm = V.batch_matrix({b, h / kv_group});
      const auto one = is_causal ? eval(softmax(causal(qm * transpose(km) / root)) * vm)
                                 : eval(softmax(qm * transpose(km) / root) * vm);
      const auto out = got.batch_matrix({b, h});
      CHECK(same_bits(one, out));
      const auto q = ref::from(qm), k = ref::from(km), v = ref::from(vm);
      ref::mat s = ref::scale(ref::matmul(q, ref::transpose(k)), rscale);
      if (is_causal) s = ref::causal(s);
      const ref::mat p = ref::softmax(s);
      CHECK(ref::worst_ratio(out, ref::matmul(p, v), ref::attention_bound<T>(q, k, v, rscale, s, p)) <= 1);
    }
}

}  // namespace

TEST_CASE("multi-head attention on tensors equals each head alone", "[tensor][attention]") {
  const auto [B, H, n, m, d] = GENERATE(table<std::size_t, std::size_t, std::size_t, std::size_t, std::size_t>({
      {1, 1, 70, 70, 16}, {2, 3, 65, 130, 17}, {3, 2, 3, 300, 64}, {1, 5, 1, 1100, 32}, {2, 2, 0, 5, 8},
  }));
  INFO("B = " << B << ", H = " << H << ", n = " << n << ", m = " << m << ", d = " << d);
  ref::rng rng(7);
  tensor<float, dyn, dyn, dyn, dyn> Q(B, H, n, d), K(B, H, m, d), V(B, H, m, d);
  fill(Q, rng);
  fill(K, rng);
  fill(V, rng);
  const float dk = float(d);
  check_heads<float>(eval(softmax(Q * transpose(K) / sqrt(dk)) * V), Q, K, V, 1, false, sqrt(dk));
  check_heads<float>(eval(softmax(causal(Q * transpose(K) / sqrt(dk))) * V), Q, K, V, 1, true, sqrt(dk));
  const auto naive_out = eval(softmax(causal(Q * transpose(K) / sqrt(dk))) * V, naive);
  const auto fused_out = eval(softmax(causal(Q * transpose(K) / sqrt(dk))) * V, fused);
  CHECK(naive_out.extents() == fused_out.extents());
}

TEST_CASE("static batch and head extents, rank 3 and rank 4, float and double", "[tensor][attention]") {
  ref::rng rng(8);
  tensor<double, 2, 4, 33, 16> Q, K, V;
  fill(Q, rng);
  fill(K, rng);
  fill(V, rng);
  const auto O = eval(softmax(Q * transpose(K) / sqrt(dim<16>)) * V);
  STATIC_REQUIRE(std::is_same_v<decltype(O), const tensor<double, 2, 4, 33, 16>>);
  check_heads<double>(O, Q, K, V, 1, false, sqrt(dim<16>));

  tensor<float, 3, 40, 8> q3, k3, v3;
  fill(q3, rng);
  fill(k3, rng);
  fill(v3, rng);
  tensor<float, 3, 40, 8> o3 = softmax(causal(q3 * transpose(k3) / sqrt(dim<8>))) * v3;
  check_heads<float>(o3, q3, k3, v3, 1, true, sqrt(dim<8>));
}

TEST_CASE("grouped-query and multi-query attention read key head h / (Hq / Hkv)", "[tensor][attention][gqa]") {
  const auto [Hq, Hkv] = GENERATE(table<std::size_t, std::size_t>({{6, 2}, {6, 3}, {4, 1}, {8, 8}}));
  INFO("Hq = " << Hq << ", Hkv = " << Hkv);
  ref::rng rng(9);
  const std::size_t B = 2, n = 70, m = 90;
  tensor<float, dyn, dyn, dyn, 24> Q(B, Hq, n), K(B, Hkv, m), V(B, Hkv, m);
  fill(Q, rng);
  fill(K, rng);
  fill(V, rng);
  const auto O = eval(softmax(causal(Q * transpose(K) / sqrt(dim<24>))) * V);
  CHECK(O.batch() == batch_extents{B, Hq});
  check_heads<float>(O, Q, K, V, Hq / Hkv, true, sqrt(dim<24>));
  // Decoding: one query per head.
  tensor<float, dyn, dyn, dyn, 24> q1(B, Hq, 1);
  fill(q1, rng);
  check_heads<float>(eval(softmax(q1 * transpose(K) / sqrt(dim<24>)) * V), q1, K, V, Hq / Hkv, false, sqrt(dim<24>));
}

TEST_CASE("both layouts, in place: [B T H D] inputs and output", "[tensor][attention][layout]") {
  const std::size_t B = 2, T = 67, H = 3, D = 20;
  ref::rng rng(10);
  tensor<float, dyn, dyn, dyn, dyn> Q(B, H, T, D), K(B, H, T, D), V(B, H, T, D);
  fill(Q, rng);
  fill(K, rng);
  fill(V, rng);
  // The same values stored heads-interleaved, as PyTorch's [B, T, H, D].
  auto interleave = [&](const auto& t) {
    std::vector<float> raw(B * T * H * D);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t i = 0; i < T; ++i)
          for (std::size_t c = 0; c < D; ++c) raw[((b * T + i) * H + h) * D + c] = t(b, h, i, c);
    return raw;
  };
  const std::vector<float> q = interleave(Q), k = interleave(K), v = interleave(V);
  const std::array<std::size_t, 4> ext{B, H, T, D}, bthd{T * H * D, D, H * D, 1};
  tensor_view<const float, dyn, dyn, dyn, dyn> Qv(q.data(), ext, bthd), Kv(k.data(), ext, bthd), Vv(v.data(), ext, bthd);
  std::vector<float> out(B * T * H * D, -1.0f);
  tensor_view<float, dyn, dyn, dyn, dyn> Ov(out.data(), ext, bthd);

  const auto want = eval(softmax(causal(Q * transpose(K) / sqrt(float(D)))) * V);
  eval_into(Ov, softmax(causal(Qv * transpose(Kv) / sqrt(float(D)))) * Vv);
  CHECK(same_bits_tensor(want, eval(softmax(causal(Qv * transpose(Kv) / sqrt(float(D)))) * Vv)));
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h) CHECK(same_bits(want.matrix_at(b, h), Ov.matrix_at(b, h)));
  // Naive, into the same layout.
  std::vector<float> out2(out.size());
  eval_into(tensor_view<float, dyn, dyn, dyn, dyn>(out2.data(), ext, bthd),
            softmax(causal(Qv * transpose(Kv) / sqrt(float(D)))) * Vv, naive);
  const auto want_naive = eval(softmax(causal(Q * transpose(K) / sqrt(float(D)))) * V, naive);
  tensor_view<const float, dyn, dyn, dyn, dyn> O2(out2.data(), ext, bthd);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h) CHECK(same_bits(want_naive.matrix_at(b, h), O2.matrix_at(b, h)));

  // A last stride other than 1 (a column-major head) works too.
  std::vector<float> qt(q.size());
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < T; ++i)
        for (std::size_t c = 0; c < D; ++c) qt[((b * H + h) * D + c) * T + i] = Q(b, h, i, c);
  tensor_view<const float, dyn, dyn, dyn, dyn> Qc(qt.data(), ext, {H * D * T, D * T, 1, T});
  CHECK(same_bits_tensor(want, eval(softmax(causal(Qc * transpose(K) / sqrt(float(D)))) * V)));
}

TEST_CASE("masks and biases per batch, per head, or broadcast", "[tensor][attention][mask]") {
  const std::size_t B = 2, H = 3, n = 50, m = 300, d = 16;
  ref::rng rng(11);
  tensor<float, dyn, dyn, dyn, dyn> Q(B, H, n, d), K(B, H, m, d), V(B, H, m, d);
  fill(Q, rng);
  fill(K, rng);
  fill(V, rng);
  tensor<bool, dyn, 1, dyn, dyn> per_batch(B, n, m);  // [B, 1, n, m]: a padding mask per sequence
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < m; ++j) per_batch(b, 0, i, j) = j < (b == 0 ? m : 200) && (i != 7 || b == 0);
  matrix<bool, dyn, dyn> shared(n, m);  // one mask for every batch and head
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) shared(i, j) = (i + j) % 4 != 0;
  tensor<float, 1, dyn, dyn, dyn> alibi(H, n, m);  // [1, H, n, m]: a bias per head
  for (std::size_t h = 0; h < H; ++h)
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < m; ++j) alibi(0, h, i, j) = -0.25f * float(h + 1) * std::abs(float(i) - float(j)) / 64;

  auto per_head = [&](auto&& formula) {
    const auto got = eval(formula(Q, K, V, per_batch, shared, alibi));
    const auto got_naive = eval(formula(Q, K, V, per_batch, shared, alibi), naive);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H; ++h) {
        INFO("b = " << b << ", h = " << h);
        const auto one = eval(formula(Q.matrix_at(b, h), K.matrix_at(b, h), V.matrix_at(b, h), per_batch.matrix_at(b, 0),
                                      shared, alibi.matrix_at(0, h)));
        CHECK(same_bits(one, got.matrix_at(b, h)));
        const auto one_naive = eval(formula(Q.matrix_at(b, h), K.matrix_at(b, h), V.matrix_at(b, h),
                                            per_batch.matrix_at(b, 0), shared, alibi.matrix_at(0, h)),
                                    naive);
        CHECK(same_bits(one_naive, got_naive.matrix_at(b, h)));
      }
    return got;
  };
  const auto masked_out = per_head([](const auto& q, const auto& k, const auto& v, const auto& mb, const auto&, const auto&) {
    return softmax(masked(q * transpose(k) / sqrt(dim<16>), mb)) * v;
  });
  // The row every key of which is masked (b = 1, i = 7) gives zeros.
  for (std::size_t h = 0; h < H; ++h)
    for (std::size_t c = 0; c < d; ++c) CHECK(masked_out(1, h, 7, c) == 0.0f);
  per_head([](const auto& q, const auto& k, const auto& v, const auto&, const auto& ms, const auto& bias) {
    return softmax(causal(masked(q * transpose(k) / sqrt(dim<16>) + bias, ms))) * v;
  });

  tensor<bool, 3, dyn, dyn> wrong(n, m);  // batch extents [1, 3] against [2, 3] broadcast: fine
  CHECK_NOTHROW(masked(Q * transpose(K), wrong));
  tensor<bool, dyn, 2, dyn, dyn> wrong2(B, n, m);  // 2 heads against 3: neither equal nor 1
  CHECK_THROWS_WITH(masked(Q * transpose(K), wrong2), Catch::Contains("qkv: masked(S, M): the batch extents"));
}

TEST_CASE("batched results are bit-identical with 1, 2 and 3 threads", "[tensor][threads]") {
  threads_guard guard;
  const auto [B, H, Hkv, n, m] = GENERATE(table<std::size_t, std::size_t, std::size_t, std::size_t, std::size_t>({
      {1, 8, 8, 130, 130}, {2, 4, 2, 70, 300}, {1, 2, 1, 1, 5000}, {1, 16, 4, 2, 700}, {3, 1, 1, 300, 300},
  }));
  INFO("B = " << B << ", H = " << H << ", Hkv = " << Hkv << ", n = " << n << ", m = " << m);
  ref::rng rng(12);
  tensor<float, dyn, dyn, dyn, 32> Q(B, H, n), K(B, Hkv, m), V(B, Hkv, m);
  fill(Q, rng);
  fill(K, rng);
  fill(V, rng);
  // Through the laws (tests/laws.hpp): 1, 2 and 3 threads bit for bit, and
  // each head equal to itself alone and within the reference bound.
  const ref::real_for<float> rs = 1 / static_cast<ref::real_for<float>>(static_cast<float>(sqrt(dim<32>)));
  test::check_laws<float>(
      test::law{"causal(Q Kᵀ / √32)", [](auto& q, auto& k, auto& v) { return softmax(causal(q * transpose(k) / sqrt(dim<32>))) * v; },
                [&](const ref::mat_for<float>& q, const ref::mat_for<float>& k, const ref::mat_for<float>& v) {
                  const ref::mat_for<float> s = ref::causal(ref::scale(ref::matmul(q, ref::transpose(k)), rs)), p = ref::softmax(s);
                  return test::expected{ref::matmul(p, v), ref::attention_bound<float>(q, k, v, rs, s, p)};
                }},
      Q, K, V);
}

TEST_CASE("the lecture's multi-head layer: projections, heads as views, concatenation", "[tensor][lecture]") {
  // X (T × d_model), Wq, Wk, Wv, Wo (d_model × d_model), h heads of d_model / h.
  const std::size_t T = 37, d_model = 48, h = 4, dh = d_model / h;
  ref::rng rng(13);
  matrix<double, dyn, dyn> X(T, d_model), Wq(d_model, d_model), Wk(d_model, d_model), Wv(d_model, d_model),
      Wo(d_model, d_model);
  for (auto* w : {&X, &Wq, &Wk, &Wv, &Wo}) rng.fill(*w, -0.5, 0.5);
  const matrix<double, dyn, dyn> Qp = X * Wq, Kp = X * Wk, Vp = X * Wv;
  // A T × d_model projection is [T, h, dh]: read it as [h, T, dh].
  auto heads = [&](const matrix<double, dyn, dyn>& p) {
    return tensor_view<const double, dyn, dyn, dyn>(p.data(), {h, T, dh}, {dh, d_model, 1});
  };
  matrix<double, dyn, dyn> concat(T, d_model);
  eval_into(tensor_view<double, dyn, dyn, dyn>(concat.data(), {h, T, dh}, {dh, d_model, 1}),
            softmax(heads(Qp) * transpose(heads(Kp)) / sqrt(double(dh))) * heads(Vp));
  const matrix<double, dyn, dyn> Y = concat * Wo;

  // Reference: per head in long double, concatenated, projected.
  const auto x = ref::from(X), wq = ref::from(Wq), wk = ref::from(Wk), wv = ref::from(Wv), wo = ref::from(Wo);
  const ref::mat q = ref::matmul(x, wq), k = ref::matmul(x, wk), v = ref::matmul(x, wv);
  ref::mat cat(T, d_model);
  for (std::size_t head = 0; head < h; ++head) {
    ref::mat qh(T, dh), kh(T, dh), vh(T, dh);
    for (std::size_t i = 0; i < T; ++i)
      for (std::size_t c = 0; c < dh; ++c)
        qh(i, c) = q(i, head * dh + c), kh(i, c) = k(i, head * dh + c), vh(i, c) = v(i, head * dh + c);
    const ref::mat oh = ref::matmul(ref::softmax(ref::scale(ref::matmul(qh, ref::transpose(kh)), 1 / std::sqrt(ref::real(dh)))), vh);
    for (std::size_t i = 0; i < T; ++i)
      for (std::size_t c = 0; c < dh; ++c) cat(i, head * dh + c) = oh(i, c);
  }
  const ref::mat y = ref::matmul(cat, wo);
  // Values are O(1) and every step is a short sum in double: relative to the
  // largest output, a few hundred units of roundoff is a generous bound
  // (γ_48 ≈ 48u per product, three products and a softmax in a chain).
  CHECK(ref::max_error(Y, y) <= 1000 * ref::unit_roundoff<double> * ref::max_abs(y));
}

TEST_CASE("eval_into a tensor: shapes checked, aliasing safe", "[tensor][eval]") {
  ref::rng rng(14);
  tensor<float, dyn, dyn, dyn, 8> Q(2, 2, 20), K(2, 2, 20), V(2, 2, 20);
  fill(Q, rng);
  fill(K, rng);
  fill(V, rng);
  tensor<float, dyn, dyn, dyn, 8> wrong(2, 3, 20);
  CHECK_THROWS_WITH(eval_into(wrong, softmax(Q * transpose(K)) * V),
                    Catch::Contains("qkv: eval_into(dst, e): the shapes of dst and e differ ([2, 3, 20, 8] vs [2, 2, 20, 8])"));
  const auto want = eval(softmax(Q * transpose(K)) * V);
  tensor<float, dyn, dyn, dyn, 8> Q2 = Q;
  Q2 = softmax(Q2 * transpose(K)) * V;  // reads Q2 while writing it
  CHECK(same_bits_tensor(want, Q2));
  tensor<float, dyn, dyn, dyn, 8> grown;
  grown = softmax(Q * transpose(K)) * V;  // dynamic extents taken from the expression
  CHECK(same_bits_tensor(want, grown));
}

TEST_CASE("cost of a batched expression", "[tensor][cost]") {
  using Qt = tensor<float, 1, 32, 4096, 128>;
  using E = decltype(softmax(std::declval<const Qt&>() * transpose(std::declval<const Qt&>()) / sqrt(dim<128>)) *
                     std::declval<const Qt&>());
  using Qm = matrix<float, 4096, 128>;
  using One = decltype(softmax(std::declval<const Qm&>() * transpose(std::declval<const Qm&>()) / sqrt(dim<128>)) *
                       std::declval<const Qm&>());
  constexpr auto heads = static_cost<E>();
  constexpr auto one = static_cost<One>();
  STATIC_REQUIRE(heads.flops == 32 * one.flops);
  STATIC_REQUIRE(heads.exps == 32 * one.exps);
  STATIC_REQUIRE(heads.naive_bytes == one.naive_bytes);  // one head's scores at a time
  STATIC_REQUIRE(heads.fused_bytes == one.fused_bytes);  // operands in place: the kernel's buffers only
}
