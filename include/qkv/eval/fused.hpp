// The fused strategy: recognises softmax(S) * V where S is a score chain,
// Q * transpose(K) (or another similarity) in slots the rules of
// eval/fusion_rules.hpp allow. The chain is read into an attention_problem
// (pointers, strides and a description of the score post-operations) and
// handed to the fused kernel. Operands that are not storage (Q = X * Wq,
// say) are evaluated first, by the same policy.
//
// With bf16 or f16 inputs it computes in float. K and V stored as leaves of
// one 2-byte type, under the dot product and without the user's functors,
// reach the compiled kernels as they are stored (kernels/api.hpp): packing
// or decoding converts them as it reads. Every other 2-byte operand is
// converted to float first (eval/widen.hpp).
#pragma once

#include "naive.hpp"
#include "widen.hpp"

#include "../kernels/api.hpp"
#include "../kernels/attention_problem.hpp"
#include "../kernels/attention_with.hpp"
#include "../kernels/row_norms.hpp"
#include "fusion_rules.hpp"
#include "key_bounds_of.hpp"
#include "naive_extensions.hpp"

#include <cstddef>
#include <optional>
#include <string_view>
#include <type_traits>

namespace qkv::detail {

// What a score chain is made of, while its operands are evaluated; K may
// be stored as S (2-byte), the rest is T.
template <class T, class S = T>
struct score_parts {
  operand<T> q, bias, col, row;
  operand<S> k;
  long double scale = 1, bias_scale = 1, col_scale = 1, row_scale = 1;  // one rounding to T at the end
  bool has_bias = false;
  bool row_term = false;  // a score_mod is around the core: a row's constant term counts
  kernels::key_bounds bounds{};  // of causal and windows (key_bounds_of.hpp)
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
  // A term w_c·t(q, k) with weights of its own (additive): t, their slope.
  template <class V>
    requires requires(const Term& t, const V& v) { t.weight_slope(v, v, std::size_t(0)); }
  V term_weight(const V& q, const V& k, std::size_t c) const {
    return term_f->weight_slope(q, k, c);
  }
  template <class V>
    requires(!std::is_same_v<Mod, none>)
  V modify(const V& s, const V& i, const V& j, std::size_t b, std::size_t h) const {
    return call_modifier(*mod_f, s, i, j, b, h);
  }
  // A modifier's tables (score_mod(S, f, P...)), for the backward.
  std::size_t table_size() const
    requires is_tabled_v<Mod>
  {
    return mod_f->size();
  }
  template <class V, class T>
    requires is_tabled_v<Mod>
  void add_table_slopes(const V& s, const V& i, const V& j, std::size_t b, std::size_t h, const V& g, T* sums) const {
    mod_f->add_slopes(s, b, h, i, j, g, sums);
  }
  bool keep(std::size_t i, std::size_t j, std::size_t b, std::size_t h) const
    requires(!std::is_same_v<Keep, none>)
  {
    return call_predicate(*keep_f, i, j, b, h);
  }
  // 1 or 0 when the predicate knows whether it keeps anything in a block
  // (its member any(i_begin, i_end, j_begin, j_end), or any(b, h, ...)),
  // −1 when it does not.
  int keep_any(std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1, std::size_t b, std::size_t h) const
    requires(!std::is_same_v<Keep, none>)
  {
    return predicate_hint(*keep_f, i0, i1, j0, j1, b, h);
  }
};

// x's value in T (float) as the kernel reads it: x's own memory, or, where x
// reads 2-byte leaves, an owned float copy.
template <class Policy, class T, class X>
operand<T> compute_operand(const X& x) {
  if constexpr (!reads_half<X>()) {
    return node_operand<Policy>(x);
  } else if constexpr (leaf<X>) {
    operand<T> r{aligned_buffer<T>(x.rows() * x.cols(), aligned_buffer<T>::recycled), {}};
    auto out = matrix_view<T, dyn, dyn>(r.owned.data(), x.rows(), x.cols(), x.cols());
    convert_matrix(x, out);
    r.view = strided_of(out).as_const();
    return r;
  } else {
    return lasting_operand<Policy>(widen(x));  // widen(x) may hold the copies a view reads
  }
}

// A chain's traits: the slots it fills and the first rule it broke
// (eval/fusion_rules.hpp), and its functors. Anything else is no chain.
struct chain_base {
  static constexpr chain_slots slots = not_a_chain;
  // The keys' leaf, for a chain whose kernel may read them as stored (the
  // dot product): a pointer to it in s (null for a null s); void otherwise.
  static constexpr void keys_of(const void*) {}
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
  static constexpr auto keys_of(const product_expr<Q, K>* s) { return arg_of(rhs_of(s)); }
  template <class Policy, class T, class KV, class Ext>
  static void describe(const product_expr<Q, K>& e, score_parts<T, KV>& parts, Ext&) {
    parts.q = compute_operand<Policy, T>(e.lhs());
    if constexpr (std::is_same_v<KV, T>) parts.k = compute_operand<Policy, T>(e.rhs().arg());
    else parts.k.view = leaf_view(e.rhs().arg());
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
  template <class Policy, class T, class KV, class Ext>
  static void describe(const neg_sq_l2_expr<Q, K>& e, score_parts<T, KV>& parts, Ext&) {
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
  template <class Policy, class T, class KV, class Ext>
  static void describe(const similarity_expr<Q, K, F>& e, score_parts<T, KV>& parts, Ext& ext) {
    parts.q = lasting_operand<Policy>(similarity_queries(e.function(), e.lhs()));
    parts.k = lasting_operand<Policy>(similarity_keys(e.function(), e.rhs()));
    ext.term_f.emplace(e.function());
  }
};

template <class X, class S, scale_op Op>
struct score_chain<scaled_expr<X, S, Op>> : score_chain<bare_t<X>> {
  using inner = score_chain<bare_t<X>>;
  static constexpr chain_slots slots = add_slot(inner::slots, chain_slot::scale);
  static constexpr auto keys_of(const scaled_expr<X, S, Op>* s) { return inner::keys_of(arg_of(s)); }
  template <class Policy, class T, class KV, class Ext>
  static void describe(const scaled_expr<X, S, Op>& e, score_parts<T, KV>& parts, Ext& ext) {
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
  static constexpr auto keys_of(const causal_expr<X>* s) {
    return score_chain<bare_t<X>>::keys_of(arg_of(s));
  }
  template <class Policy, class T, class KV, class Ext>
  static void describe(const causal_expr<X>& e, score_parts<T, KV>& parts, Ext& ext) {
    score_chain<bare_t<X>>::template describe<Policy>(e.arg(), parts, ext);
    parts.bounds = both_bounds(parts.bounds, node_bounds(&e));
  }
};

// Positions change no score: the causal and window nodes above read them
// (key_bounds_of.hpp), and key_aligned functors were told them when built.
template <class X>
struct score_chain<positions_expr<X>> : score_chain<bare_t<X>> {
  using inner = score_chain<bare_t<X>>;
  static constexpr chain_slots slots = add_slot(inner::slots, chain_slot::positions);
  static constexpr auto keys_of(const positions_expr<X>* s) { return inner::keys_of(arg_of(s)); }
  template <class Policy, class T, class KV, class Ext>
  static void describe(const positions_expr<X>& e, score_parts<T, KV>& parts, Ext& ext) {
    inner::template describe<Policy>(e.arg(), parts, ext);
  }
};

// A window narrows the bounds so far: windows and causal intersect.
template <class X>
struct score_chain<window_expr<X>> : score_chain<bare_t<X>> {
  using inner = score_chain<bare_t<X>>;
  static constexpr chain_slots slots = add_slot(inner::slots, chain_slot::window);
  static constexpr auto keys_of(const window_expr<X>* s) { return inner::keys_of(arg_of(s)); }
  template <class Policy, class T, class KV, class Ext>
  static void describe(const window_expr<X>& e, score_parts<T, KV>& parts, Ext& ext) {
    inner::template describe<Policy>(e.arg(), parts, ext);
    parts.bounds = both_bounds(parts.bounds, node_bounds(&e));
  }
};

template <class X, class M>
struct score_chain<masked_expr<X, M>> : score_chain<bare_t<X>> {
  using inner = score_chain<bare_t<X>>;
  static constexpr chain_slots slots = add_slot(inner::slots, chain_slot::mask);
  static constexpr auto keys_of(const masked_expr<X, M>* s) { return inner::keys_of(arg_of(s)); }
  template <class Policy, class T, class KV, class Ext>
  static void describe(const masked_expr<X, M>& e, score_parts<T, KV>& parts, Ext& ext) {
    inner::template describe<Policy>(e.arg(), parts, ext);
    parts.mask.view = leaf_view(e.mask());
  }
};

template <class X, class P>
struct score_chain<predicate_masked_expr<X, P>> : score_chain<bare_t<X>> {
  using inner = score_chain<bare_t<X>>;
  static constexpr chain_slots slots = add_slot(inner::slots, chain_slot::predicate);
  static constexpr auto keys_of(const predicate_masked_expr<X, P>* s) { return inner::keys_of(arg_of(s)); }
  using keep_type = P;
  template <class Policy, class T, class KV, class Ext>
  static void describe(const predicate_masked_expr<X, P>& e, score_parts<T, KV>& parts, Ext& ext) {
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
  static constexpr auto keys_of(const score_mod_expr<X, F>* s) { return inner::keys_of(arg_of(s)); }
  using mod_type = F;
  template <class Policy, class T, class KV, class Ext>
  static void describe(const score_mod_expr<X, F>& e, score_parts<T, KV>& parts, Ext& ext) {
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
  static constexpr auto keys_of(const elementwise_expr<A, B, Op>* s) {
    if constexpr (left) return inner::keys_of(lhs_of(s));
    else return inner::keys_of(rhs_of(s));
  }
  template <class Policy, class T, class KV, class Ext>
  static void describe(const elementwise_expr<A, B, Op>& e, score_parts<T, KV>& parts, Ext& ext) {
    if constexpr (left) {
      inner::template describe<Policy>(e.lhs(), parts, ext);
      parts.bias = compute_operand<Policy, T>(e.rhs());
      parts.bias_scale = Op == elementwise_op::add ? 1 : -1;
    } else {
      inner::template describe<Policy>(e.rhs(), parts, ext);
      parts.bias = compute_operand<Policy, T>(e.lhs());
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


// The element type K and V reach the kernel in: their storage type where
// both are leaves of one 2-byte type and the scores are the dot product's
// (the compiled kernels, or the user's modifier and predicate in the
// kernels of attention_with.hpp); otherwise what e computes in.
template <class E, class C = compute_t<value_type_t<E>>>
struct kv_storage {
  using type = C;
};

template <class E, class C>
  requires has_fused_form<E>
struct kv_storage<E, C> {
  using scores = typename fused_form<E>::scores;
  using keys = std::remove_pointer_t<decltype(score_chain<scores>::keys_of(nullptr))>;
  using values = bare_t<decltype(std::declval<const E&>().rhs())>;
  template <class L>
  static constexpr bool storage_leaf = leaf<L> || tensor_leaf<L>;
  static constexpr auto pick() {
    if constexpr (!std::is_void_v<keys> && !kernels::extension_traits<chain_extension_t<scores>, C>::has_term) {
      if constexpr (storage_leaf<keys> && storage_leaf<values>) {
        using S = std::remove_const_t<value_type_t<keys>>;
        if constexpr (half_element<S> && std::is_same_v<S, std::remove_const_t<value_type_t<values>>>)
          return std::type_identity<S>{};
        else return std::type_identity<C>{};
      } else {
        return std::type_identity<C>{};
      }
    } else {
      return std::type_identity<C>{};
    }
  }
  using type = typename decltype(pick())::type;
};

template <class E>
using kv_storage_t = typename kv_storage<bare_t<E>>::type;

// Whether eval(e) hands e's K and V to the kernel in their 2-byte storage.
template <class E>
inline constexpr bool reads_kv_as_stored = half_element<kv_storage_t<E>>;

// The operands of one fused attention, kept alive until the kernel has run.
template <class T, class S = T>
struct fused_operands {
  score_parts<T, S> parts;
  operand<S> v;
};

template <class E>
using fused_operands_t = fused_operands<compute_t<value_type_t<E>>, kv_storage_t<E>>;

template <class E>
using fused_problem_t = kernels::attention_problem<compute_t<value_type_t<E>>, kv_storage_t<E>>;

template <class E>
using fused_extension_t = chain_extension_t<typename fused_form<E>::scores>;

// The kernel's problem for e written into out; e's operands that are not
// storage are evaluated (by Policy) into `keep`.
// S: how K and V reach the kernel; the backward asks for them in T.
template <class Policy, class E, class S = kv_storage_t<E>>
kernels::attention_problem<compute_t<value_type_t<E>>, S> attention_problem_of(
    const E& e, kernels::strided<compute_t<value_type_t<E>>> out, fused_operands<compute_t<value_type_t<E>>, S>& keep,
    fused_extension_t<E>& ext) {
  using T = compute_t<value_type_t<E>>;
  using chain = score_chain<typename fused_form<E>::scores>;
  score_parts<T, S>& parts = keep.parts;
  chain::template describe<Policy>(e.lhs().arg(), parts, ext);
  if constexpr (std::is_same_v<S, T>) keep.v = compute_operand<Policy, T>(e.rhs());
  else keep.v.view = leaf_view(e.rhs());
  const operand<S>& v = keep.v;
  make_rows_contiguous(parts.q);
  make_rows_contiguous(parts.bias);
  make_rows_contiguous(parts.mask);

  kernels::attention_problem<T, S> problem;
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
  problem.bounds = parts.bounds;
  problem.mask = parts.mask.view;
  // The softmax's sink and the slice's position (the functors' b and h).
  problem.sink = static_cast<T>(e.lhs().sink());
  problem.batch = e.lhs().batch_index(), problem.head = e.lhs().head_index();
  // Every input of one 2-byte type (e evaluates to it): Q holds its values.
  problem.queries_in_storage_type = !std::is_same_v<S, T> && std::is_same_v<std::remove_const_t<value_type_t<E>>, S>;
  return problem;
}

// The compiled kernels, or with an extension the kernel instantiated here.
template <class T, class S, class Ext>
void run_attention(const kernels::attention_problem<T, S>* problems, std::size_t count, const Ext& ext) {
  if constexpr (Ext::empty) kernels::attention(problems, count);
  else kernels::attention_with(problems, count, ext);
}

// e's fused attention into out; for 2-byte inputs out is float.
template <class Policy, class E>
void fused_into(const E& e, kernels::strided<compute_t<value_type_t<E>>> out) {
  fused_operands_t<E> keep;
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
