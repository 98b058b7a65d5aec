// softmax(X): row-wise, each row turned into a probability distribution.
#pragma once

#include "node.hpp"

#include <tuple>
#include <utility>

namespace qkv {

template <class X>
class softmax_expr
    : public detail::node<value_type_t<X>, detail::bare_t<X>::static_rows, detail::bare_t<X>::static_cols> {
  static_assert(element<value_type_t<X>>, "qkv: softmax(X): X must be a float or double matrix (bool is for masks)");

 public:
  template <class A>
  explicit softmax_expr(A&& a) : arg_(std::forward<A>(a)) {}

  std::size_t rows() const { return arg_.rows(); }
  std::size_t cols() const { return arg_.cols(); }
  const detail::bare_t<X>& arg() const { return arg_; }
  auto operands() const { return std::tie(arg_); }

 private:
  X arg_;
};

template <expression X>
auto softmax(X&& x) {
  return softmax_expr<detail::closure_t<X&&>>(std::forward<X>(x));
}

}  // namespace qkv
