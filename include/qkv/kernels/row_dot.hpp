// Σ_c a_c·b_c over a row: the decode's scores (a query against a key, the
// key possibly 2-byte) and the backward's D_i = dO_i·O_i. Two vectors of
// sums where both rows have unit stride, the rest a vector at a time,
// zero-padded.
#pragma once

#include "load_float.hpp"

#include <xsimd/xsimd.hpp>

#include <cstddef>
#include <type_traits>

namespace qkv::kernels {

// batch::size values from p, as T (a 2-byte S converted to float).
template <class Arch, class T, class S>
xsimd::batch<T, Arch> load_as(const S* p) {
  if constexpr (std::is_same_v<S, T>) return xsimd::batch<T, Arch>::load_unaligned(p);
  else return load_float<Arch>(p);
}

// Up to batch::size values from p, `stride` apart, as T, zero-padded: the
// tail of a row, computed by the vectors' own operations so that every
// element type computes it alike (a scalar tail is contracted into fused
// multiply-adds, or not, as the compiler sees the conversion, and then a
// float query over a bf16 key differs from the same values in float).
template <class Arch, class T, class S>
xsimd::batch<T, Arch> load_tail(const S* p, std::ptrdiff_t stride, std::size_t count) {
  alignas(64) T t[xsimd::batch<T, Arch>::size] = {};
  for (std::size_t k = 0; k < count; ++k) t[k] = static_cast<T>(p[static_cast<std::ptrdiff_t>(k) * stride]);
  return xsimd::batch<T, Arch>::load_aligned(t);
}

template <class Arch, class T, class S>
T row_dot(const T* a, std::ptrdiff_t as, const S* b, std::ptrdiff_t bs, std::size_t d) {
  using batch = xsimd::batch<T, Arch>;
  constexpr std::size_t W = batch::size;
  std::size_t c = 0;
  batch acc0(T(0)), acc1(T(0));
  if (as == 1 && bs == 1) {
    for (; c + 2 * W <= d; c += 2 * W) {
      acc0 = fmadd(batch::load_unaligned(a + c), load_as<Arch, T>(b + c), acc0);
      acc1 = fmadd(batch::load_unaligned(a + c + W), load_as<Arch, T>(b + c + W), acc1);
    }
    for (; c + W <= d; c += W) acc0 = fmadd(batch::load_unaligned(a + c), load_as<Arch, T>(b + c), acc0);
  }
  for (; c < d; c += W) {
    const std::size_t k = d - c < W ? d - c : W;
    acc1 = fmadd(load_tail<Arch, T>(a + static_cast<std::ptrdiff_t>(c) * as, as, k),
                 load_tail<Arch, T>(b + static_cast<std::ptrdiff_t>(c) * bs, bs, k), acc1);
  }
  return xsimd::hadd(acc0 + acc1);
}

}  // namespace qkv::kernels
