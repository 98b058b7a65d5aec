// Numerically stable row softmax on xsimd batches: subtract the row maximum,
// exponentiate with xsimd::exp, divide by the sum.
#pragma once

#include "arch_traits.hpp"
#include "strided.hpp"

#include <xsimd/xsimd.hpp>

#include <cstddef>
#include <limits>

namespace qkv::kernels {

template <class Arch, class T>
struct softmax_kernel {
  using batch = xsimd::batch<T, Arch>;
  static constexpr std::size_t W = batch::size;

  // Each row of x (col_stride 1) replaced by its softmax, in place; a sink
  // (−∞: none) is one more logit in each denominator.
  static void run(strided<T> x, T sink) {
    if (x.cols == 0) return;  // nothing to write; and no row pointer to form from an empty buffer
    for (std::size_t i = 0; i < x.rows; ++i) row(x.ptr(i, 0), x.cols, sink);
  }

  static void row(T* r, std::size_t n, T sink = -std::numeric_limits<T>::infinity()) {
    constexpr T neg_inf = -std::numeric_limits<T>::infinity();
    const std::size_t body = n - n % W;
    const std::size_t tail = n - body;

    // The tail goes through the same vector code, padded with −∞ (exp → 0).
    alignas(64) T last[W];
    for (std::size_t j = 0; j < W; ++j) last[j] = j < tail ? r[body + j] : neg_inf;

    batch vmax(neg_inf);
    for (std::size_t j = 0; j < body; j += W) vmax = xsimd::max(vmax, batch::load_unaligned(r + j));
    vmax = xsimd::max(vmax, batch::load_aligned(last));
    alignas(64) T lanes[W];
    vmax.store_aligned(lanes);
    T mx = sink;
    for (std::size_t j = 0; j < W; ++j) mx = lanes[j] > mx ? lanes[j] : mx;

    if (mx == neg_inf) {  // every score masked: zeros (a NaN still poisons the row)
      bool nan = false;
      for (std::size_t j = 0; j < n; ++j) nan = nan || r[j] != r[j];
      for (std::size_t j = 0; j < n; ++j) r[j] = nan ? std::numeric_limits<T>::quiet_NaN() : T(0);
      return;
    }

    const batch vm(mx);
    batch sum0(T(0)), sum1(T(0));  // two chains: shorter dependency, smaller rounding error
    std::size_t j = 0;
    for (; j + 2 * W <= body; j += 2 * W) {
      const batch e0 = xsimd::exp(batch::load_unaligned(r + j) - vm);
      const batch e1 = xsimd::exp(batch::load_unaligned(r + j + W) - vm);
      e0.store_unaligned(r + j);
      e1.store_unaligned(r + j + W);
      sum0 += e0;
      sum1 += e1;
    }
    for (; j < body; j += W) {
      const batch e = xsimd::exp(batch::load_unaligned(r + j) - vm);
      e.store_unaligned(r + j);
      sum0 += e;
    }
    const batch elast = xsimd::exp(batch::load_aligned(last) - vm);
    elast.store_aligned(last);
    sum1 += elast;

    const T from_sink = xsimd::exp(batch(sink) - vm).get(0);  // 0 for no sink
    const batch vsum(xsimd::hadd(sum0 + sum1) + from_sink);
    for (j = 0; j < body; j += W) divide(batch::load_unaligned(r + j), vsum).store_unaligned(r + j);
    divide(batch::load_aligned(last), vsum).store_aligned(last);
    for (std::size_t t = 0; t < tail; ++t) r[body + t] = last[t];
  }
};

}  // namespace qkv::kernels
