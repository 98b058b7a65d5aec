// A batched expression (one over tensors) is a matrix expression per batch
// index. slice(e, index) builds that matrix expression: the same nodes, over
// matrix_views of each operand's matrix at the index its batch extents map
// it to (broadcast: index 0; grouped: index / group). The strategies then
// evaluate it exactly as they evaluate a matrix expression.
#pragma once

#include "../expr/elementwise.hpp"
#include "../expr/mask.hpp"
#include "../expr/product.hpp"
#include "../expr/scaled.hpp"
#include "../expr/score_mod.hpp"
#include "../expr/similarity.hpp"
#include "../expr/softmax.hpp"
#include "../expr/transpose.hpp"
#include "../storage/matrix_view.hpp"

#include <type_traits>

namespace qkv::detail {

template <class E>
struct slicer;

template <class E>
auto slice(const E& e, batch_extents index) {
  return slicer<E>::apply(e, index);
}

// The index of an operand of e, from the index of e.
template <class E, class X>
batch_extents operand_index(const E& e, const X& x, batch_extents index) {
  return operand_batch_index(index, batch_of(e), batch_of(x));
}

template <class E>
  requires leaf<E>
struct slicer<E> {
  static auto apply(const E& e, batch_extents) {
    return matrix_view<const value_type_t<E>, E::static_rows, E::static_cols>(e);
  }
};

template <class E>
  requires tensor_leaf<E>
struct slicer<E> {
  static auto apply(const E& e, batch_extents index) {
    return matrix_view<const value_type_t<E>, E::static_rows, E::static_cols>(e.batch_matrix(index));
  }
};

template <class X>
struct slicer<transpose_expr<X>> {
  static auto apply(const transpose_expr<X>& e, batch_extents i) { return transpose(slice(e.arg(), i)); }
};

template <class X>
struct slicer<softmax_expr<X>> {
  static auto apply(const softmax_expr<X>& e, batch_extents i) { return softmax(slice(e.arg(), i)); }
};

template <class X>
struct slicer<causal_expr<X>> {
  static auto apply(const causal_expr<X>& e, batch_extents i) { return causal(slice(e.arg(), i)); }
};

template <class X, class S, scale_op Op>
struct slicer<scaled_expr<X, S, Op>> {
  static auto apply(const scaled_expr<X, S, Op>& e, batch_extents i) {
    return scaled_expr<decltype(slice(e.arg(), i)), S, Op>(slice(e.arg(), i), e.factor());
  }
};

template <class A, class B>
struct slicer<product_expr<A, B>> {
  static auto apply(const product_expr<A, B>& e, batch_extents i) {
    return slice(e.lhs(), operand_index(e, e.lhs(), i)) * slice(e.rhs(), operand_index(e, e.rhs(), i));
  }
};

template <class A, class B, elementwise_op Op>
struct slicer<elementwise_expr<A, B, Op>> {
  static auto apply(const elementwise_expr<A, B, Op>& e, batch_extents i) {
    auto a = slice(e.lhs(), operand_index(e, e.lhs(), i));
    auto b = slice(e.rhs(), operand_index(e, e.rhs(), i));
    if constexpr (Op == elementwise_op::add) return std::move(a) + std::move(b);
    else return std::move(a) - std::move(b);
  }
};

template <class S, class M>
struct slicer<masked_expr<S, M>> {
  static auto apply(const masked_expr<S, M>& e, batch_extents i) {
    return masked(slice(e.arg(), operand_index(e, e.arg(), i)), slice(e.mask(), operand_index(e, e.mask(), i)));
  }
};

template <class X>
struct slicer<row_normalized_expr<X>> {
  static auto apply(const row_normalized_expr<X>& e, batch_extents i) { return normalize_rows(slice(e.arg(), i)); }
};

template <class X, class F>
struct slicer<score_mod_expr<X, F>> {
  static auto apply(const score_mod_expr<X, F>& e, batch_extents i) { return score_mod(slice(e.arg(), i), e.function()); }
};

template <class X, class P>
struct slicer<predicate_masked_expr<X, P>> {
  static auto apply(const predicate_masked_expr<X, P>& e, batch_extents i) {
    return masked(slice(e.arg(), i), e.predicate());
  }
};

template <class Q, class K, class F>
struct slicer<similarity_expr<Q, K, F>> {
  static auto apply(const similarity_expr<Q, K, F>& e, batch_extents i) {
    return similarity(slice(e.lhs(), operand_index(e, e.lhs(), i)), slice(e.rhs(), operand_index(e, e.rhs(), i)),
                      e.function());
  }
};

template <class Q, class K>
struct slicer<neg_sq_l2_expr<Q, K>> {
  static auto apply(const neg_sq_l2_expr<Q, K>& e, batch_extents i) {
    auto q = slice(e.lhs(), operand_index(e, e.lhs(), i));
    auto k = slice(e.rhs(), operand_index(e, e.rhs(), i));
    return neg_sq_l2_expr<decltype(q), decltype(k)>(std::move(q), std::move(k));
  }
};

template <class E>
using slice_t = decltype(slice(std::declval<const E&>(), batch_extents{}));

}  // namespace qkv::detail
