// softmax(X): row-wise, each row turned into a probability distribution.
#pragma once

#include "node.hpp"

#include <utility>

namespace qkv {

template <class X>
class softmax_expr : public detail::same_shape_unary<X> {
  static_assert(element<value_type_t<X>>, "qkv: softmax(X): X must be a float or double matrix (bool is for masks)");

 public:
  using detail::same_shape_unary<X>::same_shape_unary;
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
