// Node-by-node evaluation of the extension points: similarities, score
// modifiers, predicate masks, and the nodes the built-in similarities lower
// to. They run the same functions as the fused kernel (the score tile, the
// modifier's row loop), so both strategies compute each score alike.
#pragma once

#include "../expr/mask.hpp"
#include "../expr/score_mod.hpp"
#include "../expr/similarity.hpp"
#include "../kernels/attention_with.hpp"
#include "../kernels/row_norms.hpp"
#include "naive.hpp"

#include <cstddef>
#include <limits>
#include <type_traits>

namespace qkv::detail {

// The functor of a similarity, or of a modifier, as the kernels take it.
template <class F>
struct term_extension {
  const F* f;
  template <class V>
  V term(const V& q, const V& k, std::size_t c) const {
    return call_term(*f, q, k, c);
  }
};

template <class F>
struct modifier_extension {
  const F* f;
  template <class V>
  V modify(const V& s, const V& i, const V& j, std::size_t b, std::size_t h) const {
    return call_modifier(*f, s, i, j, b, h);
  }
};

template <class Q, class K, class F>
struct naive_evaluator<similarity_expr<Q, K, F>> {
  using T = value_type_t<Q>;
  template <class Policy>
  static void into(const similarity_expr<Q, K, F>& e, kernels::strided<T> out) {
    operand<T> q = lasting_operand<Policy>(similarity_queries(e.function(), e.lhs()));
    const operand<T> k = lasting_operand<Policy>(similarity_keys(e.function(), e.rhs()));
    make_rows_contiguous(q);
    kernels::scores_with(q.view, k.view, out, term_extension<F>{&e.function()});
  }
};

template <class X>
struct naive_evaluator<row_normalized_expr<X>> {
  using T = value_type_t<X>;
  template <class Policy>
  static void into(const row_normalized_expr<X>& e, kernels::strided<T> out) {
    node_into<Policy>(e.arg(), out);
    kernels::normalize_rows(out);
  }
};

template <class Q, class K>
struct naive_evaluator<neg_sq_l2_expr<Q, K>> {
  using T = value_type_t<Q>;
  template <class Policy>
  static void into(const neg_sq_l2_expr<Q, K>& e, kernels::strided<T> out) {
    const operand<T> q = node_operand<Policy>(e.lhs());
    const operand<T> k = node_operand<Policy>(e.rhs());
    kernels::gemm(q.view, k.view.transposed(), out.data, out.row_stride);
    aligned_buffer<T> qn(q.view.rows, aligned_buffer<T>::uninitialized), kn(k.view.rows, aligned_buffer<T>::uninitialized);
    kernels::row_sq_norms(q.view, qn.data());
    kernels::row_sq_norms(k.view, kn.data());
    for (std::size_t i = 0; i < out.rows; ++i)
      for (std::size_t j = 0; j < out.cols; ++j) out(i, j) = T(2) * out(i, j) - qn.data()[i] - kn.data()[j];
  }
};

template <class S, class F>
struct naive_evaluator<score_mod_expr<S, F>> {
  using T = value_type_t<S>;
  template <class Policy>
  static void into(const score_mod_expr<S, F>& e, kernels::strided<T> out) {
    node_into<Policy>(e.arg(), out);
    using kernel = kernels::attention_kernel<xsimd::default_arch, T, modifier_extension<F>>;
    const modifier_extension<F> ext{&e.function()};
    for (std::size_t i = 0; i < out.rows; ++i)
      kernel::modify(ext, i, 0, out.cols, out.ptr(i, 0), e.batch_index(), e.head_index());
  }
};

template <class S, class P>
struct naive_evaluator<predicate_masked_expr<S, P>> {
  using T = value_type_t<S>;
  template <class Policy>
  static void into(const predicate_masked_expr<S, P>& e, kernels::strided<T> out) {
    node_into<Policy>(e.arg(), out);
    for (std::size_t i = 0; i < out.rows; ++i)
      for (std::size_t j = 0; j < out.cols; ++j)
        if (!call_predicate(e.predicate(), i, j, e.batch_index(), e.head_index()))
          out(i, j) = -std::numeric_limits<T>::infinity();
  }
};

}  // namespace qkv::detail
