// The fused strategy: recognises softmax(S) * V where S is a score chain,
// Q * transpose(K) followed by any of: a scalar factor or divisor, causal,
// masked (one mask), + B or − B (one bias). The chain is read into an
// attention_problem (pointers, strides and a description of the score
// post-operations) and handed to the fused kernel. Operands that are not
// storage (Q = X * Wq, say) are evaluated first, by the same policy.
#pragma once

#include "naive.hpp"

#include "../kernels/api.hpp"
#include "../kernels/attention_problem.hpp"

#include <type_traits>

namespace qkv::detail {

// What a score chain is made of, while its operands are evaluated.
template <class T>
struct score_parts {
  operand<T> q, k, bias;
  long double scale = 1, bias_scale = 1;  // one rounding to T at the end
  bool has_bias = false;
  bool causal = false;
  operand<bool> mask;
};

template <class S>
struct score_chain {
  static constexpr bool matches = false, has_bias = false, has_mask = false;
};

template <class Q, class K>
  requires is_transpose_v<bare_t<K>>
struct score_chain<product_expr<Q, K>> {
  static constexpr bool matches = true, has_bias = false, has_mask = false;
  template <class Policy, class T>
  static void describe(const product_expr<Q, K>& e, score_parts<T>& parts) {
    parts.q = node_operand<Policy>(e.lhs());
    parts.k = node_operand<Policy>(e.rhs().arg());
  }
};

template <class X, class S, scale_op Op>
struct score_chain<scaled_expr<X, S, Op>> : score_chain<bare_t<X>> {
  template <class Policy, class T>
  static void describe(const scaled_expr<X, S, Op>& e, score_parts<T>& parts) {
    score_chain<bare_t<X>>::template describe<Policy>(e.arg(), parts);
    const auto c = static_cast<long double>(e.factor());
    if constexpr (Op == scale_op::multiply) {
      parts.scale *= c, parts.bias_scale *= c;
    } else {
      parts.scale /= c, parts.bias_scale /= c;
    }
  }
};

template <class X>
struct score_chain<causal_expr<X>> : score_chain<bare_t<X>> {
  template <class Policy, class T>
  static void describe(const causal_expr<X>& e, score_parts<T>& parts) {
    score_chain<bare_t<X>>::template describe<Policy>(e.arg(), parts);
    parts.causal = true;
  }
};

template <class X, class M>
struct score_chain<masked_expr<X, M>> {
  using inner = score_chain<bare_t<X>>;
  static constexpr bool matches = inner::matches && !inner::has_mask;
  static constexpr bool has_bias = inner::has_bias, has_mask = true;
  template <class Policy, class T>
  static void describe(const masked_expr<X, M>& e, score_parts<T>& parts) {
    inner::template describe<Policy>(e.arg(), parts);
    parts.mask.view = leaf_view(e.mask());
  }
};

// S + B, S − B, and B + S.
template <class A, class B, elementwise_op Op>
struct score_chain<elementwise_expr<A, B, Op>> {
  static constexpr bool left = score_chain<bare_t<A>>::matches && !score_chain<bare_t<A>>::has_bias;
  static constexpr bool right =
      !left && Op == elementwise_op::add && score_chain<bare_t<B>>::matches && !score_chain<bare_t<B>>::has_bias;
  using inner = score_chain<bare_t<std::conditional_t<left, A, B>>>;
  static constexpr bool matches = left || right;
  static constexpr bool has_bias = true, has_mask = inner::has_mask;
  template <class Policy, class T>
  static void describe(const elementwise_expr<A, B, Op>& e, score_parts<T>& parts) {
    if constexpr (left) {
      inner::template describe<Policy>(e.lhs(), parts);
      parts.bias = node_operand<Policy>(e.rhs());
      parts.bias_scale = Op == elementwise_op::add ? 1 : -1;
    } else {
      inner::template describe<Policy>(e.rhs(), parts);
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

// The fused kernel reads Q and B row by row: give them unit column stride.
template <class T>
void make_rows_contiguous(operand<T>& x) {
  if (x.view.col_stride == 1 || x.view.rows == 0) return;
  operand<T> c{aligned_buffer<T>(x.view.rows * x.view.cols, aligned_buffer<T>::uninitialized), {}};
  const auto dst = dense(c.owned.data(), x.view.rows, x.view.cols, x.view.cols);
  copy_strided(x.view, dst);
  c.view = dst.as_const();
  x = std::move(c);
}

// The operands of one fused attention, kept alive until the kernel has run.
template <class T>
struct fused_operands {
  score_parts<T> parts;
  operand<T> v;
};

// The kernel's problem for e written into out; e's operands that are not
// storage are evaluated (by Policy) into `keep`.
template <class Policy, class E>
kernels::attention_problem<value_type_t<E>> attention_problem_of(const E& e, kernels::strided<value_type_t<E>> out,
                                                                  fused_operands<value_type_t<E>>& keep) {
  using T = value_type_t<E>;
  using chain = score_chain<typename fused_form<E>::scores>;
  score_parts<T>& parts = keep.parts;
  chain::template describe<Policy>(e.lhs().arg(), parts);
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
  problem.causal = parts.causal;
  problem.mask = parts.mask.view;
  return problem;
}

template <class Policy, class E>
void fused_into(const E& e, kernels::strided<value_type_t<E>> out) {
  fused_operands<value_type_t<E>> keep;
  kernels::attention(attention_problem_of<Policy>(e, out, keep));
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
