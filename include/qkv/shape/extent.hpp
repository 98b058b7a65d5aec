// Extents: the number of rows or columns of a matrix, static or dynamic.
#pragma once

#include <boost/hana/div.hpp>
#include <boost/hana/equal.hpp>
#include <boost/hana/integral_constant.hpp>
#include <boost/hana/less.hpp>
#include <boost/hana/minus.hpp>
#include <boost/hana/mult.hpp>
#include <boost/hana/not_equal.hpp>
#include <boost/hana/plus.hpp>

#include <cstddef>
#include <limits>

namespace qkv {

// A dynamic extent, known only at run time.
inline constexpr std::size_t dyn = std::numeric_limits<std::size_t>::max();

// A compile-time extent as an ordinary value. It is a Hana integral constant,
// so arithmetic on it stays static (dim<64> * dim<2> is hana::size_c<128>),
// and qkv is among its associated namespaces, so sqrt(dim<64>) finds qkv::sqrt.
template <std::size_t N>
struct static_extent : boost::hana::integral_constant<std::size_t, N> {
  static_assert(N != dyn, "qkv: dim<N> needs a finite N (qkv::dyn marks a dynamic extent in a type)");
};

template <std::size_t N>
inline constexpr static_extent<N> dim{};

constexpr bool is_static(std::size_t e) noexcept { return e != dyn; }

// Two extents agree unless both are static and differ; a dynamic one is
// checked at run time instead.
constexpr bool extents_agree(std::size_t a, std::size_t b) noexcept {
  return a == b || a == dyn || b == dyn;
}

// The same, as a variable template: a failed static_assert on it prints the
// two extents (`static_extents_agree<4, 5>' evaluates to false).
template <std::size_t A, std::size_t B>
inline constexpr bool static_extents_agree = extents_agree(A, B);

// The extent two agreeing extents share: the static one if either is.
constexpr std::size_t common_extent(std::size_t a, std::size_t b) noexcept { return a == dyn ? b : a; }

// Holds an extent's value at run time only when it is dynamic, so a static
// shape costs no storage (CuTe's rule).
template <std::size_t N>
struct extent {
  constexpr extent() noexcept = default;
  constexpr explicit extent(std::size_t) noexcept {}
  static constexpr std::size_t value() noexcept { return N; }
};

template <>
struct extent<dyn> {
  constexpr extent() noexcept = default;
  constexpr explicit extent(std::size_t v) noexcept : v_(v) {}
  constexpr std::size_t value() const noexcept { return v_; }

 private:
  std::size_t v_ = 0;
};

}  // namespace qkv
