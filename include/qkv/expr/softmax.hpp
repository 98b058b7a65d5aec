// softmax(X): row-wise, each row turned into a probability distribution.
#pragma once

#include "node.hpp"

#include <cstddef>
#include <utility>

namespace qkv {

template <class X>
class softmax_expr : public detail::same_shape_unary<X> {
  static_assert(value_element<value_type_t<X>>, "qkv: softmax(X): X must be a float or double matrix, or a bf16 or f16 one (bool is for masks)");

 public:
  using detail::same_shape_unary<X>::same_shape_unary;

  template <class Y>
  auto rebuild(Y&& y) const {
    return softmax_expr<detail::closure_t<Y&&>>(std::forward<Y>(y));
  }
  // Per element: maximum, subtraction, sum, division, and one exponential.
  static constexpr detail::node_work work(const softmax_expr* e) {
    const std::size_t nm = detail::rows_of(e) * detail::cols_of(e);
    return {4 * nm, nm};
  }
};

template <class E>
inline constexpr bool is_softmax_v = false;
template <class X>
inline constexpr bool is_softmax_v<softmax_expr<X>> = true;

template <expression X>
auto softmax(X&& x) {
  return softmax_expr<detail::closure_t<X&&>>(std::forward<X>(x));
}

}  // namespace qkv
