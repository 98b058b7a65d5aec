// The fused attention for many queries over bf16 K and V, with both products
// on bf16 pairs (bf16_pairs.hpp): the loop of attention_prefill.hpp, whose
// tiles take two bf16 multiply-adds per float lane and instruction where the
// CPU has AVX512-BF16. As in PyTorch's and oneDNN's bf16 attention, the
// weights are rounded to bf16 before their product with V; the scores, the
// online softmax and every sum stay in float.
//
// Q is float in the problem. Its values are used as bf16 only when the
// problem says Q was stored as bf16 (queries_in_storage_type; pack() checks
// that every value is one); for any other Q, pack() packs K and V as the
// float kernel does, whose blocks then run. So float queries keep float
// products; the choice is the problem's, never the thread's.
//
// Layout, in 32-bit words: K by panels of NR keys, word p of key j holding
// k(j, 2p) in its low half and k(j, 2p + 1) in its high half; V by panels of
// NR columns, word (jp, x) holding v(2jp, x) low and v(2jp + 1, x) high; odd
// ends padded with zeros. Both take at most the float layout's room, so the
// blocking's sizes serve both. The flag of each value row (1: not finite)
// gains 2 when the panels hold pairs.
#pragma once

#include "../storage/thread_scratch.hpp"
#include "../numeric/float16.hpp"
#include "attention_prefill.hpp"
#include "bf16_pairs.hpp"
#include "prefill_loop.hpp"

#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace qkv::kernels {

// The register tile of register_tile.hpp over pairs: c (+)= A·B with A's
// rows and B's panels in words of two bf16 values, kp words deep.
template <class Pairs, std::size_t MR>
struct bf16_pair_tile {
  using batch = typename Pairs::batch;
  using words = typename Pairs::words;
  using tile = register_tile<typename Pairs::arch, float>;
  static constexpr std::size_t W = batch::size, NR = 2 * W;

  [[gnu::noinline]] static void run(std::size_t kp, const std::uint32_t* const* a, const std::uint32_t* b, float* c,
                                    std::ptrdiff_t ldc, std::size_t mr, std::size_t nr, bool accumulate) {
    batch lo[MR], hi[MR];
    product(kp, a, b, lo, hi);
    tile::store(lo, hi, c, ldc, mr, nr, accumulate);
  }

  // A whole tile of scores, with its rows' maxima (register_tile::run_keeping_max).
  [[gnu::noinline]] static void run_keeping_max(std::size_t kp, const std::uint32_t* const* a, const std::uint32_t* b,
                                                float* c, std::ptrdiff_t ldc, float* maxima) {
    batch lo[MR], hi[MR];
    product(kp, a, b, lo, hi);
    tile::raise_maxima(lo, hi, maxima);
    tile::store(lo, hi, c, ldc, MR, NR, false);
  }

  [[gnu::always_inline]] static inline void product(std::size_t kp, const std::uint32_t* const* a, const std::uint32_t* b,
                                                    batch* lo, batch* hi) {
#pragma GCC unroll 8
    for (std::size_t r = 0; r < MR; ++r) lo[r] = hi[r] = batch(0.0f);
    for (std::size_t p = 0; p < kp; ++p) {
      const words b0 = words::load_aligned(b), b1 = words::load_aligned(b + W);
#pragma GCC unroll 8
      for (std::size_t r = 0; r < MR; ++r) {
        const words ar(a[r][p]);
        lo[r] = Pairs::dot(lo[r], ar, b0);
        hi[r] = Pairs::dot(hi[r], ar, b1);
      }
      b += NR;
    }
  }
};

template <class Pairs, blocking B = blocking_of<typename Pairs::arch, float>()>
struct attention_prefill_bf16 {
  using Arch = typename Pairs::arch;
  using float_prefill = attention_prefill<Arch, float, no_extension, B>;
  using scores = typename float_prefill::scores;
  // The weights are rounded to bf16 as they are made, so an exponential of
  // relative error 1.02·10⁻⁴ (softmax_exp.hpp's degree 3) moves them far less
  // than that rounding (2⁻⁹); ref::attention_bound_bf16_pairs counts both.
  using softmax = online_softmax<Arch, float, 3>;
  static constexpr std::size_t W = float_prefill::W, MR = float_prefill::MR, NR = float_prefill::NR;
  static constexpr std::size_t BR = B.query_rows, BC = B.max_key_block;
  using tile = bf16_pair_tile<Pairs, MR>;
  using batch = typename float_prefill::batch;
  static constexpr blocking sizes = B;
  static_assert(BC % (2 * W) == 0 && B.sum_chunk % 2 == 0, "qkv: internal: pairs straddle a key block");

  static constexpr std::size_t min(std::size_t a, std::size_t b) { return a < b ? a : b; }
  static constexpr std::size_t pairs(std::size_t x) { return (x + 1) / 2; }
  static std::uint32_t word(std::uint16_t lo, std::uint16_t hi) { return lo | (std::uint32_t(hi) << 16); }
  static std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }
  static float low(std::uint32_t w) { return std::bit_cast<float>(w << 16); }
  static float high(std::uint32_t w) { return std::bit_cast<float>(w & 0xffff0000u); }
  static std::uint16_t at(const bf16* row, std::size_t i, std::ptrdiff_t stride) {
    return row[static_cast<std::ptrdiff_t>(i) * stride].bits();
  }

  // Whether the products run on pairs: Q was stored as bf16, and every
  // query is a bf16 value (its low 16 bits zero).
  static bool takes(const attention_problem<float, bf16>& p) {
    if (p.k.rows == 0 || !p.queries_in_storage_type) return false;
    const strided<const float>& q = p.q;
    std::uint32_t low = 0;  // every query's low halves, or-ed (a loop the compiler vectorises)
    for (std::size_t i = 0; i < q.rows; ++i) {
      const float* row = q.ptr(i, 0);
      if (q.col_stride == 1)
        for (std::size_t c = 0; c < q.cols; ++c) low |= bits(row[c]);
      else
        for (std::size_t c = 0; c < q.cols; ++c) low |= bits(q(i, c));
    }
    return (low & 0xffffu) == 0;
  }

  static void pack(const attention_problem<float, bf16>& p, float* shared) {
    if (!takes(p)) return float_prefill::pack(p, shared);
    const std::size_t m = p.k.rows, dk = p.q.cols, dv = p.v.cols;
    auto* kw = reinterpret_cast<std::uint32_t*>(shared);
    auto* vw = reinterpret_cast<std::uint32_t*>(shared + B.packed_k_size(m, dk));
    float* flags = shared + B.packed_k_size(m, dk) + B.packed_v_size(m, dv);
    pack_keys(p.k, kw);
    pack_values(p.v, vw);
    // A row's largest exponent field is all ones where it holds ±∞ or NaN
    // (a maximum the compiler vectorises).
    for (std::size_t j = 0; j < m; ++j) {
      const bf16* row = p.v.ptr(j, 0);
      std::uint16_t most = 0;
      for (std::size_t c = 0; c < dv; ++c) most = std::max<std::uint16_t>(most, at(row, c, p.v.col_stride) & 0x7f80u);
      flags[j] = most == 0x7f80u ? 3.0f : 2.0f;
    }
  }

  static void blocks(const attention_problem<float>& p, const float* shared, std::size_t b0, std::size_t b1,
                     float* scratch) {
    for (std::size_t b = b0; b < b1; ++b) block(p, shared, b, scratch);
  }

  static void block(const attention_problem<float>& p, const float* shared, std::size_t b, float* scratch) {
    const std::size_t m = p.k.rows;
    const float* flags = shared + B.packed_k_size(m, p.q.cols) + B.packed_v_size(m, p.v.cols);
    if (m == 0 || flags[0] < 2.0f) return float_prefill::block(p, shared, b, scratch, no_extension{});
    prefill_loop<attention_prefill_bf16>::block(p, shared, b, scratch, no_extension{});
  }

  // The pair tiles, as prefill_loop.hpp asks of a tile policy.
  using value_type = float;
  using block_state = prefill_block<float, B>;
  struct packed {
    const std::uint32_t* kw;  // K by panels of NR keys, in pairs of columns
    const std::uint32_t* vw;  // V by panels of NR columns, in pairs of rows
    const float* flags;       // a flag a value row: 3 where it holds ±∞ or NaN, else 2
    std::uint32_t* qw;        // the block's queries as pairs, a row dkp words apart
    std::uint32_t* pw;        // the block's weights as pairs, a row BC / 2 words apart
    std::size_t m, dv;
  };
  // The packed K and V, and the block's queries as pairs (in the calling
  // thread's scratch, with room for the weights').
  static packed operands(const attention_problem<float>& p, const float* shared, std::size_t i0, std::size_t br) {
    const std::size_t m = p.k.rows, dk = p.q.cols, dv = p.v.cols, dkp = pairs(dk);
    const std::size_t q_words = blocking::round_up(BR * dkp, 16);
    std::uint32_t* qw = detail::thread_scratch<std::uint32_t, detail::scratch_slot::pair_words>(q_words + BR * BC / 2);
    for (std::size_t r = 0; r < br; ++r) {
      const float* q = p.q.ptr(i0 + r, 0);
      for (std::size_t c = 0; c < dk / 2; ++c) qw[r * dkp + c] = (bits(q[2 * c]) >> 16) | (bits(q[2 * c + 1]) & 0xffff0000u);
      if (dk % 2 != 0) qw[r * dkp + dkp - 1] = bits(q[dk - 1]) >> 16;
    }
    return {reinterpret_cast<const std::uint32_t*>(shared),
            reinterpret_cast<const std::uint32_t*>(shared + B.packed_k_size(m, dk)),
            shared + B.packed_k_size(m, dk) + B.packed_v_size(m, dv), qw, qw + q_words, m, dv};
  }

  static bool strip_scores(const attention_problem<float>& p, const packed& ops, const no_extension&, block_state& x,
                           std::size_t ir) {
    const std::size_t dkp = pairs(p.q.cols), first = x.first[ir / MR], keys = x.keys[ir / MR];
    const std::uint32_t* rows[MR];
    for (std::size_t r = 0; r < MR; ++r) rows[r] = ops.qw + min(ir + r, x.br - 1) * dkp;
    for (std::size_t jr = first; jr < keys; jr += NR) {
      float* c = x.s + ir * BC + jr;
      const std::uint32_t* panel = ops.kw + (x.j0 + jr) * dkp;
      if (jr + NR <= keys) tile::run_keeping_max(dkp, rows, panel, c, BC, x.maxima + ir * W);
      else tile::run(dkp, rows, panel, c, BC, MR, NR, false);
    }
    return false;
  }

  // Row r's weights, rounded to pairs as the softmax makes them (an odd
  // count's last pair ends in the padding, weight 0).
  static void step(const packed& ops, block_state& x, std::size_t r, std::size_t from, std::size_t count, float a,
                   float known_max, std::size_t known) {
    std::uint32_t* row_pairs = ops.pw + r * BC / 2 + from / 2;
    softmax::step(x.s + r * BC + from, count, a, x.row_m[r], x.row_l[r], x.o + r * x.dvp, x.dvp, known_max, known,
                  [row_pairs](std::size_t j, batch e0, batch e1, bool) { Pairs::round_pairs(e0, e1, row_pairs + j / 2); });
  }

  // A pair reads the value row after an odd count's last key too (its
  // weight 0, but 0·∞ is NaN): the rows checked include it.
  static void values(const packed& ops, block_state& x) {
    const std::size_t mp = pairs(ops.m);
    bool finite = true;
    for (std::size_t j = x.j0; j < min(ops.m, x.j0 + x.bc + x.bc % 2); ++j) finite = finite && ops.flags[j] == 2.0f;
    const std::uint32_t* vw = ops.vw + x.j0 / 2 * NR;
    if (finite) weigh_values(ops.pw, x.br, x.first, x.keys, vw, mp, x.o, x.dvp);
    else weigh_values_skipping_zeros(ops.pw, x.br, x.first, x.keys, vw, mp, x.o, ops.dv, x.dvp);
  }

 private:
  // K's rows read as 32-bit words are its pairs. With an even dk, a unit
  // column stride and rows on 4-byte boundaries the panels are therefore the
  // float kernel's packing of those words, by register transposes, which
  // move bits and never round (at T = 1024 the word-by-word packing was
  // about a tenth of a bf16 call); otherwise word by word.
  static void pack_keys(const strided<const bf16>& k, std::uint32_t* kw) {
    const std::size_t m = k.rows, dk = k.cols, dkp = pairs(dk);
    const std::ptrdiff_t cs = k.col_stride;
    if (dk % 2 == 0 && cs == 1 && k.row_stride % 2 == 0 && reinterpret_cast<std::uintptr_t>(k.data) % 4 == 0)
      return float_prefill::tile::pack_transposed(reinterpret_cast<const float*>(k.data), k.row_stride / 2, 1, m, dkp,
                                                  reinterpret_cast<float*>(kw));
    for (std::size_t j0 = 0; j0 < m; j0 += NR, kw += NR * dkp)
      for (std::size_t j = 0; j < NR; ++j) {
        if (j0 + j >= m) {
          for (std::size_t q = 0; q < dkp; ++q) kw[q * NR + j] = 0;
          continue;
        }
        const bf16* row = k.ptr(j0 + j, 0);
        for (std::size_t q = 0; q < dk / 2; ++q) kw[q * NR + j] = word(at(row, 2 * q, cs), at(row, 2 * q + 1, cs));
        if (dk % 2 != 0) kw[(dkp - 1) * NR + j] = word(at(row, dk - 1, cs), 0);
      }
  }

  // V's rows two by two, a panel's width at a time by Pairs::interleave.
  static void pack_values(const strided<const bf16>& v, std::uint32_t* vw) {
    const std::size_t m = v.rows, dv = v.cols, mp = pairs(m);
    const std::ptrdiff_t cs = v.col_stride;
    for (std::size_t c0 = 0; c0 < dv; c0 += NR, vw += NR * mp) {
      const std::size_t nc = min(NR, dv - c0);
      for (std::size_t q = 0; q < mp; ++q) {
        const bf16* r0 = v.ptr(2 * q, c0);
        const bf16* r1 = 2 * q + 1 < m ? v.ptr(2 * q + 1, c0) : nullptr;
        std::uint32_t* out = vw + q * NR;
        if (r1 != nullptr && nc == NR && cs == 1) {
          Pairs::interleave(r0, r1, out);
          continue;
        }
        for (std::size_t x = 0; x < nc; ++x) out[x] = word(at(r0, x, cs), r1 != nullptr ? at(r1, x, cs) : 0);
        for (std::size_t x = nc; x < NR; ++x) out[x] = 0;
      }
    }
  }

  // o += weights · values on the pair tile, in partial sums of at most
  // sum_chunk keys (attention_prefill's weigh_values). vw: the block's first
  // pair of value rows; mp: pairs of value rows in a panel.
  static void weigh_values(const std::uint32_t* pw, std::size_t br, const std::size_t* first, const std::size_t* keys,
                           const std::uint32_t* vw, std::size_t mp, float* o, std::size_t dvp) {
    const std::size_t most = keys[(br - 1) / MR];
    for (std::size_t jc = 0; jc < most; jc += B.sum_chunk) {
      for (std::size_t ir = 0; ir < br; ir += MR) {
        const std::size_t lo = jc > first[ir / MR] ? jc : first[ir / MR], hi = min(jc + B.sum_chunk, keys[ir / MR]);
        if (hi <= lo) continue;  // (lo is even: a panel boundary or a chunk's)
        const std::size_t kp = pairs(hi - lo);
        const std::uint32_t* rows[MR];
        for (std::size_t r = 0; r < MR; ++r) rows[r] = pw + min(ir + r, br - 1) * (BC / 2) + lo / 2;
        for (std::size_t c = 0; c < dvp; c += NR)
          tile::run(kp, rows, vw + c * mp + lo / 2 * NR, o + ir * dvp + c, static_cast<std::ptrdiff_t>(dvp),
                    min(MR, br - ir), NR, true);
      }
    }
  }

  // The same sums, one key at a time, reading no value row whose rounded
  // weight is 0: a block holding a value row that is not finite.
  static void weigh_values_skipping_zeros(const std::uint32_t* pw, std::size_t br, const std::size_t* first,
                                          const std::size_t* keys, const std::uint32_t* vw, std::size_t mp, float* o,
                                          std::size_t dv, std::size_t dvp) {
    for (std::size_t r = 0; r < br; ++r) {
      const std::uint32_t* u = pw + r * (BC / 2);
      for (std::size_t j = first[r / MR]; j < keys[r / MR]; ++j) {
        const float w = j % 2 == 0 ? low(u[j / 2]) : high(u[j / 2]);
        if (w == 0.0f) continue;
        for (std::size_t x = 0; x < dv; ++x) {
          const std::uint32_t vx = vw[(x / NR * NR) * mp + j / 2 * NR + x % NR];
          o[r * dvp + x] += w * (j % 2 == 0 ? low(vx) : high(vx));
        }
      }
    }
  }
};

}  // namespace qkv::kernels
