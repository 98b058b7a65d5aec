// Matrices stored as bf16 or f16 read into float (exactly): the operands that
// the attention kernels do not read as stored (the queries, a 2-byte operand
// of a product) are widened once before they run. A vector at a time along
// rows of unit column stride, by load_float's conversions (F16C on x86, the
// NEON conversions, a shift for bf16); one by one elsewhere.
#pragma once

#include "load_float.hpp"
#include "strided.hpp"

#include <xsimd/xsimd.hpp>

#include <cstddef>

namespace qkv::kernels {

template <class Arch>
struct widen_kernel {
  template <class S>
  static void run(strided<const S> src, strided<float> dst) {
    constexpr std::size_t W = xsimd::batch<float, Arch>::size;
    for (std::size_t i = 0; i < src.rows; ++i) {
      std::size_t j = 0;
      if (src.col_stride == 1 && dst.col_stride == 1) {
        const S* s = src.ptr(i, 0);
        float* d = dst.ptr(i, 0);
        for (; j + W <= src.cols; j += W) load_float<Arch>(s + j).store_unaligned(d + j);
      }
      for (; j < src.cols; ++j) dst(i, j) = static_cast<float>(src(i, j));
    }
  }
};

}  // namespace qkv::kernels
