// The fused strategy: recognises softmax(S) * V where S is a score chain,
// Q * transpose(K) (or another similarity) followed by any of: a scalar
// factor or divisor, causal, masked (one mask matrix, one predicate), + B or
// − B (one bias), one score_mod (on scores not yet masked). The chain is read into an
// attention_problem (pointers, strides and a description of the score
// post-operations) and handed to the fused kernel. Operands that are not
// storage (Q = X * Wq, say) are evaluated first, by the same policy.
#pragma once

#include "naive.hpp"

#include "../kernels/api.hpp"
#include "../kernels/attention_problem.hpp"
#include "../kernels/attention_with.hpp"
#include "../kernels/row_norms.hpp"
#include "naive_extensions.hpp"

#include <cstddef>
#include <optional>
#include <type_traits>

namespace qkv::detail {

// What a score chain is made of, while its operands are evaluated.
template <class T>
struct score_parts {
  operand<T> q, k, bias, col;
  long double scale = 1, bias_scale = 1, col_scale = 1;  // one rounding to T at the end
  bool has_bias = false;
  bool causal = false;
  operand<bool> mask;
};

// The functors of the extension points a chain holds (kernels/extension.hpp),
// copied: a batched evaluation describes each batch index from a temporary
// slice of the expression. `none` marks an absent one.
struct none {};

template <class Term, class Mod, class Keep>
struct chain_extension {
  std::optional<Term> term_f;
  std::optional<Mod> mod_f;
  std::optional<Keep> keep_f;
  static constexpr bool empty =
      std::is_same_v<Term, none> && std::is_same_v<Mod, none> && std::is_same_v<Keep, none>;

  template <class V>
    requires(!std::is_same_v<Term, none>)
  V term(const V& q, const V& k, std::size_t c) const {
    return call_term(*term_f, q, k, c);
  }
  template <class V>
    requires(!std::is_same_v<Mod, none>)
  V modify(const V& s, const V& i, const V& j) const {
    return call_modifier(*mod_f, s, i, j);
  }
  bool keep(std::size_t i, std::size_t j) const
    requires(!std::is_same_v<Keep, none>)
  {
    return call_predicate(*keep_f, i, j);
  }
  // 1 or 0 when the predicate knows whether it keeps anything in a block
  // (its member any(i_begin, i_end, j_begin, j_end)), −1 when it does not.
  int keep_any(std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1) const
    requires(!std::is_same_v<Keep, none>)
  {
    if constexpr (requires { keep_f->any(i0, i1, j0, j1); }) return keep_f->any(i0, i1, j0, j1) ? 1 : 0;
    else return -1;
  }
};

// A chain's traits: whether it matches, what it already holds (one bias,
// one mask matrix, one predicate, one modifier), and its functors.
struct chain_base {
  static constexpr bool matches = false, has_bias = false, has_mask = false, has_keep = false, has_mod = false;
  static constexpr bool masks_any = false;       // causal, a mask or a predicate inside
  static constexpr bool drops_row_term = false;  // neg_sq_l2: the row's constant −‖q‖² is left out (softmax ignores it)
  using term_type = none;
  using mod_type = none;
  using keep_type = none;
};

template <class S>
struct score_chain : chain_base {};

template <class S>
using chain_extension_t = chain_extension<typename score_chain<S>::term_type, typename score_chain<S>::mod_type,
                                          typename score_chain<S>::keep_type>;

template <class Q, class K>
  requires is_transpose_v<bare_t<K>>
struct score_chain<product_expr<Q, K>> : chain_base {
  static constexpr bool matches = true;
  template <class Policy, class T, class Ext>
  static void describe(const product_expr<Q, K>& e, score_parts<T>& parts, Ext&) {
    parts.q = node_operand<Policy>(e.lhs());
    parts.k = node_operand<Policy>(e.rhs().arg());
  }
};

// −‖q − k‖² = 2 q·k − ‖k‖² − ‖q‖²: the dot product scaled by 2, the keys'
// norms added as one row shared by every query, the queries' left out.
template <class Q, class K>
struct score_chain<neg_sq_l2_expr<Q, K>> : chain_base {
  static constexpr bool matches = true, drops_row_term = true;
  template <class Policy, class T, class Ext>
  static void describe(const neg_sq_l2_expr<Q, K>& e, score_parts<T>& parts, Ext&) {
    parts.q = node_operand<Policy>(e.lhs());
    parts.k = node_operand<Policy>(e.rhs());
    const std::size_t m = parts.k.view.rows;
    parts.col.owned = aligned_buffer<T>(m, aligned_buffer<T>::uninitialized);
    kernels::row_sq_norms(parts.k.view, parts.col.owned.data());
    for (std::size_t j = 0; j < m; ++j) parts.col.owned.data()[j] = -parts.col.owned.data()[j];
    parts.col.view = dense<const T>(parts.col.owned.data(), 1, m, m);
    parts.scale *= 2;
  }
};

template <class Q, class K, class F>
struct score_chain<similarity_expr<Q, K, F>> : chain_base {
  static constexpr bool matches = true;
  using term_type = F;
  template <class Policy, class T, class Ext>
  static void describe(const similarity_expr<Q, K, F>& e, score_parts<T>& parts, Ext& ext) {
    parts.q = similarity_operand<Policy>(similarity_queries(e.function(), e.lhs()));
    parts.k = similarity_operand<Policy>(similarity_keys(e.function(), e.rhs()));
    ext.term_f.emplace(e.function());
  }
};

template <class X, class S, scale_op Op>
struct score_chain<scaled_expr<X, S, Op>> : score_chain<bare_t<X>> {
  using inner = score_chain<bare_t<X>>;
  static constexpr bool matches = inner::matches && !inner::has_mod;  // the kernel scales before it modifies
  template <class Policy, class T, class Ext>
  static void describe(const scaled_expr<X, S, Op>& e, score_parts<T>& parts, Ext& ext) {
    inner::template describe<Policy>(e.arg(), parts, ext);
    const auto c = static_cast<long double>(e.factor());
    if constexpr (Op == scale_op::multiply) {
      parts.scale *= c, parts.bias_scale *= c, parts.col_scale *= c;
    } else {
      parts.scale /= c, parts.bias_scale /= c, parts.col_scale /= c;
    }
  }
};

template <class X>
struct score_chain<causal_expr<X>> : score_chain<bare_t<X>> {
  static constexpr bool masks_any = true;
  template <class Policy, class T, class Ext>
  static void describe(const causal_expr<X>& e, score_parts<T>& parts, Ext& ext) {
    score_chain<bare_t<X>>::template describe<Policy>(e.arg(), parts, ext);
    parts.causal = true;
  }
};

template <class X, class M>
struct score_chain<masked_expr<X, M>> : score_chain<bare_t<X>> {
  using inner = score_chain<bare_t<X>>;
  static constexpr bool matches = inner::matches && !inner::has_mask;
  static constexpr bool has_mask = true, masks_any = true;
  template <class Policy, class T, class Ext>
  static void describe(const masked_expr<X, M>& e, score_parts<T>& parts, Ext& ext) {
    inner::template describe<Policy>(e.arg(), parts, ext);
    parts.mask.view = leaf_view(e.mask());
  }
};

template <class X, class P>
struct score_chain<predicate_masked_expr<X, P>> : score_chain<bare_t<X>> {
  using inner = score_chain<bare_t<X>>;
  static constexpr bool matches = inner::matches && !inner::has_keep;
  static constexpr bool has_keep = true, masks_any = true;
  using keep_type = P;
  template <class Policy, class T, class Ext>
  static void describe(const predicate_masked_expr<X, P>& e, score_parts<T>& parts, Ext& ext) {
    inner::template describe<Policy>(e.arg(), parts, ext);
    ext.keep_f.emplace(e.predicate());
  }
};

// The modifier sees the scores as written inside it: scaled and biased, not
// yet masked (a mask inside would hand it −∞, and the kernel masks after).
template <class X, class F>
struct score_chain<score_mod_expr<X, F>> : score_chain<bare_t<X>> {
  using inner = score_chain<bare_t<X>>;
  static constexpr bool matches = inner::matches && !inner::has_mod && !inner::masks_any && !inner::drops_row_term;
  static constexpr bool has_mod = true;
  using mod_type = F;
  template <class Policy, class T, class Ext>
  static void describe(const score_mod_expr<X, F>& e, score_parts<T>& parts, Ext& ext) {
    inner::template describe<Policy>(e.arg(), parts, ext);
    ext.mod_f.emplace(e.function());
  }
};

// S + B, S − B, and B + S: which side is the chain.
template <class A, class B, elementwise_op Op>
struct bias_sides {
  using a_chain = score_chain<bare_t<A>>;
  using b_chain = score_chain<bare_t<B>>;
  static constexpr bool left = a_chain::matches && !a_chain::has_bias && !a_chain::has_mod;
  static constexpr bool right =
      !left && Op == elementwise_op::add && b_chain::matches && !b_chain::has_bias && !b_chain::has_mod;
  using inner = score_chain<bare_t<std::conditional_t<left, A, B>>>;
};

template <class A, class B, elementwise_op Op>
struct score_chain<elementwise_expr<A, B, Op>> : bias_sides<A, B, Op>::inner {
  using inner = typename bias_sides<A, B, Op>::inner;
  static constexpr bool left = bias_sides<A, B, Op>::left;
  static constexpr bool matches = left || bias_sides<A, B, Op>::right;
  static constexpr bool has_bias = true;
  template <class Policy, class T, class Ext>
  static void describe(const elementwise_expr<A, B, Op>& e, score_parts<T>& parts, Ext& ext) {
    if constexpr (left) {
      inner::template describe<Policy>(e.lhs(), parts, ext);
      parts.bias = node_operand<Policy>(e.rhs());
      parts.bias_scale = Op == elementwise_op::add ? 1 : -1;
    } else {
      inner::template describe<Policy>(e.rhs(), parts, ext);
      parts.bias = node_operand<Policy>(e.lhs());
      parts.bias_scale = 1;
    }
    parts.has_bias = true;
  }
};

template <class E>
struct fused_form {
  static constexpr bool value = false;
};

template <class A, class V>
  requires is_softmax_v<bare_t<A>>
struct fused_form<product_expr<A, V>> {
  using scores = bare_t<decltype(std::declval<const bare_t<A>&>().arg())>;
  static constexpr bool value = score_chain<scores>::matches;
};

template <class E>
inline constexpr bool has_fused_form = fused_form<bare_t<E>>::value;


// The operands of one fused attention, kept alive until the kernel has run.
template <class T>
struct fused_operands {
  score_parts<T> parts;
  operand<T> v;
};

template <class E>
using fused_extension_t = chain_extension_t<typename fused_form<E>::scores>;

// The kernel's problem for e written into out; e's operands that are not
// storage are evaluated (by Policy) into `keep`.
template <class Policy, class E>
kernels::attention_problem<value_type_t<E>> attention_problem_of(const E& e, kernels::strided<value_type_t<E>> out,
                                                                  fused_operands<value_type_t<E>>& keep,
                                                                  fused_extension_t<E>& ext) {
  using T = value_type_t<E>;
  using chain = score_chain<typename fused_form<E>::scores>;
  score_parts<T>& parts = keep.parts;
  chain::template describe<Policy>(e.lhs().arg(), parts, ext);
  keep.v = node_operand<Policy>(e.rhs());
  const operand<T>& v = keep.v;
  make_rows_contiguous(parts.q);
  make_rows_contiguous(parts.bias);
  make_rows_contiguous(parts.mask);

  kernels::attention_problem<T> problem;
  problem.q = parts.q.view;
  problem.k = parts.k.view;
  problem.v = v.view;
  problem.out = out;
  problem.scale = static_cast<T>(parts.scale);
  if (parts.has_bias) {
    problem.bias = parts.bias.view;
    problem.bias_scale = static_cast<T>(parts.bias_scale);
  }
  if (parts.col.view.data != nullptr) {
    problem.col_bias = parts.col.view;
    problem.col_scale = static_cast<T>(parts.col_scale);
  }
  problem.causal = parts.causal;
  problem.mask = parts.mask.view;
  return problem;
}

// The compiled kernels, or with an extension the kernel instantiated here.
template <class T, class Ext>
void run_attention(const kernels::attention_problem<T>* problems, std::size_t count, const Ext& ext) {
  if constexpr (Ext::empty) kernels::attention(problems, count);
  else kernels::attention_with(problems, count, ext);
}

template <class Policy, class E>
void fused_into(const E& e, kernels::strided<value_type_t<E>> out) {
  fused_operands<value_type_t<E>> keep;
  fused_extension_t<E> ext;
  const auto problem = attention_problem_of<Policy>(e, out, keep, ext);
  run_attention(&problem, 1, ext);
}

// Fuses every subexpression that has a fused form; the rest node by node.
struct best_policy {
  template <class E>
  static void into(const E& e, kernels::strided<value_type_t<E>> out) {
    if constexpr (has_fused_form<E>) {
      fused_into<best_policy>(e, out);
    } else {
      naive_evaluator<E>::template into<best_policy>(e, out);
    }
  }
};

}  // namespace qkv::detail
