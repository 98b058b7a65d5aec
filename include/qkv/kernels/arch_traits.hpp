// What the kernels need to know of an instruction set beyond its vector width.
#pragma once

#include <xsimd/xsimd.hpp>

#include <cstddef>
#include <type_traits>

namespace qkv::kernels {

template <class Arch>
struct arch_traits {
  // AVX-512 and AArch64 have 32 vector registers, the others 16.
#if XSIMD_WITH_NEON64
  static constexpr bool is_neon64 = std::is_base_of_v<xsimd::neon64, Arch>;
#else
  static constexpr bool is_neon64 = false;
#endif
  static constexpr bool is_avx512 = std::is_base_of_v<xsimd::avx512f, Arch>;
  static constexpr std::size_t vector_registers = is_avx512 || is_neon64 ? 32 : 16;
  // Whether a fused multiply-add is one instruction.
  static constexpr bool has_fma =
      is_avx512 || is_neon64 || std::is_base_of_v<xsimd::fma3<xsimd::avx2>, Arch>;
};

// a·b + c and a·b − c, rounded once. xsimd 8.1 has no fused multiply-add
// for AVX-512: its xsimd::fma there is a·b + c, one instruction only where
// the compiler contracts it (optimised builds, -ffp-contract=fast), so an
// unoptimised build (the sanitizers') would round twice, outside the bounds
// the tests hold the kernels to. The intrinsics make it one rounding at any
// flags.
template <class Arch, class T>
xsimd::batch<T, Arch> fmadd(const xsimd::batch<T, Arch>& a, const xsimd::batch<T, Arch>& b,
                            const xsimd::batch<T, Arch>& c) noexcept {
#if defined(__AVX512F__)
  if constexpr (std::is_base_of_v<xsimd::avx512f, Arch> && std::is_same_v<T, float>) return _mm512_fmadd_ps(a, b, c);
  if constexpr (std::is_base_of_v<xsimd::avx512f, Arch> && std::is_same_v<T, double>) return _mm512_fmadd_pd(a, b, c);
#endif
  return xsimd::fma(a, b, c);
}

template <class Arch, class T>
xsimd::batch<T, Arch> fmsub(const xsimd::batch<T, Arch>& a, const xsimd::batch<T, Arch>& b,
                            const xsimd::batch<T, Arch>& c) noexcept {
#if defined(__AVX512F__)
  if constexpr (std::is_base_of_v<xsimd::avx512f, Arch> && std::is_same_v<T, float>) return _mm512_fmsub_ps(a, b, c);
  if constexpr (std::is_base_of_v<xsimd::avx512f, Arch> && std::is_same_v<T, double>) return _mm512_fmsub_pd(a, b, c);
#endif
  return xsimd::fms(a, b, c);
}

// a / b, correctly rounded. xsimd 8.1 divides floats on AArch64 with the
// ARMv7 reciprocal estimate and two Newton steps (off by an ulp or two);
// AArch64 has an exact vector division.
template <class Arch, class T>
xsimd::batch<T, Arch> divide(const xsimd::batch<T, Arch>& a, const xsimd::batch<T, Arch>& b) noexcept {
#if XSIMD_WITH_NEON64
  if constexpr (std::is_same_v<T, float> && std::is_base_of_v<xsimd::neon64, Arch>) {
    return vdivq_f32(a, b);
  }
#endif
  return a / b;
}

}  // namespace qkv::kernels
