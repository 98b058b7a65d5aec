// The prefill's loop over one block of query rows, written once for every
// kind of tile: per key block, the keys each strip of rows sees
// (key_bounds.hpp), the strips' scores on the policy's score tile, the
// weights by the online softmax, the weights times the values on the
// policy's values tile; at the end each row divided by its sum.
//
// A tile policy says how K and V were packed and how its two products run:
//   value_type, sizes (the blocking), softmax, scores (score_transform)
//   operands(p, shared, i0, br) -> ops     the packed K and V, and what the
//                                          block's queries need (per block)
//   strip_scores(p, ops, ext, ctx, ir)     the scores of strip ir into ctx.s
//                                          (true: it weighed them too)
//   step(ops, ctx, r, from, count, a, known_max, known)
//                                          row r's weights, by softmax::step
//   values(ops, ctx)                       o += the block's weights · values
// attention_prefill.hpp holds the float tiles, attention_prefill_bf16.hpp
// the bf16-pair ones; a new kind of tile (8-bit or 4-bit K and V, AMX) is a
// policy beside them.
#pragma once

#include "attention_problem.hpp"
#include "blocking.hpp"
#include "extension.hpp"
#include "key_bounds.hpp"

#include <cstddef>

namespace qkv::kernels {

// What one key block of one query block is, for the policies: its scores
// (BR × BC, rows ld apart), the rows' running maxima, sums and unnormalised
// output, and which keys of it each strip of MR rows sees.
template <class T, blocking B>
struct prefill_block {
  static constexpr std::size_t BR = B.query_rows, BC = B.max_key_block, MR = B.tile_rows;
  std::size_t i0 = 0, br = 0, dvp = 0;  // the block's first row and rows; o's row length
  std::size_t j0 = 0, bc = 0;           // the key block: [j0, j0 + bc)
  T* s = nullptr;                       // scores, then weights, row r at s + r·BC
  T* o = nullptr;                       // row r at o + r·dvp
  T* row_m = nullptr;
  T* row_l = nullptr;
  T* maxima = nullptr;                  // lane-wise maxima of whole score panels, W a row
  std::size_t first[BR / MR] = {}, keys[BR / MR] = {};  // strip s sees [first[s], keys[s]) from j0
};

template <class Tiles>
struct prefill_loop {
  using T = typename Tiles::value_type;
  using softmax = typename Tiles::softmax;
  using scores = typename Tiles::scores;
  static constexpr blocking B = Tiles::sizes;
  static constexpr std::size_t BR = B.query_rows, BC = B.max_key_block, MR = B.tile_rows, NR = B.tile_cols();
  static constexpr std::size_t W = B.lanes;

  static constexpr std::size_t min(std::size_t a, std::size_t b) { return a < b ? a : b; }

  // Query block b (rows [b·BR, (b + 1)·BR)); ext holds the user's functors.
  template <class Ext>
  static void block(const attention_problem<T>& p, const T* shared, std::size_t b, T* scratch, const Ext& ext) {
    const std::size_t n = p.q.rows, m = p.k.rows, dk = p.q.cols, dv = p.v.cols;
    prefill_block<T, B> x;
    x.i0 = b * BR, x.br = min(BR, n - x.i0), x.dvp = blocking::round_up(dv, NR);
    x.s = scratch;
    x.o = x.s + B.aligned(BR * BC);
    x.row_m = x.o + B.aligned(BR * x.dvp);
    x.row_l = x.row_m + B.aligned(BR);
    alignas(64) T maxima[BR * W];
    x.maxima = maxima;
    const auto ops = Tiles::operands(p, shared, x.i0, x.br);
    const std::size_t i0 = x.i0, br = x.br, kb = B.key_block(dk, dv);
    // A sink is the first term of every row's maximum and sum.
    for (std::size_t r = 0; r < br; ++r) x.row_m[r] = p.sink, x.row_l[r] = p.sink == softmax::neg_inf ? T(0) : T(1);
    for (std::size_t c = 0; c < BR * x.dvp; ++c) x.o[c] = T(0);
    // The last row sees the most keys, the first the earliest (a window's);
    // the blocks start at a panel boundary.
    const std::size_t j_end = key_end(p, i0 + br - 1);
    const std::size_t j_begin = key_begin(p, i0) / NR * NR;

    for (std::size_t jb = j_begin; jb < j_end; jb += kb) {
      const auto [j0, j1] = scores::kept_keys(p, ext, i0, br, jb, min(kb, j_end - jb), B.mask_stretch);
      if (j0 == j1) continue;
      x.j0 = j0, x.bc = j1 - j0;
      // Outside the keys each strip sees nothing is computed, weighed or
      // summed (rows of a strip that see fewer keys are masked by apply, as
      // anywhere else).
      strip_keys(p.bounds, n, m, i0, br, j0, x.bc, MR, NR, x.first, x.keys);

      // Scores of the block; rows past br read the last row again and are
      // ignored. Whole panels keep their rows' maxima (lane-wise, in maxima).
      for (std::size_t c = 0; c < BR * W; ++c) maxima[c] = softmax::neg_inf;
      bool weighed[BR / MR];
      for (std::size_t ir = 0; ir < br; ir += MR) weighed[ir / MR] = Tiles::strip_scores(p, ops, ext, x, ir);
      // Weights, in place. Where apply leaves a row's scores as they are, the
      // maxima of its whole panels spare the softmax a pass over them.
      for (std::size_t r = 0; r < br; ++r) {
        const std::size_t from = x.first[r / MR], count = x.keys[r / MR] - from;
        if (count == 0 || weighed[r / MR]) continue;
        T* u = x.s + r * BC + from;
        const T a = scores::apply(p, i0 + r, j0 + from, count, u, ext);
        const std::size_t full = count / NR * NR;  // whole panels: a causal cut past them masks only the tail
        const std::size_t known =
            extension_traits<Ext, T>::has_term || !scores::leaves(p, i0 + r, j0 + from, full) ? 0 : full;
        const T known_max = known == 0 ? softmax::neg_inf : softmax::lane_max(softmax::batch::load_aligned(maxima + r * W));
        Tiles::step(ops, x, r, from, count, a, known_max, known);
      }
      Tiles::values(ops, x);
    }
    for (std::size_t r = 0; r < br; ++r) softmax::finish(x.o + r * x.dvp, x.row_l[r], p.out.ptr(i0 + r, 0), dv);
    if (p.row_stats != nullptr)
      for (std::size_t r = 0; r < br; ++r)
        p.row_stats[2 * (i0 + r)] = x.row_m[r], p.row_stats[2 * (i0 + r) + 1] = x.row_l[r];
  }
};

}  // namespace qkv::kernels
