// From raw similarities to the scores the softmax sees: the scale, the
// biases, the user's modifier, and the masks (causal, a mask matrix, the
// user's predicate), for a stretch of one row; and which key blocks a mask
// leaves anything visible in, so that the kernel can skip the others.
#pragma once

#include "arch_traits.hpp"
#include "../numeric/dual.hpp"
#include "attention_problem.hpp"
#include "extension.hpp"
#include "key_bounds.hpp"

#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <utility>

namespace qkv::kernels {

template <class Arch, class T, class Ext>
struct score_transform {
  using batch = xsimd::batch<T, Arch>;
  static constexpr std::size_t W = batch::size;
  static constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  using traits = extension_traits<Ext, T>;

  // The keys row i may see and whether a block sees any (key_bounds.hpp).
  static std::size_t key_end(const attention_problem<T>& p, std::size_t i) { return kernels::key_end(p, i); }
  static std::size_t key_begin(const attention_problem<T>& p, std::size_t i) { return kernels::key_begin(p, i); }
  static bool bounds_keep_any(const attention_problem<T>& p, std::size_t i0, std::size_t rows, std::size_t j0,
                              std::size_t cols) {
    return kernels::bounds_keep_any(p, i0, rows, j0, cols);
  }

  // The scores of row i for keys [j0, j0 + count), raw q·k in u on entry.
  // Whether apply leaves the scores of row i for keys [j0, j0 + count) as
  // they are (and returns the scale); a causal cut may mask keys past them.
  static bool leaves(const attention_problem<T>& p, std::size_t i, std::size_t j0, std::size_t count) {
    return p.bias.data == nullptr && p.col_bias.data == nullptr && p.scale > T(0) && !traits::modifies &&
           key_begin(p, i) <= j0 && key_end(p, i) >= j0 + count && p.mask.data == nullptr && !traits::keeps;
  }

  // Applies the biases, the modifier and the masks; returns the factor a > 0
  // such that the score is a·u (the scale is left to the exponent when
  // nothing else needs the scaled score; online_softmax.hpp). With_slope
  // (a modifier's backward), slope[j] is the modifier's derivative f′ at
  // u[j]'s scaled, biased score: only then is f called on dual numbers.
  // Pre, where given, gets the scores the modifier saw.
  template <bool with_slope = false>
  static T apply(const attention_problem<T>& p, std::size_t i, std::size_t j0, std::size_t count, T* u,
                 const Ext& ext = Ext{}, T* slope = nullptr, T* pre = nullptr) {
    T a = p.scale;
    if (p.bias.data != nullptr || p.col_bias.data != nullptr || !(p.scale > T(0)) || traits::modifies) {
      const batch vs(p.scale), vb(p.bias_scale);
      std::size_t j = 0;
      if (p.bias.data != nullptr) {
        const T* b = p.bias.ptr(i, j0);
        for (; j + W <= count; j += W)
          fmadd(vs, batch::load_unaligned(u + j), vb * batch::load_unaligned(b + j)).store_unaligned(u + j);
        for (; j < count; ++j) u[j] = p.scale * u[j] + p.bias_scale * b[j];
      } else {
        for (; j < count; ++j) u[j] *= p.scale;
      }
      if (p.col_bias.data != nullptr) {
        const T* c = p.col_bias.ptr(0, j0);
        for (j = 0; j < count; ++j) u[j] += p.col_scale * c[j];
      }
      if (p.row_bias.data != nullptr) {
        const T r = p.row_scale * p.row_bias(i, 0);
        for (j = 0; j < count; ++j) u[j] += r;
      }
      if constexpr (traits::modifies) {
        if (pre != nullptr) std::copy_n(u, count, pre);
        if constexpr (with_slope) modify_with_slope(ext, i, j0, count, u, slope, p.batch, p.head);
        else modify(ext, i, j0, count, u, p.batch, p.head);
      }
      a = T(1);
    }
    const std::size_t begin = key_begin(p, i), end = key_end(p, i);
    for (std::size_t j = 0; j < count && j0 + j < begin; ++j) u[j] = neg_inf;
    for (std::size_t j = end > j0 ? end - j0 : 0; j < count; ++j) u[j] = neg_inf;
    if (p.mask.data != nullptr) {
      const bool* keep = p.mask.ptr(i, j0);
      for (std::size_t j = 0; j < count; ++j)
        if (!keep[j]) u[j] = neg_inf;
    }
    if constexpr (traits::keeps) {
      for (std::size_t j = 0; j < count; ++j) u[j] = ext.keep(i, j0 + j, p.batch, p.head) ? u[j] : neg_inf;
    }
    return a;
  }

  // s ← f(s, i, j) over a row: W keys at a time on batches, the tail on
  // scalars; b and h are the slice's batch and head.
  static void modify(const Ext& ext, std::size_t i, std::size_t j0, std::size_t count, T* u, std::size_t b,
                     std::size_t h) {
    alignas(64) T lanes[W];
    for (std::size_t l = 0; l < W; ++l) lanes[l] = T(l);
    const batch iota = batch::load_aligned(lanes), vi(static_cast<T>(i));
    std::size_t j = 0;
    for (; j + W <= count; j += W) {
      const batch vj = iota + batch(static_cast<T>(j0 + j));
      batch(ext.modify(batch::load_unaligned(u + j), vi, vj, b, h)).store_unaligned(u + j);
    }
    for (; j < count; ++j) u[j] = static_cast<T>(ext.modify(u[j], static_cast<T>(i), static_cast<T>(j0 + j), b, h));
  }

  // s ← f(s, i, j) and slope ← ∂f/∂s, calling f on dual numbers
  // (numeric/dual.hpp): one call gives both.
  static void modify_with_slope(const Ext& ext, std::size_t i, std::size_t j0, std::size_t count, T* u, T* slope,
                                std::size_t b, std::size_t h) {
    using D = dual<batch>;
    alignas(64) T lanes[W];
    for (std::size_t l = 0; l < W; ++l) lanes[l] = T(l);
    const batch iota = batch::load_aligned(lanes), vi(static_cast<T>(i)), one(T(1));
    std::size_t j = 0;
    for (; j + W <= count; j += W) {
      const D r = ext.modify(D(batch::load_unaligned(u + j), one), D(vi), D(iota + batch(static_cast<T>(j0 + j))), b, h);
      r.v.store_unaligned(u + j);
      r.d.store_unaligned(slope + j);
    }
    for (; j < count; ++j) {
      const dual<T> r =
          ext.modify(dual<T>(u[j], T(1)), dual<T>(static_cast<T>(i)), dual<T>(static_cast<T>(j0 + j)), b, h);
      u[j] = r.v, slope[j] = r.d;
    }
  }

  // Whether the masks leave any pair of rows [i0, i0 + rows) and keys
  // [j0, j0 + cols) visible; a block they empty is skipped, never read.
  static bool keeps_any(const attention_problem<T>& p, const Ext& ext, std::size_t i0, std::size_t rows,
                        std::size_t j0, std::size_t cols) {
    if (!bounds_keep_any(p, i0, rows, j0, cols)) return false;
    if (p.mask.data != nullptr && !mask_keeps_any(p, i0, rows, j0, cols)) return false;
    if constexpr (traits::keeps) {
      if (!predicate_keeps_any(ext, i0, rows, j0, cols, p.batch, p.head)) return false;
    }
    return true;
  }

  // The keys of block [j0, j0 + count) worth computing for rows [i0, i0 +
  // rows): [from, to), empty where none is visible. Where a mask or a
  // predicate may hide keys, stretches of `stretch` keys (from j0 on) that
  // it hides whole are left out at either end of the block, so that a
  // large block skips about as much as small ones would.
  static std::pair<std::size_t, std::size_t> kept_keys(const attention_problem<T>& p, const Ext& ext, std::size_t i0,
                                                       std::size_t rows, std::size_t j0, std::size_t count,
                                                       std::size_t stretch) {
    std::size_t from = j0, to = j0 + count;
    if (p.mask.data == nullptr && !traits::keeps) {
      if (!keeps_any(p, ext, i0, rows, j0, count)) from = to;
      return {from, to};
    }
    while (from < to && !keeps_any(p, ext, i0, rows, from, to - from < stretch ? to - from : stretch)) from += stretch;
    if (from >= to) return {to, to};
    for (std::size_t last = from + (to - from - 1) / stretch * stretch; last > from; last -= stretch) {
      if (keeps_any(p, ext, i0, rows, last, to - last)) break;
      to = last;
    }
    return {from, to};
  }

  static bool mask_keeps_any(const attention_problem<T>& p, std::size_t i0, std::size_t rows, std::size_t j0,
                             std::size_t cols) {
    for (std::size_t r = 0; r < rows; ++r) {
      const bool* keep = p.mask.ptr(i0 + r, j0);
      for (std::size_t j = 0; j < cols; ++j)
        if (keep[j]) return true;
    }
    return false;
  }

  // The predicate's block hint where it has one, else every pair asked.
  // (Each row is OR-reduced without an early exit, which the compiler can
  // vectorise for a predicate of plain comparisons.)
  static bool predicate_keeps_any(const Ext& ext, std::size_t i0, std::size_t rows, std::size_t j0,
                                  std::size_t cols, std::size_t b, std::size_t h) {
    if constexpr (requires { ext.keep_any(i0, i0, j0, j0, b, h); }) {
      const int hint = ext.keep_any(i0, i0 + rows, j0, j0 + cols, b, h);
      if (hint >= 0) return hint != 0;
    }
    for (std::size_t r = 0; r < rows; ++r) {
      bool any = false;
      for (std::size_t j = 0; j < cols; ++j) any |= static_cast<bool>(ext.keep(i0 + r, j0 + j, b, h));
      if (any) return true;
    }
    return false;
  }
};

}  // namespace qkv::kernels
