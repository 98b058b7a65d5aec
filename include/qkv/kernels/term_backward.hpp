// A similarity term's share of the fused backward (attention_backward.hpp):
// with scores s_ij = Σ_c t(q_ic, k_jc, c), dK and dQ are sums of dS times
// t's partial derivatives rather than products. Each takes the register
// tile of the product it replaces, with the derivative in place of the
// other operand's value: for t = q·k the derivative is that value, and the
// loops are the products'. t is called on dual batches (numeric/dual.hpp),
// so no derivative is written by hand. A term with weights of its own,
// w_c·t(q_c, k_c) (additive's w), has their gradient Σ_ij dS_ij t(q_ic, k_jc)
// summed beside dK.
#pragma once

#include "blocking.hpp"
#include "extension.hpp"
#include "prefetch.hpp"
#include "register_tile.hpp"
#include "transpose.hpp"
#include "../numeric/dual.hpp"

#include <xsimd/xsimd.hpp>

#include <cstddef>

namespace qkv::kernels {

// BQ × BK: the backward's tile of queries by keys; dS comes in rows of BK.
template <class Arch, class T, class Ext, std::size_t BQ, std::size_t BK>
struct term_backward {
  using tile = register_tile<Arch, T>;
  using batch = typename tile::batch;
  using D = dual<batch>;
  static constexpr std::size_t W = tile::W, MR = tile::MR, NR = tile::NR;
  static constexpr std::size_t ldt = blocking::round_up(BQ, NR);  // a row of dS transposed
  static_assert(BK % NR == 0, "qkv: internal: a key block of whole panels");

  // What the kernel packed (prepare): Qᵀ (dk rows of stride n_ld), K as the
  // score tile reads it with the rows that are not finite zeroed (kz: NR
  // keys by dk components per panel), and the transposed sums of dK (dk ×
  // m_ld) and of dQ (dk × n_ld).
  struct operands {
    const T* qt;
    std::size_t n_ld;
    const T* kz;
    T* dkt;
    std::size_t m_ld;
    T* dqt;
    std::size_t dk;
  };

  static constexpr std::size_t min(std::size_t a, std::size_t b) { return a < b ? a : b; }

  // dKᵀ_cj += Σ_i dS_ij ∂t/∂k(q_ic, k_jc, c) over the tile's queries i0 +
  // [first[panel], br), keys j0 + [0, bc): sum_over_queries' register tile,
  // MR components by NR keys. With weight_sums, also weight_sums[c] +=
  // Σ_ij dS_ij ∂t/∂w_c. Qᵀ's columns [next, next + ahead) are fetched ahead.
  [[gnu::flatten]] static void keys(const operands& o, std::size_t i0, std::size_t br, const std::size_t* first,
                                    const T* ds, std::size_t j0, std::size_t bc, T* weight_sums, const Ext& ext,
                                    std::size_t next, std::size_t ahead) {
    if (weight_sums != nullptr) weights(o, i0, br, first, ds, j0, bc, weight_sums, ext);
    const batch one(T(1));
    const std::size_t dk = o.dk;
    for (std::size_t jr = 0; jr < bc; jr += NR) {
      const std::size_t r0 = first[jr / NR];
      if (r0 == br) continue;
      const T* panel = o.kz + (j0 + jr) * dk;
      for (std::size_t c0 = 0; c0 < dk; c0 += MR) {
        if (jr == 0)
          for (std::size_t r = c0; ahead != 0 && r < min(c0 + MR, dk); ++r)
            prefetch_bytes<1>(o.qt + r * o.n_ld + next, ahead * sizeof(T));
        // Components past dk repeat the last one and are not stored.
        // Batches, not duals, live across the loop: a dual made where it is
        // used is seen to be a constant or not, and its zeros fold away.
        std::size_t cs[MR];
        batch k0[MR], k1[MR], lo[MR], hi[MR];
        T* out[MR];
        for (std::size_t r = 0; r < MR; ++r) {
          cs[r] = min(c0 + r, dk - 1);
          k0[r] = batch::load_aligned(panel + cs[r] * NR);
          k1[r] = batch::load_aligned(panel + cs[r] * NR + W);
          out[r] = o.dkt + cs[r] * o.m_ld + j0 + jr;
          lo[r] = batch::load_unaligned(out[r]);
          hi[r] = batch::load_unaligned(out[r] + W);
        }
        for (std::size_t i = r0; i < br; ++i) {
          const batch d0 = batch::load_aligned(ds + i * BK + jr), d1 = batch::load_aligned(ds + i * BK + jr + W);
#pragma GCC unroll 8
          for (std::size_t r = 0; r < MR; ++r) {
            const D q(batch(o.qt[cs[r] * o.n_ld + i0 + i]));
            lo[r] = fmadd(d0, D(ext.term(q, D(k0[r], one), cs[r])).d, lo[r]);
            hi[r] = fmadd(d1, D(ext.term(q, D(k1[r], one), cs[r])).d, hi[r]);
          }
        }
        for (std::size_t r = 0; r < min(MR, dk - c0); ++r) {
          lo[r].store_unaligned(out[r]);
          hi[r].store_unaligned(out[r] + W);
        }
      }
    }
  }

  // dQ_ic += Σ_j dS_ij ∂t/∂q(q_ic, k_jc, c), as dQᵀ = Kᵀ dSᵀ on the register
  // tile: MR components by NR queries, summed over the keys, with dS
  // transposed once per tile (into dst, rows of ldt queries) and the
  // derivative in place of the key's value. Lanes are queries, so every
  // term's call has one component c. The sums go to dQᵀ a vector at a time,
  // but a block's last strip value by value: the next block's columns may
  // be another thread's. keys[strip] is how many keys each strip of MR rows
  // sees; the next block's columns of dQᵀ, [next, next + ahead), are fetched
  // ahead.
  [[gnu::flatten]] static void queries(const operands& o, std::size_t i0, std::size_t br, const std::size_t* keys,
                                       const T* ds, T* dst, std::size_t j0, const Ext& ext, std::size_t next,
                                       std::size_t ahead) {
    for (std::size_t c = 0; ahead != 0 && c < o.dk; ++c) prefetch_bytes<1>(o.dqt + c * o.n_ld + next, ahead * sizeof(T));
    std::size_t most = 0;
    for (std::size_t ir = 0; ir < br; ir += MR) most = keys[ir / MR] > most ? keys[ir / MR] : most;
    // dS transposed; rows past br, up to the strip's NR, are 0.
    transpose_matrix<Arch, T>(ds, BK, br, most, dst, ldt);
    for (std::size_t j = 0; j < most; ++j)
      for (std::size_t i = br; i < blocking::round_up(br, NR); ++i) dst[j * ldt + i] = T(0);
    for (std::size_t ir = 0; ir < br; ir += NR) {
      const std::size_t rows = min(NR, br - ir);
      std::size_t count = 0;  // the keys the strip's rows see
      for (std::size_t r = ir; r < ir + rows; r += MR) count = keys[r / MR] > count ? keys[r / MR] : count;
      count = keys[(ir + rows - 1) / MR] > count ? keys[(ir + rows - 1) / MR] : count;
      if (count == 0) continue;
      // A strip of W rows or fewer (66 = 4·16 + 2 with AVX2's blocks) takes
      // one vector: two would compute 16 lanes for 2 rows.
      if (rows > W) query_strip<2>(o, i0 + ir, rows, dst + ir, count, j0, ext);
      else query_strip<1>(o, i0 + ir, rows, dst + ir, count, j0, ext);
    }
  }

 private:
  // weight_sums[c] += Σ_ij dS_ij t(q_ic, k_jc) for a term w_c·t(q_ic, k_jc),
  // over the tile's panels in order. Padded and masked keys have dS = 0
  // and finite copies (kz), so they add 0.
  static void weights(const operands& o, std::size_t i0, std::size_t br, const std::size_t* first, const T* ds,
                      std::size_t j0, std::size_t bc, T* weight_sums, const Ext& ext) {
    if constexpr (extension_traits<Ext, batch>::has_term_weight) {
      for (std::size_t c = 0; c < o.dk; ++c) {
        batch acc(T(0));
        for (std::size_t jr = 0; jr < bc; jr += NR) {
          const T* panel = o.kz + (j0 + jr) * o.dk + c * NR;
          const batch k0 = batch::load_aligned(panel), k1 = batch::load_aligned(panel + W);
          for (std::size_t r = first[jr / NR]; r < br; ++r) {
            const batch q(o.qt[c * o.n_ld + i0 + r]);
            const T* d = ds + r * BK + jr;
            acc = fmadd(batch::load_aligned(d), ext.term_weight(q, k0, c), acc);
            acc = fmadd(batch::load_aligned(d + W), ext.term_weight(q, k1, c), acc);
          }
        }
        weight_sums[c] += xsimd::hadd(acc);
      }
    }
  }

  // queries' tile for queries [i0, i0 + rows), H vectors of them (rows ≤
  // H·W), dst their column of dSᵀ, over count keys from j0.
  template <std::size_t H>
  static void query_strip(const operands& o, std::size_t i0, std::size_t rows, const T* dst, std::size_t count,
                          std::size_t j0, const Ext& ext) {
    const batch one(T(1));
    const std::size_t dk = o.dk;
    alignas(64) T tail[MR * H * W];  // a last strip's queries, zero past rows
    alignas(64) T sums[H * W];
    for (std::size_t c0 = 0; c0 < dk; c0 += MR) {
      std::size_t cs[MR];
      batch q[H][MR], acc[H][MR];
      for (std::size_t r = 0; r < MR; ++r) {
        cs[r] = min(c0 + r, dk - 1);
        const T* row = o.qt + cs[r] * o.n_ld + i0;
        if (rows < H * W) {
          for (std::size_t i = 0; i < H * W; ++i) tail[r * H * W + i] = i < rows ? row[i] : T(0);
          row = tail + r * H * W;
        }
        for (std::size_t h = 0; h < H; ++h) q[h][r] = batch::load_unaligned(row + h * W), acc[h][r] = batch(T(0));
      }
      for (std::size_t jr = 0; jr < count; jr += NR) {
        const T* panel = o.kz + (j0 + jr) * dk;
        const T* d = dst + jr * ldt;
        for (std::size_t j = 0; j < min(NR, count - jr); ++j, ++panel, d += ldt) {
          batch ds[H];
          for (std::size_t h = 0; h < H; ++h) ds[h] = batch::load_aligned(d + h * W);
#pragma GCC unroll 8
          for (std::size_t r = 0; r < MR; ++r) {
            const D k = D(batch(panel[cs[r] * NR]));  // (not D k(batch(x)): a function declaration to clang)
            for (std::size_t h = 0; h < H; ++h) acc[h][r] = fmadd(ds[h], D(ext.term(D(q[h][r], one), k, cs[r])).d, acc[h][r]);
          }
        }
      }
      for (std::size_t r = 0; r < min(MR, dk - c0); ++r) {
        T* out = o.dqt + (c0 + r) * o.n_ld + i0;
        if (rows == H * W) {
          for (std::size_t h = 0; h < H; ++h) (batch::load_unaligned(out + h * W) + acc[h][r]).store_unaligned(out + h * W);
        } else {
          for (std::size_t h = 0; h < H; ++h) acc[h][r].store_aligned(sums + h * W);
          for (std::size_t i = 0; i < rows; ++i) out[i] += sums[i];
        }
      }
    }
  }
};

}  // namespace qkv::kernels
