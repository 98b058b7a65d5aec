// The fused attention for many queries, in the FlashAttention-2 loop order:
// an outer loop over blocks of BR queries, an inner loop over blocks of BC
// keys. Per key block the BR×BC scores are computed on the register tile
// into a small buffer, turned into weights in place by the online softmax,
// and multiplied into an unnormalised BR×dv output that is divided by the
// row sums once at the end. No n×m buffer exists.
//
// K and V are packed once per call (O(m·d) extra memory, read by every query
// block), converted to T there when they are stored as bf16 or f16; Q and
// the weights are read in place through row pointers. Key blocks past the
// causal diagonal, outside a window, or emptied by the masks, are skipped.
//
// A key a row may not see has weight exactly 0, and its value row must not
// reach that row's output even when it holds NaN or ±∞ (a padded key/value
// cache): 0·NaN is NaN. Packing notes which value rows are not finite; a key
// block holding one multiplies weights by values skipping zero weights.
// On the causal diagonal each strip of MR rows stops at the keys its last
// row sees.
#pragma once

#include "arch_traits.hpp"
#include "attention_problem.hpp"
#include "blocking.hpp"
#include "online_softmax.hpp"
#include "prefill_loop.hpp"
#include "register_tile.hpp"
#include "score_transform.hpp"
#include "term_tile.hpp"
#include "weights_tile.hpp"

#include <xsimd/xsimd.hpp>

#include <cmath>
#include <cstddef>

namespace qkv::kernels {

template <class Arch, class T, class Ext, blocking B>
struct attention_prefill {
  using tile = register_tile<Arch, T>;
  using batch = typename tile::batch;
  using scores = score_transform<Arch, T, Ext>;
  using softmax = online_softmax<Arch, T>;
  static constexpr std::size_t W = tile::W, MR = tile::MR, NR = tile::NR;
  static constexpr std::size_t BR = B.query_rows, BC = B.max_key_block;
  static_assert(B.valid() && B.lanes == W && B.tile_rows == MR, "qkv: internal: blocking of another instruction set");

  static constexpr std::size_t min(std::size_t a, std::size_t b) { return a < b ? a : b; }
  static constexpr std::size_t aligned(std::size_t elements) { return B.aligned(elements); }

  // K and V as the tiles read them, converted to T where they are stored
  // otherwise (S: bf16 or f16).
  template <class S>
  static void pack(const attention_problem<T, S>& p, T* shared) {
    const std::size_t m = p.k.rows, dk = p.q.cols, dv = p.v.cols;
    T* vp = shared + B.packed_k_size(m, dk);
    tile::pack_transposed(p.k.data, p.k.row_stride, p.k.col_stride, m, dk, shared);
    tile::pack(p.v.data, p.v.row_stride, p.v.col_stride, m, dv, vp);
    // x·0 is 0 for finite x and NaN for ±∞ and NaN.
    T* flags = vp + B.packed_v_size(m, dv);
    const std::size_t dvp = blocking::round_up(dv, NR);
    for (std::size_t j = 0; j < m; ++j) {
      batch probe(T(0));
      for (std::size_t c = 0; c < dvp; c += NR) {
        const T* v = vp + c * m + j * NR;
        probe += batch::load_aligned(v) * T(0) + batch::load_aligned(v + W) * T(0);
      }
      flags[j] = xsimd::any(xsimd::isnan(probe)) ? T(1) : T(0);  // (not probe != probe: ordered on AVX in xsimd 8.1)
    }
  }

  // Query block b (rows [b·BR, (b + 1)·BR)); ext holds the user's functors.
  static void block(const attention_problem<T>& p, const T* shared, std::size_t b, T* scratch, const Ext& ext) {
    prefill_loop<attention_prefill>::block(p, shared, b, scratch, ext);
  }

  // The float tiles, as prefill_loop.hpp asks of a tile policy.
  using value_type = T;
  static constexpr blocking sizes = B;
  using block_state = prefill_block<T, B>;
  struct packed {
    const T* kp;          // K by panels of NR keys, dk deep
    const T* vp;          // V by panels of NR columns
    const T* not_finite;  // a flag a value row: 1 where it holds ±∞ or NaN
    std::size_t m;
  };
  static packed operands(const attention_problem<T>& p, const T* shared, std::size_t, std::size_t) {
    const std::size_t m = p.k.rows;
    const T* vp = shared + B.packed_k_size(m, p.q.cols);
    return {shared, vp, vp + B.packed_v_size(m, p.v.cols), m};
  }

  // Strip ir's scores, on the register tile (or the user's term tile). A
  // strip whose rows already have a maximum, and whose scores nothing
  // changes, gets its weights from the tiles (weights_tile.hpp): true.
  static bool strip_scores(const attention_problem<T>& p, const packed& ops, const Ext& ext, block_state& x,
                           std::size_t ir) {
    const std::size_t n = p.q.rows, dk = p.q.cols, first = x.first[ir / MR], keys = x.keys[ir / MR];
    const T* rows[MR];
    for (std::size_t r = 0; r < MR; ++r) rows[r] = p.q.ptr(min(x.i0 + ir + r, n - 1), 0);
    if (weighs_in_tiles(p, x.i0, x.br, ir, x.j0 + first, keys - first, x.row_m) &&
        weigh_strip(p, rows, ops.kp, x.j0, ir, x.br, first, keys, x.s, x.maxima, x.row_m, x.row_l, x.o, x.dvp))
      return true;
    for (std::size_t jr = first; jr < keys; jr += NR) {
      T* c = x.s + ir * BC + jr;
      const T* panel = ops.kp + (x.j0 + jr) * dk;
      if constexpr (extension_traits<Ext, T>::has_term) {
        term_tile<Arch, T, Ext>::run(ext, dk, rows, panel, c, BC, NR);
      } else if (jr + NR <= keys) {
        tile::template run_keeping_max<1>(dk, rows, panel, c, BC, x.maxima + ir * W);
      } else {
        tile::template run<1>(dk, rows, panel, c, BC, MR, NR, false);
      }
    }
    return false;
  }

  // Row r's weights from its scores, by the online softmax.
  static void step(const packed&, block_state& x, std::size_t r, std::size_t from, std::size_t count, T a,
                   T known_max, std::size_t known) {
    softmax::step(x.s + r * BC + from, count, a, x.row_m[r], x.row_l[r], x.o + r * x.dvp, x.dvp, known_max, known);
  }

  // o += the block's weights · values; skipping zero weights where a value
  // row is not finite.
  static void values(const packed& ops, block_state& x) {
    if (none_set(ops.not_finite + x.j0, x.bc))
      weigh_values(x.s, x.br, x.first, x.keys, ops.vp + x.j0 * NR, ops.m, x.o, x.dvp);
    else
      weigh_values_skipping_zeros(x.s, x.br, x.first, x.keys, ops.vp + x.j0 * NR, ops.m, x.o, x.dvp);
  }

 private:
  using weights = weights_tile<Arch, T>;

  // Whether the strip of rows [ir, ir + MR) can take the weights of keys
  // [j, j + count) from the tiles: whole panels, scores that apply leaves
  // as they are, and rows that have a maximum (not their first visible
  // block) small enough that the scale stays folded into the exponent.
  static bool weighs_in_tiles(const attention_problem<T>& p, std::size_t i0, std::size_t br, std::size_t ir,
                              std::size_t j, std::size_t count, const T* row_m) {
    if constexpr (extension_traits<Ext, T>::has_term) {
      return false;
    } else {
      if (count == 0 || count % NR != 0) return false;
      for (std::size_t r = ir; r < min(ir + MR, br); ++r)
        if (!(std::abs(row_m[r]) <= softmax::fold_limit) || !scores::leaves(p, i0 + r, j, count)) return false;
      return true;
    }
  }

  // The strip's weights from the tiles, taken into its rows' m, l and o;
  // false (its scores to compute again) where a row's maximum is not finite
  // or grew past weights::stale_limit.
  static bool weigh_strip(const attention_problem<T>& p, const T* const* rows, const T* kp, std::size_t j0,
                          std::size_t ir, std::size_t br, std::size_t first, std::size_t keys, T* s, T* maxima,
                          T* row_m, T* row_l, T* o, std::size_t dvp) {
    const std::size_t dk = p.q.cols, last = min(ir + MR, br);
    alignas(64) T sums[2 * MR * W] = {};
    T minus_m[MR];
    for (std::size_t r = 0; r < MR; ++r) minus_m[r] = -row_m[min(ir + r, br - 1)];
    for (std::size_t jr = first; jr < keys; jr += NR)
      weights::run(dk, rows, kp + (j0 + jr) * dk, s + ir * BC + jr, BC, p.scale, minus_m, sums, maxima + ir * W);
    T mx[MR];
    for (std::size_t r = ir; r < last; ++r) {
      mx[r - ir] = p.scale * softmax::lane_max(batch::load_aligned(maxima + r * W));
      if (!(mx[r - ir] - row_m[r] <= weights::stale_limit) || !(std::abs(mx[r - ir]) <= softmax::fold_limit))
        return false;
    }
    for (std::size_t r = ir; r < last; ++r) {
      const T* sum = sums + 2 * (r - ir) * W;
      softmax::adopt(s + r * BC + first, keys - first, xsimd::hadd(batch::load_aligned(sum) + batch::load_aligned(sum + W)),
                     mx[r - ir], row_m[r], row_l[r], o + r * dvp, dvp);
    }
    return true;
  }

  // Whether all of flags[0, count) (each 0 or 1) are 0: a vector at a time,
  // since it is asked once per key block.
  static bool none_set(const T* flags, std::size_t count) {
    batch any(T(0));
    std::size_t j = 0;
    for (; j + W <= count; j += W) any = xsimd::max(any, batch::load_unaligned(flags + j));
    for (; j < count; ++j)
      if (flags[j] != T(0)) return false;
    return !xsimd::any(any != batch(T(0)));
  }

  // o += weights · values on the register tile, in partial sums of at most
  // sum_chunk keys, as the matrix product sums (its error grows with the
  // length of each sequential sum). vp: the block's first packed value row;
  // [first, keys): the keys each strip of MR rows sees.
  static void weigh_values(const T* s, std::size_t br, const std::size_t* first, const std::size_t* keys,
                           const T* vp, std::size_t m, T* o, std::size_t dvp) {
    const std::size_t most = keys[(br - 1) / MR];  // the last strip's: key_end grows with the row
    for (std::size_t jc = 0; jc < most; jc += B.sum_chunk) {
      for (std::size_t ir = 0; ir < br; ir += MR) {
        const std::size_t lo = jc > first[ir / MR] ? jc : first[ir / MR], hi = min(jc + B.sum_chunk, keys[ir / MR]);
        if (hi <= lo) continue;
        const T* rows[MR];
        for (std::size_t r = 0; r < MR; ++r) rows[r] = s + min(ir + r, br - 1) * BC + lo;
        for (std::size_t c = 0; c < dvp; c += NR)
          tile::template run<1>(hi - lo, rows, vp + c * m + lo * NR, o + ir * dvp + c, static_cast<std::ptrdiff_t>(dvp),
                                min(MR, br - ir), NR, true);
      }
    }
  }

  // The same sums, row by row, reading no value row whose weight is 0.
  static void weigh_values_skipping_zeros(const T* s, std::size_t br, const std::size_t* first,
                                          const std::size_t* keys, const T* vp, std::size_t m, T* o,
                                          std::size_t dvp) {
    for (std::size_t r = 0; r < br; ++r) {
      const T* u = s + r * BC;
      const std::size_t count = keys[r / MR];
      for (std::size_t c = 0; c < dvp; c += NR) {
        T* out = o + r * dvp + c;
        for (std::size_t jc = first[r / MR]; jc < count; jc += B.sum_chunk) {
          batch lo(T(0)), hi(T(0));
          for (std::size_t j = jc; j < min(count, jc + B.sum_chunk); ++j) {
            if (u[j] == T(0)) continue;
            const batch w(u[j]);
            const T* v = vp + c * m + j * NR;
            lo = fmadd(w, batch::load_aligned(v), lo);
            hi = fmadd(w, batch::load_aligned(v + W), hi);
          }
          (batch::load_aligned(out) + lo).store_aligned(out);
          (batch::load_aligned(out + W) + hi).store_aligned(out + W);
        }
      }
    }
  }
};

}  // namespace qkv::kernels
