// The fused backward of attention_problem.hpp's attention, FlashAttention-2's:
// the weights are recomputed block by block from Q, K and each row's maximum
// m and sum l that the forward kept, P = exp(s − m) / l (the log-sum-exp
// L = m + log l, kept apart), and never stored whole. For a BQ × BK tile of queries i and keys j, with D_i = Σ_c dO_ic O_ic:
//   dV_j += Pᵀ dO_i,  dP = dO_i V_jᵀ,  dS = P ∘ (dP − D_i),
//   dK_j += a dSᵀ Q_i,  dQ_i += a dS K_j      (a: the score's scale)
// The split that needs no atomics: a key block's dK and dV are sums over the
// query blocks, in their order, on one thread (key_group); a query block's dQ
// is a sum over the key blocks, in their order (query_block, or key_group
// on one thread, which computes the same tiles and sums them in the same
// order). Either way every sum runs in one fixed order, so the result does
// not depend on the threads.
//
// Layouts, all packed once per call (prepare): K and V as the score tile's B
// operands (Kᵀ, Vᵀ panels), K again as the B operand of dS K, and Qᵀ and
// dOᵀ as rows, the A operands of the products that sum over queries. dK and
// dV are summed transposed (dk × m, dv × m), so that a tile's P and dS,
// packed as B operands, serve both; finish() writes them out.
//
// With a score modifier f (an extension, instantiated in the user's unit by
// attention_backward_with.hpp), dS is multiplied by f′ at each score, which
// the modifier gives when called on dual numbers; a predicate masks and
// skips tiles as in the forward. With a similarity term t, the scores come
// from the term tile, and dK and dQ are sums of dS times t's partial
// derivatives instead of products (term_backward.hpp). A term with
// weights of its own, w_c·t(q_c, k_c) (additive's w), has their gradient
// Σ_ij dS_ij t(q_ic, k_jc) summed beside dK, one row of sums per key group,
// added in the groups' order at the end: no order that depends on threads.
//
// A weight of 0 (a masked key, a row that sees nothing) gives dS = 0
// exactly, and must not read what it weighs: a key or query row that is not
// finite (a padded cache) is 0 in the copies that dQ and dK sum, since any
// row that sees it has non-finite scores, and its gradients are NaN anyway.
// A value row is read only through dP, whose entries P = 0 discards.
#pragma once

#include "arch_traits.hpp"
#include "attention_problem.hpp"
#include "blocking.hpp"
#include "online_softmax.hpp"
#include "prefetch.hpp"
#include "register_tile.hpp"
#include "row_dot.hpp"
#include "score_transform.hpp"
#include "term_backward.hpp"
#include "term_tile.hpp"
#include "transpose.hpp"

#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>

namespace qkv::kernels {

template <class Arch, class T, class Ext, blocking B>
struct attention_backward_kernel {
  using tile = register_tile<Arch, T>;
  using batch = typename tile::batch;
  using scores = score_transform<Arch, T, Ext>;
  using softmax = online_softmax<Arch, T>;
  using traits = typename scores::traits;
  using terms = term_tile<Arch, T, Ext>;
  static constexpr std::size_t W = tile::W, MR = tile::MR, NR = tile::NR;
  static constexpr std::size_t BQ = B.query_rows;                 // queries in a tile
  static constexpr std::size_t BK =                              // keys in a tile
      B.max_key_block < blocking::round_up(other_blocks::backward_keys, NR) ? B.max_key_block
                                                                           : blocking::round_up(other_blocks::backward_keys, NR);
  using term_grads = term_backward<Arch, T, Ext, BQ, BK>;
  static_assert(B.valid() && B.lanes == W && B.tile_rows == MR, "qkv: internal: blocking of another instruction set");

  static constexpr std::size_t min(std::size_t a, std::size_t b) { return a < b ? a : b; }
  static constexpr std::size_t aligned(std::size_t x) { return B.aligned(x); }
  static constexpr std::size_t up(std::size_t x, std::size_t to) { return blocking::round_up(x, to); }

  static constexpr std::size_t query_blocks(std::size_t n) { return (n + BQ - 1) / BQ; }
  static constexpr std::size_t key_blocks(std::size_t m) { return (m + BK - 1) / BK; }

  // The row stride of a matrix stored transposed, for count queries or keys:
  // one cache line more than a multiple of 64 bytes, so that the rows a tile
  // reads at once (4 KiB apart for 1024 floats) do not all fall in one set
  // of the L1 cache.
  static constexpr std::size_t ld(std::size_t count) { return aligned(count) + aligned(1); }

  // The shared buffer's parts, in order.
  struct parts {
    std::size_t kt, vt, kp, kz, qt, dot, delta, dkt, dvt, tw, dqt, end;
    std::size_t n_ld, m_ld;  // row strides of qt and dot, of dkt and dvt
  };
  static constexpr parts layout(std::size_t n, std::size_t m, std::size_t dk, std::size_t dv) {
    parts x{};
    x.n_ld = ld(n), x.m_ld = ld(m);
    x.kt = 0;
    x.vt = x.kt + aligned(up(m, NR) * dk);
    x.kp = x.vt + aligned(up(m, NR) * dv);
    // A user's term reads K as the score tile does (kt), and its
    // derivatives a copy with the keys that are not finite zeroed (kz);
    // the dot product reads kp instead.
    x.kz = x.kp + (traits::has_term ? 0 : aligned(m * up(dk, NR)));
    x.qt = x.kz + (traits::has_term ? aligned(up(m, NR) * dk) : 0);
    x.dot = x.qt + dk * x.n_ld;
    x.delta = x.dot + dv * x.n_ld;
    x.dkt = x.delta + aligned(n);
    x.dvt = x.dkt + dk * x.m_ld;
    x.tw = x.dvt + dv * x.m_ld;  // the term's weights: dk sums per key group
    x.dqt = x.tw + (traits::has_term_weight ? key_groups(m, dk, dv) * dk : 0);
    x.end = x.dqt + (traits::has_term ? dk * x.n_ld : 0);  // a term's dQ, summed transposed
    return x;  // (then a modifier's table sums, tables_size per key group: table_sums)
  }
  static constexpr std::size_t shared_size(std::size_t n, std::size_t m, std::size_t dk, std::size_t dv) {
    return layout(n, m, dk, dv).end;
  }
  // With the sums of tables_size table entries per key group.
  static constexpr std::size_t shared_size(std::size_t n, std::size_t m, std::size_t dk, std::size_t dv,
                                           std::size_t tables_size) {
    return layout(n, m, dk, dv).end + key_groups(m, dk, dv) * tables_size;
  }
  // Key group kg's sums of the gradients of the tables a modifier reads.
  static T* table_sums(const attention_problem<T>& p, const attention_gradient<T>& g, T* shared, std::size_t kg) {
    const std::size_t m = p.k.rows, dk = p.q.cols, dv = p.v.cols;
    return shared + layout(p.q.rows, m, dk, dv).end + kg * g.tables_size;
  }
  // A tile's scores or weights, dP or dS, and P and dS packed (or, with a
  // term, dS transposed, rows of up(BQ, NR) queries): per thread.
  static constexpr std::size_t scratch_size() { return 3 * aligned(BQ * BK) + aligned(BK * up(BQ, NR)); }

  // Packs the operands, computes D, and zeroes the sums (dQ's too).
  static void prepare(const attention_problem<T>& p, const attention_gradient<T>& g, T* shared) {
    const std::size_t n = p.q.rows, m = p.k.rows, dk = p.q.cols, dv = p.v.cols;
    const parts x = layout(n, m, dk, dv);
    tile::pack_transposed(p.k.data, p.k.row_stride, p.k.col_stride, m, dk, shared + x.kt);
    tile::pack_transposed(p.v.data, p.v.row_stride, p.v.col_stride, m, dv, shared + x.vt);
    if constexpr (traits::has_term) {
      T* kz = shared + x.kz;
      for (std::size_t e = 0; e < up(m, NR) * dk; ++e) kz[e] = shared[x.kt + e];
      for (std::size_t j = 0; j < m; ++j)
        if (!finite_row(p.k.ptr(j, 0), p.k.col_stride, dk))
          for (std::size_t c = 0; c < dk; ++c) kz[j / NR * NR * dk + c * NR + j % NR] = T(0);
    } else {
      tile::pack(p.k.data, p.k.row_stride, p.k.col_stride, m, dk, shared + x.kp);
      T* kp = shared + x.kp;
      for (std::size_t j = 0; j < m; ++j)
        if (!finite_row(p.k.ptr(j, 0), p.k.col_stride, dk))
          for (std::size_t c = 0; c < dk; ++c) kp[c / NR * NR * m + j * NR + c % NR] = T(0);
    }
    T* qt = shared + x.qt;
    T* delta = shared + x.delta;
    transpose_of(p.q, shared + x.qt, x.n_ld);
    transpose_of(g.d_out, shared + x.dot, x.n_ld);
    for (std::size_t i = 0; i < n; ++i) {
      if (!finite_row(p.q.ptr(i, 0), p.q.col_stride, dk))
        for (std::size_t c = 0; c < dk; ++c) qt[c * x.n_ld + i] = T(0);
      delta[i] = row_dot<Arch>(g.d_out.ptr(i, 0), g.d_out.col_stride, g.out.ptr(i, 0), g.out.col_stride, dv);
    }
    std::fill(shared + x.dkt, shared + x.end, T(0));
    if constexpr (traits::has_tables)
      if (g.d_tables != nullptr) std::fill_n(table_sums(p, g, shared, 0), key_groups(m, dk, dv) * g.tables_size, T(0));
    if constexpr (!traits::has_term)
      for (std::size_t i = 0; i < n; ++i) {
        if (g.dq.col_stride == 1) std::fill_n(g.dq.ptr(i, 0), dk, T(0));
        else for (std::size_t c = 0; c < dk; ++c) g.dq(i, c) = T(0);
      }
  }

  // Key blocks go in groups whose packed K and V and sums of dK and dV stay
  // in L2 together, so that dQ's rows, summed into once per tile, are
  // fetched once per group rather than once per key block. A group takes
  // the L2 share, and up to twice it (512 KiB: all of a Zen 3 core's L2,
  // half of a Zen 4's) while at least four groups remain: at d = 128 that
  // is three key blocks rather than one, which took 0.86–0.96 of the time
  // at T = 4096 and 8192 on Zen 3. One head on several threads splits its
  // groups among them, so small T keeps small groups. The size depends on
  // the shape alone, never on the threads: a term's weight sums are kept
  // per group.
  static constexpr std::size_t group_blocks(std::size_t m, std::size_t dk, std::size_t dv) {
    const std::size_t per_block = BK * (3 * dk + 2 * dv), at_least = 4;
    const std::size_t share = B.l2_elements / (per_block == 0 ? 1 : per_block);
    const std::size_t most = 2 * B.l2_elements / (per_block == 0 ? 1 : per_block);
    const std::size_t spread = key_blocks(m) / at_least;
    const std::size_t fit = share > spread ? share : (most < spread ? most : spread);
    return fit < 1 ? 1 : fit;
  }
  static constexpr std::size_t key_groups(std::size_t m, std::size_t dk, std::size_t dv) {
    const std::size_t g = group_blocks(m, dk, dv);
    return (key_blocks(m) + g - 1) / g;
  }

  // dK and dV of the key blocks of group kg, over every query block that sees
  // them; dQ too when with_dq (one thread: then no query_block is run).
  static void key_group(const attention_problem<T>& p, const attention_gradient<T>& g, T* shared, std::size_t kg,
                        T* scratch, bool with_dq, const Ext& ext) {
    const std::size_t n = p.q.rows, m = p.k.rows, per = group_blocks(m, p.q.cols, p.v.cols);
    const std::size_t kb1 = min((kg + 1) * per, key_blocks(m));
    group_sums sums;
    if constexpr (traits::has_term_weight)
      if (g.d_term_weight != nullptr) sums.weights = shared + layout(n, m, p.q.cols, p.v.cols).tw + kg * p.q.cols;
    if constexpr (traits::has_tables)
      if (g.d_tables != nullptr) sums.tables = table_sums(p, g, shared, kg);
    for (std::size_t qb = 0; qb < query_blocks(n); ++qb) {
      const std::size_t i0 = qb * BQ, br = min(BQ, n - i0);
      for (std::size_t kb = kg * per; kb < kb1; ++kb) {
        const std::size_t j0 = kb * BK, bc = min(BK, m - j0);
        if (visible(p, ext, i0, br, j0, bc))
          pair(p, g, shared, i0, br, j0, bc, scratch, true, with_dq, sums, ext, kb + 1 == kb1 ? i0 + BQ : n);
      }
    }
  }

  // dQ of query block qb, over every key block it sees.
  static void query_block(const attention_problem<T>& p, const attention_gradient<T>& g, T* shared, std::size_t qb,
                          T* scratch, const Ext& ext) {
    const std::size_t n = p.q.rows, m = p.k.rows, i0 = qb * BQ, br = min(BQ, n - i0);
    for (std::size_t kb = 0; kb < key_blocks(m); ++kb) {
      const std::size_t j0 = kb * BK, bc = min(BK, m - j0);
      if (visible(p, ext, i0, br, j0, bc)) pair(p, g, shared, i0, br, j0, bc, scratch, false, true, group_sums{}, ext, n);
    }
  }

  // dK and dV out of their transposed sums (a term's dQ too); the term's
  // weights', group by group.
  static void finish(const attention_problem<T>& p, const attention_gradient<T>& g, const T* shared) {
    const std::size_t n = p.q.rows, m = p.k.rows, dk = p.q.cols, dv = p.v.cols;
    const parts x = layout(n, m, dk, dv);
    if constexpr (traits::has_term) transpose_to(shared + x.dqt, x.n_ld, g.dq);
    transpose_to(shared + x.dkt, x.m_ld, g.dk);
    transpose_to(shared + x.dvt, x.m_ld, g.dv);
    if constexpr (traits::has_term_weight) {
      if (g.d_term_weight != nullptr)
        for (std::size_t c = 0; c < dk; ++c) {
          T sum = T(0);
          for (std::size_t kg = 0; kg < key_groups(m, dk, dv); ++kg) sum += shared[x.tw + kg * dk + c];
          g.d_term_weight[c] = sum;
        }
    }
    if constexpr (traits::has_tables) {
      if (g.d_tables != nullptr)
        for (std::size_t e = 0; e < g.tables_size; ++e) {
          T sum = T(0);
          for (std::size_t kg = 0; kg < key_groups(m, dk, dv); ++kg) sum += shared[x.end + kg * g.tables_size + e];
          g.d_tables[e] = sum;
        }
    }
  }

 private:
  // A key group's sums, where it keeps them: additive's weights', a
  // modifier's tables'.
  struct group_sums {
    T* weights = nullptr;
    T* tables = nullptr;
  };

  static typename term_grads::operands term_operands(T* shared, const parts& x, std::size_t dk) {
    return {shared + x.qt, x.n_ld, shared + x.kz, shared + x.dkt, x.m_ld, shared + x.dqt, dk};
  }

  // count values from row into L2 (the next tile's, kept out of L1's way).
  static void prefetch(const T* row, std::size_t count) { prefetch_bytes<1>(row, count * sizeof(T)); }

  static bool finite_row(const T* x, std::ptrdiff_t stride, std::size_t count) {
    // x·0 is NaN for ±∞ and NaN, and a NaN stays in the sum; a vector of
    // sums, not one chain of count dependent additions.
    std::size_t c = 0;
    T probe = T(0);
    if (stride == 1) {
      batch sums(T(0));
      for (; c + W <= count; c += W) sums = fmadd(batch::load_unaligned(x + c), batch(T(0)), sums);
      probe = xsimd::hadd(sums);
    }
    for (; c < count; ++c) probe += x[static_cast<std::ptrdiff_t>(c) * stride] * T(0);
    return probe == T(0);
  }

  // out[c·ld + i] = x(i, c): Q and dO as rows of Qᵀ and dOᵀ.
  static void transpose_of(const strided<const T>& x, T* out, std::size_t ld) {
    if (x.col_stride == 1 && x.row_stride >= 0) {
      transpose_matrix<Arch, T>(x.data, static_cast<std::size_t>(x.row_stride), x.rows, x.cols, out, ld);
    } else {
      for (std::size_t i = 0; i < x.rows; ++i)
        for (std::size_t c = 0; c < x.cols; ++c) out[c * ld + i] = x(i, c);
    }
  }
  // x(j, c) = sum[c·ld + j]: a sum kept transposed, written out.
  static void transpose_to(const T* sum, std::size_t ld, const strided<T>& x) {
    if (x.col_stride == 1 && x.row_stride >= 0) {
      transpose_matrix<Arch, T>(sum, ld, x.cols, x.rows, x.data, static_cast<std::size_t>(x.row_stride));
    } else {
      for (std::size_t j = 0; j < x.rows; ++j)
        for (std::size_t c = 0; c < x.cols; ++c) x(j, c) = sum[c * ld + j];
    }
  }

  static bool visible(const attention_problem<T>& p, const Ext& ext, std::size_t i0, std::size_t br, std::size_t j0,
                      std::size_t bc) {
    return scores::keeps_any(p, ext, i0, br, j0, bc);  // the causal and window bounds first
  }

  // One tile: queries [i0, i0 + br), keys [j0, j0 + bc).
  static void pair(const attention_problem<T>& p, const attention_gradient<T>& g, T* shared, std::size_t i0,
                   std::size_t br, std::size_t j0, std::size_t bc, T* scratch, bool with_dkdv, bool with_dq,
                   group_sums sums, const Ext& ext, std::size_t next) {
    const std::size_t n = p.q.rows, m = p.k.rows, dk = p.q.cols, dv = p.v.cols;
    const parts x = layout(n, m, dk, dv);
    const std::size_t bcp = up(bc, NR);
    // The rows of queries [next, next + BQ), which the next tile reads, are
    // fetched ahead a strip at a time by a group's last tile: the next tile
    // starts a new query block, whose rows would otherwise come from L3 as
    // the products wait.
    const std::size_t ahead = next < n ? min(BQ, n - next) : 0;
    T* s = scratch;                  // scores, then weights P (rows of BK)
    T* ds = s + aligned(BQ * BK);    // dP, then dS
    T* pp = ds + aligned(BQ * BK);   // P packed as a B operand
    T* dsp = pp + aligned(BQ * BK);  // dS packed alike

    // The keys each strip of MR rows sees (on the causal diagonal fewer than
    // bc, none above it), and for each panel of NR keys the first row that
    // sees any: past them, and before it, every weight is 0, and nothing is
    // computed or summed.
    std::size_t keys[BQ / MR] = {}, first[BK / NR] = {};
    for (std::size_t ir = 0; ir < br; ir += MR) {
      const std::size_t end = scores::key_end(p, i0 + min(ir + MR, br) - 1);
      keys[ir / MR] = end > j0 ? min(bc, end - j0) : 0;
    }
    for (std::size_t jr = 0; jr < bc; jr += NR) {
      std::size_t r = 0;
      while (r < br && scores::key_end(p, i0 + r) <= j0 + jr) ++r;
      first[jr / NR] = r;
    }

    // Scores and dP; rows past br read the last row again and are not used.
    for (std::size_t ir = 0; ir < br; ir += MR) {
      const T* q_rows[MR];
      const T* do_rows[MR];
      for (std::size_t r = 0; r < MR; ++r) {
        const std::size_t i = min(i0 + ir + r, n - 1);
        q_rows[r] = p.q.ptr(i, 0);
        do_rows[r] = g.d_out.ptr(i, 0);
      }
      for (std::size_t r = ir; r < min(ir + MR, ahead); ++r) {
        prefetch(p.q.ptr(next + r, 0), dk);
        prefetch(g.d_out.ptr(next + r, 0), dv);
        if (with_dq && !traits::has_term) prefetch(g.dq.ptr(next + r, 0), dk);
      }
      for (std::size_t jr = 0; jr < keys[ir / MR]; jr += NR) {
        if constexpr (traits::has_term) terms::run(ext, dk, q_rows, shared + x.kt + (j0 + jr) * dk, s + ir * BK + jr, BK, NR);
        else tile::template run<1>(dk, q_rows, shared + x.kt + (j0 + jr) * dk, s + ir * BK + jr, BK, MR, NR, false);
        tile::template run<1>(dv, do_rows, shared + x.vt + (j0 + jr) * dv, ds + ir * BK + jr, BK, MR, NR, false);
      }
    }
    // P = exp(s − L) and dS = a · P ∘ (dP − D), exactly 0 where P is.
    const T* delta = shared + x.delta;
    const batch zero(T(0)), va(p.scale);
    // With a modifier f: dS = a · f′ · P ∘ (dP − D), f′ at each score.
    alignas(64) T slope[traits::modifies ? BK : 1];
    // With tables (score_mod(S, f, P...)): the scores f saw, and G = P ∘ (dP − D).
    alignas(64) T pre[traits::has_tables ? BK : 1], gw[traits::has_tables ? BK : 1];
    for (std::size_t r = 0; r < br; ++r) {
      T* u = s + r * BK;
      T* d = ds + r * BK;
      const std::size_t count = keys[r / MR], counted = up(count, W);
      for (std::size_t j = counted; j < bcp; ++j) u[j] = d[j] = T(0);
      if (count == 0) continue;
      const T a = scores::template apply<traits::modifies>(p, i0 + r, j0, count, u, ext, slope,
                                                            traits::has_tables ? pre : nullptr);
      if constexpr (traits::modifies)
        for (std::size_t j = count; j < counted; ++j) slope[j] = T(0);
      for (std::size_t j = count; j < counted; ++j) u[j] = softmax::neg_inf;
      // P = exp(s − m) / l, as the forward weighs; a row that sees nothing
      // (m = −∞, l = 0) has weights exp(−∞) · 0 = 0.
      const T mx = g.row_stats[2 * (i0 + r)], l = g.row_stats[2 * (i0 + r) + 1];
      const batch vm(mx == softmax::neg_inf ? T(0) : mx), vinv(l == T(0) ? T(0) : T(1) / l), vd(delta[i0 + r]),
          vra(a);
      if (g.d_bias.data != nullptr) {  // dB = bias_scale·f′·P ∘ (dP − D), before d is overwritten
        const batch vb(p.bias_scale);
        T* db = g.d_bias.ptr(i0 + r, j0);
        for (std::size_t j = 0; j < counted; j += W) {
          const batch w = softmax::exp(fmsub(vra, batch::load_aligned(u + j), vm)) * vinv;
          batch dbj = vb * w * (batch::load_aligned(d + j) - vd);
          if constexpr (traits::modifies) dbj = dbj * batch::load_aligned(slope + j);
          alignas(64) T lanes[W];
          xsimd::select(w == zero, zero, dbj).store_aligned(lanes);
          for (std::size_t l = 0; l < W && j + l < count; ++l) db[j + l] = lanes[l];
        }
      }
      if constexpr (traits::has_tables) {
        if (sums.tables != nullptr) {
          for (std::size_t j = count; j < counted; ++j) pre[j] = T(0);
          for (std::size_t j = 0; j < counted; j += W) {
            const batch w = softmax::exp(fmsub(vra, batch::load_aligned(u + j), vm)) * vinv;
            xsimd::select(w == zero, zero, w * (batch::load_aligned(d + j) - vd)).store_aligned(gw + j);
          }
          table_slopes(ext, i0 + r, j0, counted, pre, gw, p.batch, p.head, sums.tables);
        }
      }
      for (std::size_t j = 0; j < counted; j += W) {
        const batch w = softmax::exp(fmsub(vra, batch::load_aligned(u + j), vm)) * vinv;
        batch dsj = va * w * (batch::load_aligned(d + j) - vd);
        if constexpr (traits::modifies) dsj = dsj * batch::load_aligned(slope + j);
        w.store_aligned(u + j);
        xsimd::select(w == zero, zero, dsj).store_aligned(d + j);
      }
    }
    if (with_dkdv) {
      // dVᵀ += dOᵀ P and dKᵀ += Qᵀ dS, both sums over the tile's queries.
      tile::pack(s, BK, 1, br, bc, pp);
      sum_over_queries(shared + x.dot, x.n_ld, i0, br, first, dv, pp, shared + x.dvt, x.m_ld, j0, bc, next, ahead);
      if constexpr (traits::has_term) {
        term_grads::keys(term_operands(shared, x, dk), i0, br, first, ds, j0, bc, sums.weights, ext, next, ahead);
      } else {
        tile::pack(ds, BK, 1, br, bc, dsp);
        sum_over_queries(shared + x.qt, x.n_ld, i0, br, first, dk, dsp, shared + x.dkt, x.m_ld, j0, bc, next, ahead);
      }
    }
    if constexpr (traits::has_term) {
      if (with_dq) term_grads::queries(term_operands(shared, x, dk), i0, br, keys, ds, dsp, j0, ext, next, ahead);
    } else if (with_dq) {
      // dQ += dS K, a sum over the tile's keys.
      for (std::size_t ir = 0; ir < br; ir += MR) {
        if (keys[ir / MR] == 0) continue;
        const T* rows[MR];
        for (std::size_t r = 0; r < MR; ++r) rows[r] = ds + min(ir + r, br - 1) * BK;
        for (std::size_t c = 0; c < dk; c += NR) {
          T* out = g.dq.ptr(i0 + ir, c);
          tile::template run<1>(keys[ir / MR], rows, shared + x.kp + c * m + j0 * NR, out, g.dq.row_stride, min(MR, br - ir),
                                min(NR, dk - c), true);
        }
      }
    }
  }

  // The tables' gradients from row i's keys [j0, j0 + count): G (gw) times
  // f's derivative in each entry read at the score f saw (pre), W keys at a
  // time, added in key order.
  static void table_slopes(const Ext& ext, std::size_t i, std::size_t j0, std::size_t count, const T* pre,
                           const T* gw, std::size_t b, std::size_t h, T* sums) {
    alignas(64) T lanes[W];
    for (std::size_t l = 0; l < W; ++l) lanes[l] = T(l);
    const batch iota = batch::load_aligned(lanes), vi(static_cast<T>(i)), zero(T(0));
    for (std::size_t j = 0; j < count; j += W) {
      const batch gj = batch::load_aligned(gw + j);
      if (xsimd::all(gj == zero)) continue;
      ext.add_table_slopes(batch::load_aligned(pre + j), vi, iota + batch(static_cast<T>(j0 + j)), b, h, gj, sums);
    }
  }

  // sum[0:d, j0:j0+bc] += A[0:d, i0:i0+br] · packed, for A stored d × n
  // (row stride n) and sum d × m (row stride m), both transposed; the panel
  // of keys jr from row first[jr / NR] of the tile on; A's columns [next,
  // next + ahead) fetched ahead for the next tile, a strip at a time.
  static void sum_over_queries(const T* a, std::size_t n, std::size_t i0, std::size_t br, const std::size_t* first,
                               std::size_t d, const T* packed, T* sum, std::size_t m, std::size_t j0, std::size_t bc,
                               std::size_t next, std::size_t ahead) {
    for (std::size_t c = 0; c < d; c += MR) {
      for (std::size_t r = c; ahead != 0 && r < min(c + MR, d); ++r) prefetch(a + r * n + next, ahead);
      for (std::size_t jr = 0; jr < bc; jr += NR) {
        const std::size_t r0 = first[jr / NR];
        if (r0 == br) continue;
        const T* rows[MR];
        for (std::size_t r = 0; r < MR; ++r) rows[r] = a + min(c + r, d - 1) * n + i0 + r0;
        T* out = sum + c * m + j0 + jr;
        tile::template run<1>(br - r0, rows, packed + jr * br + r0 * NR, out, static_cast<std::ptrdiff_t>(m),
                              min(MR, d - c), min(NR, bc - jr), true);
      }
    }
  }
};

}  // namespace qkv::kernels
