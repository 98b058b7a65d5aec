// A W×W block of floats transposed in registers: r[i] holds row i before and
// column i after. It packs K's rows into the columns of the register tile's
// panels, a vector at a time instead of one value at a time (at T = 256 the
// scalar packing was 5–7% of an attention call), and turns a tile of dS
// into dSᵀ for a similarity term's dQ. xsimd 8.1's zip_lo and zip_hi
// interleave within 128-bit lanes on AVX and AVX-512, so the shuffles are
// each set's own; a set without them (transposes<Arch, T> false) moves
// value by value.
#pragma once

#include <xsimd/xsimd.hpp>

#include <cstddef>
#include <type_traits>

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace qkv::kernels {

template <class Arch, class T>
inline constexpr bool transposes = std::is_same_v<T, float> && (
#if defined(__AVX512F__)
    std::is_base_of_v<xsimd::avx512f, Arch> ||
#endif
#if defined(__AVX__)
    std::is_base_of_v<xsimd::avx, Arch> ||
#endif
    false);

// Always inlined: called, its 16 registers went through memory both ways
// (packing K at m = 1024 took 9.8 µs instead of 6.5 at d = 64, 24 instead
// of 12.5 at d = 128, on Zen 5). Its loops are unrolled by pragma, not left
// to -O3: at -O2 g++ kept them, and the arrays went through the stack
// (K's packing took twice as long at m = 256).
template <class Arch, class T>
[[gnu::always_inline]] inline void transpose_square(xsimd::batch<T, Arch>* r) {
  static_assert(transposes<Arch, T>, "qkv: internal: no register transpose for this set and type");
#if defined(__AVX512F__)
  if constexpr (transposes<Arch, T> && std::is_base_of_v<xsimd::avx512f, Arch>) {
    // Pairs of rows interleaved by 32 bits, then by 64, then 128-bit lanes
    // gathered across registers twice: 64 shuffles for 256 values.
    auto pd = [](__m512 x) { return _mm512_castps_pd(x); };
    auto ps = [](__m512d x) { return _mm512_castpd_ps(x); };
    __m512 a[16], b[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) a[i] = r[i];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      b[2 * i] = _mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]);
      b[2 * i + 1] = _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      a[4 * i] = ps(_mm512_unpacklo_pd(pd(b[4 * i]), pd(b[4 * i + 2])));
      a[4 * i + 1] = ps(_mm512_unpackhi_pd(pd(b[4 * i]), pd(b[4 * i + 2])));
      a[4 * i + 2] = ps(_mm512_unpacklo_pd(pd(b[4 * i + 1]), pd(b[4 * i + 3])));
      a[4 * i + 3] = ps(_mm512_unpackhi_pd(pd(b[4 * i + 1]), pd(b[4 * i + 3])));
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i)
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        b[8 * i + c] = _mm512_shuffle_f32x4(a[8 * i + c], a[8 * i + 4 + c], 0x88);
        b[8 * i + 4 + c] = _mm512_shuffle_f32x4(a[8 * i + c], a[8 * i + 4 + c], 0xdd);
      }
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      r[c] = _mm512_shuffle_f32x4(b[c], b[8 + c], 0x88);
      r[8 + c] = _mm512_shuffle_f32x4(b[c], b[8 + c], 0xdd);
    }
  }
#endif
#if defined(__AVX__)
  if constexpr (transposes<Arch, T> && std::is_base_of_v<xsimd::avx, Arch>) {
    // Rows interleaved by 32 bits, then by 64 within each 128-bit lane,
    // then the lanes exchanged: 24 shuffles for 64 values.
    __m256 a[8], b[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      a[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      a[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i) {
      b[4 * i] = _mm256_shuffle_ps(a[4 * i], a[4 * i + 2], 0x44);
      b[4 * i + 1] = _mm256_shuffle_ps(a[4 * i], a[4 * i + 2], 0xee);
      b[4 * i + 2] = _mm256_shuffle_ps(a[4 * i + 1], a[4 * i + 3], 0x44);
      b[4 * i + 3] = _mm256_shuffle_ps(a[4 * i + 1], a[4 * i + 3], 0xee);
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      r[c] = _mm256_permute2f128_ps(b[c], b[4 + c], 0x20);
      r[4 + c] = _mm256_permute2f128_ps(b[c], b[4 + c], 0x31);
    }
  }
#endif
  (void)r;
}

// dst[c·ldd + r] = src[r·lds + c] for r < rows, c < cols (rows of unit
// stride both): W×W blocks in registers where the set has a transpose,
// value by value at the edges and on other sets. The backward turns Q and
// dO into rows of Qᵀ and dOᵀ with it, and its transposed sums back: one
// value at a time, T = 256 spent a tenth of its time there.
template <class Arch, class T>
void transpose_matrix(const T* src, std::size_t lds, std::size_t rows, std::size_t cols, T* dst, std::size_t ldd) {
  std::size_t r0 = 0, c0 = 0;  // [0, r0) × [0, c0) by blocks
  if constexpr (transposes<Arch, T>) {
    using batch = xsimd::batch<T, Arch>;
    constexpr std::size_t W = batch::size;
    r0 = rows / W * W, c0 = cols / W * W;
    for (std::size_t r = 0; r < r0; r += W)
      for (std::size_t c = 0; c < c0; c += W) {
        batch x[W];
#pragma GCC unroll 16
        for (std::size_t i = 0; i < W; ++i) x[i] = batch::load_unaligned(src + (r + i) * lds + c);
        transpose_square<Arch, T>(x);
#pragma GCC unroll 16
        for (std::size_t i = 0; i < W; ++i) x[i].store_unaligned(dst + (c + i) * ldd + r);
      }
  }
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = r < r0 ? c0 : 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}

}  // namespace qkv::kernels
