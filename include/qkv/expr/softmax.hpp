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

namespace detail {
// Where a softmax reads its per-head sinks: element h at data + h·stride,
// read as a C by `read` (which knows the element type).
template <class C>
struct head_sinks {
  const void* data = nullptr;
  std::ptrdiff_t stride = 1;
  C (*read)(const void*, std::ptrdiff_t, std::size_t) = nullptr;
};
}  // namespace detail

template <class X>
class softmax_expr : public detail::same_shape_unary<X>, public detail::slice_position {
  static_assert(value_element<value_type_t<X>>, "qkv: softmax(X): X must be a float or double matrix, or a bf16 or f16 one (bool is for masks)");
  using C = compute_t<value_type_t<X>>;

 public:
  using detail::same_shape_unary<X>::same_shape_unary;

  // The sink of the slice being evaluated; −∞ for none. Per-head sinks are
  // read from the user's matrix when asked, as every other operand is: a
  // change to it is seen by the next evaluation of the same expression.
  C sink() const { return heads_.read != nullptr ? heads_.read(heads_.data, heads_.stride, head_index()) : sink_; }
  bool has_sink() const { return sink_ != -std::numeric_limits<C>::infinity() || heads_.read != nullptr; }
  void set_sink(C sink) { sink_ = sink; }
  // One sink per head: element h of a row `stride` elements apart, of type E.
  template <class E>
  void set_head_sinks(const E* data, std::ptrdiff_t stride) {
    heads_ = {data, stride, [](const void* d, std::ptrdiff_t st, std::size_t h) {
                return static_cast<C>(static_cast<const E*>(d)[static_cast<std::ptrdiff_t>(h) * st]);
              }};
  }
  // The same, from values the node keeps (a temporary matrix's).
  void own_head_sinks(std::shared_ptr<const std::vector<C>> values) {
    owned_ = std::move(values);
    set_head_sinks(owned_->data(), 1);
  }
  // The user's matrix of per-head sinks, when its elements are of the type
  // the softmax computes in: a leaf that gradient(e, dO, wrt(sinks)) may
  // name. Null otherwise.
  using sink_leaf_type = matrix_view<const C, dyn, dyn>;
  const sink_leaf_type* sink_leaf() const { return leaf_ ? &*leaf_ : nullptr; }
  void set_sink_leaf(const sink_leaf_type& m) { leaf_ = m; }

  template <class Y>
  auto rebuild(Y&& y) const {
    softmax_expr<detail::closure_t<Y&&>> r(std::forward<Y>(y));
    r.heads_ = heads_;
    r.owned_ = owned_;
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
  detail::head_sinks<C> heads_;
  std::shared_ptr<const std::vector<C>> owned_;  // a temporary sink matrix's values
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

// One sink per head: a 1 × H matrix or matrix_view, held as every operand
// is: an lvalue matrix (or any view) is read where it is, when the
// expression is evaluated; a temporary matrix's values are kept.
template <expression X, expression M>
  requires(leaf<M>)
auto softmax(X&& x, M&& sinks) {
  using m_t = std::remove_cvref_t<M>;
  using C = compute_t<value_type_t<X>>;
  using E = std::remove_const_t<value_type_t<m_t>>;
  constexpr std::size_t heads = detail::static_batch_of<std::remove_cvref_t<X>>()[1];
  static_assert(!std::is_same_v<E, bool>,
                "qkv: softmax(S, sinks): the sinks must be numbers (a 1 x H matrix of logits), not bool");
  static_assert(static_extents_agree<m_t::static_rows, 1>, "qkv: softmax(S, sinks): the sink matrix must have one row (1 x H)");
  static_assert(static_extents_agree<m_t::static_cols, heads>,
                "qkv: softmax(S, sinks): the sink matrix's columns differ from the heads of S (one sink per head)");
  const std::size_t h = batch_of(x)[1];
  if (sinks.rows() != 1 || sinks.cols() != h)
    throw std::invalid_argument("qkv: softmax(S, sinks): the sink matrix is " + std::to_string(sinks.rows()) + " x " +
                                std::to_string(sinks.cols()) + ", S has " + std::to_string(h) +
                                (h == 1 ? " head (1 x 1 expected)" : " heads (1 x " + std::to_string(h) + " expected)"));
  softmax_expr<detail::closure_t<X&&>> r(std::forward<X>(x));
  if constexpr (std::is_lvalue_reference_v<M> || m_t::qkv_is_view) {
    std::ptrdiff_t stride = 1;
    if constexpr (requires { sinks.col_stride(); }) stride = static_cast<std::ptrdiff_t>(sinks.col_stride());
    r.set_head_sinks(sinks.data(), stride);
    if constexpr (std::is_same_v<E, C>) r.set_sink_leaf(matrix_view<const C, dyn, dyn>(sinks));
  } else {
    auto values = std::make_shared<std::vector<C>>(h);
    for (std::size_t k = 0; k < h; ++k) (*values)[k] = static_cast<C>(sinks(0, k));
    r.own_head_sinks(std::move(values));
  }
  return r;
}

}  // namespace qkv
