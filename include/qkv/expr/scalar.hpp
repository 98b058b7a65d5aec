// Scalars that scale an expression: plain numbers, and compile-time ones
// such as sqrt(dim<64>).
#pragma once

#include "../shape/extent.hpp"

#include <boost/hana/integral_constant.hpp>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <type_traits>

namespace qkv {

namespace detail {

// Newton's iteration in long double, converged to a fixed point; the result
// is rounded once more to float or double where it is used.
constexpr long double constexpr_sqrt(long double x) {
  if (x <= 0) return 0;
  long double r = x < 1 ? 1 : x;
  for (;;) {
    long double next = (r + x / r) / 2;
    if (next >= r) return r;  // decreasing from above until it stalls
    r = next;
  }
}

}  // namespace detail

// The square root of a static extent, known while compiling.
template <std::size_t N>
struct sqrt_extent {
  static constexpr bool qkv_static_scalar = true;
  static constexpr long double value = detail::constexpr_sqrt(static_cast<long double>(N));
  template <std::floating_point T>
  constexpr explicit operator T() const noexcept {
    return static_cast<T>(value);
  }
};

// sqrt(dim<64>): a compile-time scalar.
template <std::size_t N>
constexpr sqrt_extent<N> sqrt(boost::hana::integral_constant<std::size_t, N>) noexcept {
  return {};
}

// sqrt(x) of a run-time number; an ordinary value.
template <std::floating_point T>
T sqrt(T x) noexcept {
  return std::sqrt(x);
}

// What may multiply or divide an expression: a number (not bool), or a
// compile-time scalar.
template <class S>
concept scalar = (std::is_arithmetic_v<std::remove_cvref_t<S>> && !std::is_same_v<std::remove_cvref_t<S>, bool>) ||
                 requires { requires std::remove_cvref_t<S>::qkv_static_scalar; };

// A scalar's value in the element type T.
template <class T, class S>
constexpr T scalar_value(const S& s) noexcept {
  return static_cast<T>(s);
}

}  // namespace qkv
