// What the fused kernel may be given beyond an attention_problem: the
// functors of the notation's extension points. An extension object has any
// of
//   term(q, k, c)   a similarity's term for component c; the score is the sum
//                   of the terms over the components (the dot product's is q·k)
//   term_weight(q, k, c)  with term, when the term is w_c·t(q, k) for a
//                   weight w_c of its own: t's value (∂term/∂w_c), from
//                   which the backward sums the weights' gradient
//   modify(s, i, j, b, h)  a score modifier: the new score from the score,
//                   the query and key positions, and the slice's batch and
//                   head indices (attention_problem's batch and head)
//   keep(i, j, b, h)       a predicate mask: false excludes key j from query i
//   table_size(), add_table_slopes(s, i, j, b, h, g, sums)   with modify,
//                   when the modifier reads tables (score_mod(S, f, P...)):
//                   their entries in all, and sums[e] += g·∂f/∂P_e at s
// The first two are called on xsimd batches (W keys side by side, i and j as
// values of the element type) and on scalars; keep on std::size_t indices.
#pragma once

#include <cstddef>

namespace qkv::kernels {

struct no_extension {};

// Which of them an extension has, for element type T.
template <class Ext, class T>
struct extension_traits {
  static constexpr bool has_term = requires(const Ext& e, T x) { e.term(x, x, std::size_t(0)); };
  static constexpr bool has_term_weight = requires(const Ext& e, T x) { e.term_weight(x, x, std::size_t(0)); };
  static constexpr bool modifies = requires(const Ext& e, T x, std::size_t b) { e.modify(x, x, x, b, b); };
  static constexpr bool keeps = requires(const Ext& e, std::size_t i) { e.keep(i, i, i, i); };
  static constexpr bool has_tables = requires(const Ext& e) { e.table_size(); };
};

}  // namespace qkv::kernels
