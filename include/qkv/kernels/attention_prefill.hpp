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
    const std::size_t n = p.q.rows, m = p.k.rows, dk = p.q.cols, dv = p.v.cols;
    const std::size_t i0 = b * BR, dvp = blocking::round_up(dv, NR);
    const T* kp = shared;
    const T* vp = kp + B.packed_k_size(m, dk);
    const T* not_finite = vp + B.packed_v_size(m, dv);
    T* s = scratch;
    T* o = s + aligned(BR * BC);
    T* row_m = o + aligned(BR * dvp);
    T* row_l = row_m + aligned(BR);
    alignas(64) T maxima[BR * W];
    const std::size_t kb = B.key_block(dk, dv);
    const std::size_t br = min(BR, n - i0);
    // A sink is the first term of every row's maximum and sum.
    for (std::size_t r = 0; r < br; ++r) row_m[r] = p.sink, row_l[r] = p.sink == softmax::neg_inf ? T(0) : T(1);
    for (std::size_t x = 0; x < BR * dvp; ++x) o[x] = T(0);
    // The last row sees the most keys, the first the earliest (a window's);
    // the blocks start at a panel boundary.
    const std::size_t j_end = scores::key_end(p, i0 + br - 1);
    const std::size_t j_begin = scores::key_begin(p, i0) / NR * NR;

    for (std::size_t jb = j_begin; jb < j_end; jb += kb) {
      const auto [j0, j1] = scores::kept_keys(p, ext, i0, br, jb, min(kb, j_end - jb), B.mask_stretch);
      if (j0 == j1) continue;
      const std::size_t bc = j1 - j0;
      // Keys [first, keys) of the block each strip of MR rows sees: on the
      // causal diagonal fewer than bc, none for strips above it, and from a
      // panel boundary for a window's later strips. Outside them nothing is
      // computed, weighed or summed (rows of a strip that see fewer keys
      // are masked by apply, as anywhere else).
      std::size_t keys[BR / MR] = {}, first[BR / MR] = {};
      strip_keys(p.bounds, n, m, i0, br, j0, bc, MR, NR, first, keys);

      // Scores of the block; rows past br read the last row again and are
      // ignored. Whole panels keep their rows' maxima (lane-wise, in maxima).
      // A strip whose rows already have a maximum, and whose scores nothing
      // changes, gets its weights from the tiles (weights_tile.hpp).
      for (std::size_t x = 0; x < BR * W; ++x) maxima[x] = softmax::neg_inf;
      bool weighed[BR / MR];
      for (std::size_t ir = 0; ir < br; ir += MR) {
        const T* rows[MR];
        for (std::size_t r = 0; r < MR; ++r) rows[r] = p.q.ptr(min(i0 + ir + r, n - 1), 0);
        weighed[ir / MR] = weighs_in_tiles(p, i0, br, ir, j0 + first[ir / MR], keys[ir / MR] - first[ir / MR], row_m) &&
                           weigh_strip(p, rows, kp, j0, ir, br, first[ir / MR], keys[ir / MR], s, maxima, row_m, row_l,
                                       o, dvp);
        if (weighed[ir / MR]) continue;
        for (std::size_t jr = first[ir / MR]; jr < keys[ir / MR]; jr += NR) {
          if constexpr (extension_traits<Ext, T>::has_term) {
            term_tile<Arch, T, Ext>::run(ext, dk, rows, kp + (j0 + jr) * dk, s + ir * BC + jr, BC, NR);
          } else if (jr + NR <= keys[ir / MR]) {
            tile::template run_keeping_max<1>(dk, rows, kp + (j0 + jr) * dk, s + ir * BC + jr, BC, maxima + ir * W);
          } else {
            tile::template run<1>(dk, rows, kp + (j0 + jr) * dk, s + ir * BC + jr, BC, MR, NR, false);
          }
        }
      }
      // Weights, in place. Where apply leaves a row's scores as they are, the
      // maxima of its whole panels spare the softmax a pass over them.
      for (std::size_t r = 0; r < br; ++r) {
        const std::size_t from = first[r / MR], count = keys[r / MR] - from;
        if (count == 0 || weighed[r / MR]) continue;
        T* u = s + r * BC + from;
        const T a = scores::apply(p, i0 + r, j0 + from, count, u, ext);
        const std::size_t full = count / NR * NR;  // whole panels: a causal cut past them masks only the tail
        const std::size_t known =
            extension_traits<Ext, T>::has_term || !scores::leaves(p, i0 + r, j0 + from, full) ? 0 : full;
        const T known_max = known == 0 ? softmax::neg_inf : softmax::lane_max(batch::load_aligned(maxima + r * W));
        softmax::step(u, count, a, row_m[r], row_l[r], o + r * dvp, dvp, known_max, known);
      }
      if (none_set(not_finite + j0, bc)) weigh_values(s, br, first, keys, vp + j0 * NR, m, o, dvp);
      else weigh_values_skipping_zeros(s, br, first, keys, vp + j0 * NR, m, o, dvp);
    }
    for (std::size_t r = 0; r < br; ++r) softmax::finish(o + r * dvp, row_l[r], p.out.ptr(i0 + r, 0), dv);
    if (p.row_stats != nullptr)
      for (std::size_t r = 0; r < br; ++r) p.row_stats[2 * (i0 + r)] = row_m[r], p.row_stats[2 * (i0 + r) + 1] = row_l[r];
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
