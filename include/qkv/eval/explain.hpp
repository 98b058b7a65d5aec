// What eval(e) will do, asked before running it: fuses<E> and
// fusion_rule_broken<E> while compiling, explain(e) as text, one line per
// node that evaluates (fused, or node by node and why not fused).
#pragma once

#include "../expr/elementwise.hpp"
#include "../expr/mask.hpp"
#include "../expr/product.hpp"
#include "../expr/scaled.hpp"
#include "../expr/score_mod.hpp"
#include "../expr/similarity.hpp"
#include "../expr/softmax.hpp"
#include "../expr/transpose.hpp"
#include "../similarity/builtin.hpp"
#include "fused.hpp"
#include "fusion_rules.hpp"
#include "plain_operands.hpp"
#include "widen.hpp"

#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

namespace qkv {

// The first rule of eval/fusion_rules.hpp that E breaks, fusion_rule::none
// when eval(e, qkv::fused) accepts it.
template <class E>
inline constexpr fusion_rule fusion_rule_broken = detail::fused_form<detail::bare_t<E>>::broken;

// Whether E itself is one fused attention (eval(e) then runs the fused kernel).
template <class E>
inline constexpr bool fuses = fusion_rule_broken<E> == fusion_rule::none;

namespace detail {

template <class Wq, class Wk, class Wv>
inline constexpr std::string_view similarity_name<additive_t<Wq, Wk, Wv>> = "additive";

template <class E>
inline constexpr std::string_view node_name = "node";
template <class A, class B>
inline constexpr std::string_view node_name<product_expr<A, B>> = "A * B";
template <class X, class S>
inline constexpr std::string_view node_name<scaled_expr<X, S, scale_op::multiply>> = "X * c";
template <class X, class S>
inline constexpr std::string_view node_name<scaled_expr<X, S, scale_op::divide>> = "X / c";
template <class A, class B>
inline constexpr std::string_view node_name<elementwise_expr<A, B, elementwise_op::add>> = "A + B";
template <class A, class B>
inline constexpr std::string_view node_name<elementwise_expr<A, B, elementwise_op::subtract>> = "A - B";
template <class X>
inline constexpr std::string_view node_name<softmax_expr<X>> = "softmax(S)";
template <class X>
inline constexpr std::string_view node_name<causal_expr<X>> = "causal(S)";
template <class X>
inline constexpr std::string_view node_name<window_expr<X>> = "window(S, left, right)";
template <class X>
inline constexpr std::string_view node_name<positions_expr<X>> = "positions(S, q0, k0)";
template <class X, class M>
inline constexpr std::string_view node_name<masked_expr<X, M>> = "masked(S, M)";
template <class X, class P>
inline constexpr std::string_view node_name<predicate_masked_expr<X, P>> = "masked(S, pred)";
template <class X, class F>
inline constexpr std::string_view node_name<score_mod_expr<X, F>> = "score_mod(S, f)";
template <class Q, class K, class F>
inline constexpr std::string_view node_name<similarity_expr<Q, K, F>> = "similarity(Q, K, f)";
template <class Q, class K>
inline constexpr std::string_view node_name<neg_sq_l2_expr<Q, K>> = "similarity(Q, K, neg_sq_l2)";
template <class X>
inline constexpr std::string_view node_name<row_normalized_expr<X>> = "normalize_rows(X)";

// A fused attention's similarity and the slots its chain fills, in the
// order the kernel applies them.
template <class S>
std::string fused_text() {
  using chain = score_chain<S>;
  constexpr chain_slots s = chain::slots;
  std::string t = "fused: softmax(S) * V with similarity ";
  t += chain::core_name;
  const std::pair<bool, std::string_view> slots[] = {{s.scale, "scale"},         {s.bias, "bias"},
                                                     {s.modifier, "score_mod"},  {s.causal, "causal"},
                                                     {s.window, "window"},       {s.mask, "mask"},
                                                     {s.predicate, "predicate"}, {s.positions, "positions"}};
  for (const auto& [filled, name] : slots)
    if (filled) t.append(", ").append(name);
  return t;
}

template <class E>
void explain_into(const E& e, std::string& out, std::size_t depth);

// The operands a fused chain evaluates first (its Q, K and bias), down to its core.
template <class Q, class K>
void explain_chain(const product_expr<Q, K>& s, std::string& out, std::size_t depth);
template <class Q, class K>
void explain_chain(const neg_sq_l2_expr<Q, K>& s, std::string& out, std::size_t depth);
template <class Q, class K, class F>
void explain_chain(const similarity_expr<Q, K, F>& s, std::string& out, std::size_t depth);
template <class A, class B, elementwise_op Op>
void explain_chain(const elementwise_expr<A, B, Op>& s, std::string& out, std::size_t depth);
template <class S>
  requires requires(const S& s) { s.arg(); }
void explain_chain(const S& s, std::string& out, std::size_t depth);

template <class Q, class K>
void explain_chain(const product_expr<Q, K>& s, std::string& out, std::size_t depth) {
  explain_into(s.lhs(), out, depth);
  explain_into(s.rhs(), out, depth);
}
template <class Q, class K>
void explain_chain(const neg_sq_l2_expr<Q, K>& s, std::string& out, std::size_t depth) {
  explain_into(s.lhs(), out, depth);
  explain_into(s.rhs(), out, depth);
}
template <class Q, class K, class F>
void explain_chain(const similarity_expr<Q, K, F>& s, std::string& out, std::size_t depth) {
  explain_into(similarity_queries(s.function(), s.lhs()), out, depth);
  explain_into(similarity_keys(s.function(), s.rhs()), out, depth);
}
template <class A, class B, elementwise_op Op>
void explain_chain(const elementwise_expr<A, B, Op>& s, std::string& out, std::size_t depth) {
  if constexpr (score_chain<elementwise_expr<A, B, Op>>::left) {
    explain_chain(s.lhs(), out, depth);
    explain_into(s.rhs(), out, depth);
  } else {
    explain_into(s.lhs(), out, depth);
    explain_chain(s.rhs(), out, depth);
  }
}
template <class S>
  requires requires(const S& s) { s.arg(); }
void explain_chain(const S& s, std::string& out, std::size_t depth) {
  explain_chain(s.arg(), out, depth);
}

// One line for e if it evaluates (storage and transposes are views), then
// its operands', indented under it.
template <class E>
void explain_into(const E& e, std::string& out, std::size_t depth) {
  using X = bare_t<E>;
  if constexpr (storage_leaf<X>) {
    return;
  } else if constexpr (is_transpose_v<X>) {
    explain_into(e.arg(), out, depth);
  } else if constexpr (fuses<X>) {
    out.append(2 * depth, ' ').append(fused_text<typename fused_form<X>::scores>());
    if (e.lhs().has_sink()) out.append(", sink");
    out.append("\n");
    explain_chain(e.lhs().arg(), out, depth + 1);
    explain_into(e.rhs(), out, depth + 1);
  } else {
    out.append(2 * depth, ' ').append("node by node: ").append(node_name<X>);
    if constexpr (fusion_rule_broken<X> != fusion_rule::not_attention)
      out.append(" (not fused: ").append(to_string(fusion_rule_broken<X>)).append(")");
    out.append("\n");
    if constexpr (is_similarity_v<X>) {
      explain_into(similarity_queries(e.function(), e.lhs()), out, depth + 1);
      explain_into(similarity_keys(e.function(), e.rhs()), out, depth + 1);
    } else {
      std::apply([&](const auto&... child) { (explain_into(child, out, depth + 1), ...); }, e.operands());
    }
  }
}

}  // namespace detail

// What eval(e) does with each subexpression that evaluates, one line each,
// operands indented under the node that reads them:
//   fused: softmax(S) * V with similarity dot, scale, causal
//   node by node: A * B (not fused: two biases in the scores)
// Storage and transposes read memory in place and have no line. With bf16
// or f16 inputs a first line says that they are evaluated in float, and
// whether the fused kernel reads K and V in their 2-byte storage. A last
// line says when the user's functors were compiled for a narrower
// instruction set than the kernels run, and what to do.
template <expression E>
std::string explain(const E& e) {
  using bare = detail::bare_t<E>;
  std::string out;
  if constexpr (detail::reads_kv_as_stored<bare>) {
    out = "in float: K and V read as stored";
    if (detail::half_leaf_count<bare>() > 2) out += ", the other 2-byte inputs converted";
  } else if constexpr (detail::reads_half<bare>()) {
    out = "in float: the 2-byte inputs converted";
  }
  if constexpr (detail::reads_half<bare>()) out += half_element<value_type_t<E>> ? ", the result rounded once\n" : "\n";
  if constexpr (detail::reads_quantized<bare>()) out += std::string("K or V quantized (") + detail::quantized_formats<bare>() + "): dequantized to float first\n";
  detail::explain_into(e, out, 0);
  if constexpr (detail::has_fused_form<bare>) {
    if constexpr (!detail::fused_extension_t<bare>::empty) {
      // The user's functors run at this unit's flags (kernels/attention_with.hpp).
      if (!kernels::runs_like_library<xsimd::default_arch>())
        out.append("your functors: compiled for ").append(xsimd::default_arch::name())
            .append(" (this unit's flags) while the kernels run ").append(kernels::active_arch())
            .append(": build this unit with -march=native (CMake: link qkv::native; pkg-config: qkv-native) "
                    "to run them as fast\n");
    }
  }
  return out;
}

}  // namespace qkv
