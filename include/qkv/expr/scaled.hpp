// X * s, s * X and X / s for a scalar s.
#pragma once

#include "node.hpp"
#include "scalar.hpp"

#include <utility>

namespace qkv {

enum class scale_op { multiply, divide };

template <class X, class S, scale_op Op>
class scaled_expr : public detail::same_shape_unary<X> {
  static_assert(value_element<value_type_t<X>>, "qkv: X * s, X / s: X must be a float or double matrix, or a bf16 or f16 one (bool is for masks)");

 public:
  static constexpr scale_op op = Op;

  template <class A>
  scaled_expr(A&& a, S s) : detail::same_shape_unary<X>(std::forward<A>(a)), s_(s) {}

  const S& factor() const { return s_; }

  template <class Y>
  auto rebuild(Y&& y) const {
    return scaled_expr<detail::closure_t<Y&&>, S, Op>(std::forward<Y>(y), s_);
  }
  static constexpr detail::node_work work(const scaled_expr* e) { return {detail::rows_of(e) * detail::cols_of(e)}; }

 private:
  [[no_unique_address]] S s_;
};

template <class E>
inline constexpr bool is_scaled_v = false;
template <class X, class S, scale_op Op>
inline constexpr bool is_scaled_v<scaled_expr<X, S, Op>> = true;

template <expression X, scalar S>
auto operator*(X&& x, S s) {
  return scaled_expr<detail::closure_t<X&&>, S, scale_op::multiply>(std::forward<X>(x), s);
}

// s * X is X * s: multiplication of two floats commutes exactly.
template <scalar S, expression X>
auto operator*(S s, X&& x) {
  return std::forward<X>(x) * s;
}

template <expression X, scalar S>
auto operator/(X&& x, S s) {
  return scaled_expr<detail::closure_t<X&&>, S, scale_op::divide>(std::forward<X>(x), s);
}

}  // namespace qkv
