// The naive strategy: one evaluator per node type (Eigen's split of
// expressions from evaluators). Each evaluator either writes its node into a
// destination (into) or, for leaves and transposes, hands out a strided view
// of memory that already holds it (evaluate), copying nothing.
#pragma once

#include "../expr/elementwise.hpp"
#include "../expr/mask.hpp"
#include "../expr/product.hpp"
#include "../expr/scaled.hpp"
#include "../expr/softmax.hpp"
#include "../expr/transpose.hpp"
#include "../kernels/api.hpp"
#include "../kernels/mask.hpp"
#include "../storage/aligned_buffer.hpp"

#include <cstddef>
#include <type_traits>
#include <utility>

namespace qkv::detail {

// A node's value: a view, and the buffer behind it when the evaluation owns one.
template <class T>
struct operand {
  aligned_buffer<T> owned;
  kernels::strided<const T> view;
};

template <class T>
kernels::strided<T> dense(T* data, std::size_t rows, std::size_t cols, std::size_t row_stride) {
  return {data, rows, cols, static_cast<std::ptrdiff_t>(row_stride), 1};
}

template <class E>
struct naive_evaluator;  // no evaluator: the node is unknown to the naive strategy

template <class E>
void naive_into(const E& e, kernels::strided<value_type_t<E>> out) {
  naive_evaluator<E>::into(e, out);
}

template <class E>
operand<value_type_t<E>> naive_operand(const E& e) {
  if constexpr (requires { naive_evaluator<E>::evaluate(e); }) {
    return naive_evaluator<E>::evaluate(e);
  } else {
    using T = value_type_t<E>;
    operand<T> r{aligned_buffer<T>(e.rows() * e.cols(), aligned_buffer<T>::uninitialized), {}};
    naive_into(e, dense(r.owned.data(), e.rows(), e.cols(), e.cols()));
    r.view = dense<const T>(r.owned.data(), e.rows(), e.cols(), e.cols());
    return r;
  }
}

template <class T>
void copy_strided(kernels::strided<const T> src, kernels::strided<T> dst) {
  if constexpr (element<T>) {
    kernels::copy(src, dst);
  } else {  // bool masks
    for (std::size_t i = 0; i < src.rows; ++i)
      for (std::size_t j = 0; j < src.cols; ++j) dst(i, j) = src(i, j);
  }
}

// matrix, matrix_view: their own memory.
template <class E>
  requires leaf<E>
struct naive_evaluator<E> {
  using T = value_type_t<E>;
  static operand<T> evaluate(const E& e) { return {{}, dense<const T>(e.data(), e.rows(), e.cols(), e.row_stride())}; }
  static void into(const E& e, kernels::strided<T> out) { copy_strided(evaluate(e).view, out); }
};

// transpose: the operand's memory with its strides swapped.
template <class X>
struct naive_evaluator<transpose_expr<X>> {
  using T = value_type_t<X>;
  static operand<T> evaluate(const transpose_expr<X>& e) {
    operand<T> r = naive_operand(e.arg());
    r.view = r.view.transposed();
    return r;
  }
  static void into(const transpose_expr<X>& e, kernels::strided<T> out) { copy_strided(evaluate(e).view, out); }
};

template <class A, class B>
struct naive_evaluator<product_expr<A, B>> {
  using T = value_type_t<A>;
  static void into(const product_expr<A, B>& e, kernels::strided<T> out) {
    const operand<T> a = naive_operand(e.lhs());
    const operand<T> b = naive_operand(e.rhs());
    kernels::gemm(a.view, b.view, out.data, out.row_stride);
  }
};

template <class X, class S, scale_op Op>
struct naive_evaluator<scaled_expr<X, S, Op>> {
  using T = value_type_t<X>;
  static void into(const scaled_expr<X, S, Op>& e, kernels::strided<T> out) {
    naive_into(e.arg(), out);
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
  static void into(const elementwise_expr<A, B, Op>& e, kernels::strided<T> out) {
    naive_into(e.lhs(), out);
    const operand<T> b = naive_operand(e.rhs());
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
  static void into(const softmax_expr<X>& e, kernels::strided<T> out) {
    naive_into(e.arg(), out);
    kernels::softmax_rows(out);
  }
};

template <class S>
struct naive_evaluator<causal_expr<S>> {
  using T = value_type_t<S>;
  static void into(const causal_expr<S>& e, kernels::strided<T> out) {
    naive_into(e.arg(), out);
    kernels::mask_causal(out);
  }
};

template <class S, class M>
struct naive_evaluator<masked_expr<S, M>> {
  using T = value_type_t<S>;
  static void into(const masked_expr<S, M>& e, kernels::strided<T> out) {
    naive_into(e.arg(), out);
    const auto& m = e.mask();
    kernels::mask_where_false(out, dense<const bool>(m.data(), m.rows(), m.cols(), m.row_stride()));
  }
};

}  // namespace qkv::detail
