// Extents, static and dynamic, and compile-time scalars.
#include <catch2/catch.hpp>

#include <qkv/qkv.hpp>

#include <boost/hana/core/is_a.hpp>
#include <boost/hana/integral_constant.hpp>

#include <cmath>
#include <type_traits>
#include <utility>

// sqrt(dim<N>) without `using namespace qkv`: found by argument-dependent lookup.
namespace adl_probe {
constexpr double sqrt_16() { return static_cast<double>(sqrt(qkv::dim<16>)); }
}  // namespace adl_probe

using namespace qkv;
namespace hana = boost::hana;

TEST_CASE("dim<N> is a Hana compile-time integer", "[shape]") {
  STATIC_REQUIRE(hana::value(dim<64>) == 64);
  STATIC_REQUIRE(decltype(dim<64>)::value == 64);
  // Arithmetic on static extents stays static.
  constexpr auto twice = dim<64> * dim<2>;
  STATIC_REQUIRE(hana::value(twice) == 128);
  STATIC_REQUIRE(hana::is_a<hana::integral_constant_tag<std::size_t>>(dim<3>));
  STATIC_REQUIRE(std::is_empty_v<std::remove_cv_t<decltype(dim<7>)>>);
}

TEST_CASE("dyn marks a dynamic extent", "[shape]") {
  STATIC_REQUIRE(!is_static(dyn));
  STATIC_REQUIRE(is_static(64));
  STATIC_REQUIRE(extents_agree(3, 3));
  STATIC_REQUIRE(!extents_agree(3, 4));
  STATIC_REQUIRE(extents_agree(dyn, 4));
  STATIC_REQUIRE(extents_agree(3, dyn));
  STATIC_REQUIRE(common_extent(dyn, 4) == 4);
  STATIC_REQUIRE(common_extent(4, dyn) == 4);
}

TEST_CASE("a static extent costs no storage", "[shape]") {
  STATIC_REQUIRE(std::is_empty_v<extent<64>>);
  STATIC_REQUIRE(sizeof(matrix_view<float, 4, 8>) == 3 * sizeof(void*));  // pointer and the two strides only
  STATIC_REQUIRE(sizeof(matrix_view<float, dyn, dyn>) == 5 * sizeof(void*));
}

TEST_CASE("sqrt(dim<N>) is a compile-time scalar and correctly rounded", "[shape]") {
  constexpr auto s = sqrt(dim<64>);
  STATIC_REQUIRE(static_cast<double>(s) == 8.0);
  STATIC_REQUIRE(std::is_empty_v<decltype(s)>);
  STATIC_REQUIRE(scalar<decltype(s)>);
  STATIC_REQUIRE(adl_probe::sqrt_16() == 4.0);
  // Equal to the correctly rounded std::sqrt in float and double, for every
  // head size up to 300 and a few larger ones.
  const auto check = []<std::size_t... N>(std::index_sequence<N...>) {
    const double as_double[] = {static_cast<double>(sqrt(dim<N + 1>))...};
    const float as_float[] = {static_cast<float>(sqrt(dim<N + 1>))...};
    int wrong = 0;
    for (std::size_t i = 0; i < sizeof...(N); ++i) {
      wrong += as_double[i] != std::sqrt(double(i + 1));
      wrong += as_float[i] != std::sqrt(float(i + 1));
    }
    return wrong;
  };
  CHECK(check(std::make_index_sequence<300>{}) == 0);
  CHECK(static_cast<double>(sqrt(dim<4096>)) == 64.0);
  CHECK(static_cast<double>(sqrt(dim<12288>)) == std::sqrt(12288.0));
}

TEST_CASE("sqrt of a run-time value is an ordinary number", "[shape]") {
  float dk = 64;
  CHECK(sqrt(dk) == 8.0f);
  STATIC_REQUIRE(std::is_same_v<decltype(qkv::sqrt(dk)), float>);
  STATIC_REQUIRE(scalar<float>);
  STATIC_REQUIRE(scalar<int>);
  STATIC_REQUIRE(!scalar<bool>);
  STATIC_REQUIRE(!scalar<matrix<float, 2, 2>>);
}
