// A W×W block of floats transposed in registers: r[i] holds row i before and
// column i after. It packs K's rows into the columns of the register tile's
// panels, a vector at a time instead of one value at a time (at T = 256 the
// scalar packing was 5–7% of an attention call). xsimd 8.1's zip_lo and
// zip_hi interleave within 128-bit lanes on AVX and AVX-512, so the shuffles
// are each set's own; a set without them (transposes<Arch, T> false) packs
// value by value.
#pragma once

#include <xsimd/xsimd.hpp>

#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace qkv::kernels {

template <class Arch, class T>
inline constexpr bool transposes =
#if defined(__AVX512F__)
    std::is_base_of_v<xsimd::avx512f, Arch> && std::is_same_v<T, float>;
#else
    false;
#endif

template <class Arch, class T>
void transpose_square(xsimd::batch<T, Arch>* r) {
  static_assert(transposes<Arch, T>, "qkv: internal: no register transpose for this set and type");
#if defined(__AVX512F__)
  if constexpr (transposes<Arch, T>) {
    // Pairs of rows interleaved by 32 bits, then by 64, then 128-bit lanes
    // gathered across registers twice: 64 shuffles for 256 values.
    auto pd = [](__m512 x) { return _mm512_castps_pd(x); };
    auto ps = [](__m512d x) { return _mm512_castpd_ps(x); };
    __m512 a[16], b[16];
    for (int i = 0; i < 16; ++i) a[i] = r[i];
    for (int i = 0; i < 8; ++i) {
      b[2 * i] = _mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]);
      b[2 * i + 1] = _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
      a[4 * i] = ps(_mm512_unpacklo_pd(pd(b[4 * i]), pd(b[4 * i + 2])));
      a[4 * i + 1] = ps(_mm512_unpackhi_pd(pd(b[4 * i]), pd(b[4 * i + 2])));
      a[4 * i + 2] = ps(_mm512_unpacklo_pd(pd(b[4 * i + 1]), pd(b[4 * i + 3])));
      a[4 * i + 3] = ps(_mm512_unpackhi_pd(pd(b[4 * i + 1]), pd(b[4 * i + 3])));
    }
    for (int i = 0; i < 2; ++i)
      for (int c = 0; c < 4; ++c) {
        b[8 * i + c] = _mm512_shuffle_f32x4(a[8 * i + c], a[8 * i + 4 + c], 0x88);
        b[8 * i + 4 + c] = _mm512_shuffle_f32x4(a[8 * i + c], a[8 * i + 4 + c], 0xdd);
      }
    for (int c = 0; c < 8; ++c) {
      r[c] = _mm512_shuffle_f32x4(b[c], b[8 + c], 0x88);
      r[8 + c] = _mm512_shuffle_f32x4(b[c], b[8 + c], 0xdd);
    }
  }
#else
  (void)r;
#endif
}

}  // namespace qkv::kernels
