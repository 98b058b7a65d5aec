// A + B and A - B, elementwise on expressions of one shape.
#pragma once

#include "../shape/check.hpp"
#include "node.hpp"

#include <tuple>
#include <type_traits>
#include <utility>

namespace qkv {

enum class elementwise_op { add, subtract };

template <class A, class B, elementwise_op Op>
class elementwise_expr
    : public detail::node<value_type_t<A>, common_extent(detail::bare_t<A>::static_rows, detail::bare_t<B>::static_rows),
                          common_extent(detail::bare_t<A>::static_cols, detail::bare_t<B>::static_cols)> {
  using a_t = detail::bare_t<A>;
  using b_t = detail::bare_t<B>;
  static_assert(element<value_type_t<A>>, "qkv: A + B, A - B: A must be a float or double matrix (bool is for masks)");
  static_assert(std::is_same_v<value_type_t<A>, value_type_t<B>>, "qkv: A + B, A - B: A and B have different element types");
  static_assert(static_extents_agree<a_t::static_rows, b_t::static_rows>, "qkv: A + B, A - B: the rows of A differ from the rows of B");
  static_assert(static_extents_agree<a_t::static_cols, b_t::static_cols>, "qkv: A + B, A - B: the columns of A differ from the columns of B");

 public:
  static constexpr elementwise_op op = Op;

  template <class L, class R>
  elementwise_expr(L&& a, R&& b) : a_(std::forward<L>(a)), b_(std::forward<R>(b)) {
    const char* what = Op == elementwise_op::add ? "A + B: the shapes differ" : "A - B: the shapes differ";
    detail::require_equal(a_.rows(), b_.rows(), what, a_.rows(), a_.cols(), b_.rows(), b_.cols());
    detail::require_equal(a_.cols(), b_.cols(), what, a_.rows(), a_.cols(), b_.rows(), b_.cols());
  }

  std::size_t rows() const { return a_.rows(); }
  std::size_t cols() const { return a_.cols(); }
  const a_t& lhs() const { return a_; }
  const b_t& rhs() const { return b_; }
  auto operands() const { return std::tie(a_, b_); }

 private:
  A a_;
  B b_;
};

template <expression A, expression B>
auto operator+(A&& a, B&& b) {
  return elementwise_expr<detail::closure_t<A&&>, detail::closure_t<B&&>, elementwise_op::add>(std::forward<A>(a),
                                                                                               std::forward<B>(b));
}

template <expression A, expression B>
auto operator-(A&& a, B&& b) {
  return elementwise_expr<detail::closure_t<A&&>, detail::closure_t<B&&>, elementwise_op::subtract>(
      std::forward<A>(a), std::forward<B>(b));
}

}  // namespace qkv
