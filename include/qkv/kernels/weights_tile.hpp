// The score tile turned into weights while it is still in registers. Once a
// row has seen a key block its running maximum m is known, and the next
// blocks' weights e^(a·u − m) need no pass of their own over the scores:
// the tile exponentiates its accumulators, stores weights instead of
// scores, and sums them: no load or store of a score, and the
// exponential's additions and permutes may run beside the next tile's
// products on pipes those leave idle (docs/performance.md: what that gave).
//
// A weight may exceed 1 when a score passes m; online_softmax::adopt then
// brings m up to the block's maximum and scales the weights down, and past
// m + stale_limit (or where the maximum is not finite) the caller computes
// the block's scores again and takes the usual path.
#pragma once

#include "arch_traits.hpp"
#include "online_softmax.hpp"
#include "register_tile.hpp"

#include <xsimd/xsimd.hpp>

#include <cstddef>

namespace qkv::kernels {

template <class Arch, class T>
struct weights_tile {
  using tile = register_tile<Arch, T>;
  using batch = typename tile::batch;
  using softmax = online_softmax<Arch, T>;
  static constexpr std::size_t W = tile::W, MR = tile::MR, NR = tile::NR;
  // A tile row's two vectors are the pairs exponentiate sums: its bits.
  static_assert(NR == 2 * W, "qkv: internal: the weights tile sums pairs of vectors");

  // How far past m a score may be and its weight still be taken: e^64 and
  // a block's sum of them are far from float's overflow.
  static constexpr T stale_limit = T(64);

  // For the tile's scores u = A·B (rows read as plain rows): c = e^(a·u − m_r)
  // for row r (minus_m[r] = −m_r), sums[2r·W, (2r + 1)·W) and
  // sums[(2r + 1)·W, (2r + 2)·W) raised by the weights of its first and
  // second W columns (the pairs online_softmax::exponentiate sums in the same
  // order), and maxima raised lane-wise by u as run_keeping_max does.
  // Never inlined, as the tile's other loops are not.
  [[gnu::noinline]] static void run(std::size_t kc, const T* const* a, const T* b, T* c, std::ptrdiff_t ldc, T scale,
                                    const T* minus_m, T* sums, T* maxima) {
    batch lo[MR], hi[MR];
    tile::template product<1>(kc, a, b, lo, hi);
    tile::raise_maxima(lo, hi, maxima);
    const batch va(scale);
#pragma GCC unroll 8
    for (std::size_t r = 0; r < MR; ++r) {
      const batch vm(minus_m[r]);
      const batch e0 = softmax::exp(fmadd(va, lo[r], vm));
      const batch e1 = softmax::exp(fmadd(va, hi[r], vm));
      T* cr = c + static_cast<std::ptrdiff_t>(r) * ldc;
      e0.store_aligned(cr);
      e1.store_aligned(cr + W);
      (batch::load_aligned(sums + 2 * r * W) + e0).store_aligned(sums + 2 * r * W);
      (batch::load_aligned(sums + (2 * r + 1) * W) + e1).store_aligned(sums + (2 * r + 1) * W);
    }
  }
};

}  // namespace qkv::kernels
