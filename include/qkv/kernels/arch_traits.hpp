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

}  // namespace qkv::kernels
