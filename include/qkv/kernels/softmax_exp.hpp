// The fused softmax's exponential. There is one per score, the kernel's
// largest cost beside its two products, and a general exp spends most of
// its work on handling ranges that a softmax never produces. A softmax's
// exponents are x − max x: never above a rounding error of 0.
//
// fast_exp2 (float): x = n + r with n = round(x) and |r| ≤ ½. Base 2 makes r
// exact, so no Cody–Waite split is needed. 2^r comes from a degree-6
// polynomial and 2^n is built in the exponent field. The polynomial's
// relative error is 2·10⁻⁹ (a minimax fit on [−½, ½]). With Horner's
// roundings the result is within 1 ulp of 2^x: 0.95 at worst over every
// float of [−126, 0], and 1.2 on a set without FMA. tests/softmax_exp_test.cpp
// checks this on a sample. A degree-5 polynomial would save one FMA per 8
// scores and cost 2 ulp.
//
// It is exact where the softmax's invariants need it: 2^−∞ = 0 (a masked
// key's weight), NaN stays NaN (it must poison its row), and 2^0 = 1 (the
// row maximum's weight). Below −126.5 the result flushes to 0 instead of
// going subnormal; above 127.5 it is ∞.
//
// On AVX-512 (with DQ) the scaling is one vscalefps (with a mask for the
// flush), and the exponent is the softmax's largest share beside the two
// products, whose fused multiply-adds it competes with. So x is split
// finer, x = y + r with y a multiple of 1/16 and |r| ≤ 1/32, both exact
// (adding 1.5·2¹⁹ rounds x to sixteenths); 2^(y mod 1) is one of 16 table
// entries picked by one vpermps, and 2^r needs only degree 3 (1.6·10⁻⁹):
// four FMA-pipe operations instead of six, and adds in place of
// vrndscaleps and vreduceps. The table's own rounding (½ ulp) and the last
// FMA's keep it within 1 ulp: 0.986 at worst over every float of [−126.5, 0].
// Past 127.5 it overflows only at x = 128, as the exact value would.
// tests/softmax_exp_avx512_test.cpp checks it.
//
// softmax_exp(x) = e^x. For float it is fast_exp2(x·log2(e)). Rounding that
// product, and log2(e) to a float, add a relative error of up to
// 1.25·|x|·2⁻²⁴ to the weight e^x. Since e^x·|x| ≤ 1/e, that is below
// 2⁻²⁴/2 of the row's largest weight (which is 1), under the rounding of the
// float sum that follows. The weights that matter, with x near 0, keep the
// 1 ulp. The weights tile (weights_tile.hpp) also feeds it exponents up to
// 64 (a score past the row's maximum so far): there the largest weights
// carry up to 80·2⁻²⁴, within about twice what rounding their scores
// already costs (|a·u|·2⁻²⁴ and more), before one rescaling.
// On AVX-512 the product is never rounded: x and log2(e) go into the two
// fused multiply-adds that split the exponent (exp2_by_sixteenths), which
// saves the multiply and leaves log2(e)'s rounding alone (0.23·|x|·2⁻²⁴:
// 19.8 ulp at worst, at x = −86.6, against 62.9 for the rounded product).
// Folding log2(e) into the kernel's scale a would save the multiply, but
// without FMA fl(a·u) − m then loses |a·u|·2⁻²⁴, not |x|·2⁻²⁴, and a·u can
// be far larger than x (and a = 1 makes that product exact today).
// Double uses xsimd::exp: beside a double's products it costs little.
#pragma once

#include "arch_traits.hpp"

#include <xsimd/xsimd.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__AVX512DQ__)
#include <immintrin.h>
#endif

namespace qkv::kernels {

// 2^r for |r| ≤ ½, a polynomial 1 + r·q(r) of least relative error (1 so
// that 2^0 = 1 exactly) by Horner's rule. Degree 6 is the softmax's: 2·10⁻⁹.
// Degree 3 (1.02·10⁻⁴, 2^−13.3, with its coefficients in float) serves
// weights rounded to bf16 next (attention_prefill_bf16.hpp), whose own
// rounding is up to 2⁻⁹: three fused multiply-adds fewer per vector.
template <std::size_t Degree, class Arch>
xsimd::batch<float, Arch> exp2_fraction(xsimd::batch<float, Arch> r) {
  using batch = xsimd::batch<float, Arch>;
  static_assert(Degree == 6 || Degree == 3, "qkv: internal: no exponential of this degree");
  batch p;
  if constexpr (Degree == 6) {
    p = batch(1.53533595e-4f);
    p = fmadd(p, r, batch(1.33988743e-3f));
    p = fmadd(p, r, batch(9.61843737e-3f));
    p = fmadd(p, r, batch(5.55033247e-2f));
    p = fmadd(p, r, batch(2.40226479e-1f));
    p = fmadd(p, r, batch(6.93147203e-1f));
  } else {
    p = batch(5.50076030e-2f);
    p = fmadd(p, r, batch(2.42210001e-1f));
    p = fmadd(p, r, batch(6.93282962e-1f));
  }
  return fmadd(p, r, batch(1.0f));
}

#if defined(__AVX512DQ__)
// AVX-512's 2^(x·s), s = 1 or log2 e, x·s never rounded on its own: the
// two fused multiply-adds that take it (for t and for r) see it exact.
// Flushed to 0 where x < flush (x·s < −126.5), NaN kept.
template <class Arch>
xsimd::batch<float, Arch> exp2_by_sixteenths(xsimd::batch<float, Arch> x, float s, float flush) {
  using batch = xsimd::batch<float, Arch>;
  // y = x·s rounded to sixteenths (t's low 4 mantissa bits are 16·y mod 16,
  // the table's index, and vscalefps scales by 2^⌊y⌋); r = x·s − y, within
  // 1/32, rounded once. −∞ gives r = NaN, but it is masked to 0 anyway, and
  // NaN stays.
  alignas(64) static constexpr float sixteenths[16] = {
      1.000000000e+00f, 1.044273734e+00f, 1.090507746e+00f, 1.138788581e+00f,
      1.189207077e+00f, 1.241857767e+00f, 1.296839595e+00f, 1.354255557e+00f,
      1.414213538e+00f, 1.476826191e+00f, 1.542210817e+00f, 1.610490322e+00f,
      1.681792855e+00f, 1.756252170e+00f, 1.834008098e+00f, 1.915206552e+00f};
  const batch shifter(786432.0f);  // 1.5·2¹⁹
  const batch t = fmadd(x, batch(s), shifter);
  const batch y = t - shifter;
  const batch r = fmsub(x, batch(s), y);
  const batch two_y(_mm512_permutexvar_ps(_mm512_castps_si512(t), _mm512_load_ps(sixteenths)));
  // 2^r = 1 + r·q(r), a minimax fit of least relative error on [−1/32, 1/32].
  batch q = fmadd(batch(5.550213531e-2f), r, batch(2.402342856e-1f));
  q = fmadd(q, r, batch(6.931471825e-1f));
  const __mmask16 kept = _mm512_cmp_ps_mask(x, _mm512_set1_ps(flush), _CMP_NLT_UQ);  // x ≥ flush or NaN
  return _mm512_maskz_scalef_ps(kept, fmadd(two_y * r, q, two_y), y);
}
#endif

template <std::size_t Degree = 6, class Arch>
xsimd::batch<float, Arch> fast_exp2(xsimd::batch<float, Arch> x) {
  using batch = xsimd::batch<float, Arch>;
  using ints = xsimd::batch<std::int32_t, Arch>;
#if defined(__AVX512DQ__)
  if constexpr (std::is_base_of_v<xsimd::avx512dq, Arch> && Degree == 6) return exp2_by_sixteenths(x, 1.0f, -126.5f);
  if constexpr (std::is_base_of_v<xsimd::avx512dq, Arch>) {
    // n and r = x − n side by side, both from x: r is exact, and ±∞ give
    // r = 0, so that 2^−∞ is scalef(1, −∞) = 0 and 2^∞ is ∞. No clamp:
    // past 127.5 the scaling overflows as the exact value does.
    constexpr int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const batch n(_mm512_roundscale_ps(x, nearest));
    const batch r(_mm512_reduce_ps(x, nearest));
    const __mmask16 kept = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.5f), _CMP_NLT_UQ);  // x ≥ −126.5 or NaN
    return _mm512_maskz_scalef_ps(kept, exp2_fraction<Degree>(r), n);
  }
#endif
  // max and min return their second operand when either one is NaN (x86's
  // maxps and minps; NEON's propagate NaN), so NaN passes through the clamp.
  x = xsimd::min(batch(128.0f), xsimd::max(batch(-127.0f), x));
  // Adding 1.5·2²³ rounds to an integer and leaves it in the low mantissa bits.
  const batch shifter(12582912.0f);
  const batch t = x + shifter;
  const batch p = exp2_fraction<Degree>(x - (t - shifter));
  // The bits of 2^n are (n + 127)·2²³; n = −127 gives +0 and n = 128 gives ∞.
  const ints scale = (xsimd::bitwise_cast<ints>(t) << 23) + ints(127 << 23);
  return p * xsimd::bitwise_cast<batch>(scale);
}

template <std::size_t Degree = 6, class Arch, class T>
xsimd::batch<T, Arch> softmax_exp(xsimd::batch<T, Arch> x) {
  if constexpr (std::is_same_v<T, float>) {
#if defined(__AVX512DQ__)
    // x·log2 e inside the fused multiply-adds: one multiply fewer, and no
    // rounding of the product. −87.68 is −126.5·ln 2 (as a float).
    if constexpr (std::is_base_of_v<xsimd::avx512dq, Arch> && Degree == 6)
      return exp2_by_sixteenths(x, 1.44269504088896340736f, -87.6831183f);
#endif
    return fast_exp2<Degree>(x * xsimd::batch<T, Arch>(1.44269504088896340736f));
  } else {
    return xsimd::exp(x);
  }
}

}  // namespace qkv::kernels
