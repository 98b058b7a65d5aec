// The instruction sets the compiled kernels exist for, best first, as one
// list: each with its xsimd architecture, its one name (what QKV_ARCH and
// set_arch take and active_arch returns), whether this build has its kernels
// and whether this CPU runs them. src/dispatch.cpp picks from it,
// src/arch_*.cpp build their kernels from it, and runs_like_library compares
// a unit's architecture with it.
#pragma once

#include <xsimd/xsimd.hpp>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <array>
#include <cstddef>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

namespace qkv::kernels {

// The CPU family this is compiled for: a build has the kernels of its family
// only (cmake/QkvArchitectures.cmake).
#if defined(__x86_64__) || defined(_M_X64)
inline constexpr bool x86_64_build = true;
#else
inline constexpr bool x86_64_build = false;
#endif
#if defined(__aarch64__)
inline constexpr bool aarch64_build = true;
#else
inline constexpr bool aarch64_build = false;
#endif

// runs_here() asks the compiler's __builtin_cpu_supports, not
// xsimd::available_architectures(): xsimd 8.1 reads SSE2 from the XSAVE bit
// and AVX from the wrong CPUID leaf, and checks no OS support, so it finds no
// SSE2 on a Nehalem. The compiler's check reads the right bits and the
// OS-enabled register state (XGETBV).
struct isa_sse2 {
  using arch = xsimd::sse2;
  static constexpr std::string_view name = "sse2";
  static constexpr bool built = x86_64_build;
  static bool runs_here() noexcept { return built; }  // part of x86-64
};

struct isa_avx2 {
  using arch = xsimd::fma3<xsimd::avx2>;
  static constexpr std::string_view name = "avx2";
  static constexpr bool built = x86_64_build;
  static bool runs_here() noexcept {
#if defined(__x86_64__)
    __builtin_cpu_init();
    // F16C: the f16 conversions of the 2-byte kernels (every AVX2 CPU has it).
    // Read from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports
    // does not know "f16c".
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
    return false;
#endif
  }
};

struct isa_avx512bw {
  using arch = xsimd::avx512bw;
  static constexpr std::string_view name = "avx512bw";
  static constexpr bool built = x86_64_build;
  static bool runs_here() noexcept {
#if defined(__x86_64__)
    return isa_avx2::runs_here() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
#else
    return false;
#endif
  }
};

// AVX-512 with AVX512-BF16 (Cooper Lake, Sapphire Rapids, Zen 4 and 5):
// the AVX-512 kernels, and products of bf16 pairs for bf16 K and V
// (attention_prefill_bf16.hpp). xsimd has no architecture of its own for it.
struct isa_avx512bf16 {
  using arch = xsimd::avx512bw;
  static constexpr std::string_view name = "avx512bf16";
  static constexpr bool built = x86_64_build;
  static bool runs_here() noexcept {
#if defined(__x86_64__)
    return isa_avx512bw::runs_here() && __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
  }
};

struct isa_neon64 {
  using arch = xsimd::neon64;
  static constexpr std::string_view name = "neon64";
  static constexpr bool built = aarch64_build;
  static bool runs_here() noexcept { return built; }  // part of AArch64
};

// Best first: with no name given, the first one this CPU runs is picked.
using arch_list = std::tuple<isa_avx512bf16, isa_avx512bw, isa_avx2, isa_sse2, isa_neon64>;
inline constexpr std::size_t arch_count = std::tuple_size_v<arch_list>;

// The index of the first instruction set whose descriptor satisfies
// pred(std::type_identity<Isa>{}); arch_count if none does.
template <class Pred>
constexpr std::size_t find_arch(Pred pred) {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    std::size_t found = arch_count;
    (void)((pred(std::type_identity<std::tuple_element_t<I, arch_list>>{}) ? (found = I, true) : false) || ...);
    return found;
  }(std::make_index_sequence<arch_count>{});
}

// The index of the instruction set named `name`; arch_count for a name not in the list.
constexpr std::size_t arch_index(std::string_view name) {
  return find_arch([name](auto isa) { return decltype(isa)::type::name == name; });
}

// The index of the first instruction set whose xsimd architecture is Arch;
// arch_count if none is. (avx512bf16 and avx512bw share one.)
template <class Arch>
inline constexpr std::size_t arch_index_of =
    find_arch([](auto isa) { return std::is_same_v<typename decltype(isa)::type::arch, Arch>; });

// The widest instruction set this build has kernels for (the first built).
inline constexpr std::size_t widest_built_arch = find_arch([](auto isa) { return decltype(isa)::type::built; });
using widest_built_arch_t = typename std::tuple_element_t<widest_built_arch, arch_list>::arch;

// The names, in the order of the list.
inline constexpr std::array<std::string_view, arch_count> arch_names =
    []<std::size_t... I>(std::index_sequence<I...>) {
      return std::array<std::string_view, arch_count>{std::tuple_element_t<I, arch_list>::name...};
    }(std::make_index_sequence<arch_count>{});

// Whether instruction set i's xsimd architecture is Arch.
template <class Arch>
constexpr bool arch_is(std::size_t i) {
  std::size_t j = 0;
  return find_arch([&](auto isa) { return j++ == i && std::is_same_v<typename decltype(isa)::type::arch, Arch>; }) !=
         arch_count;
}

// Whether this build has the kernels of instruction set i and this CPU runs them.
inline bool arch_runs_here(std::size_t i) noexcept {
  std::size_t j = 0;
  return find_arch([&](auto isa) {
           using isa_t = typename decltype(isa)::type;
           return j++ == i && isa_t::built && isa_t::runs_here();
         }) != arch_count;
}

}  // namespace qkv::kernels
