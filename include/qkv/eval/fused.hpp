// The fused strategy: recognises softmax(S) * V where S is a score chain,
// Q * transpose(K) (or another similarity) in slots the rules of
// eval/fusion_rules.hpp allow. The chain is read into an attention_problem
// (pointers, strides and a description of the score post-operations) and
// handed to the fused kernel. Operands that are not storage (Q = X * Wq,
// say) are evaluated first, by the same policy.
#pragma once

#include "naive.hpp"

#include "../kernels/api.hpp"
#include "../kernels/attention_problem.hpp"
#include "../kernels/attention_with.hpp"
#include "../kernels/row_norms.hpp"
#include "fusion_rules.hpp"
#include "naive_extensions.hpp"

#include <cstddef>
#include <optional>
#include <string_view>
#include <type_traits>

namespace qkv::detail {

// What a score chain is made of, while its operands are evaluated.
template <class T>
struct score_parts {
  operand<T> q, k, bias, col, row;
  long double scale = 1, bias_scale = 1, col_scale = 1, row_scale = 1;  // one rounding to T at the end
  bool has_bias = false;
  bool row_term = false;  // a score_mod is around the core: a row's constant term counts
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

// A chain's traits: the slots it fills and the first rule it broke
// (eval/fusion_rules.hpp), and its functors. Anything else is no chain.
struct chain_base {
  static constexpr chain_slots slots = not_a_chain;
  static constexpr std::string_view core_name = "";  // the similarity, as explain(e) names it
  using term_type = none;
  using mod_type = none;
  using keep_type = none;
};

template <class S>
struct score_chain : chain_base {};

// A similarity function's name in explain(e); built-ins name themselves.
template <class F>
inline constexpr std::string_view similarity_name = "f";

template <class S>
inline constexpr bool chain_fuses = score_chain<S>::slots.broken == fusion_rule::none;

template <class S>
using chain_extension_t = chain_extension<typename score_chain<S>::term_type, typename score_chain<S>::mod_type,
                                          typename score_chain<S>::keep_type>;

template <class Q, class K>
  requires is_transpose_v<bare_t<K>>
struct score_chain<product_expr<Q, K>> : chain_base {
  static constexpr chain_slots slots = core_slots;
  static constexpr std::string_view core_name = "dot";
  template <class Policy, class T, class Ext>
  static void describe(const product_expr<Q, K>& e, score_parts<T>& parts, Ext&) {
    parts.q = node_operand<Policy>(e.lhs());
    parts.k = node_operand<Policy>(e.rhs().arg());
  }
};

// −‖q − k‖² = 2 q·k − ‖k‖² − ‖q‖²: the dot product scaled by 2, the keys'
// norms added as one row shared by every query, the queries' as one column
// shared by every key when a modifier needs the true score (softmax alone
// ignores a row's constant, so it is left out otherwise).
template <class Q, class K>
struct score_chain<neg_sq_l2_expr<Q, K>> : chain_base {
  static constexpr chain_slots slots = core_slots;
  static constexpr std::string_view core_name = "neg_sq_l2";
  template <class Policy, class T, class Ext>
  static void describe(const neg_sq_l2_expr<Q, K>& e, score_parts<T>& parts, Ext&) {
    parts.q = node_operand<Policy>(e.lhs());
    parts.k = node_operand<Policy>(e.rhs());
    const std::size_t m = parts.k.view.rows;
    parts.col.owned = aligned_buffer<T>(m, aligned_buffer<T>::uninitialized);
    kernels::row_sq_norms(parts.k.view, parts.col.owned.data());
    for (std::size_t j = 0; j < m; ++j) parts.col.owned.data()[j] = -parts.col.owned.data()[j];
    parts.col.view = dense<const T>(parts.col.owned.data(), 1, m, m);
    if (parts.row_term) {
      const std::size_t n = parts.q.view.rows;
      parts.row.owned = aligned_buffer<T>(n, aligned_buffer<T>::uninitialized);
      kernels::row_sq_norms(parts.q.view, parts.row.owned.data());
      for (std::size_t i = 0; i < n; ++i) parts.row.owned.data()[i] = -parts.row.owned.data()[i];
      parts.row.view = dense<const T>(parts.row.owned.data(), n, 1, 1);
    }
    parts.scale *= 2;
  }
};

template <class Q, class K, class F>
struct score_chain<similarity_expr<Q, K, F>> : chain_base {
  static constexpr chain_slots slots = core_slots;
  static constexpr std::string_view core_name = similarity_name<F>;
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
  static constexpr chain_slots slots = add_slot(inner::slots, chain_slot::scale);
  template <class Policy, class T, class Ext>
  static void describe(const scaled_expr<X, S, Op>& e, score_parts<T>& parts, Ext& ext) {
    inner::template describe<Policy>(e.arg(), parts, ext);
    const auto c = static_cast<long double>(e.factor());
    if constexpr (Op == scale_op::multiply) {
      parts.scale *= c, parts.bias_scale *= c, parts.col_scale *= c, parts.row_scale *= c;
    } else {
      parts.scale /= c, parts.bias_scale /= c, parts.col_scale /= c, parts.row_scale /= c;
    }
  }
};

template <class X>
struct score_chain<causal_expr<X>> : score_chain<bare_t<X>> {
  static constexpr chain_slots slots = add_slot(score_chain<bare_t<X>>::slots, chain_slot::causal);
  template <class Policy, class T, class Ext>
  static void describe(const causal_expr<X>& e, score_parts<T>& parts, Ext& ext) {
    score_chain<bare_t<X>>::template describe<Policy>(e.arg(), parts, ext);
    parts.causal = true;
  }
};

template <class X, class M>
struct score_chain<masked_expr<X, M>> : score_chain<bare_t<X>> {
  using inner = score_chain<bare_t<X>>;
  static constexpr chain_slots slots = add_slot(inner::slots, chain_slot::mask);
  template <class Policy, class T, class Ext>
  static void describe(const masked_expr<X, M>& e, score_parts<T>& parts, Ext& ext) {
    inner::template describe<Policy>(e.arg(), parts, ext);
    parts.mask.view = leaf_view(e.mask());
  }
};

template <class X, class P>
struct score_chain<predicate_masked_expr<X, P>> : score_chain<bare_t<X>> {
  using inner = score_chain<bare_t<X>>;
  static constexpr chain_slots slots = add_slot(inner::slots, chain_slot::predicate);
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
  static constexpr chain_slots slots = add_slot(inner::slots, chain_slot::modifier);
  using mod_type = F;
  template <class Policy, class T, class Ext>
  static void describe(const score_mod_expr<X, F>& e, score_parts<T>& parts, Ext& ext) {
    parts.row_term = true;
    inner::template describe<Policy>(e.arg(), parts, ext);
    ext.mod_f.emplace(e.function());
  }
};

// S + B, S − B, and B + S: which side is the chain.
template <class A, class B, elementwise_op Op>
struct bias_sides {
  static constexpr chain_slots slots = add_bias(score_chain<bare_t<A>>::slots, score_chain<bare_t<B>>::slots,
                                                Op == elementwise_op::add);
  static constexpr bool left = add_slot(score_chain<bare_t<A>>::slots, chain_slot::bias).broken == fusion_rule::none;
  using inner = score_chain<bare_t<std::conditional_t<left, A, B>>>;
};

template <class A, class B, elementwise_op Op>
struct score_chain<elementwise_expr<A, B, Op>> : bias_sides<A, B, Op>::inner {
  using inner = typename bias_sides<A, B, Op>::inner;
  static constexpr bool left = bias_sides<A, B, Op>::left;
  static constexpr chain_slots slots = bias_sides<A, B, Op>::slots;
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

// catches anything but softmax(S) * V, gives not_attention.
template <class E>
struct fused_form {
  static constexpr fusion_rule broken = fusion_rule::not_attention;
  static constexpr bool value = false;
};

template <class A, class V>
  requires is_softmax_v<bare_t<A>>
struct fused_form<product_expr<A, V>> {
  using scores = bare_t<decltype(std::declval<const bare_t<A>&>().arg())>;
  static constexpr fusion_rule broken = score_chain<scores>::slots.broken;
  static constexpr bool value = broken == fusion_rule::none;
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
  if (parts.row.view.data != nullptr) {
    problem.row_bias = parts.row.view;
    problem.row_scale = static_cast<T>(parts.row_scale);
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
