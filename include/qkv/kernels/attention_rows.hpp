// Fused attention with an extension, for a user's unit compiled for a
// narrower instruction set than the library's kernels run (the default
// flags on an AVX-512 machine, say): only what needs the user's functors
// runs here (a similarity's scores, the modifier, the predicate), on a block
// of query rows; the softmax and the product with V run on the library's
// kernels, which are faster than this unit's code could be.
//
// The keys a block of rows may see are cut into blocks of block_keys. Those
// the mask matrix or the predicate (its hint, else its values) empty are
// skipped: no score, no modifier, no predicate call. Then the softmax and the
// product with V cover only the span from the first block holding a visible
// score to the last; blocks inside the span found empty are −∞ (weight 0).
// The span depends only on which scores are visible, so a hint changes the
// work, never the result; and a block is computed alike whoever runs it.
// Memory: one block_rows × span block of scores per thread, never n × m.
// Asked for them (p.row_stats), it keeps each row's maximum and sum, as the
// online kernel does, for the backward.
#pragma once

#include "../storage/thread_scratch.hpp"
#include "api.hpp"
#include "attention.hpp"

#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace qkv::kernels {

template <class T, class Ext>
struct attention_rows_kernel {
  using kernel = attention_kernel<xsimd::default_arch, T, Ext>;
  using tile = register_tile<xsimd::default_arch, T>;
  using traits = extension_traits<Ext, T>;
  static constexpr std::size_t MR = tile::MR, NR = tile::NR;
  // blocking.hpp says why these sizes.
  static constexpr std::size_t block_rows = other_blocks::row_path_rows;
  static constexpr std::size_t block_keys = other_blocks::row_path_keys;
  static_assert(block_keys % NR == 0);
  static constexpr T neg_inf = -std::numeric_limits<T>::infinity();

  static constexpr std::size_t round_up(std::size_t x, std::size_t to) { return (x + to - 1) / to * to; }
  static constexpr std::size_t min(std::size_t a, std::size_t b) { return a < b ? a : b; }

  // A user's similarity reads K packed for the register tile, once per
  // problem (or group of problems sharing K); the dot product reads K in
  // place through the library's product.
  static std::size_t pack_size(const attention_problem<T>& p) {
    return traits::has_term ? round_up(p.k.rows, NR) * p.q.cols : 0;
  }
  static void pack(const attention_problem<T>& p, T* shared) {
    if constexpr (traits::has_term)
      tile::pack_transposed(p.k.data, p.k.row_stride, p.k.col_stride, p.k.rows, p.q.cols, shared);
  }
  static std::size_t blocks(const attention_problem<T>& p) { return (p.q.rows + block_rows - 1) / block_rows; }

  // Query rows [b · block_rows, …) into p.out.
  static void block(const attention_problem<T>& p, const T* shared, std::size_t b, const Ext& ext) {
    const std::size_t n = p.q.rows, dk = p.q.cols;
    const std::size_t i0 = b * block_rows, br = min(block_rows, n - i0);
    const std::size_t j_end = kernel::key_end(p, i0 + br - 1);  // the last row sees the most keys
    const std::size_t nb = (j_end + block_keys - 1) / block_keys;

    // 1 for a key block whose scores are computed, 2 once one of them is
    // found visible (not −∞; a NaN counts, it must poison its row).
    unsigned char* state = detail::thread_scratch<unsigned char, detail::scratch_slot::row_states>(nb);
    std::fill_n(state, nb, static_cast<unsigned char>(0));
    std::size_t lo = nb, hi = 0;
    for (std::size_t kb = kernel::key_begin(p, i0) / block_keys; kb < nb; ++kb) {
      const std::size_t j0 = kb * block_keys, bc = min(block_keys, j_end - j0);
      if (!kernel::scores::keeps_any(p, ext, i0, br, j0, bc)) continue;
      state[kb] = 1;
      lo = lo < kb ? lo : kb;
      hi = kb + 1;
    }
    if (lo >= hi) return zero_rows(p, i0, br);

    // Scores of the computed blocks, on a block of rows from key c0 on.
    const std::size_t c0 = lo * block_keys, ld = round_up(min(hi * block_keys, j_end) - c0, NR) + NR;
    T* sd = detail::thread_scratch<T, detail::scratch_slot::row_scores>(round_up(br, MR) * ld);
    for (std::size_t ka = lo; ka < hi;) {  // runs of consecutive computed blocks
      if (state[ka] == 0) {
        ++ka;
        continue;
      }
      std::size_t kz = ka;
      while (kz < hi && state[kz] != 0) ++kz;
      const std::size_t ja = ka * block_keys, jb = min(kz * block_keys, j_end);
      if constexpr (traits::has_term) {
        for (std::size_t ir = 0; ir < br; ir += MR) {
          const T* q_rows[MR];  // rows past br read the last row again; ignored
          for (std::size_t r = 0; r < MR; ++r) q_rows[r] = p.q.ptr(i0 + min(ir + r, br - 1), 0);
          for (std::size_t jr = ja; jr < jb; jr += NR)
            kernel::term_tile(ext, dk, q_rows, shared + jr * dk, sd + ir * ld + (jr - c0),
                              static_cast<std::ptrdiff_t>(ld), NR);
        }
      } else {
        const strided<const T> qb{p.q.ptr(i0, 0), br, dk, p.q.row_stride, p.q.col_stride};
        const strided<const T> kt{p.k.ptr(ja, 0), dk, jb - ja, p.k.col_stride, p.k.row_stride};
        gemm(qb, kt, sd + (ja - c0), static_cast<std::ptrdiff_t>(ld));
      }
      ka = kz;
    }

    // Scale, bias, modifier and masks on the computed blocks; −∞ elsewhere.
    for (std::size_t r = 0; r < br; ++r) {
      T* row = sd + r * ld;
      for (std::size_t kb = lo; kb < hi; ++kb) {
        const std::size_t j0 = kb * block_keys, bc = min(block_keys, j_end - j0);
        T* u = row + (j0 - c0);
        if (state[kb] == 0) {
          for (std::size_t j = 0; j < bc; ++j) u[j] = neg_inf;
          continue;
        }
        const T a = kernel::transform(p, i0 + r, j0, bc, u, ext);
        if (a != T(1))
          for (std::size_t j = 0; j < bc; ++j) u[j] *= a;
        if (state[kb] == 1) {
          bool visible = false;
          for (std::size_t j = 0; j < bc; ++j) visible |= u[j] != neg_inf;
          if (visible) state[kb] = 2;
        }
      }
    }

    // The softmax and the product with V over the span of visible blocks.
    std::size_t vlo = lo, vhi = hi;
    while (vlo < vhi && state[vlo] != 2) ++vlo;
    while (vhi > vlo && state[vhi - 1] != 2) --vhi;
    if (vlo == vhi) return zero_rows(p, i0, br);
    const std::size_t ja = vlo * block_keys, width = min(vhi * block_keys, j_end) - ja;
    T* span = sd + (ja - c0);
    if (p.row_stats != nullptr) keep_row_stats(p, i0, br, span, ld, width);
    softmax_rows(strided<T>{span, br, width, static_cast<std::ptrdiff_t>(ld), 1}, p.sink);
    const strided<const T> pb{span, br, width, static_cast<std::ptrdiff_t>(ld), 1};
    const strided<const T> vb{p.v.ptr(ja, 0), width, p.v.cols, p.v.row_stride, p.v.col_stride};
    weigh(pb, vb, p.out.ptr(i0, 0), p.out.row_stride);  // a masked key reads nothing of its value row
  }

 private:
  // Each row's maximum and sum Σ exp(s − max), a sink counted as one more
  // score, for the backward (2 values a row; −∞ and 0 for a row that sees
  // nothing).
  static void keep_row_stats(const attention_problem<T>& p, std::size_t i0, std::size_t br, const T* span,
                             std::size_t ld, std::size_t width) {
    for (std::size_t r = 0; r < br; ++r) {
      const T* u = span + r * ld;
      T mx = p.sink, l = T(0);
      for (std::size_t j = 0; j < width; ++j) mx = u[j] > mx ? u[j] : mx;
      if (mx != neg_inf) {
        l = std::exp(p.sink - mx);
        for (std::size_t j = 0; j < width; ++j) l += std::exp(u[j] - mx);
      }
      p.row_stats[2 * (i0 + r)] = mx, p.row_stats[2 * (i0 + r) + 1] = l;
    }
  }

  // Rows that see nothing give zeros, as softmax_rows gives for a row of −∞
  // (the sink alone: its statistics).
  static void zero_rows(const attention_problem<T>& p, std::size_t i0, std::size_t br) {
    const T l = p.sink == neg_inf ? T(0) : T(1);
    if (p.row_stats != nullptr)
      for (std::size_t r = 0; r < br; ++r) p.row_stats[2 * (i0 + r)] = p.sink, p.row_stats[2 * (i0 + r) + 1] = l;
    for (std::size_t r = 0; r < br; ++r) {
      T* o = p.out.ptr(i0 + r, 0);
      for (std::size_t c = 0; c < p.v.cols; ++c) o[c] = T(0);
    }
  }
};

}  // namespace qkv::kernels
