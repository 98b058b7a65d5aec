// The fused kernels over K and V stored as bf16 or f16 (kernels/api.hpp).
// Converting a 2-byte value to float is exact and the kernels convert K and
// V as they pack or stream them, so every result must be the float kernel's
// on float copies, bit for bit: on each instruction set (the forced runs and
// the emulated ones run this file too), over every tail of the conversion
// loops (dk, dv not multiples of the vector width), strided K and V, the
// decoding path and its parts, causal, and values the conversions find hard
// (f16 subnormals, bf16 beyond f16's range, NaN and ∞ in masked value rows).
#include "support.hpp"

#include <qkv/kernels/api.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

using namespace qkv;

namespace {

// A value for the test: mostly uniform in [−2, 2], one in eight a value
// whose conversion is special (an f16 subnormal, or a large bf16).
template <class S>
S test_value(ref::rng& rng) {
  const double u = rng.uniform(0, 1);
  if (u < 0.125) {
    if constexpr (std::is_same_v<S, f16>) return f16::from_bits(static_cast<std::uint16_t>(1 + rng.uniform(0, 1022)));
    else return bf16(static_cast<float>(rng.uniform(-1, 1) * 1e5));
  }
  return S(static_cast<float>(rng.uniform(-2, 2)));
}

struct shape {
  std::size_t n, m, dk, dv;
};

template <class S>
void check_shape(shape sh, std::size_t k_col_stride, bool causal) {
  const auto [n, m, dk, dv] = sh;
  INFO("n = " << n << ", m = " << m << ", dk = " << dk << ", dv = " << dv << ", K column stride " << k_col_stride
              << ", causal = " << causal << ", kernels " << kernels::active_arch());
  ref::rng rng(static_cast<std::uint32_t>(n * 131 + m * 7 + dk + dv));
  // K with every k_col_stride-th column used, V with rows padded by 3.
  const std::size_t k_row = dk * k_col_stride + 1, v_row = dv + 3;
  std::vector<S> k16(m * k_row), v16(m * v_row);
  for (auto& x : k16) x = test_value<S>(rng);
  for (auto& x : v16) x = test_value<S>(rng);
  // The last value row not finite: under causal, rows before the last may
  // not see it, and it must not reach them.
  if (causal && m > 1 && n > 1) {
    v16[(m - 1) * v_row] = S(std::numeric_limits<float>::infinity());
    if (dv > 1) v16[(m - 1) * v_row + 1] = S(std::numeric_limits<float>::quiet_NaN());
  }
  std::vector<float> kf(k16.begin(), k16.end()), vf(v16.begin(), v16.end());
  std::vector<float> q(n * dk);
  for (auto& x : q) x = static_cast<float>(rng.uniform(-1, 1));
  std::vector<float> out16(n * dv, -1.0f), out32(n * dv, -2.0f);

  const auto kr = static_cast<std::ptrdiff_t>(k_row), vr = static_cast<std::ptrdiff_t>(v_row);
  const auto kc = static_cast<std::ptrdiff_t>(k_col_stride);
  kernels::attention_problem<float, S> p16;
  p16.q = {q.data(), n, dk, static_cast<std::ptrdiff_t>(dk), 1};
  p16.k = {k16.data(), m, dk, kr, kc};
  p16.v = {v16.data(), m, dv, vr, 1};
  p16.out = {out16.data(), n, dv, static_cast<std::ptrdiff_t>(dv), 1};
  p16.scale = 1.0f / std::sqrt(static_cast<float>(dk));
  p16.bounds.causal = causal;
  kernels::attention_problem<float> p32;
  p32.q = p16.q;
  p32.k = {kf.data(), m, dk, kr, kc};
  p32.v = {vf.data(), m, dv, vr, 1};
  p32.out = {out32.data(), n, dv, static_cast<std::ptrdiff_t>(dv), 1};
  p32.scale = p16.scale;
  p32.bounds.causal = causal;
  kernels::attention(&p16, 1);
  kernels::attention(&p32, 1);
  CHECK(std::memcmp(out16.data(), out32.data(), out16.size() * sizeof(float)) == 0);
  // Something was computed: the rows that see only finite values are finite.
  bool finite = true;
  const std::size_t clean_rows = causal && n > 1 ? n - 1 : n;
  for (std::size_t i = 0; i < clean_rows; ++i)
    for (std::size_t j = 0; j < dv; ++j) finite = finite && std::isfinite(out16[i * dv + j]);
  CHECK(finite);
}

}  // namespace

TEMPLATE_TEST_CASE("kernels over 2-byte K and V give the float kernel's bits on float copies",
                   "[half][attention][decode]", bf16, f16) {
  const kernels::blocking b = kernels::active_blocking(sizeof(float));
  const std::size_t w = b.lanes;
  // Decoding (n ≤ decode_rows), one part and several; many queries by
  // blocks, with tails of the vector width, the tile and the key block.
  const std::vector<shape> shapes = {
      {1, 1, 1, 1},
      {1, 37, w + 3, 2 * w + 1},
      {b.decode_rows, b.decode_split + 70, 2 * w, 4 * w},
      {3, 2 * b.decode_split + 5, 8 * w + 1, 8 * w + 3},
      {b.decode_rows + 1, 40, 3, 5},
      {70, 300, 2 * w - 1, 2 * w + 5},
      {b.query_rows + 3, b.max_key_block + 9, 4 * w, 4 * w},
  };
  for (const shape& sh : shapes) {
    if (test::emulation_skips(sh.n, sh.m, sh.dk, sh.dv)) continue;
    for (std::size_t kcs : {1, 2})
      for (bool causal : {false, true}) check_shape<TestType>(sh, kcs, causal);
  }
}

TEMPLATE_TEST_CASE("decoding over wide 2-byte value rows never reads a row whose weight is 0",
                   "[half][decode][nonfinite]", bf16, f16) {
  // dv wider than the vectors any set keeps in registers: each value row is
  // read whole, two rows a trip where both weigh something. Keys hidden by
  // the mask, at even and odd positions, alone and side by side, hold NaN
  // and ∞ in their value rows; they must reach no output.
  using S = TestType;
  const std::size_t w = kernels::active_blocking(sizeof(float)).lanes;
  const std::size_t n = 2, m = 300, dk = 16, dv = 8 * w + 3;
  ref::rng rng(17);
  std::vector<S> k16(m * dk), v16(m * dv);
  for (auto& x : k16) x = S(static_cast<float>(rng.uniform(-1, 1)));
  for (auto& x : v16) x = S(static_cast<float>(rng.uniform(-1, 1)));
  std::vector<float> q(n * dk);
  for (auto& x : q) x = static_cast<float>(rng.uniform(-1, 1));
  bool keep[n * m];
  for (bool& b : keep) b = true;
  const std::size_t hidden[] = {0, 7, 8, 9, 130, 131, 200, 299};
  for (std::size_t j : hidden) {
    for (std::size_t i = 0; i < n; ++i) keep[i * m + j] = false;
    for (std::size_t c = 0; c < dv; ++c)
      v16[j * dv + c] = S(c % 2 ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity());
  }
  std::vector<float> kf(k16.begin(), k16.end()), vf(v16.begin(), v16.end()), out16(n * dv), out32(n * dv);

  kernels::attention_problem<float, S> p16;
  p16.q = {q.data(), n, dk, static_cast<std::ptrdiff_t>(dk), 1};
  p16.k = {k16.data(), m, dk, static_cast<std::ptrdiff_t>(dk), 1};
  p16.v = {v16.data(), m, dv, static_cast<std::ptrdiff_t>(dv), 1};
  p16.out = {out16.data(), n, dv, static_cast<std::ptrdiff_t>(dv), 1};
  p16.scale = 0.25f;
  p16.mask = {keep, n, m, static_cast<std::ptrdiff_t>(m), 1};
  kernels::attention_problem<float> p32;
  p32.q = p16.q;
  p32.k = {kf.data(), m, dk, static_cast<std::ptrdiff_t>(dk), 1};
  p32.v = {vf.data(), m, dv, static_cast<std::ptrdiff_t>(dv), 1};
  p32.out = {out32.data(), n, dv, static_cast<std::ptrdiff_t>(dv), 1};
  p32.scale = p16.scale;
  p32.mask = p16.mask;
  kernels::attention(&p16, 1);
  kernels::attention(&p32, 1);
  bool finite = true;
  for (float x : out16) finite = finite && std::isfinite(x);
  CHECK(finite);
  CHECK(std::memcmp(out16.data(), out32.data(), out16.size() * sizeof(float)) == 0);
}

TEMPLATE_TEST_CASE("widen reads 2-byte matrices as float, every f16 and a bf16 of every exponent, contiguous and strided",
                   "[half][kernels]", bf16, f16) {
  using S = TestType;
  // Every bit pattern of f16; for bf16 every exponent and sign with a few
  // mantissas each (the low 7 bits and the top one vary).
  std::vector<S> all;
  for (std::uint32_t b = 0; b < 65536; ++b)
    if (std::is_same_v<S, f16> || (b & 0x78) == 0 || (b & 0x78) == 0x78) all.push_back(S::from_bits(static_cast<std::uint16_t>(b)));
  const auto same = [](float a, S s) {
    const float b = static_cast<float>(s);
    return std::isnan(b) ? std::isnan(a) : std::memcmp(&a, &b, sizeof a) == 0;
  };
  // Rows of 37 columns (tails of every vector width), then the transpose.
  const std::size_t cols = 37, rows = all.size() / cols;
  std::vector<float> out(rows * cols, -1.0f);
  kernels::widen(kernels::strided<const S>{all.data(), rows, cols, static_cast<std::ptrdiff_t>(cols), 1},
                 kernels::strided<float>{out.data(), rows, cols, static_cast<std::ptrdiff_t>(cols), 1});
  std::size_t wrong = 0;
  for (std::size_t k = 0; k < rows * cols; ++k) wrong += same(out[k], all[k]) ? 0 : 1;
  CHECK(wrong == 0);
  std::vector<float> t(rows * cols, -1.0f);
  kernels::widen(kernels::strided<const S>{all.data(), cols, rows, 1, static_cast<std::ptrdiff_t>(cols)},
                 kernels::strided<float>{t.data(), cols, rows, static_cast<std::ptrdiff_t>(rows), 1});
  wrong = 0;
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) wrong += same(t[j * rows + i], all[i * cols + j]) ? 0 : 1;
  CHECK(wrong == 0);
}
