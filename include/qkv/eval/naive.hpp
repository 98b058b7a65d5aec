// The naive strategy: one evaluator per node type (Eigen's split of
// expressions from evaluators). Each evaluator either writes its node into a
// destination (into) or, for leaves and transposes, hands out a strided view
// of memory that already holds it (evaluate), copying nothing.
#pragma once

#include "../expr/elementwise.hpp"
#include "../expr/mask.hpp"
#include "../expr/positions.hpp"
#include "../expr/product.hpp"
#include "../expr/scaled.hpp"
#include "../expr/softmax.hpp"
#include "../expr/transpose.hpp"
#include "../expr/window.hpp"
#include "key_bounds_of.hpp"
#include "../kernels/api.hpp"
#include "../kernels/mask.hpp"
#include "../storage/aligned_buffer.hpp"

#include <bit>
#include <cstddef>
#include <type_traits>
#include <utility>

namespace qkv::detail {

// A node's value: a view, and the buffer behind it when the evaluation owns one.
template <class T>
struct operand {
  aligned_buffer<T> owned;
  kernels::strided<const T> view{nullptr, 0, 0, 0, 1};
};

template <class T>
kernels::strided<T> dense(T* data, std::size_t rows, std::size_t cols, std::size_t row_stride) {
  return {data, rows, cols, static_cast<std::ptrdiff_t>(row_stride), 1};
}

// A storage leaf's memory as the kernels see it.
template <class L>
auto leaf_view(const L& l) {
  using T = std::remove_pointer_t<decltype(l.data())>;
  std::size_t cs = 1;
  if constexpr (requires { l.col_stride(); }) cs = l.col_stride();
  kernels::strided<const std::remove_const_t<T>> v{l.data(), l.rows(), l.cols(),
                                                   static_cast<std::ptrdiff_t>(l.row_stride()),
                                                   static_cast<std::ptrdiff_t>(cs)};
  if constexpr (requires { l.page_table(); }) {  // a sequence of a paged cache (storage/paged_view.hpp)
    v.pages = l.page_table(), v.page_rows = l.page_rows(), v.page_stride = static_cast<std::ptrdiff_t>(l.page_stride());
    if ((v.page_rows & (v.page_rows - 1)) == 0) v.page_shift = std::countr_zero(v.page_rows);
  }
  return v;
}

// The same for a destination, whose data() is mutable.
template <class L>
auto leaf_view_mutable(L&& l) {
  const auto v = leaf_view(l);
  return kernels::strided<std::remove_pointer_t<decltype(l.data())>>{l.data(), v.rows, v.cols, v.row_stride,
                                                                      v.col_stride};
}

template <class E>
struct naive_evaluator;  // no evaluator: the node is unknown to the naive strategy

// A strategy is a policy with `into(e, out)`; evaluators pass it down to
// their operands, so one set of evaluators serves node-by-node evaluation
// (naive_policy) and evaluation that fuses what it recognises (eval/fused.hpp).
template <class Policy, class E>
void node_into(const E& e, kernels::strided<value_type_t<E>> out) {
  Policy::into(e, out);
}

template <class Policy, class E>
operand<value_type_t<E>> node_operand(const E& e) {
  if constexpr (requires { naive_evaluator<E>::template evaluate<Policy>(e); }) {
    return naive_evaluator<E>::template evaluate<Policy>(e);
  } else {
    using T = value_type_t<E>;
    operand<T> r{aligned_buffer<T>(e.rows() * e.cols(), aligned_buffer<T>::uninitialized), {}};
    node_into<Policy>(e, dense(r.owned.data(), e.rows(), e.cols(), e.cols()));
    r.view = dense<const T>(r.owned.data(), e.rows(), e.cols(), e.cols());
    return r;
  }
}

// Every node by its own evaluator.
struct naive_policy {
  template <class E>
  static void into(const E& e, kernels::strided<value_type_t<E>> out) {
    naive_evaluator<E>::template into<naive_policy>(e, out);
  }
};

template <class T>
void copy_strided(kernels::strided<const T> src, kernels::strided<T> dst) {
  if constexpr (element<T>) {
    kernels::copy(src, dst);
  } else {  // bool masks, 2-byte types
    for (std::size_t i = 0; i < src.rows; ++i)
      for (std::size_t j = 0; j < src.cols; ++j) dst(i, j) = src(i, j);
  }
}

// x's value as an operand that outlives x (a similarity's queries(Q) or
// keys(K), an expression over float copies of 2-byte leaves). A result
// returned by value that evaluates to a view of memory it holds itself (a
// matrix, or a node over one) dies at the end of the full expression that
// made it: its values are copied into the operand's own buffer.
template <class Policy, class X>
operand<value_type_t<X>> lasting_operand(X&& x) {
  using T = value_type_t<X>;
  operand<T> r = node_operand<Policy>(x);
  if constexpr (!std::is_lvalue_reference_v<X>) {
    if (r.owned.data() == nullptr && r.view.rows != 0 && r.view.cols != 0) {
      operand<T> c{aligned_buffer<T>(r.view.rows * r.view.cols, aligned_buffer<T>::uninitialized), {}};
      const auto dst = dense(c.owned.data(), r.view.rows, r.view.cols, r.view.cols);
      copy_strided(r.view, dst);
      c.view = dst.as_const();
      return c;
    }
  }
  return r;
}

// For kernels that read rows in place (the fused kernel's Q, bias and mask,
// a similarity's queries): unit column stride, copying if need be.
template <class T>
void make_rows_contiguous(operand<T>& x) {
  if (x.view.col_stride == 1 || x.view.rows == 0) return;
  operand<T> c{aligned_buffer<T>(x.view.rows * x.view.cols, aligned_buffer<T>::uninitialized), {}};
  const auto dst = dense(c.owned.data(), x.view.rows, x.view.cols, x.view.cols);
  copy_strided(x.view, dst);
  c.view = dst.as_const();
  x = std::move(c);
}

// matrix, matrix_view: their own memory.
template <class E>
  requires leaf<E>
struct naive_evaluator<E> {
  using T = value_type_t<E>;
  template <class Policy>
  static operand<T> evaluate(const E& e) {
    return {{}, leaf_view(e)};
  }
  template <class Policy>
  static void into(const E& e, kernels::strided<T> out) {
    copy_strided(evaluate<Policy>(e).view, out);
  }
};

// transpose: the operand's memory with its strides swapped.
template <class X>
struct naive_evaluator<transpose_expr<X>> {
  using T = value_type_t<X>;
  template <class Policy>
  static operand<T> evaluate(const transpose_expr<X>& e) {
    operand<T> r = node_operand<Policy>(e.arg());
    r.view = r.view.transposed();
    return r;
  }
  template <class Policy>
  static void into(const transpose_expr<X>& e, kernels::strided<T> out) {
    copy_strided(evaluate<Policy>(e).view, out);
  }
};

template <class A, class B>
struct naive_evaluator<product_expr<A, B>> {
  using T = value_type_t<A>;
  template <class Policy>
  static void into(const product_expr<A, B>& e, kernels::strided<T> out) {
    const operand<T> a = node_operand<Policy>(e.lhs());
    const operand<T> b = node_operand<Policy>(e.rhs());
    // softmax(S) * V: a key a row may not see (weight 0) is not read for it.
    if constexpr (is_softmax_v<bare_t<A>>) kernels::weigh(a.view, b.view, out.data, out.row_stride);
    else kernels::gemm(a.view, b.view, out.data, out.row_stride);
  }
};

template <class X, class S, scale_op Op>
struct naive_evaluator<scaled_expr<X, S, Op>> {
  using T = value_type_t<X>;
  template <class Policy>
  static void into(const scaled_expr<X, S, Op>& e, kernels::strided<T> out) {
    node_into<Policy>(e.arg(), out);
    if constexpr (Op == scale_op::multiply) {
      kernels::multiply(out, scalar_value<T>(e.factor()));
    } else {
      kernels::divide(out, scalar_value<T>(e.factor()));
    }
  }
};

template <class A, class B, elementwise_op Op>
struct naive_evaluator<elementwise_expr<A, B, Op>> {
  using T = value_type_t<A>;
  template <class Policy>
  static void into(const elementwise_expr<A, B, Op>& e, kernels::strided<T> out) {
    node_into<Policy>(e.lhs(), out);
    const operand<T> b = node_operand<Policy>(e.rhs());
    if constexpr (Op == elementwise_op::add) {
      kernels::add(out, b.view);
    } else {
      kernels::subtract(out, b.view);
    }
  }
};

template <class X>
struct naive_evaluator<softmax_expr<X>> {
  using T = value_type_t<X>;
  template <class Policy>
  static void into(const softmax_expr<X>& e, kernels::strided<T> out) {
    node_into<Policy>(e.arg(), out);
    kernels::softmax_rows(out, static_cast<T>(e.sink()));
  }
};

template <class S>
struct naive_evaluator<causal_expr<S>> {
  using T = value_type_t<S>;
  template <class Policy>
  static void into(const causal_expr<S>& e, kernels::strided<T> out) {
    node_into<Policy>(e.arg(), out);
    kernels::mask_outside(out, node_bounds(&e));
  }
};

template <class S>
struct naive_evaluator<window_expr<S>> {
  using T = value_type_t<S>;
  template <class Policy>
  static void into(const window_expr<S>& e, kernels::strided<T> out) {
    node_into<Policy>(e.arg(), out);
    kernels::mask_outside(out, node_bounds(&e));
  }
};

// Positions change no score (the causal and window nodes above read them).
template <class S>
struct naive_evaluator<positions_expr<S>> {
  using T = value_type_t<S>;
  template <class Policy>
  static void into(const positions_expr<S>& e, kernels::strided<T> out) {
    node_into<Policy>(e.arg(), out);
  }
};

template <class S, class M>
struct naive_evaluator<masked_expr<S, M>> {
  using T = value_type_t<S>;
  template <class Policy>
  static void into(const masked_expr<S, M>& e, kernels::strided<T> out) {
    node_into<Policy>(e.arg(), out);
    kernels::mask_where_false(out, leaf_view(e.mask()));
  }
};

}  // namespace qkv::detail
