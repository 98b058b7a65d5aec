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
    : public detail::node<value_type_t<A>, detail::bare_t<A>::static_rows, detail::bare_t<B>::static_cols> {
  using a_t = detail::bare_t<A>;
  using b_t = detail::bare_t<B>;
  static_assert(element<value_type_t<A>>, "qkv: A * B: A must be a float or double matrix (bool is for masks)");
  static_assert(std::is_same_v<value_type_t<A>, value_type_t<B>>, "qkv: A * B: A and B have different element types");
  static_assert(static_extents_agree<a_t::static_cols, b_t::static_rows>, "qkv: A * B: the columns of A differ from the rows of B");

 public:
  template <class L, class R>
  product_expr(L&& a, R&& b) : a_(std::forward<L>(a)), b_(std::forward<R>(b)) {
    detail::require_equal(a_.cols(), b_.rows(), "A * B: the columns of A differ from the rows of B", a_.rows(),
                          a_.cols(), b_.rows(), b_.cols());
  }

  std::size_t rows() const { return a_.rows(); }
  std::size_t cols() const { return b_.cols(); }
  const a_t& lhs() const { return a_; }
  const b_t& rhs() const { return b_; }
  auto operands() const { return std::tie(a_, b_); }

 private:
  A a_;
  B b_;
};

template <expression A, expression B>
auto operator*(A&& a, B&& b) {
  return product_expr<detail::closure_t<A&&>, detail::closure_t<B&&>>(std::forward<A>(a), std::forward<B>(b));
}

}  // namespace qkv
