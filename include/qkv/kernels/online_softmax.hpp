// The online softmax of one row of scores, a block of keys at a time: its
// running maximum m and sum l, and an unnormalised output o rescaled only
// when m grows; finish() divides by l once at the end.
//
// A score may reach this code as a·u, u the raw q·k and a > 0 the scale, so
// that the exponent is one fused multiply-add, exp(fma(a, u, −m)). That fold
// is exact only while m's rounding is small: fl(a·u_max) is off by up to
// |m|·ε/2, which past 2³¹ in float exceeds the ±88 exp can take, and the
// largest weight would overflow or vanish. Past |m| = 1/ε (rounding ≤ ½) the
// scores are scaled first, as the node-by-node softmax scales them.
//
// Its exponential is softmax_exp.hpp's (ExpDegree: its polynomial's), one
// pass over a block's scores. The weights are written over the scores, or
// handed to a sink two vectors at a time (the bf16 kernel rounds them into
// pairs there, without storing them as floats first).
#pragma once

#include "arch_traits.hpp"
#include "softmax_exp.hpp"

#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace qkv::kernels {

// Stores 2W weights from u + j (the second vector 0 past the scores).
template <class T>
struct weights_in_place {
  T* u;
  template <class batch>
  void operator()(std::size_t j, batch e0, batch e1, bool both) const {
    e0.store_aligned(u + j);
    if (both) e1.store_aligned(u + j + batch::size);
  }
};

template <class Arch, class T, std::size_t ExpDegree = 6>
struct online_softmax {
  using batch = xsimd::batch<T, Arch>;
  static constexpr std::size_t W = batch::size;
  static constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  static constexpr T fold_limit = T(1) / std::numeric_limits<T>::epsilon();
  static batch exp(batch x) { return softmax_exp<ExpDegree>(x); }

  static constexpr std::size_t round_up(std::size_t x, std::size_t to) { return (x + to - 1) / to * to; }

  static T row_max(const T* u, std::size_t padded) {
    batch vmax(neg_inf);
    for (std::size_t j = 0; j < padded; j += W) vmax = xsimd::max(vmax, batch::load_aligned(u + j));
    return lane_max(vmax);
  }

  // Once per row and key block: on AVX-512 a loop over the lanes took an
  // eighth to a sixth of the softmax's time.
  static T lane_max(batch v) {
#if defined(__AVX512F__)
    if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) {
      if constexpr (std::is_same_v<T, float>) return _mm512_reduce_max_ps(v);
      else return _mm512_reduce_max_pd(v);
    }
#endif
    alignas(64) T lanes[W];
    v.store_aligned(lanes);
    T mx = lanes[0];
    for (std::size_t j = 1; j < W; ++j) mx = lanes[j] > mx ? lanes[j] : mx;
    return mx;
  }

  // The scores of a row as a·u (u padded with −∞ to a multiple of W):
  // returns their maximum, with u scaled in place and a set to 1 where the
  // fold would not be exact (above), given the row's maximum so far. The
  // first `known` scores (a multiple of W) have the maximum known_max.
  static T block_max(T* u, std::size_t padded, T& a, T m_so_far, T known_max = neg_inf, std::size_t known = 0) {
    const T tail = known < padded ? row_max(u + known, padded - known) : neg_inf;
    const T raw = tail > known_max ? tail : known_max;
    const T mx = a * raw;
    const T m = mx > m_so_far ? mx : m_so_far;
    if (a == T(1) || !(std::abs(m) > fold_limit) || m == neg_inf) return mx;
    const batch va(a);
    for (std::size_t j = 0; j < padded; j += W) (va * batch::load_aligned(u + j)).store_aligned(u + j);
    a = T(1);
    return row_max(u, padded);
  }

  // exp(a·u − m) over `padded` values, handed to sink (in place: u ←);
  // returns their sum.
  template <class Sink>
  static T exponentiate(T* u, std::size_t padded, T a, T m, const Sink& sink) {
    const batch va(a), vm(-m);
    batch s0(T(0)), s1(T(0));
    std::size_t j = 0;
    for (; j + 2 * W <= padded; j += 2 * W) {
      const batch e0 = exp(fmadd(va, batch::load_aligned(u + j), vm));
      const batch e1 = exp(fmadd(va, batch::load_aligned(u + j + W), vm));
      sink(j, e0, e1, true);
      s0 += e0;
      s1 += e1;
    }
    if (j < padded) {
      const batch e = exp(fmadd(va, batch::load_aligned(u + j), vm));
      sink(j, e, batch(T(0)), false);
      s0 += e;
    }
    return xsimd::hadd(s0 + s1);
  }
  static T exponentiate(T* u, std::size_t padded, T a, T m) { return exponentiate(u, padded, a, m, weights_in_place<T>{u}); }

  // The weights of one block's scores (a·u, count of them), in place, with
  // the row's m, l and output o (dvp values) brought up to date; the first
  // `known` scores may come with their maximum, as block_max takes them.
  template <class Sink>
  static void step(T* u, std::size_t count, T a, T& m, T& l, T* o, std::size_t dvp, T known_max, std::size_t known,
                   const Sink& sink) {
    const std::size_t padded = round_up(count, W);
    for (std::size_t j = count; j < padded; ++j) u[j] = neg_inf;
    const T mx = block_max(u, padded, a, m, known_max, known);
    const T m_new = mx > m ? mx : m;
    // A row with nothing visible yet keeps m = −∞; exp then sees −∞ − 0 = −∞
    // (weight 0) for masked scores and NaN for NaN ones, which must poison.
    const T m_safe = m_new == neg_inf ? T(0) : m_new;
    const T sum = exponentiate(u, padded, a, m_safe, sink);
    // From m = −∞ the correction is 0, and o and l hold only 0, or NaN that
    // stays: nothing to rescale (a row's first visible block).
    if (m_new != m && m != neg_inf) {
      const T correction = exp(batch(m - m_safe)).get(0);
      l *= correction;
      const batch vc(correction);
      for (std::size_t c = 0; c < dvp; c += W) (batch::load_aligned(o + c) * vc).store_aligned(o + c);
    }
    l += sum;
    m = m_new;
  }
  static void step(T* u, std::size_t count, T a, T& m, T& l, T* o, std::size_t dvp, T known_max = neg_inf,
                   std::size_t known = 0) {
    step(u, count, a, m, l, o, dvp, known_max, known, weights_in_place<T>{u});
  }

  // A block's weights already taken against the row's m (weights_tile.hpp):
  // `count` of them at u (a multiple of W), sum their sum, mx = a·(the
  // largest score). Where mx ≤ m these are the bits step gives. Where it
  // grew (by at most weights_tile's stale_limit), m becomes mx and the
  // weights, l and o are scaled by e^(m − mx) as step scales l and o.
  static void adopt(T* u, std::size_t count, T sum, T mx, T& m, T& l, T* o, std::size_t dvp) {
    if (!(mx > m)) {
      l += sum;
      return;
    }
    const T correction = exp(batch(m - mx)).get(0);
    const batch vc(correction);
    for (std::size_t j = 0; j < count; j += W) (batch::load_aligned(u + j) * vc).store_aligned(u + j);
    for (std::size_t c = 0; c < dvp; c += W) (batch::load_aligned(o + c) * vc).store_aligned(o + c);
    l = (l + sum) * correction;
    m = mx;
  }

  // The weights of a whole row (decoding): returns its maximum and sets its sum.
  static T whole_row(T* u, std::size_t count, T a, T& l) {
    const std::size_t padded = round_up(count, W);
    for (std::size_t j = count; j < padded; ++j) u[j] = neg_inf;
    const T mx = block_max(u, padded, a, neg_inf);
    l = exponentiate(u, padded, a, mx == neg_inf ? T(0) : mx);
    return mx;
  }

  // out = o / l, a vector at a time (o and out may be the same).
  static void finish(const T* o, T l, T* out, std::size_t dv) {
    // A fully masked row (l = 0) gives zeros; NaN stays NaN.
    if (l == T(0)) {
      std::fill_n(out, dv, T(0));
      return;
    }
    const T inv = T(1) / l;
    std::size_t c = 0;
    for (; c + W <= dv; c += W) (batch::load_unaligned(o + c) * batch(inv)).store_unaligned(out + c);
    for (; c < dv; ++c) out[c] = o[c] * inv;
  }
};

}  // namespace qkv::kernels
