// Fused attention, O = softmax(S) V with S = scale·Q Kᵀ (+ bias, masks), in
// the FlashAttention-2 loop order: an outer loop over blocks of BR queries,
// an inner loop over blocks of BC keys. Per key block the BR×BC scores are
// computed on the register tile into a small buffer, turned into weights in
// place by an online softmax (running row maximum m and sum l; the output
// rescaled only when m grows), and multiplied into an unnormalised BR×dv
// output that is divided by l once at the end. No n×m buffer exists.
//
// K and V are packed once per call (O(m·d) extra memory, read by every query
// block); Q and the weights are read in place through row pointers. Key
// blocks past the causal diagonal, or emptied by the mask, are skipped. For
// a handful of queries (decoding) a GEMV-style loop reads K and V once, in
// fixed parts of the keys merged by their log-sum-exp.
#pragma once

#include "attention_problem.hpp"
#include "extension.hpp"
#include "register_tile.hpp"

#include <xsimd/xsimd.hpp>

#include <cstddef>
#include <limits>

namespace qkv::kernels {

// Ext adds what the notation's extension points ask for (extension.hpp):
// another similarity than the dot product, a score modifier, a predicate
// mask. The library's compiled kernels use none.
template <class Arch, class T, class Ext = no_extension>
struct attention_kernel {
  using tile = register_tile<Arch, T>;
  using arch_traits_of = arch_traits<Arch>;
  using batch = typename tile::batch;
  static constexpr std::size_t W = tile::W;
  static constexpr std::size_t MR = tile::MR;
  static constexpr std::size_t NR = tile::NR;
  // A BR×BC block of scores is at most 64 KiB in float: it stays in L2 beside
  // the packed keys and values it is computed from. BC is the most keys (up
  // to 256) whose packed K and V panels fit in about 256 KiB of L2, so it
  // shrinks for large heads: 256 for d_k + d_v ≤ 256 in float, 32 at 4096.
  static constexpr std::size_t BR = (64 + MR - 1) / MR * MR;
  static constexpr std::size_t BC = 256;  // the largest key block
  static constexpr std::size_t key_block(std::size_t dk, std::size_t dv) {
    const std::size_t fit = (262144 / sizeof(T)) / (dk + dv == 0 ? 1 : dk + dv) / NR * NR;
    return fit < NR ? NR : (fit > BC ? BC : fit);
  }
  static constexpr std::size_t sum_chunk = 128;
  // Up to this many queries, the GEMV-style path: packing K and V would cost
  // as much as the whole computation.
  static constexpr std::size_t decode_rows = 4;
  static constexpr T neg_inf = -std::numeric_limits<T>::infinity();

  static constexpr std::size_t round_up(std::size_t x, std::size_t to) { return (x + to - 1) / to * to; }
  static constexpr std::size_t min(std::size_t a, std::size_t b) { return a < b ? a : b; }
  static constexpr std::size_t aligned(std::size_t elements) { return round_up(elements, 64 / sizeof(T)); }

  // The work is split so that a caller can spread it over threads: pack()
  // fills the shared buffer (K and V, read by every query block) once; then
  // blocks() runs query blocks [b0, b1) with a scratch buffer of its own.
  // A block is computed the same way whoever runs it. With at most
  // decode_rows queries there is nothing to pack: the decode functions below
  // do it all, in parts of the keys that may be spread alike.
  static constexpr std::size_t block_rows() { return BR; }

  // K packed for the score tile and V for the output tile (any n), and a
  // query block's scores, output and row statistics.
  static constexpr std::size_t pack_size(std::size_t m, std::size_t dk, std::size_t dv) {
    return aligned(round_up(m, NR) * dk) + aligned(round_up(dv, NR) * m);
  }
  static constexpr std::size_t block_scratch_size(std::size_t dv) {
    return aligned(BR * BC) + aligned(BR * round_up(dv, NR)) + 2 * aligned(BR);
  }

  static constexpr std::size_t shared_size(std::size_t n, std::size_t m, std::size_t dk, std::size_t dv) {
    return n <= decode_rows ? 0 : pack_size(m, dk, dv);
  }

  static constexpr std::size_t scratch_size(std::size_t n, std::size_t m, std::size_t dv) {
    if (n <= decode_rows) return aligned(round_up(min(m, decode_split), W)) + aligned(round_up(dv, W));
    return block_scratch_size(dv);
  }

  static void pack(const attention_problem<T>& p, T* shared) {
    const std::size_t m = p.k.rows, dk = p.q.cols, dv = p.v.cols;
    tile::pack_transposed(p.k.data, p.k.row_stride, p.k.col_stride, m, dk, shared);
    tile::pack(p.v.data, p.v.row_stride, p.v.col_stride, m, dv, shared + pack_size(m, dk, 0));
  }

  static void blocks(const attention_problem<T>& p, const T* shared, std::size_t b0, std::size_t b1, T* scratch) {
    for (std::size_t b = b0; b < b1; ++b) query_block(p, shared, b * BR, scratch, Ext{});
  }

  // One query block with an extension object (its functors may hold state).
  static void block(const attention_problem<T>& p, const T* shared, std::size_t b, T* scratch, const Ext& ext) {
    query_block(p, shared, b * BR, scratch, ext);
  }

 public:
  // The last key (exclusive) that row i may see: all m, or i + (m − n) + 1 when causal.
  static std::size_t key_end(const attention_problem<T>& p, std::size_t i) {
    const std::size_t n = p.q.rows, m = p.k.rows;
    if (!p.causal) return m;
    const std::ptrdiff_t end = static_cast<std::ptrdiff_t>(i + m) - static_cast<std::ptrdiff_t>(n) + 1;
    return end <= 0 ? 0 : min(static_cast<std::size_t>(end), m);
  }

  // The scores of row i for keys [j0, j0 + count), raw q·k in u on entry.
  // Applies the bias and the masks; returns the factor a > 0 such that the
  // score is a·u (the scale is folded into the exponent when there is no bias).
  static T transform(const attention_problem<T>& p, std::size_t i, std::size_t j0, std::size_t count, T* u,
                     const Ext& ext = Ext{}) {
    T a = p.scale;
    if (p.bias.data != nullptr || p.col_bias.data != nullptr || !(p.scale > T(0)) || extension_traits<Ext, T>::modifies) {
      const batch vs(p.scale), vb(p.bias_scale);
      std::size_t j = 0;
      if (p.bias.data != nullptr) {
        const T* b = p.bias.ptr(i, j0);
        for (; j + W <= count; j += W)
          xsimd::fma(vs, batch::load_unaligned(u + j), vb * batch::load_unaligned(b + j)).store_unaligned(u + j);
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
      if constexpr (extension_traits<Ext, T>::modifies) modify(ext, i, j0, count, u);
      a = T(1);
    }
    const std::size_t end = key_end(p, i);
    for (std::size_t j = end > j0 ? end - j0 : 0; j < count; ++j) u[j] = neg_inf;
    if (p.mask.data != nullptr) {
      const bool* keep = p.mask.ptr(i, j0);
      for (std::size_t j = 0; j < count; ++j)
        if (!keep[j]) u[j] = neg_inf;
    }
    if constexpr (extension_traits<Ext, T>::keeps) {
      for (std::size_t j = 0; j < count; ++j) u[j] = ext.keep(i, j0 + j) ? u[j] : neg_inf;
    }
    return a;
  }


 public:
  // s ← f(s, i, j) over a row: W keys at a time on batches, the tail on scalars.
  static void modify(const Ext& ext, std::size_t i, std::size_t j0, std::size_t count, T* u) {
    alignas(64) T lanes[W];
    for (std::size_t l = 0; l < W; ++l) lanes[l] = T(l);
    const batch iota = batch::load_aligned(lanes), vi(static_cast<T>(i));
    std::size_t j = 0;
    for (; j + W <= count; j += W) {
      const batch vj = iota + batch(static_cast<T>(j0 + j));
      batch(ext.modify(batch::load_unaligned(u + j), vi, vj)).store_unaligned(u + j);
    }
    for (; j < count; ++j) u[j] = static_cast<T>(ext.modify(u[j], static_cast<T>(i), static_cast<T>(j0 + j)));
  }

  // Whether the predicate keeps any pair of the block (else it is skipped).
  // (Each row is OR-reduced without an early exit, which the compiler can
  // vectorise for a predicate of plain comparisons.)
  static bool predicate_keeps_any(const Ext& ext, std::size_t i0, std::size_t rows, std::size_t j0, std::size_t cols) {
    if constexpr (requires { ext.keep_any(i0, i0, j0, j0); }) {
      const int hint = ext.keep_any(i0, i0 + rows, j0, j0 + cols);
      if (hint >= 0) return hint != 0;
    }
    for (std::size_t r = 0; r < rows; ++r) {
      bool any = false;
      for (std::size_t j = 0; j < cols; ++j) any |= static_cast<bool>(ext.keep(i0 + r, j0 + j));
      if (any) return true;
    }
    return false;
  }

  // An MR×NR tile of scores Σ_c term(q_c, k_c) for a similarity of the
  // user's: the register tile's loop with the user's term for the FMA.
  static void term_tile(const Ext& ext, std::size_t dk, const T* const* a, const T* b, T* c, std::ptrdiff_t ldc,
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

 private:

  static T row_max(const T* u, std::size_t padded) {
    batch vmax(neg_inf);
    for (std::size_t j = 0; j < padded; j += W) vmax = xsimd::max(vmax, batch::load_aligned(u + j));
    alignas(64) T lanes[W];
    vmax.store_aligned(lanes);
    T mx = lanes[0];
    for (std::size_t j = 1; j < W; ++j) mx = lanes[j] > mx ? lanes[j] : mx;
    return mx;
  }

  // u ← exp(a·u − m) over `padded` values; returns their sum.
  static T exponentiate(T* u, std::size_t padded, T a, T m) {
    const batch va(a), vm(-m);
    batch s0(T(0)), s1(T(0));
    std::size_t j = 0;
    for (; j + 2 * W <= padded; j += 2 * W) {
      const batch e0 = xsimd::exp(xsimd::fma(va, batch::load_aligned(u + j), vm));
      const batch e1 = xsimd::exp(xsimd::fma(va, batch::load_aligned(u + j + W), vm));
      e0.store_aligned(u + j);
      e1.store_aligned(u + j + W);
      s0 += e0;
      s1 += e1;
    }
    for (; j < padded; j += W) {
      const batch e = xsimd::exp(xsimd::fma(va, batch::load_aligned(u + j), vm));
      e.store_aligned(u + j);
      s0 += e;
    }
    return xsimd::hadd(s0 + s1);
  }

  // One online-softmax step for a row: its running max m and sum l, its
  // unnormalised output o (dvp values), and the new scores u of one block.
  static void online_step(T* u, std::size_t count, T a, T& m, T& l, T* o, std::size_t dvp) {
    const std::size_t padded = round_up(count, W);
    for (std::size_t j = count; j < padded; ++j) u[j] = neg_inf;
    const T block_max = a * row_max(u, padded);
    const T m_new = block_max > m ? block_max : m;
    // A row with nothing visible yet keeps m = −∞; exp then sees −∞ − 0 = −∞
    // (weight 0) for masked scores and NaN for NaN ones, which must poison.
    const T m_safe = m_new == neg_inf ? T(0) : m_new;
    const T sum = exponentiate(u, padded, a, m_safe);
    if (m_new != m) {
      const T correction = xsimd::exp(batch(m - m_safe)).get(0);
      l *= correction;
      const batch vc(correction);
      for (std::size_t c = 0; c < dvp; c += W) (batch::load_aligned(o + c) * vc).store_aligned(o + c);
    }
    l += sum;
    m = m_new;
  }

  static void finish_row(const T* o, T l, T* out, std::size_t dv) {
    // A fully masked row (l = 0) gives zeros; NaN stays NaN.
    const T inv = l == T(0) ? T(0) : T(1) / l;
    for (std::size_t c = 0; c < dv; ++c) out[c] = l == T(0) ? T(0) : o[c] * inv;
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

  static void query_block(const attention_problem<T>& p, const T* shared, std::size_t i0, T* scratch, const Ext& ext) {
    const std::size_t n = p.q.rows, m = p.k.rows, dk = p.q.cols, dv = p.v.cols;
    const std::size_t dvp = round_up(dv, NR);
    const T* kp = shared;
    const T* vp = kp + pack_size(m, dk, 0);
    T* s = scratch;
    T* o = s + aligned(BR * BC);
    T* row_m = o + aligned(BR * dvp);
    T* row_l = row_m + aligned(BR);
    const std::size_t kb = key_block(dk, dv);
    const std::size_t br = min(BR, n - i0);
    for (std::size_t r = 0; r < br; ++r) row_m[r] = neg_inf, row_l[r] = T(0);
    for (std::size_t x = 0; x < BR * dvp; ++x) o[x] = T(0);
    const std::size_t j_end = key_end(p, i0 + br - 1);  // the last row sees the most keys

    for (std::size_t j0 = 0; j0 < j_end; j0 += kb) {
      const std::size_t bc = min(kb, j_end - j0);
      if (p.mask.data != nullptr && !mask_keeps_any(p, i0, br, j0, bc)) continue;
      if constexpr (extension_traits<Ext, T>::keeps) {
        if (!predicate_keeps_any(ext, i0, br, j0, bc)) continue;
      }

      // Scores of the block; rows past br read the last row again and are ignored.
      for (std::size_t ir = 0; ir < br; ir += MR) {
        const T* rows[MR];
        for (std::size_t r = 0; r < MR; ++r) rows[r] = p.q.ptr(min(i0 + ir + r, n - 1), 0);
        for (std::size_t jr = 0; jr < bc; jr += NR) {
          if constexpr (extension_traits<Ext, T>::has_term) {
            term_tile(ext, dk, rows, kp + (j0 + jr) * dk, s + ir * BC + jr, BC, NR);
          } else {
            tile::template run<1>(dk, rows, kp + (j0 + jr) * dk, s + ir * BC + jr, BC, MR, NR, false);
          }
        }
      }
      // Weights, in place.
      for (std::size_t r = 0; r < br; ++r) {
        T* u = s + r * BC;
        const T a = transform(p, i0 + r, j0, bc, u, ext);
        online_step(u, bc, a, row_m[r], row_l[r], o + r * dvp, dvp);
      }
      // Unnormalised output += weights · values, in partial sums of at most
      // sum_chunk keys, as the matrix product sums (its error grows with
      // the length of each sequential sum).
      for (std::size_t jc = 0; jc < bc; jc += sum_chunk) {
        const std::size_t kc = min(sum_chunk, bc - jc);
        for (std::size_t ir = 0; ir < br; ir += MR) {
          const T* rows[MR];
          for (std::size_t r = 0; r < MR; ++r) rows[r] = s + min(ir + r, br - 1) * BC + jc;
          for (std::size_t c = 0; c < dvp; c += NR)
            tile::template run<1>(kc, rows, vp + c * m + (j0 + jc) * NR, o + ir * dvp + c,
                                  static_cast<std::ptrdiff_t>(dvp), min(MR, br - ir), NR, true);
        }
      }
    }
    for (std::size_t r = 0; r < br; ++r) finish_row(o + r * dvp, row_l[r], p.out.ptr(i0 + r, 0), dv);
  }

  // A few queries (decoding): the m keys in fixed parts of decode_split,
  // which a caller may spread over threads. For each part and each query,
  // every score by vector dot products, W keys at a time in independent
  // accumulators, then one pass of exp, then the value rows weighted and
  // summed in registers, a few output vectors at a time: the part's row
  // maximum, sum of exponentials and unnormalised output. K and V are read
  // once, nothing is packed. The parts are then merged by their log-sum-exp
  // in part order. The split never depends on the number of threads, so
  // neither does the result; with one part (m ≤ decode_split) the merge
  // only divides, as a single pass would.
 public:
  static constexpr std::size_t decode_split = 1024;
  // Parts then cut no partial sum of sum_chunk keys, nor a group of the
  // keys whose scores are computed side by side.
  static_assert(decode_split % sum_chunk == 0 && decode_split % 8 == 0);

  // How many parts a problem of n queries and m keys is decoded in; 0 when
  // n is too large for decoding (pack() and blocks() do it).
  static constexpr std::size_t decode_parts(std::size_t n, std::size_t m) {
    if (n > decode_rows) return 0;
    return m == 0 ? 1 : (m + decode_split - 1) / decode_split;
  }

  // One part's results: for each query row its maximum and sum (stats), then
  // its unnormalised output, each row on its own aligned stretch.
  static constexpr std::size_t decode_part_size(std::size_t n, std::size_t dv) {
    return aligned(2 * n) + n * aligned(round_up(dv, W));
  }

  // Part `part` of the keys, into part_out (decode_part_size values).
  static void decode_part(const attention_problem<T>& p, std::size_t part, T* scratch, T* part_out) {
    const std::size_t n = p.q.rows, m = p.k.rows, dv = p.v.cols;
    const std::size_t j0 = part * decode_split, j1 = min(j0 + decode_split, m);
    T* u = scratch;
    T* leftover = u + aligned(round_up(min(m, decode_split), W));
    T* stats = part_out;
    for (std::size_t i = 0; i < n; ++i) {
      T* o = part_out + aligned(2 * n) + i * aligned(round_up(dv, W));
      for (std::size_t c = 0; c < round_up(dv, W); ++c) o[c] = T(0);
      T mx = neg_inf, l = T(0);
      const std::size_t end = min(key_end(p, i), j1);
      if (end > j0) {
        const std::size_t count = end - j0;
        scores(p, p.q.ptr(i, 0), j0, count, u);
        const T a = transform(p, i, j0, count, u);
        const std::size_t padded = round_up(count, W);
        for (std::size_t j = count; j < padded; ++j) u[j] = neg_inf;
        mx = a * row_max(u, padded);
        l = exponentiate(u, padded, a, mx == neg_inf ? T(0) : mx);
        weighted_sum(p, u, j0, count, o, leftover);
      }
      stats[2 * i] = mx;
      stats[2 * i + 1] = l;
    }
  }

  // Combines `count` parts, laid out one after another, into p.out. Part q
  // weighs exp(m_q − M), M the largest part maximum; a part holding that
  // maximum weighs exactly 1. A part with a NaN maximum or sum makes its row
  // NaN; a row with nothing visible (every sum 0) gives zeros.
  static void decode_merge(const attention_problem<T>& p, const T* parts, std::size_t count) {
    const std::size_t n = p.q.rows, dv = p.v.cols, size = decode_part_size(n, dv);
    for (std::size_t i = 0; i < n; ++i) {
      T big = neg_inf;
      for (std::size_t q = 0; q < count; ++q) {
        const T mq = parts[q * size + 2 * i];
        big = mq > big ? mq : big;
      }
      T* out = p.out.ptr(i, 0);
      for (std::size_t c = 0; c < dv; ++c) out[c] = T(0);
      T l = T(0);
      for (std::size_t q = 0; q < count; ++q) {
        const T* part = parts + q * size;
        const T mq = part[2 * i];
        const T w = mq == big ? T(1) : xsimd::exp(batch(mq - big)).get(0);
        l += w * part[2 * i + 1];
        const T* o = part + aligned(2 * n) + i * aligned(round_up(dv, W));
        for (std::size_t c = 0; c < dv; ++c) out[c] += w * o[c];
      }
      finish_row(out, l, out, dv);
    }
  }

  // Every part in order, into `parts` (decode_parts · decode_part_size
  // values), then the merge: the same result as the parts spread over threads.
  static void decode(const attention_problem<T>& p, T* scratch, T* parts) {
    const std::size_t count = decode_parts(p.q.rows, p.k.rows), size = decode_part_size(p.q.rows, p.v.cols);
    for (std::size_t q = 0; q < count; ++q) decode_part(p, q, scratch, parts + q * size);
    decode_merge(p, parts, count);
  }

 private:
  // u[j] = q · k_{j0+j} for j < count.
  static void scores(const attention_problem<T>& p, const T* q, std::size_t j0, std::size_t count, T* u) {
    constexpr std::size_t KB = 8;  // keys whose dot products run side by side
    const std::size_t dk = p.q.cols, body = dk - dk % W;
    std::size_t j = 0;
    if (p.k.col_stride == 1) {
      for (; j + KB <= count; j += KB) {
        batch acc[KB];
        for (std::size_t t = 0; t < KB; ++t) acc[t] = batch(T(0));
        for (std::size_t c = 0; c < body; c += W) {
          const batch qc = batch::load_unaligned(q + c);
          for (std::size_t t = 0; t < KB; ++t)
            acc[t] = xsimd::fma(qc, batch::load_unaligned(p.k.ptr(j0 + j + t, c)), acc[t]);
        }
        // (Not xsimd::haddp: in xsimd 8.1 it permutes the lanes on AVX-512.)
        for (std::size_t t = 0; t < KB; ++t) {
          T x = xsimd::hadd(acc[t]);
          for (std::size_t c = body; c < dk; ++c) x += q[c] * p.k(j0 + j + t, c);
          u[j + t] = x;
        }
      }
    }
    for (; j < count; ++j) u[j] = dot(q, p.k.ptr(j0 + j, 0), p.k.col_stride, dk);
  }

  // o = Σ_j u_j v_{j0+j} over j < count, in partial sums of sum_chunk keys;
  // zero weights (masked keys) are skipped. o (round_up(dv, W) values) is
  // zero on entry; leftover holds dv values.
  static void weighted_sum(const attention_problem<T>& p, const T* u, std::size_t j0, std::size_t count, T* o,
                           T* leftover) {
    const std::size_t dv = p.v.cols;
    std::size_t c0 = 0;
    if (p.v.col_stride == 1) {
      if constexpr (arch_traits_of::vector_registers == 32) c0 = weighted_columns<8>(p, u, j0, count, o, c0);
      c0 = weighted_columns<4>(p, u, j0, count, o, c0);
      c0 = weighted_columns<1>(p, u, j0, count, o, c0);
    }
    if (c0 == dv) return;
    // Columns left over, element by element, through the same partial sums.
    for (std::size_t jc = 0; jc < count; jc += sum_chunk) {
      for (std::size_t c = c0; c < dv; ++c) leftover[c] = T(0);
      for (std::size_t j = jc; j < min(count, jc + sum_chunk); ++j)
        if (u[j] != T(0)) axpy(u[j], p.v.ptr(j0 + j, c0), p.v.col_stride, leftover + c0, dv - c0);
      for (std::size_t c = c0; c < dv; ++c) o[c] += leftover[c];
    }
  }

  // Output columns [c0, …) in groups of NV vectors held in registers while
  // the value rows stream past; returns the first column not done.
  template <std::size_t NV>
  static std::size_t weighted_columns(const attention_problem<T>& p, const T* u, std::size_t j0, std::size_t count,
                                      T* o, std::size_t c0) {
    for (; c0 + NV * W <= p.v.cols; c0 += NV * W) {
      batch acc[NV];
      for (std::size_t r = 0; r < NV; ++r) acc[r] = batch(T(0));
      for (std::size_t jc = 0; jc < count; jc += sum_chunk) {
        batch part[NV];
        for (std::size_t r = 0; r < NV; ++r) part[r] = batch(T(0));
        for (std::size_t j = jc; j < min(count, jc + sum_chunk); ++j) {
          if (u[j] == T(0)) continue;
          const batch w(u[j]);
          const T* vj = p.v.ptr(j0 + j, c0);
          for (std::size_t r = 0; r < NV; ++r) part[r] = xsimd::fma(w, batch::load_unaligned(vj + r * W), part[r]);
        }
        for (std::size_t r = 0; r < NV; ++r) acc[r] += part[r];
      }
      for (std::size_t r = 0; r < NV; ++r) acc[r].store_aligned(o + c0 + r * W);
    }
    return c0;
  }

  static T dot(const T* q, const T* k, std::ptrdiff_t kcs, std::size_t d) {
    std::size_t c = 0;
    T tail = T(0);
    batch acc0(T(0)), acc1(T(0));
    if (kcs == 1) {
      for (; c + 2 * W <= d; c += 2 * W) {
        acc0 = xsimd::fma(batch::load_unaligned(q + c), batch::load_unaligned(k + c), acc0);
        acc1 = xsimd::fma(batch::load_unaligned(q + c + W), batch::load_unaligned(k + c + W), acc1);
      }
      for (; c + W <= d; c += W) acc0 = xsimd::fma(batch::load_unaligned(q + c), batch::load_unaligned(k + c), acc0);
    }
    for (; c < d; ++c) tail += q[c] * k[static_cast<std::ptrdiff_t>(c) * kcs];
    return xsimd::hadd(acc0 + acc1) + tail;
  }

  static void axpy(T a, const T* x, std::ptrdiff_t xcs, T* y, std::size_t d) {
    std::size_t c = 0;
    const batch va(a);
    if (xcs == 1)
      for (; c + W <= d; c += W)
        xsimd::fma(va, batch::load_unaligned(x + c), batch::load_unaligned(y + c)).store_unaligned(y + c);
    for (; c < d; ++c) y[c] += a * x[static_cast<std::ptrdiff_t>(c) * xcs];
  }
};

}  // namespace qkv::kernels
