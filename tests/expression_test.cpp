// Nodes: lazy, shaped as the maths says, holding temporaries by value, and
// refusing dynamic extents that disagree.
#include <catch2/catch.hpp>

#include "reference.hpp"

#include <qkv/qkv.hpp>

#include <string>
#include <type_traits>
#include <vector>

using namespace qkv;

TEST_CASE("nodes carry the shapes of the maths", "[expr]") {
  matrix<float, 8, 16> Q;
  matrix<float, 12, 16> K;
  matrix<float, 12, 4> V;
  auto S = Q * transpose(K);
  STATIC_REQUIRE(decltype(S)::static_rows == 8);
  STATIC_REQUIRE(decltype(S)::static_cols == 12);
  auto O = softmax(S / sqrt(dim<16>)) * V;
  STATIC_REQUIRE(decltype(O)::static_rows == 8);
  STATIC_REQUIRE(decltype(O)::static_cols == 4);
  STATIC_REQUIRE(std::is_same_v<decltype(eval(O)), matrix<float, 8, 4>>);
  CHECK(O.rows() == 8);
  CHECK(O.cols() == 4);

  // Mixed: a static extent survives where either side has it.
  matrix<float, dyn, 16> Qd(8);
  auto Sd = Qd * transpose(K);
  STATIC_REQUIRE(decltype(Sd)::static_rows == dyn);
  STATIC_REQUIRE(decltype(Sd)::static_cols == 12);
  matrix<float, dyn, dyn> A(3, 4);
  matrix<float, 3, 4> B;
  STATIC_REQUIRE(decltype(A + B)::static_rows == 3);
  STATIC_REQUIRE(decltype(A - B)::static_cols == 4);
}

TEST_CASE("nothing is computed until evaluation", "[expr]") {
  std::vector<float> q{1, 0}, k{1, 0, 0, 1};
  matrix_view<const float, 1, 2> Q(q.data(), 1, 2);
  matrix_view<const float, 2, 2> K(k.data(), 2, 2);
  auto S = Q * transpose(K);
  q[0] = 3;  // after the expression is built
  const auto s = eval(S);
  CHECK(s(0, 0) == 3.0f);
  CHECK(s(0, 1) == 0.0f);
}

namespace {
matrix<float, 2, 2> identity() { return matrix<float, 2, 2>{{1, 0}, {0, 1}}; }
}  // namespace

TEST_CASE("leaves are held by reference and temporaries by value", "[expr]") {
  matrix<float, 2, 2> A{{1, 2}, {3, 4}};
  auto e = A * identity();
  using E = decltype(e);
  STATIC_REQUIRE(std::is_same_v<E, product_expr<const matrix<float, 2, 2>&, matrix<float, 2, 2>>>);
  STATIC_REQUIRE(std::is_same_v<decltype(transpose(identity())), transpose_expr<matrix<float, 2, 2>>>);
  STATIC_REQUIRE(std::is_same_v<decltype(softmax(A * 2.0f)),
                                softmax_expr<scaled_expr<const matrix<float, 2, 2>&, float, scale_op::multiply>>>);
  // A view is copied even when it is an lvalue: it holds no data of its own.
  matrix_view<const float, 2, 2> v = A;
  STATIC_REQUIRE(std::is_same_v<decltype(transpose(v)), transpose_expr<matrix_view<const float, 2, 2>>>);
}

TEST_CASE("expressions stored with auto do not dangle", "[expr]") {
  // Every operand below is a temporary that dies at the end of its statement;
  // the expression must own copies. (The sanitizer build turns a dangling
  // reference here into a hard failure.)
  auto e = softmax(identity() * transpose(identity() * 2.0f) / sqrt(dim<4>) + identity()) * (identity() - identity() * 0.5f);
  auto c = causal(identity() * identity());
  auto m = masked(identity() * identity(), matrix<bool, 2, 2>{{true, false}, {true, true}});
  std::vector<float> scratch(4096, 7.0f);  // reuse freed stack/heap, if anything dangles
  const auto r = eval(e);
  // softmax of [[2, 0], [0, 2]]/2 + I = [[2, 0], [0, 2]] → rows (e², 1)/(e² + 1); times 0.5·I.
  const double p = std::exp(2.0) / (std::exp(2.0) + 1);
  CHECK(r(0, 0) == Approx(0.5 * p).epsilon(1e-6));
  CHECK(r(0, 1) == Approx(0.5 * (1 - p)).epsilon(1e-6));
  const auto rc = eval(c);
  CHECK(rc(0, 1) == -std::numeric_limits<float>::infinity());
  CHECK(rc(1, 1) == 1.0f);
  const auto rm = eval(m);
  CHECK(rm(0, 1) == -std::numeric_limits<float>::infinity());
  CHECK(rm(0, 0) == 1.0f);
}

TEST_CASE("dynamic extents that disagree throw shape_error naming both shapes", "[expr]") {
  matrix<float, dyn, dyn> A(3, 4), B(5, 6), M(3, 5);
  try {
    (void)(A * B);
    FAIL("no exception");
  } catch (const shape_error& e) {
    CHECK(std::string(e.what()) == "qkv: A * B: the columns of A differ from the rows of B (3x4 vs 5x6)");
  }
  CHECK_THROWS_AS(A + M, shape_error);
  CHECK_THROWS_AS(A - M, shape_error);
  CHECK_THROWS_WITH(A + M, Catch::Contains("3x4 vs 3x5"));
  CHECK_THROWS_AS(softmax(A * transpose(A)) * B, shape_error);
  matrix<bool, dyn, dyn> mask(3, 3);
  CHECK_THROWS_WITH(masked(A, mask), Catch::Contains("masked(S, M)") && Catch::Contains("3x4 vs 3x3"));
  STATIC_REQUIRE(std::is_base_of_v<std::invalid_argument, shape_error>);

  matrix<float, 3, 4> O;
  CHECK_THROWS_WITH(O = A * transpose(A), Catch::Contains("3x4 vs 3x3"));
  CHECK_THROWS_WITH((matrix<float, 3, 4>(A * transpose(A))), Catch::Contains("3x4 vs 3x3"));
  matrix<float, dyn, dyn> out(2, 2);
  CHECK_THROWS_AS(eval_into(matrix_view<float, dyn, dyn>(out), A), shape_error);
}
