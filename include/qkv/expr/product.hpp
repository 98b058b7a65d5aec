// A * B: the matrix product of two expressions.
#pragma once

#include "../shape/check.hpp"
#include "node.hpp"

#include <tuple>
#include <type_traits>
#include <utility>

namespace qkv {

template <class A, class B>
class product_expr
    : public detail::binary<A, B, detail::bare_t<A>::static_rows, detail::bare_t<B>::static_cols, true> {
  using a_t = detail::bare_t<A>;
  using b_t = detail::bare_t<B>;
  static constexpr batch_extents a_batch = detail::static_batch_of<a_t>(), b_batch = detail::static_batch_of<b_t>();
  static_assert(value_element<value_type_t<A>>, "qkv: A * B: A must be a float or double matrix, or a bf16 or f16 one (bool is for masks)");
  static_assert(mixable_elements<value_type_t<A>, value_type_t<B>>, "qkv: A * B: A and B have different element types (float mixes with bf16 or f16, nothing else)");
  static_assert(static_extents_agree<a_t::static_cols, b_t::static_rows>, "qkv: A * B: the columns of A differ from the rows of B");
  static_assert(static_batches_agree<a_batch[0], a_batch[1], b_batch[0], b_batch[1], true>,
                "qkv: A * B: the batch extents of A and B differ (each pair must be equal, or one 1, or one divide the other)");

 public:
  template <class L, class R>
  product_expr(L&& a, R&& b)
      : detail::binary<A, B, a_t::static_rows, b_t::static_cols, true>(std::forward<L>(a), std::forward<R>(b)) {
    this->require_batch("A * B: the batch extents of A and B differ");
    detail::require_equal(this->lhs().cols(), this->rhs().rows(), "A * B: the columns of A differ from the rows of B",
                          this->lhs().rows(), this->lhs().cols(), this->rhs().rows(), this->rhs().cols());
  }

  std::size_t rows() const { return this->lhs().rows(); }
  std::size_t cols() const { return this->rhs().cols(); }

  template <class L, class R>
  auto rebuild(L&& a, R&& b) const {
    return product_expr<detail::closure_t<L&&>, detail::closure_t<R&&>>(std::forward<L>(a), std::forward<R>(b));
  }
  // n×k by k×m: 2·n·k·m.
  static constexpr detail::node_work work(const product_expr* e) {
    return {2 * detail::rows_of(e) * detail::cols_of(detail::lhs_of(e)) * detail::cols_of(e)};
  }
};

template <class E>
inline constexpr bool is_product_v = false;
template <class A, class B>
inline constexpr bool is_product_v<product_expr<A, B>> = true;

template <expression A, expression B>
auto operator*(A&& a, B&& b) {
  return product_expr<detail::closure_t<A&&>, detail::closure_t<B&&>>(std::forward<A>(a), std::forward<B>(b));
}

}  // namespace qkv
