// transpose(X): the n×m matrix Xᵀ of an m×n expression.
#pragma once

#include "node.hpp"

#include <array>
#include <tuple>
#include <utility>

namespace qkv {

template <class X>
class transpose_expr
    : public detail::unary_node<X, detail::bare_t<X>::static_cols, detail::bare_t<X>::static_rows> {
 public:
  template <class A>
  explicit transpose_expr(A&& a) : arg_(std::forward<A>(a)) {}

  std::size_t rows() const { return arg_.cols(); }
  std::size_t cols() const { return arg_.rows(); }
  batch_extents batch() const { return detail::batch_of(arg_); }
  const detail::bare_t<X>& arg() const { return arg_; }
  auto operands() const { return std::tie(arg_); }

  template <class Y>
  auto rebuild(Y&& y) const {
    return transpose_expr<detail::closure_t<Y&&>>(std::forward<Y>(y));
  }
  // Storage is read transposed in place; anything else is evaluated first.
  static constexpr std::array<bool, 1> operand_buffers{true};
  static constexpr detail::node_work work(const void*) { return {}; }

 private:
  X arg_;
};

template <class E>
inline constexpr bool is_transpose_v = false;
template <class X>
inline constexpr bool is_transpose_v<transpose_expr<X>> = true;

template <expression X>
auto transpose(X&& x) {
  return transpose_expr<detail::closure_t<X&&>>(std::forward<X>(x));
}

}  // namespace qkv
