// The fused attention for a few queries (decoding): the m keys in fixed
// parts of decode_split, which a caller may spread over threads. For each
// part and each query, every score by vector dot products, W keys at a time
// in independent accumulators, then one pass of exp, then the value rows
// weighted and summed in registers, a few output vectors at a time: the
// part's row maximum, sum of exponentials and unnormalised output. K and V
// are read once, nothing is packed. The parts are then merged by their
// log-sum-exp in part order. The split never depends on the number of
// threads, so neither does the result; with one part (m ≤ decode_split) the
// merge only divides, as a single pass would.
//
// A value row whose weight is 0 (a key the row may not see) is never read.
// K and V may be stored as bf16 or f16 (S), converted as they stream past:
// decoding is bound by the bytes it reads.
#pragma once

#include "arch_traits.hpp"
#include "attention_problem.hpp"
#include "blocking.hpp"
#include "online_softmax.hpp"
#include "prefetch.hpp"
#include "row_dot.hpp"
#include "score_transform.hpp"

#include <xsimd/xsimd.hpp>

#include <cstddef>
#include <tuple>
#include <type_traits>

namespace qkv::kernels {

// Rows start, start + 1, ... of x in order, each address one add from the
// last; a paged x's first row of each page through its table
// (strided.hpp), so that reading K and V in place costs little more per row.
template <class S>
class row_walk {
 public:
  row_walk(const strided<const S>& x, std::size_t start) noexcept : x_(x), i_(start) {}
  // (An address, and a page's table entry, is found when its row is asked
  // for, never before.)
  const S* next() noexcept {
    if (at_ == nullptr || (x_.pages != nullptr && left_-- == 0)) {
      at_ = x_.ptr(i_, 0);
      left_ = x_.pages != nullptr ? x_.page_rows - 1 - i_ % x_.page_rows : 0;
    }
    const S* r = at_;
    ++i_, at_ += x_.row_stride;
    return r;
  }

 private:
  const strided<const S>& x_;
  std::size_t i_;
  const S* at_ = nullptr;
  std::size_t left_ = 0;  // a paged x: rows of this page after the current one
};

template <class Arch, class T, class Ext, blocking B>
struct attention_decode {
  using batch = xsimd::batch<T, Arch>;
  using scores_of = score_transform<Arch, T, Ext>;
  using softmax = online_softmax<Arch, T>;
  static constexpr std::size_t W = batch::size;
  static_assert(B.valid() && B.lanes == W, "qkv: internal: blocking of another instruction set");

  static constexpr std::size_t min(std::size_t a, std::size_t b) { return a < b ? a : b; }
  static constexpr std::size_t round_up(std::size_t x, std::size_t to) { return blocking::round_up(x, to); }
  static constexpr std::size_t aligned(std::size_t elements) { return B.aligned(elements); }
  static constexpr std::size_t part_size(std::size_t n, std::size_t dv) { return B.decode_part_size(n, dv); }

  // Part `part` of the keys (blocking::decode_parts), into part_out
  // (decode_part_size values); scratch holds decode_scratch_size.
  // With the user's functors (ext: a modifier, a predicate; the dot
  // product's scores), the modifier and the predicate apply to the scores,
  // and the keys a predicate hides at either end of the part, by its block
  // hint in stretches of blocking::mask_stretch, are not read.
  template <class S>
  static void part(const attention_problem<T, S>& p, std::size_t part, T* scratch, T* part_out, const Ext& ext = Ext{}) {
    const std::size_t n = p.q.rows, m = p.k.rows, dv = p.v.cols;
    const std::size_t j0 = part * B.decode_split, j1 = min(j0 + B.decode_split, m);
    T* u = scratch;
    T* leftover = u + aligned(round_up(min(m, B.decode_split), W));
    T* stats = part_out;
    const attention_problem<T> g = without_kv_data(p);
    for (std::size_t i = 0; i < n; ++i) {
      T* o = part_out + aligned(2 * n) + i * aligned(round_up(dv, W));
      for (std::size_t c = 0; c < round_up(dv, W); ++c) o[c] = T(0);
      T mx = softmax::neg_inf, l = T(0);
      std::size_t end = min(scores_of::key_end(g, i), j1), from = scores_of::key_begin(g, i);
      from = from > j0 ? from : j0;
      if constexpr (extension_traits<Ext, T>::keeps) {
        if (end > from) std::tie(from, end) = scores_of::kept_keys(g, ext, i, 1, from, end - from, B.mask_stretch);
      }
      if (end > from) {
        const std::size_t count = end - from;
        scores(p, p.q.ptr(i, 0), from, count, u);
        mx = softmax::whole_row(u, count, scores_of::apply(g, i, from, count, u, ext), l);
        weighted_sum(p, u, from, count, o, leftover);
      }
      stats[2 * i] = mx;
      stats[2 * i + 1] = l;
    }
  }

  // Combines `count` parts, laid out one after another, into p.out. Part q
  // weighs exp(m_q − M), M the largest part maximum; a part holding that
  // maximum weighs exactly 1. A part with a NaN maximum or sum makes its row
  // NaN; a row with nothing visible (every sum 0) gives zeros.
  static void merge(const attention_problem<T>& p, const T* parts, std::size_t count) {
    const std::size_t n = p.q.rows, dv = p.v.cols, size = part_size(n, dv);
    for (std::size_t i = 0; i < n; ++i) {
      T big = p.sink;  // a sink is one more part, of one score and no value
      for (std::size_t q = 0; q < count; ++q) {
        const T mq = parts[q * size + 2 * i];
        big = mq > big ? mq : big;
      }
      T* out = p.out.ptr(i, 0);
      for (std::size_t c = 0; c < dv; ++c) out[c] = T(0);
      T l = p.sink == softmax::neg_inf ? T(0) : p.sink == big ? T(1) : softmax::exp(batch(p.sink - big)).get(0);
      for (std::size_t q = 0; q < count; ++q) {
        const T* at = parts + q * size;
        const T mq = at[2 * i];
        const T w = mq == big ? T(1) : softmax::exp(batch(mq - big)).get(0);
        l += w * at[2 * i + 1];
        const T* o = at + aligned(2 * n) + i * aligned(round_up(dv, W));
        for (std::size_t c = 0; c < dv; ++c) out[c] += w * o[c];
      }
      softmax::finish(out, l, out, dv);
      if (p.row_stats != nullptr) p.row_stats[2 * i] = big, p.row_stats[2 * i + 1] = l;
    }
  }

 private:
  // u[j] = q · k_{j0+j} for j < count.
  template <class S>
  static void scores(const attention_problem<T, S>& p, const T* q, std::size_t j0, std::size_t count, T* u) {
    constexpr std::size_t KB = 8;  // keys whose dot products run side by side
    constexpr std::size_t K_AHEAD = 4 * KB;  // rows prefetched ahead
    const std::size_t dk = p.q.cols, body = dk - dk % W;
    const batch q_tail = load_tail<Arch, T>(q + body, 1, dk - body);
    std::size_t j = 0;
    if (p.k.col_stride == 1 && count >= KB) {
      row_walk<S> rows(p.k, j0), ahead(p.k, j0 + (count >= K_AHEAD + KB ? K_AHEAD : 0));
      for (; j + KB <= count; j += KB) {
        if (j + K_AHEAD + KB <= count)
          for (std::size_t t = 0; t < KB; ++t) prefetch_row(ahead.next(), dk * sizeof(S));
        batch acc[KB];
        const S* row[KB];
        for (std::size_t t = 0; t < KB; ++t) acc[t] = batch(T(0)), row[t] = rows.next();
        for (std::size_t c = 0; c < body; c += W) {
          const batch qc = batch::load_unaligned(q + c);
          for (std::size_t t = 0; t < KB; ++t) acc[t] = fmadd(qc, load(row[t] + c), acc[t]);
        }
        if (body < dk)  // the tail as row_dot takes it: a zero-padded vector, alike for every S
          for (std::size_t t = 0; t < KB; ++t)
            acc[t] = fmadd(q_tail, load_tail<Arch, T>(row[t] + body, 1, dk - body), acc[t]);
        // (Not xsimd::haddp: in xsimd 8.1 it permutes the lanes on AVX-512.)
        for (std::size_t t = 0; t < KB; ++t) u[j + t] = xsimd::hadd(acc[t]);
      }
    }
    for (; j < count; ++j) u[j] = row_dot<Arch>(q, 1, p.k.ptr(j0 + j, 0), p.k.col_stride, dk);
  }

  // o = Σ_j u_j v_{j0+j} over j < count, in partial sums of sum_chunk keys;
  // zero weights are skipped. o (round_up(dv, W) values) is zero on entry;
  // leftover holds dv values.
  template <class S>
  static void weighted_sum(const attention_problem<T, S>& p, const T* u, std::size_t j0, std::size_t count, T* o,
                           T* leftover) {
    const std::size_t dv = p.v.cols;
    std::size_t c0 = 0;
    constexpr std::size_t most = arch_traits<Arch>::vector_registers == 32 ? 8 : 4;  // vectors held in registers
    if (p.v.col_stride == 1) {
      if (dv > most * W) {
        c0 = streamed_columns(p, u, j0, count, o, leftover);
      } else {
        if constexpr (most == 8) c0 = weighted_columns<8>(p, u, j0, count, o, c0);
        c0 = weighted_columns<4>(p, u, j0, count, o, c0);
      }
      c0 = weighted_columns<1>(p, u, j0, count, o, c0);
    }
    if (c0 == dv) return;
    // Columns left over, element by element, through the same partial sums.
    for (std::size_t jc = 0; jc < count; jc += B.sum_chunk) {
      for (std::size_t c = c0; c < dv; ++c) leftover[c] = T(0);
      for (std::size_t j = jc; j < min(count, jc + B.sum_chunk); ++j)
        if (u[j] != T(0)) axpy(u[j], p.v.ptr(j0 + j, c0), p.v.col_stride, leftover + c0, dv - c0);
      for (std::size_t c = c0; c < dv; ++c) o[c] += leftover[c];
    }
  }

  // Wide rows, more vectors than the registers hold: each value row read
  // once, whole, its weighted vectors added to a partial sum kept in
  // `part` (L1) rather than in registers. Reading the rows once in order is
  // what decoding needs (it is bound by the bytes it reads): groups of
  // columns in registers read every row once per group. Returns the first
  // column not done.
  template <class S>
  static std::size_t streamed_columns(const attention_problem<T, S>& p, const T* u, std::size_t j0, std::size_t count,
                                      T* o, T* part) {
    const std::size_t body = p.v.cols - p.v.cols % W;
    row_walk<S> rows(p.v, j0);
    for (std::size_t jc = 0; jc < count; jc += B.sum_chunk) {
      for (std::size_t c = 0; c < body; c += W) batch(T(0)).store_unaligned(part + c);
      const std::size_t end = min(count, jc + B.sum_chunk);
      for (std::size_t j = jc; j < end;) {
        // Two rows at a time where both weigh something: half the trips
        // through `part`.
        if (j + 17 < count) {  // rows of this part only
          prefetch_row(p.v.ptr(j0 + j + 16, 0), p.v.cols * sizeof(S));
          prefetch_row(p.v.ptr(j0 + j + 17, 0), p.v.cols * sizeof(S));
        }
        const S* v0 = rows.next();
        if (j + 1 < end && u[j] != T(0) && u[j + 1] != T(0)) {
          const batch w0(u[j]), w1(u[j + 1]);
          const S* v1 = rows.next();
          for (std::size_t c = 0; c < body; c += W)
            fmadd(w1, load(v1 + c), fmadd(w0, load(v0 + c), batch::load_unaligned(part + c)))
                .store_unaligned(part + c);
          j += 2;
          continue;
        }
        if (u[j] != T(0)) {
          const batch w(u[j]);
          for (std::size_t c = 0; c < body; c += W)
            fmadd(w, load(v0 + c), batch::load_unaligned(part + c)).store_unaligned(part + c);
        }
        ++j;
      }
      for (std::size_t c = 0; c < body; c += W)
        (batch::load_aligned(o + c) + batch::load_unaligned(part + c)).store_aligned(o + c);
    }
    return body;
  }

  // Output columns [c0, …) in groups of NV vectors held in registers while
  // the value rows stream past; returns the first column not done.
  // Value rows prefetched ahead: the hardware's prefetch finds a value
  // stream again only after a few rows, and in a paged cache the stream
  // breaks at every page.
  static constexpr std::size_t V_AHEAD = 16;
  template <std::size_t NV, class S>
  static std::size_t weighted_columns(const attention_problem<T, S>& p, const T* u, std::size_t j0, std::size_t count,
                                      T* o, std::size_t c0) {
    for (; c0 + NV * W <= p.v.cols; c0 += NV * W) {
      batch acc[NV];
      for (std::size_t r = 0; r < NV; ++r) acc[r] = batch(T(0));
      row_walk<S> rows(p.v, j0), ahead(p.v, j0 + (count > V_AHEAD ? V_AHEAD : 0));
      for (std::size_t jc = 0; jc < count; jc += B.sum_chunk) {
        batch part[NV];
        for (std::size_t r = 0; r < NV; ++r) part[r] = batch(T(0));
        for (std::size_t j = jc; j < min(count, jc + B.sum_chunk); ++j) {
          if (j + V_AHEAD < count) prefetch_row(ahead.next() + c0, NV * W * sizeof(S));
          const S* vj = rows.next() + c0;
          if (u[j] == T(0)) continue;
          const batch w(u[j]);
          for (std::size_t r = 0; r < NV; ++r) part[r] = fmadd(w, load(vj + r * W), part[r]);
        }
        for (std::size_t r = 0; r < NV; ++r) acc[r] += part[r];
      }
      for (std::size_t r = 0; r < NV; ++r) acc[r].store_aligned(o + c0 + r * W);
    }
    return c0;
  }

  template <class S>
  static void axpy(T a, const S* x, std::ptrdiff_t xcs, T* y, std::size_t d) {
    std::size_t c = 0;
    const batch va(a);
    if (xcs == 1)
      for (; c + W <= d; c += W) fmadd(va, load(x + c), batch::load_unaligned(y + c)).store_unaligned(y + c);
    for (; c < d; c += W) {  // zero-padded vectors, alike for every S (row_dot.hpp)
      const std::size_t k = d - c < W ? d - c : W;
      alignas(64) T yt[W];
      const batch r = fmadd(va, load_tail<Arch, T>(x + static_cast<std::ptrdiff_t>(c) * xcs, xcs, k),
                            load_tail<Arch, T>(y + c, 1, k));
      r.store_aligned(yt);
      for (std::size_t l = 0; l < k; ++l) y[c + l] = yt[l];
    }
  }

  // Decoding waits on memory, and between the keys and the values of a part
  // the hardware's own prefetch has to find each stream again.
  static void prefetch_row(const void* row, std::size_t bytes) { prefetch_bytes(row, bytes); }

  template <class S>
  static batch load(const S* p) {
    return load_as<Arch, T>(p);
  }

  template <class S>
  static attention_problem<T> without_kv_data(const attention_problem<T, S>& p) {
    if constexpr (std::is_same_v<S, T>) return p;
    else return p.without_kv_data();
  }
};

}  // namespace qkv::kernels
