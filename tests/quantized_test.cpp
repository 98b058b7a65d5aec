// The 8-bit and 4-bit formats: the documented layout, each code the nearest
// point of its group's grid, dequantize exact, non-finite values kept to
// their group, and the holders keeping their source's extents.
#include <catch2/catch.hpp>

#include "reference.hpp"

#include <qkv/qkv.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

using namespace qkv;

namespace {

float float_at(const std::byte* p) {
  float f;
  std::memcpy(&f, p, sizeof f);
  return f;
}

// Value c of a q8 row of d values, read as docs/design.md lays the row out:
// d / 32 float scales, then one int8 code a value.
float q8_documented(const std::byte* row, std::size_t d, std::size_t c) {
  const auto code = static_cast<std::int8_t>(row[d / 32 * 4 + c]);
  return float_at(row + c / 32 * 4) * static_cast<float>(code);
}

// q4: d / 32 scales, d / 32 minimums, then 16 bytes a group, byte k holding
// value k in its low four bits and value k + 16 in its high four.
float q4_documented(const std::byte* row, std::size_t d, std::size_t c) {
  const std::size_t g = c / 32, k = c % 32;
  const auto byte = static_cast<unsigned>(row[d / 32 * 8 + g * 16 + k % 16]);
  const unsigned code = k < 16 ? byte & 15u : byte >> 4;
  return std::fma(float_at(row + g * 4), static_cast<float>(code), float_at(row + (d / 32 + g) * 4));
}

template <class M>
M random_rows(std::size_t rows, std::size_t d, ref::rng& rng, double spread = 1) {
  M m(rows, d);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t c = 0; c < d; ++c) m(i, c) = static_cast<typename M::value_type>(rng.uniform(-spread, spread));
  return m;
}

// Each value within half a grid step of x (round to nearest), plus the one
// rounding of the value itself; the extremes of each group exact to that
// rounding (q8: ±max|x| is code ±127; q4: the minimum is code 0).
template <class F, class M, class Q>
void check_nearest(const M& x, const Q& xq) {
  const std::size_t d = x.cols();
  for (std::size_t i = 0; i < x.rows(); ++i)
    for (std::size_t g = 0; g < d / 32; ++g) {
      const float scale = float_at(xq.row(i) + g * 4);
      double lo = INFINITY, hi = -INFINITY;
      for (std::size_t c = 32 * g; c < 32 * g + 32; ++c) lo = std::min(lo, double(float(x(i, c)))), hi = std::max(hi, double(float(x(i, c))));
      if constexpr (std::is_same_v<F, q8>) CHECK(scale == float(std::max(std::fabs(lo), std::fabs(hi)) / 127));
      else CHECK(scale == float((hi - lo) / 15));
      for (std::size_t c = 32 * g; c < 32 * g + 32; ++c) {
        const double v = xq(i, c), want = double(float(x(i, c)));
        INFO("row " << i << ", column " << c);
        CHECK(std::fabs(v - want) <= 0.5 * scale * (1 + 1e-6) + std::fabs(v) * 0x1p-24);
      }
    }
}

}  // namespace

TEST_CASE("q8 and q4 rows: the documented layout, nearest codes, dequantize exact", "[quantized]") {
  ref::rng rng(60);
  for (std::size_t d : {32, 64, 96, 128}) {
    INFO("d = " << d);
    const auto x = random_rows<matrix<float, dyn, dyn>>(7, d, rng, 3);
    const auto x8 = quantize<q8>(x);
    const auto x4 = quantize<q4>(x);
    static_assert(std::is_same_v<decltype(x8), const quantized<q8, matrix<float, dyn, dyn>>>);
    REQUIRE(x8.row_bytes() == d / 32 * 4 + d);
    REQUIRE(x4.row_bytes() == d / 32 * 8 + d / 2);
    REQUIRE(x8.bytes() == 7 * x8.row_bytes());
    REQUIRE(x4.rows() == 7);
    REQUIRE(x4.cols() == d);
    const matrix<float, dyn, dyn> y8 = dequantize(x8), y4 = dequantize(x4);
    for (std::size_t i = 0; i < 7; ++i)
      for (std::size_t c = 0; c < d; ++c) {
        CHECK(y8(i, c) == q8_documented(x8.row(i), d, c));
        CHECK(y8(i, c) == x8(i, c));
        CHECK(y4(i, c) == q4_documented(x4.row(i), d, c));
        CHECK(y4(i, c) == x4(i, c));
      }
    check_nearest<q8>(x, x8);
    check_nearest<q4>(x, x4);
  }
}

TEST_CASE("q8 and q4: bf16 and f16 sources, views, tensors and raggeds", "[quantized]") {
  ref::rng rng(61);
  const auto x = random_rows<matrix<bf16, dyn, 64>>(5, 64, rng);
  matrix<float, dyn, 64> as_float(5, 64);
  for (std::size_t i = 0; i < 5; ++i)
    for (std::size_t c = 0; c < 64; ++c) as_float(i, c) = float(x(i, c));
  // The 2-byte values convert exactly: the same codes as from their floats.
  const auto a = quantize<q4>(x), b = quantize<q4>(as_float);
  REQUIRE(std::memcmp(a.data(), b.data(), a.bytes()) == 0);
  const auto h = random_rows<matrix<f16, dyn, dyn>>(3, 32, rng);
  const auto hq = quantize<q8>(matrix_view<const f16, dyn, dyn>(h));
  check_nearest<q8>(h, hq);

  tensor<float, 2, 3, dyn, 32> t(2, 3, 4, 32);
  for (std::size_t k = 0; k < t.size(); ++k) t.data()[k] = float(rng.uniform(-1, 1));
  const auto tq = quantize<q8>(t);
  REQUIRE(tq.extents() == t.extents());
  const tensor<float, 2, 3, dyn, 32> td = dequantize(tq);
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t hh = 0; hh < 3; ++hh)
      for (std::size_t i = 0; i < 4; ++i)
        for (std::size_t c = 0; c < 32; ++c) {
          CHECK(td(b, hh, i, c) == tq(b, hh, i, c));
          CHECK(std::fabs(td(b, hh, i, c) - t(b, hh, i, c)) <= 0.5f / 127 * (1 + 1e-5f));
        }

  ragged<f16, 2, 64> r(std::vector<std::int32_t>{0, 3, 3, 5}, {2, 64});
  for (std::size_t k = 0; k < r.size(); ++k) r.data()[k] = f16(float(rng.uniform(-1, 1)));
  const auto rq = quantize<q4>(r);
  REQUIRE(rq.batch() == 3);
  REQUIRE(rq.length(1) == 0);
  REQUIRE(rq.tokens() == 5);
  const ragged<float, 2, 64> rd = dequantize(rq);
  REQUIRE(rd.batch() == 3);
  for (std::size_t tok = 0; tok < 5; ++tok)
    for (std::size_t hh = 0; hh < 2; ++hh)
      for (std::size_t c = 0; c < 64; ++c) {
        CHECK(rd(tok, hh, c) == rq(tok, hh, c));
        CHECK(std::fabs(rd(tok, hh, c) - float(r(tok, hh, c))) <= 0.5f * 2 / 15 * (1 + 1e-5f));
      }
}

TEST_CASE("q8 and q4: groups of equal values, zeros and the widest finite range", "[quantized]") {
  matrix<float, 2, 64> x;
  for (std::size_t c = 0; c < 32; ++c) x(0, c) = 0.75f, x(1, c) = 0;  // one value a group; zeros
  for (std::size_t c = 32; c < 64; ++c) x(0, c) = c % 2 ? 3e38f : -3e38f, x(1, c) = c == 40 ? 1e-30f : 0;
  const auto x8 = quantize<q8>(x);
  const auto x4 = quantize<q4>(x);
  for (std::size_t c = 0; c < 32; ++c) {
    CHECK(std::fabs(x8(0, c) - 0.75f) <= 0.75f * 0x1p-23f);  // 127 · (0.75 / 127): two roundings
    CHECK(x4(0, c) == 0.75f);  // the minimum itself, scale 0
    CHECK(x8(1, c) == 0);
    CHECK(x4(1, c) == 0);
  }
  for (std::size_t c = 32; c < 64; ++c) {
    INFO("column " << c);
    CHECK(std::isfinite(x4(0, c)));
    CHECK(std::fabs(x8(0, c) - x(0, c)) <= 3e38f * 0x1p-22f);
    CHECK(std::fabs(x4(0, c) - x(0, c)) <= 3e38f * 0x1p-22f);
    CHECK(std::fabs(x8(1, c) - x(1, c)) <= 1e-30f / 254 * 1.0001f);
  }
}

TEST_CASE("q8 and q4: NaN and infinities make their own group NaN, nothing else", "[quantized]") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (float bad : {nan, inf, -inf}) {
    matrix<float, 1, 96> x;
    for (std::size_t c = 0; c < 96; ++c) x(0, c) = 0.01f * float(c) - 0.3f;
    x(0, 40) = bad;  // group 1
    const auto x8 = quantize<q8>(x);
    const auto x4 = quantize<q4>(x);
    matrix<float, 1, 32> first;
    for (std::size_t c = 0; c < 32; ++c) first(0, c) = x(0, c);
    const auto clean8 = quantize<q8>(first);
    for (std::size_t c = 0; c < 96; ++c) {
      INFO(bad << " at 40, column " << c);
      if (c >= 32 && c < 64) {
        CHECK(std::isnan(x8(0, c)));
        CHECK(std::isnan(x4(0, c)));
      } else {
        CHECK(std::fabs(x8(0, c) - x(0, c)) <= 0.5f * 0.66f / 127);  // |x| ≤ 0.65 in groups 0 and 2
        CHECK(std::isfinite(x4(0, c)));
      }
    }
    for (std::size_t c = 0; c < 32; ++c) CHECK(x8(0, c) == clean8(0, c));  // the same codes as alone
  }
}

TEST_CASE("q8 and q4: a row length not a multiple of 32 is a shape_error", "[quantized]") {
  const matrix<float, dyn, dyn> x(2, 48);
  CHECK_THROWS_AS(quantize<q8>(x), shape_error);
  CHECK_THROWS_AS(quantize<q4>(x), shape_error);
  CHECK_THROWS_WITH(quantize<q4>(x), Catch::Contains("qkv: quantize<q4>") && Catch::Contains("48"));
  const matrix<float, dyn, dyn> none(0, 32);
  CHECK(quantize<q8>(none).bytes() == 0);
}

namespace {

template <class A, class B>
bool same_values(const A& a, const B& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

// Until the kernels read the codes as stored, a quantized K or V is
// dequantized before the strategy runs: the result is then bit for bit the
// float attention over the dequantized values (which the float tests check
// against the float64 reference), fused and naive alike.
TEST_CASE("attention over quantized K and V: the float attention over their values, bit for bit", "[quantized]") {
  ref::rng rng(62);
  const auto Q = random_rows<matrix<float, dyn, 64>>(9, 64, rng);
  const auto K = random_rows<matrix<float, dyn, 64>>(70, 64, rng);
  const auto V = random_rows<matrix<float, dyn, 64>>(70, 64, rng);
  const auto K8 = quantize<q8>(K);
  const auto V4 = quantize<q4>(V);
  const matrix<float, dyn, 64> Kd = dequantize(K8), Vd = dequantize(V4);
  const auto e = softmax(causal(Q * transpose(K8) / 8.0f)) * V4;
  const auto plain = softmax(causal(Q * transpose(Kd) / 8.0f)) * Vd;
  CHECK(same_values(eval(e), eval(plain)));
  CHECK(same_values(eval(e, naive), eval(plain, naive)));
  matrix<float, dyn, 64> O(9, 64);
  eval_into(O, e);
  CHECK(same_values(O, eval(plain)));
  const auto [O1, L1] = eval_with_lse(e);
  const auto [O2, L2] = eval_with_lse(plain);
  CHECK(same_values(O1, O2));
  CHECK(same_values(L1, L2));
  CHECK_THAT(explain(e), Catch::StartsWith("K or V quantized (q8 and q4): dequantized to float first"));
  // Q's gradient through quantized K and V (the codes themselves have none).
  const auto dO = random_rows<matrix<float, dyn, 64>>(9, 64, rng);
  CHECK(same_values(std::get<0>(gradient(e, dO, wrt(Q))), std::get<0>(gradient(plain, dO, wrt(Q)))));

  // Grouped heads over a bf16 cache quantized, and a ragged batch.
  tensor<float, 2, 8, dyn, 32> Qt(2, 8, 1, 32);
  tensor<bf16, 2, 2, dyn, 32> Kt(2, 2, 45, 32), Vt(2, 2, 45, 32);
  for (std::size_t k = 0; k < Qt.size(); ++k) Qt.data()[k] = float(rng.uniform(-1, 1));
  for (std::size_t k = 0; k < Kt.size(); ++k) Kt.data()[k] = bf16(float(rng.uniform(-1, 1))), Vt.data()[k] = bf16(float(rng.uniform(-1, 1)));
  const auto Kt8 = quantize<q8>(Kt), Vt8 = quantize<q8>(Vt);
  CHECK(same_values(eval(softmax(Qt * transpose(Kt8)) * Vt8), eval(softmax(Qt * transpose(dequantize(Kt8))) * dequantize(Vt8))));
  ragged<float, 2, 32> Qr(std::vector<std::int32_t>{0, 3, 4, 4}, {2, 32}), Kr(std::vector<std::int32_t>{0, 5, 41, 41}, {2, 32});
  for (std::size_t k = 0; k < Qr.size(); ++k) Qr.data()[k] = float(rng.uniform(-1, 1));
  for (std::size_t k = 0; k < Kr.size(); ++k) Kr.data()[k] = float(rng.uniform(-1, 1));
  const auto Kr4 = quantize<q4>(Kr);
  const auto Or = eval(softmax(causal(Qr * transpose(Kr4))) * Kr4);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(Or)>, ragged<float, 2, 32>>);
  CHECK(same_values(Or, eval(softmax(causal(Qr * transpose(dequantize(Kr4)))) * dequantize(Kr4))));
}
