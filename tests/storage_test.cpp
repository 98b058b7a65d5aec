// matrix and matrix_view: construction, extents, access, alignment, errors.
#include <catch2/catch.hpp>

#include <qkv/qkv.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

using namespace qkv;

TEST_CASE("a static matrix is zero-filled and aligned", "[storage]") {
  matrix<float, 3, 5> m;
  REQUIRE(m.rows() == 3);
  REQUIRE(m.cols() == 5);
  REQUIRE(m.size() == 15);
  REQUIRE(m.row_stride() == 5);
  REQUIRE(reinterpret_cast<std::uintptr_t>(m.data()) % 64 == 0);
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 5; ++j) CHECK(m(i, j) == 0.0f);
  STATIC_REQUIRE(decltype(m)::static_rows == 3);
  STATIC_REQUIRE(decltype(m)::static_cols == 5);
  STATIC_REQUIRE(std::is_default_constructible_v<matrix<double, 1024, 64>>);
}

TEST_CASE("nested braces fill row by row", "[storage]") {
  const matrix<double, 2, 3> m{{1, 2, 3}, {4, 5, 6}};
  CHECK(m(0, 0) == 1);
  CHECK(m(0, 2) == 3);
  CHECK(m(1, 0) == 4);
  CHECK(m(1, 2) == 6);
  CHECK(m.data()[4] == 5);  // row-major, contiguous

  const matrix<float, dyn, dyn> d{{1, 2}, {3, 4}, {5, 6}};
  CHECK(d.rows() == 3);
  CHECK(d.cols() == 2);
  CHECK(d(2, 1) == 6.0f);

  const matrix<float, 1, 2> row{{1, 0}};
  CHECK(row(0, 0) == 1.0f);
  CHECK(row(0, 1) == 0.0f);

  const matrix<bool, 2, 2> mask{{true, false}, {false, true}};
  CHECK(mask(0, 0));
  CHECK(!mask(0, 1));
}

TEST_CASE("dynamic matrices take their extents at run time and are zero-filled", "[storage]") {
  matrix<float, dyn, 64> a(10);
  CHECK(a.rows() == 10);
  CHECK(a.cols() == 64);
  CHECK(a(9, 63) == 0.0f);

  matrix<double, dyn, dyn> b(7, 3);
  CHECK(b.rows() == 7);
  CHECK(b.cols() == 3);

  matrix<float, dyn, dyn> empty;
  CHECK(empty.rows() == 0);
  CHECK(empty.size() == 0);

  // A static extent given at run time must agree.
  CHECK_THROWS_AS((matrix<float, 4, dyn>(5, 2)), shape_error);
  CHECK_NOTHROW(matrix<float, 4, dyn>(4, 2));
}

TEST_CASE("matrices copy and move by value", "[storage]") {
  matrix<float, 2, 2> a{{1, 2}, {3, 4}};
  matrix<float, 2, 2> b = a;
  b(0, 0) = 9;
  CHECK(a(0, 0) == 1.0f);
  matrix<float, 2, 2> c = std::move(b);
  CHECK(c(0, 0) == 9.0f);
  a = c;
  CHECK(a(0, 0) == 9.0f);
}

TEST_CASE("at() checks bounds", "[storage]") {
  matrix<float, 2, 3> m;
  m.at(1, 2) = 5;
  CHECK(m(1, 2) == 5.0f);
  CHECK_THROWS_AS(m.at(2, 0), std::out_of_range);
  CHECK_THROWS_AS(m.at(0, 3), std::out_of_range);
}

TEST_CASE("a view reads user memory with a row stride", "[storage]") {
  std::vector<float> buf(4 * 10);
  for (std::size_t k = 0; k < buf.size(); ++k) buf[k] = float(k);

  matrix_view<const float, dyn, dyn> v(buf.data(), 4, 3, 10);
  CHECK(v.rows() == 4);
  CHECK(v.cols() == 3);
  CHECK(v.row_stride() == 10);
  CHECK(v(2, 1) == 21.0f);
  CHECK(v.data() == buf.data());

  matrix_view<float, 4, 10> w(buf.data(), 4, 10);
  w(1, 1) = -1;
  CHECK(buf[11] == -1.0f);
  CHECK(v.at(1, 1) == -1.0f);
  CHECK_THROWS_AS(v.at(4, 0), std::out_of_range);
}

TEST_CASE("views check what they are given", "[storage]") {
  std::vector<float> buf(40);
  CHECK_THROWS_AS((matrix_view<float, 4, 10>(buf.data(), 5, 10)), shape_error);
  CHECK_THROWS_AS((matrix_view<float, dyn, dyn>(buf.data(), 4, 10, 9)), shape_error);
  CHECK_THROWS_AS((matrix_view<float, dyn, dyn>(nullptr, 4, 10)), std::invalid_argument);
  CHECK_NOTHROW(matrix_view<float, dyn, dyn>(nullptr, 0, 10));
  try {
    matrix_view<float, dyn, 8>(buf.data(), 4, 10);
    FAIL("no exception");
  } catch (const shape_error& e) {
    CHECK(std::string(e.what()).find("qkv: matrix_view columns: the type says 8, got 10") != std::string::npos);
  }
}

TEST_CASE("matrices convert to views and views to const and dynamic views", "[storage]") {
  matrix<float, 3, 4> m;
  matrix_view<float, 3, 4> v = m;
  v(0, 0) = 2;
  CHECK(m(0, 0) == 2.0f);
  matrix_view<const float, dyn, dyn> c = v;
  CHECK(c(0, 0) == 2.0f);
  matrix_view<const float, 3, dyn> cm = m;
  CHECK(cm.cols() == 4);
  CHECK_THROWS_AS((matrix_view<const float, 3, 4>(matrix_view<const float, dyn, dyn>(m.data(), 2, 4))), shape_error);
  STATIC_REQUIRE(!std::is_constructible_v<matrix_view<float, 3, 4>, const matrix<float, 3, 4>&>);
  STATIC_REQUIRE(!std::is_constructible_v<matrix_view<float, 3, 4>, matrix<float, 3, 4>&&>);  // would dangle
  STATIC_REQUIRE(!std::is_constructible_v<matrix_view<float, 3, 4>, matrix<double, 3, 4>&>);
}
