// causal(S) and masked(S, M): scores set to −∞ where a query may not look.
#pragma once

#include "../shape/check.hpp"
#include "key_aligned.hpp"
#include "positions.hpp"
#include "node.hpp"

#include <array>
#include <concepts>
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

namespace qkv {

// Masks S(i, j) where j > i + (m − n): query i sees keys up to its own
// position, the last query row aligned with the last key (bottom-right).
template <class S>
class causal_expr : public detail::same_shape_unary<S> {
  static_assert(value_element<value_type_t<S>>, "qkv: causal(S): S must be a float or double matrix, or a bf16 or f16 one");

 public:
  using detail::same_shape_unary<S>::same_shape_unary;

  template <class Y>
  auto rebuild(Y&& y) const {
    return causal_expr<detail::closure_t<Y&&>>(std::forward<Y>(y));
  }
};

// Masks S(i, j) where M(i, j) is false.
template <class S, class M>
class masked_expr
    : public detail::binary<S, M, detail::bare_t<S>::static_rows, detail::bare_t<S>::static_cols> {
  using s_t = detail::bare_t<S>;
  using m_t = detail::bare_t<M>;
  static_assert(value_element<value_type_t<S>>, "qkv: masked(S, M): S must be a float or double matrix, or a bf16 or f16 one");
  static_assert(std::is_same_v<value_type_t<M>, bool> && (leaf<m_t> || tensor_leaf<m_t>),
                "qkv: masked(S, M): M must be a matrix, matrix_view, tensor or tensor_view of bool");
  static_assert(static_extents_agree<s_t::static_rows, m_t::static_rows>, "qkv: masked(S, M): the rows of S differ from the rows of M");
  static_assert(static_extents_agree<s_t::static_cols, m_t::static_cols>, "qkv: masked(S, M): the columns of S differ from the columns of M");
  static constexpr batch_extents s_batch = detail::static_batch_of<s_t>(), m_batch = detail::static_batch_of<m_t>();
  static_assert(static_batches_agree<s_batch[0], s_batch[1], m_batch[0], m_batch[1], false>,
                "qkv: masked(S, M): the batch extents of S and M differ (each pair must be equal or one 1)");

 public:
  template <class A, class B>
  masked_expr(A&& s, B&& m)
      : detail::binary<S, M, s_t::static_rows, s_t::static_cols>(std::forward<A>(s), std::forward<B>(m)) {
    detail::require_same_shape(arg(), mask(), "masked(S, M): the shapes of S and M differ");
    this->require_batch("masked(S, M): the batch extents of S and M differ");
  }

  std::size_t rows() const { return arg().rows(); }
  std::size_t cols() const { return arg().cols(); }
  const s_t& arg() const { return this->lhs(); }
  const m_t& mask() const { return this->rhs(); }

  template <class Y, class N>
  auto rebuild(Y&& y, N&& mask) const {
    return masked_expr<detail::closure_t<Y&&>, detail::closure_t<N&&>>(std::forward<Y>(y), std::forward<N>(mask));
  }
  // S in place; M is storage.
  static constexpr std::array<bool, 2> operand_buffers{false, false};
};

// pred(i, j), or pred(b, h, i, j) with the slice's batch and head indices
// (std::size_t; 0 for a matrix): true keeps key j for query i.
template <class P>
concept position_predicate = std::predicate<const P&, std::size_t, std::size_t> ||
                             std::predicate<const P&, std::size_t, std::size_t, std::size_t, std::size_t>;

// Masks S(i, j) where pred(i, j) is false (pred on std::size_t positions):
// a sliding window, a prefix-LM, a block-sparse pattern, without an n×m mask
// in memory. The fused kernel skips key blocks in which it keeps nothing.
// i is the row of Q; key_aligned(pred) gets its position among the keys.
// pred must be pure and copyable.
template <class S, class P>
class predicate_masked_expr : public detail::same_shape_unary<S>, public detail::slice_position {
  static_assert(value_element<value_type_t<S>>, "qkv: masked(S, pred): S must be a float or double matrix, or a bf16 or f16 one");
  static_assert(position_predicate<P>,
                "qkv: masked(S, pred): pred must be callable as pred(i, j) or pred(b, h, i, j) on std::size_t "
                "indices, giving a bool");

 public:
  template <class A>
  predicate_masked_expr(A&& s, P pred) : detail::same_shape_unary<S>(std::forward<A>(s)), pred_(std::move(pred)) {
    detail::place_functor_over(pred_, this->arg());
  }

  const P& predicate() const { return pred_; }

  template <class Y>
  auto rebuild(Y&& y) const {
    predicate_masked_expr<detail::closure_t<Y&&>, P> r(std::forward<Y>(y), pred_);
    r.at_slice(position());
    return r;
  }

 private:
  [[no_unique_address]] P pred_;
};

namespace detail {

// pred(b, h, i, j) or pred(i, j), whichever pred takes. (For a pred not
// callable so the node's static_assert has said so: false, and no more
// errors.)
template <class P>
bool call_predicate(const P& pred, std::size_t i, std::size_t j, std::size_t b = 0, std::size_t h = 0) {
  if constexpr (std::predicate<const P&, std::size_t, std::size_t, std::size_t, std::size_t>)
    return static_cast<bool>(pred(b, h, i, j));
  else if constexpr (std::predicate<const P&, std::size_t, std::size_t>) return static_cast<bool>(pred(i, j));
  else return false;
}

// 1 or 0 where pred's block hint, any(b, h, i0, i1, j0, j1) or
// any(i0, i1, j0, j1), says whether it keeps anything of rows [i0, i1) and
// keys [j0, j1); −1 where it has none.
template <class P>
int predicate_hint(const P& pred, std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1, std::size_t b,
                   std::size_t h) {
  if constexpr (requires { pred.any(b, h, i0, i1, j0, j1); }) return pred.any(b, h, i0, i1, j0, j1) ? 1 : 0;
  else if constexpr (requires { pred.any(i0, i1, j0, j1); }) return pred.any(i0, i1, j0, j1) ? 1 : 0;
  else return -1;
}

}  // namespace detail

template <class E>
inline constexpr bool is_predicate_masked_v = false;
template <class S, class P>
inline constexpr bool is_predicate_masked_v<predicate_masked_expr<S, P>> = true;

template <expression S>
auto causal(S&& s) {
  return causal_expr<detail::closure_t<S&&>>(std::forward<S>(s));
}

template <expression S, expression M>
auto masked(S&& s, M&& m) {
  return masked_expr<detail::closure_t<S&&>, detail::closure_t<M&&>>(std::forward<S>(s), std::forward<M>(m));
}

template <expression S, class P>
  requires(!expression<P>)
auto masked(S&& s, P pred) {
  return predicate_masked_expr<detail::closure_t<S&&>, P>(std::forward<S>(s), std::move(pred));
}

}  // namespace qkv
