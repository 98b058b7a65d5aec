// Scores of a similarity of the user's on the register tile: an MR×NR tile
// of Σ_c term(q_c, k_c), the tile's loop with the user's term in place of
// the fused multiply-add. K is packed as for the dot product.
#pragma once

#include "register_tile.hpp"

#include <xsimd/xsimd.hpp>

#include <cstddef>

namespace qkv::kernels {

template <class Arch, class T, class Ext>
struct term_tile {
  using tile = register_tile<Arch, T>;
  using batch = typename tile::batch;
  static constexpr std::size_t W = tile::W, MR = tile::MR, NR = tile::NR;

  // c[0:MR, 0:nr] = the scores of rows a[0..MR) against the NR packed keys b.
  // Flattened: the user's term, and what it calls (xsimd's tanh, say), is
  // compiled into the loop whatever g++'s inlining budget for the caller
  // has left; called out of line it cost 14% of an additive similarity.
  [[gnu::flatten]] static void run(const Ext& ext, std::size_t dk, const T* const* a, const T* b, T* c, std::ptrdiff_t ldc,
                  std::size_t nr) {
    batch lo[MR], hi[MR];
    for (std::size_t r = 0; r < MR; ++r) lo[r] = hi[r] = batch(T(0));
    for (std::size_t p = 0; p < dk; ++p) {
      const batch b0 = batch::load_aligned(b), b1 = batch::load_aligned(b + W);
      for (std::size_t r = 0; r < MR; ++r) {
        const batch ar(a[r][p]);
        lo[r] = lo[r] + batch(ext.term(ar, b0, p));
        hi[r] = hi[r] + batch(ext.term(ar, b1, p));
      }
      b += NR;
    }
    alignas(64) T t[NR];
    for (std::size_t r = 0; r < MR; ++r) {
      T* cr = c + static_cast<std::ptrdiff_t>(r) * ldc;
      if (nr == NR) {
        lo[r].store_unaligned(cr);
        hi[r].store_unaligned(cr + W);
      } else {
        lo[r].store_aligned(t);
        hi[r].store_aligned(t + W);
        for (std::size_t j = 0; j < nr; ++j) cr[j] = t[j];
      }
    }
  }
};

}  // namespace qkv::kernels
