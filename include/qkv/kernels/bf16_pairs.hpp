// Products of bf16 pairs: a 32-bit lane holds two bf16 values, element 2i in
// its low half and 2i + 1 in its high half (the layout of a bf16 row read as
// 32-bit words), and dot(acc, a, b) adds to each float lane of acc the
// products of its two pairs. AVX512-BF16's vdpbf16ps does this in one
// instruction, twice the multiply-adds of a float FMA; its definition (Intel
// SDM) is acc += a.hi·b.hi, then acc += a.lo·b.lo, each product of two bf16
// exact in float, each sum rounded to nearest even, subnormal inputs and
// results flushed to zero.
//
// bf16_pairs_emulated computes the same sums with two float FMAs (keeping
// subnormals) on any instruction set: it lets the kernel built on pairs run,
// and be tested, where the instruction is missing. bf16_pairs_avx512 is the
// instruction; it compiles only with -mavx512bf16 (src/arch_avx512bf16.cpp).
#pragma once

#include "../numeric/float16.hpp"
#include "arch_traits.hpp"

#include <xsimd/xsimd.hpp>

#include <cstddef>
#include <cstdint>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace qkv::kernels {

template <class Arch>
struct bf16_pairs_emulated {
  using arch = Arch;
  using batch = xsimd::batch<float, Arch>;
  using words = xsimd::batch<std::uint32_t, Arch>;

  static batch low(words x) { return xsimd::bitwise_cast<batch>(x << 16); }
  static batch high(words x) { return xsimd::bitwise_cast<batch>(x & words(0xffff0000u)); }

  static batch dot(batch acc, words a, words b) {
    acc = fmadd(high(a), high(b), acc);
    return fmadd(low(a), low(b), acc);
  }

  // The 2W floats x[0, 2W) rounded to bf16 (nearest even; NaN stays NaN) as
  // W words, x[2i] and x[2i + 1] in word i.
  static void round_pairs(const float* x, std::uint32_t* out) {
    round_pairs(batch::load_unaligned(x), batch::load_unaligned(x + batch::size), out);
  }
  static void round_pairs(batch x0, batch x1, std::uint32_t* out) {
    alignas(64) std::uint32_t r[2 * batch::size];
    for (std::size_t h = 0; h < 2; ++h) {
      const words u = xsimd::bitwise_cast<words>(h == 0 ? x0 : x1);
      const words nearest = (u + words(0x7fffu) + ((u >> 16) & words(1u))) >> 16;
      const words quiet = (u >> 16) | words(0x40u);
      const auto is_nan = (u & words(0x7fffffffu)) > words(0x7f800000u);
      xsimd::select(is_nan, quiet, nearest).store_aligned(r + h * batch::size);
    }
    for (std::size_t i = 0; i < batch::size; ++i) out[i] = r[2 * i] | (r[2 * i + 1] << 16);
  }

  // Two rows of 2W values as 2W words, a[x] in the low half of word x and
  // b[x] in its high half: a panel's pairs of value rows.
  static void interleave(const bf16* a, const bf16* b, std::uint32_t* out) {
    for (std::size_t x = 0; x < 2 * batch::size; ++x) out[x] = a[x].bits() | (std::uint32_t(b[x].bits()) << 16);
  }
};

#if defined(__AVX512BF16__)
struct bf16_pairs_avx512 {
  using arch = xsimd::avx512bw;
  using batch = xsimd::batch<float, arch>;
  using words = xsimd::batch<std::uint32_t, arch>;

  static batch dot(batch acc, words a, words b) {
    return _mm512_dpbf16_ps(acc, (__m512bh) static_cast<__m512i>(a),
                            (__m512bh) static_cast<__m512i>(b));
  }

  // vcvtne2ps2bf16 rounds to nearest even and keeps NaN a NaN; its first
  // operand gives the high half of the result.
  static void round_pairs(const float* x, std::uint32_t* out) {
    round_pairs(batch::load_unaligned(x), batch::load_unaligned(x + 16), out);
  }
  static void round_pairs(batch x0, batch x1, std::uint32_t* out) {
    _mm512_storeu_si512(out, (__m512i) _mm512_cvtne2ps_pbh(x1, x0));
  }

  static void interleave(const bf16* a, const bf16* b, std::uint32_t* out) {
    for (int h = 0; h < 2; ++h) {
      const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 16 * h)));
      const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 * h)));
      _mm512_storeu_si512(out + 16 * h, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
};
#endif

}  // namespace qkv::kernels
