// window(S, w) and window(S, left, right): a sliding window. Query i sees
// the keys j with i' − left ≤ j ≤ i' + right, where i' = i + (m − n) is its
// position among the keys, aligned as causal aligns it (the last query with
// the last key): right for a decode against a cache, whatever n and m are.
// window(S, w) is the query's own position and the w − 1 keys before it.
// The fused kernels skip the key blocks outside it, at any compiler flags.
#pragma once

#include "node.hpp"

#include <concepts>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

namespace qkv {

template <class S>
class window_expr : public detail::same_shape_unary<S> {
  static_assert(value_element<value_type_t<S>>,
                "qkv: window(S, w): S must be a score matrix of float or double, or of bf16 or f16 (bool is for masks)");

 public:
  template <class A>
  window_expr(A&& s, std::size_t left, std::size_t right)
      : detail::same_shape_unary<S>(std::forward<A>(s)), left_(left), right_(right) {}

  std::size_t left() const { return left_; }
  std::size_t right() const { return right_; }

  template <class Y>
  auto rebuild(Y&& y) const {
    return window_expr<detail::closure_t<Y&&>>(std::forward<Y>(y), left_, right_);
  }

 private:
  std::size_t left_, right_;
};

template <class E>
inline constexpr bool is_window_v = false;
template <class S>
inline constexpr bool is_window_v<window_expr<S>> = true;

namespace detail {

// A window's extent as a std::size_t; negative ones throw.
template <std::integral I>
std::size_t window_extent(I x, const char* what) {
  if constexpr (std::is_signed_v<I>) {
    if (x < 0) throw std::invalid_argument(std::string("qkv: ") + what + " must not be negative, got " + std::to_string(x));
  }
  return static_cast<std::size_t>(x);
}

}  // namespace detail

template <expression S, std::integral L, std::integral R>
auto window(S&& s, L left, R right) {
  return window_expr<detail::closure_t<S&&>>(std::forward<S>(s), detail::window_extent(left, "window(S, left, right): left"),
                                             detail::window_extent(right, "window(S, left, right): right"));
}

template <expression S, std::integral I>
auto window(S&& s, I w) {
  const std::size_t width = detail::window_extent(w, "window(S, w): w");
  if (width == 0) throw std::invalid_argument("qkv: window(S, w): w must be at least 1 (the query's own position)");
  return window_expr<detail::closure_t<S&&>>(std::forward<S>(s), width - 1, std::size_t{0});
}

// What is not a score matrix.
template <class S, class... I>
  requires(!expression<S>)
auto window(S&&, I...) {
  static_assert(expression<S>, "qkv: window(S, w): S must be a score matrix (an expression such as Q * transpose(K))");
}

}  // namespace qkv
