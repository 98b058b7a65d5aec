// A vector of floats from storage of float, bf16 or f16: how the attention
// kernel reads K and V in their 2-byte storage, converting as it packs or
// streams them. xsimd 8.1 has no 16-bit float batches, so the conversions
// are each instruction set's own: a bf16 is the top half of a float (widen
// and shift), an f16 goes through F16C on x86 and the NEON conversion on
// AArch64. Every conversion is exact; where a set has none (f16 on SSE2) the
// values are converted one by one.
#pragma once

#include "../numeric/float16.hpp"

#include <xsimd/xsimd.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace qkv::kernels {

// Element types K and V may be stored in for a float kernel.
template <class S>
inline constexpr bool float_storage = std::is_same_v<S, float> || std::is_same_v<S, bf16> || std::is_same_v<S, f16>;

namespace load_detail {

template <class Arch, class S>
xsimd::batch<float, Arch> one_by_one(const S* p) {
  using batch = xsimd::batch<float, Arch>;
  alignas(64) float x[batch::size];
  for (std::size_t c = 0; c < batch::size; ++c) x[c] = static_cast<float>(p[c]);
  return batch::load_aligned(x);
}

}  // namespace load_detail

// batch::size values from p (any alignment), as floats.
template <class Arch, class S>
xsimd::batch<float, Arch> load_float(const S* p) {
  using batch = xsimd::batch<float, Arch>;
  static_assert(float_storage<S>, "qkv: internal: load_float reads float, bf16 or f16");
  if constexpr (std::is_same_v<S, float>) {
    return batch::load_unaligned(p);
  } else {
    [[maybe_unused]] const void* raw = p;
#if defined(__AVX512F__)
    if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) {
      const __m256i h = _mm256_loadu_si256(static_cast<const __m256i*>(raw));
      if constexpr (std::is_same_v<S, bf16>) return batch(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
      else return batch(_mm512_cvtph_ps(h));
    }
#endif
#if defined(__AVX2__)
    if constexpr (std::is_base_of_v<xsimd::avx2, Arch>) {
      const __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(raw));
      if constexpr (std::is_same_v<S, bf16>) {
        return batch(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
      } else {
#if defined(__F16C__)
        return batch(_mm256_cvtph_ps(h));
#endif
      }
    }
#endif
#if defined(__SSE2__)
    if constexpr (std::is_same_v<Arch, xsimd::sse2> && std::is_same_v<S, bf16>) {
      const __m128i h = _mm_loadl_epi64(static_cast<const __m128i*>(raw));
      return batch(_mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h)));  // each bf16 above 16 zero bits
    }
#endif
#if defined(__aarch64__)
    if constexpr (std::is_base_of_v<xsimd::neon64, Arch>) {
      const uint16x4_t h = vld1_u16(static_cast<const std::uint16_t*>(raw));
      if constexpr (std::is_same_v<S, bf16>) return batch(vreinterpretq_f32_u32(vshll_n_u16(h, 16)));
      else return batch(vcvt_f32_f16(vreinterpret_f16_u16(h)));
    }
#endif
    return load_detail::one_by_one<Arch>(p);
  }
}

}  // namespace qkv::kernels
