// Elementwise kernels on xsimd batches: scale, add, subtract, copy. Rows with
// unit column stride are vectorised; other layouts (a transpose) go element
// by element.
#pragma once

#include "arch_traits.hpp"
#include "strided.hpp"

#include <xsimd/xsimd.hpp>

#include <cstddef>
#include <type_traits>

namespace qkv::kernels {

template <class Arch, class T>
struct elementwise_kernel {
  using batch = xsimd::batch<T, Arch>;
  static constexpr std::size_t W = batch::size;

  // x(i, j) = f(x(i, j), y(i, j)) for batches and for scalars alike.
  template <class F>
  static void apply(strided<T> x, strided<const T> y, F f) {
    for (std::size_t i = 0; i < x.rows; ++i) {
      T* xr = x.ptr(i, 0);
      std::size_t j = 0;
      if (y.col_stride == 1 && x.col_stride == 1) {
        const T* yr = y.ptr(i, 0);
        for (; j + W <= x.cols; j += W) f(batch::load_unaligned(xr + j), batch::load_unaligned(yr + j)).store_unaligned(xr + j);
      }
      for (; j < x.cols; ++j) x(i, j) = f(x(i, j), y(i, j));
    }
  }

  static void multiply(strided<T> x, T s) {
    apply(x, x.as_const(), [s](auto v, auto) { return v * s; });
  }
  static void divide(strided<T> x, T s) {
    apply(x, x.as_const(), [s](auto v, auto) {
      if constexpr (std::is_same_v<decltype(v), batch>) {
        return kernels::divide(v, batch(s));
      } else {
        return v / s;
      }
    });
  }
  static void add(strided<T> x, strided<const T> y) {
    apply(x, y, [](auto a, auto b) { return a + b; });
  }
  static void subtract(strided<T> x, strided<const T> y) {
    apply(x, y, [](auto a, auto b) { return a - b; });
  }
  static void copy(strided<const T> src, strided<T> dst) {
    apply(dst, src, [](auto, auto b) { return b; });
  }
};

}  // namespace qkv::kernels
