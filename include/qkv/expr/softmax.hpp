// softmax(X): row-wise, each row turned into a probability distribution.
// softmax(X, sink): each row's denominator gains one logit σ, an attention
// sink: p_ij = exp(x_ij) / (exp(σ) + Σ_j exp(x_ij)). σ is a number, or one
// per head (a 1 × H matrix, for scores with H heads), broadcast over the batch.
#pragma once

#include "../storage/matrix_view.hpp"
#include "node.hpp"

#include <cstddef>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace qkv {

template <class X>
class softmax_expr : public detail::same_shape_unary<X>, public detail::slice_position {
  static_assert(value_element<value_type_t<X>>, "qkv: softmax(X): X must be a float or double matrix, or a bf16 or f16 one (bool is for masks)");
  using C = compute_t<value_type_t<X>>;

 public:
  using detail::same_shape_unary<X>::same_shape_unary;

  // The sink of the slice being evaluated; −∞ for none.
  C sink() const { return sink_; }
  bool has_sink() const { return sink_ != -std::numeric_limits<C>::infinity() || heads_ != nullptr; }
  void set_sink(C sink) { sink_ = sink; }
  // One sink per head; the slice at head h (eval/slice.hpp) takes the h-th.
  void set_head_sinks(std::shared_ptr<const std::vector<C>> heads) {
    heads_ = std::move(heads);
    sink_ = (*heads_)[0];
  }
  // The user's matrix of per-head sinks, when its elements are of the type
  // the softmax computes in: a leaf that gradient(e, dO, wrt(sinks)) may
  // name (the values are copied, so nothing else reads it). Null otherwise.
  using sink_leaf_type = matrix_view<const C, dyn, dyn>;
  const sink_leaf_type* sink_leaf() const { return leaf_ ? &*leaf_ : nullptr; }
  void set_sink_leaf(const sink_leaf_type& m) { leaf_ = m; }
  void at_slice(batch_extents index) {
    slice_position::at_slice(index);
    if (heads_ != nullptr) sink_ = (*heads_)[index[1]];
  }

  template <class Y>
  auto rebuild(Y&& y) const {
    softmax_expr<detail::closure_t<Y&&>> r(std::forward<Y>(y));
    r.heads_ = heads_;
    r.sink_ = sink_;
    r.leaf_ = leaf_;
    r.slice_position::at_slice(position());
    return r;
  }
  // Per element: maximum, subtraction, sum, division, and one exponential.
  static constexpr detail::node_work work(const softmax_expr* e) {
    const std::size_t nm = detail::rows_of(e) * detail::cols_of(e);
    return {4 * nm, nm};
  }

 private:
  template <class>
  friend class softmax_expr;
  C sink_ = -std::numeric_limits<C>::infinity();
  std::shared_ptr<const std::vector<C>> heads_;
  std::optional<sink_leaf_type> leaf_;
};

template <class E>
inline constexpr bool is_softmax_v = false;
template <class X>
inline constexpr bool is_softmax_v<softmax_expr<X>> = true;

template <expression X>
auto softmax(X&& x) {
  return softmax_expr<detail::closure_t<X&&>>(std::forward<X>(x));
}

// A sink as a number.
template <expression X, class N>
  requires(!expression<N> && (std::is_arithmetic_v<N> || half_element<N>))
auto softmax(X&& x, N sink) {
  softmax_expr<detail::closure_t<X&&>> r(std::forward<X>(x));
  r.set_sink(static_cast<compute_t<value_type_t<X>>>(sink));
  return r;
}

// One sink per head: a 1 × H matrix or matrix_view.
template <expression X, expression M>
  requires(leaf<M>)
auto softmax(X&& x, const M& sinks) {
  using m_t = std::remove_cvref_t<M>;
  using C = compute_t<value_type_t<X>>;
  constexpr std::size_t heads = detail::static_batch_of<std::remove_cvref_t<X>>()[1];
  static_assert(!std::is_same_v<std::remove_const_t<value_type_t<m_t>>, bool>,
                "qkv: softmax(S, sinks): the sinks must be numbers (a 1 x H matrix of logits), not bool");
  static_assert(static_extents_agree<m_t::static_rows, 1>, "qkv: softmax(S, sinks): the sink matrix must have one row (1 x H)");
  static_assert(static_extents_agree<m_t::static_cols, heads>,
                "qkv: softmax(S, sinks): the sink matrix's columns differ from the heads of S (one sink per head)");
  const std::size_t h = batch_of(x)[1];
  if (sinks.rows() != 1 || sinks.cols() != h)
    throw std::invalid_argument("qkv: softmax(S, sinks): the sink matrix is " + std::to_string(sinks.rows()) + " x " +
                                std::to_string(sinks.cols()) + ", S has " + std::to_string(h) +
                                (h == 1 ? " head (1 x 1 expected)" : " heads (1 x " + std::to_string(h) + " expected)"));
  auto values = std::make_shared<std::vector<C>>(h);
  for (std::size_t k = 0; k < h; ++k) (*values)[k] = static_cast<C>(sinks(0, k));
  softmax_expr<detail::closure_t<X&&>> r(std::forward<X>(x));
  r.set_head_sinks(std::move(values));
  if constexpr (std::is_same_v<std::remove_const_t<value_type_t<m_t>>, C>) r.set_sink_leaf(matrix_view<const C, dyn, dyn>(sinks));
  return r;
}

}  // namespace qkv
