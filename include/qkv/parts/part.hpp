// An attention over part of a longer sequence: e's n queries are rows
// [row_origin, row_origin + n) of the whole sequence's N, its m keys rows
// [key_origin, key_origin + m) of the whole's M. Causal and windows align as
// over the whole (query i at key position row_origin + i + M − N), the user's
// functors see the whole's indices (i + row_origin, j + key_origin) and a
// key_aligned functor the whole's M − N. The parts' results, each with its
// rows' log-sum-exp, merge into the whole's (merge_rows below, merge in
// parts/lse.hpp): what splitting a sequence across processes needs
// (<qkv/mpi.hpp>). A sink counts in one part only.
#pragma once

#include "../expr/key_aligned.hpp"
#include "../kernels/key_bounds.hpp"
#include "../numeric/number_as.hpp"
#include "../eval/batched.hpp"
#include "../eval/cost.hpp"
#include "../eval/fused.hpp"
#include "../eval/slice.hpp"

#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <vector>

namespace qkv::detail {

struct sequence_part {
  std::size_t row_origin = 0, key_origin = 0;
  std::size_t rows = 0, keys = 0;  // N and M; both 0: the part is the whole
  bool sink = true;                // whether this part counts the softmax's sink
};

// The user's functors with the whole sequence's indices. Modifiers get them
// as values of the element type: exact in float up to 2²⁴ positions.
template <class Ext>
struct positioned_extension {
  Ext inner;
  std::size_t row0 = 0, key0 = 0;
  static constexpr bool empty = Ext::empty;

  template <class V>
    requires requires(const Ext& e, const V& v, std::size_t c) { e.term(v, v, c); }
  V term(const V& q, const V& k, std::size_t c) const {
    return inner.term(q, k, c);
  }
  template <class V>
    requires requires(const Ext& e, const V& v, std::size_t b) { e.modify(v, v, v, b, b); }
  V modify(const V& s, const V& i, const V& j, std::size_t b, std::size_t h) const {
    return inner.modify(s, i + number_as<V>(row0), j + number_as<V>(key0), b, h);
  }
  bool keep(std::size_t i, std::size_t j, std::size_t b, std::size_t h) const
    requires requires(const Ext& e) { e.keep(i, j, b, h); }
  {
    return inner.keep(i + row0, j + key0, b, h);
  }
  int keep_any(std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1, std::size_t b, std::size_t h) const
    requires requires(const Ext& e) { e.keep_any(i0, i1, j0, j1, b, h); }
  {
    return inner.keep_any(i0 + row0, i1 + row0, j0 + key0, j1 + key0, b, h);
  }
};

// The shift that aligns an n × m part's rows among its keys as the whole's
// (kernels::key_bounds::shift).
inline std::ptrdiff_t part_shift(std::size_t n, std::size_t m, const sequence_part& part) {
  if (part.rows == 0 && part.keys == 0) return 0;
  const auto whole = static_cast<std::ptrdiff_t>(part.keys) - static_cast<std::ptrdiff_t>(part.rows);
  return static_cast<std::ptrdiff_t>(part.row_origin) - static_cast<std::ptrdiff_t>(part.key_origin) + whole -
         (static_cast<std::ptrdiff_t>(m) - static_cast<std::ptrdiff_t>(n));
}

// Bounds b of n queries and m keys, as a part: aligned as the whole's, or,
// where positions place the whole's rows and keys, moved by the part's
// origins in the whole.
inline kernels::key_bounds part_bounds(kernels::key_bounds b, std::size_t n, std::size_t m, const sequence_part& part) {
  if (part.rows == 0 && part.keys == 0) return b;
  if (b.positioned) b.shift += static_cast<std::ptrdiff_t>(part.row_origin) - static_cast<std::ptrdiff_t>(part.key_origin);
  else b.shift = part_shift(n, m, part);
  return b;
}

// The problem and functors of e as a part: its alignment shifted to the
// whole's, key_aligned functors told the whole's shape (unless positions
// placed them).
template <class P, class Ext>
void place_part(P& p, Ext& ext, const sequence_part& part) {
  if (part.rows == 0 && part.keys == 0) return;
  p.bounds = part_bounds(p.bounds, p.q.rows, p.k.rows, part);
  if constexpr (requires { ext.mod_f; }) {
    if (ext.mod_f) place_functor(*ext.mod_f, part.rows, part.keys);
  }
  if constexpr (requires { ext.keep_f; }) {
    if (ext.keep_f) place_functor(*ext.keep_f, part.rows, part.keys);
  }
}

// e's fused attention as a part, into out (e's rows, batch index after batch
// index for a tensor, each row `row_stride` apart) and stats (each row's m
// and l, as attention_problem::row_stats).
template <class E, class T = compute_t<value_type_t<E>>>
void attention_part(const E& e, T* out, std::size_t row_stride, T* stats, const sequence_part& part) {
  using Ext = fused_extension_t<E>;
  const std::size_t n = e.rows(), dv = e.cols();
  std::vector<fused_operands_t<E>> keep;
  std::vector<fused_problem_t<E>> problems;
  std::optional<Ext> ext;
  const auto add = [&](const auto& s, std::size_t k) {
    Ext mine;
    problems.push_back(attention_problem_of<best_policy>(s, kernels::strided<T>{out + k * n * row_stride, n, dv, static_cast<std::ptrdiff_t>(row_stride), 1},
                                                         keep[k], mine));
    problems.back().row_stats = stats + 2 * n * k;
    if (!part.sink) problems.back().sink = -std::numeric_limits<T>::infinity();
    place_part(problems.back(), mine, part);
    if (!ext) ext.emplace(std::move(mine));
  };
  if constexpr (is_batched_v<E>) {
    const batch_extents b = batch_of(e);
    keep.resize(b[0] * b[1]);
    problems.reserve(b[0] * b[1]);
    for_each_batch_index(b, [&](batch_extents i) { add(slice(e, i), problems.size()); });
  } else {
    keep.resize(1);
    add(e, 0);
  }
  for (std::size_t k = 0; k < problems.size() * n; ++k) stats[2 * k] = -std::numeric_limits<T>::infinity(), stats[2 * k + 1] = T(0);
  if (!ext) return;
  // No value columns: the rows' statistics alone are asked for (the
  // normalisers). The kernels run on one column of zeros instead.
  using stored = std::remove_const_t<std::remove_pointer_t<decltype(problems[0].v.data)>>;
  static const stored zero{};
  std::vector<T> no_values(dv == 0 ? problems.size() * n : 0);
  if (dv == 0)
    for (std::size_t k = 0; k < problems.size(); ++k) {
      problems[k].v = {&zero, problems[k].k.rows, 1, 0, 1};
      problems[k].out = {no_values.data() + k * n, n, 1, 1, 1};
    }
  if constexpr (Ext::empty) {
    run_attention(problems.data(), problems.size(), *ext);
  } else if (part.rows == 0 && part.keys == 0) {
    run_attention(problems.data(), problems.size(), *ext);
  } else {
    run_attention(problems.data(), problems.size(), positioned_extension<Ext>{*ext, part.row_origin, part.key_origin});
  }
}

template <class E>
kernels::key_bounds part_bounds(const E& e, const sequence_part& part) {
  return part_bounds(chain_bounds(&e.lhs().arg()), e.rows(), e.lhs().cols(), part);
}

// Whether the causal and window bounds of e, as a part, leave any of its
// pairs visible: a part they empty need not be computed.
template <class E>
bool part_sees_any(const E& e, const sequence_part& part) {
  const std::size_t n = e.rows(), m = e.lhs().cols();
  return kernels::sees_any(part_bounds(e, part), n, m, 0, n, 0, m);
}

// How many of one batch index's pairs of e, as a part, the bounds leave
// visible (the work of computing it).
template <class E>
std::size_t part_pairs(const E& e, const sequence_part& part) {
  return kernels::visible_pairs(part_bounds(e, part), e.rows(), e.lhs().cols());
}

// The log-sum-exp of a row from its m and l.
template <class T>
T lse_of(T m, T l) {
  return l == T(0) ? -std::numeric_limits<T>::infinity() : m + std::log(l);
}

// One row of the attention over two disjoint key sets from each set's row
// (a, of log-sum-exp x; b, of y), d values, into out; returns the union's
// log-sum-exp. Each part weighs exp(L_part − max); one that weighs 0 is not
// read (anything, for a row it never saw); both −∞: zeros.
template <class T, class V, class A, class B>
T merge_rows(T x, const A& a, T y, const B& b, std::size_t d, V* out) {
  const T m = x > y ? x : y;
  if (m == -std::numeric_limits<T>::infinity()) {
    for (std::size_t c = 0; c < d; ++c) out[c] = V(0);
    return m;
  }
  const T wa = std::exp(x - m), wb = std::exp(y - m), s = wa + wb;
  for (std::size_t c = 0; c < d; ++c) {
    const T va = wa == T(0) ? T(0) : static_cast<T>(a(c)), vb = wb == T(0) ? T(0) : static_cast<T>(b(c));
    const T sum = wb == T(0) ? wa * va : wa == T(0) ? wb * vb : wa * va + wb * vb;
    out[c] = static_cast<V>(sum / s);
  }
  return m + std::log(s);
}

// The attention of a sequence's query rows over its keys, part by part:
// add(e, part) computes e (the same rows, some of the keys) as a part and
// merges it into what the parts so far gave. The order of the adds fixes
// the roundings; the same order gives the same bits.
template <class T>
struct part_accumulator {
  std::size_t rows = 0, cols = 0, count = 1;  // each batch index's rows × cols; batch indices
  std::vector<T> out, lse;                      // count·rows·cols and count·rows, batch index after batch index

  part_accumulator(std::size_t r, std::size_t c, std::size_t batches)
      : rows(r), cols(c), count(batches), out(r * c * batches, T(0)),
        lse(r * batches, -std::numeric_limits<T>::infinity()) {}

  // e's rows are rows [first, first + e.rows()) of each batch index's.
  template <class E>
  void add(const E& e, const sequence_part& part, std::size_t first = 0) {
    const std::size_t n = e.rows();
    if (n == 0) return;
    if (!part_sees_any(e, part)) {
      if (part.sink) add_sink(e, first);  // what the part would have counted
      return;
    }
    std::vector<T> o(n * cols * count), stats(2 * n * count);
    attention_part(e, o.data(), cols, stats.data(), part);
    for (std::size_t x = 0; x < count; ++x)
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t r = x * rows + first + i, k = x * n + i;
        T* acc = out.data() + r * cols;
        const T* mine = o.data() + k * cols;
        lse[r] = merge_rows(lse[r], [&](std::size_t c) { return acc[c]; }, lse_of(stats[2 * k], stats[2 * k + 1]),
                            [&](std::size_t c) { return mine[c]; }, cols, acc);
      }
  }

  // The softmax's sink of e alone, one more logit σ with a zero value: each
  // row merged with (σ, 0).
  template <class E>
  void add_sink(const E& e, std::size_t first) {
    std::vector<T> sinks;
    if constexpr (is_batched_v<E>) for_each_batch_index(batch_of(e), [&](batch_extents i) { sinks.push_back(slice(e, i).lhs().sink()); });
    else sinks.push_back(e.lhs().sink());
    for (std::size_t x = 0; x < count; ++x)
      for (std::size_t i = 0; i < e.rows(); ++i) {
        T* acc = out.data() + (x * rows + first + i) * cols;
        lse[x * rows + first + i] = merge_rows(lse[x * rows + first + i], [&](std::size_t c) { return acc[c]; }, sinks[x],
                                               [](std::size_t) { return T(0); }, cols, acc);
      }
  }
};

}  // namespace qkv::detail
