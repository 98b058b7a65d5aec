// The matrix product and the elementwise nodes against the reference, over
// shapes that cross every tail of the blocked kernel: sizes that are not
// multiples of the vector width, of the register tile (MR × NR) or of the
// cache blocks (KC = 128 or 256, MC ≥ 96, NC ≥ 1024 elements).
#include <catch2/catch.hpp>

#include "reference.hpp"

#include <qkv/qkv.hpp>

#include <tuple>

using namespace qkv;

namespace {

template <class T>
void check_product(std::size_t m, std::size_t k, std::size_t n, std::uint32_t seed) {
  ref::rng rng(seed);
  matrix<T, dyn, dyn> A(m, k), B(k, n), Bt(n, k);
  rng.fill(A);
  rng.fill(B);
  rng.fill(Bt);
  const auto a = ref::from(A), b = ref::from(B), bt = ref::from(Bt);

  INFO("m = " << m << ", k = " << k << ", n = " << n << ", kernels " << active_arch());
  const auto C = eval(A * B);
  CHECK(ref::worst_ratio(C, ref::matmul(a, b), ref::gemm_bound<T>(a, b)) <= 1);
  // Bᵀ read in place through swapped strides, as in Q Kᵀ.
  const auto Ct = eval(A * transpose(Bt));
  CHECK(ref::worst_ratio(Ct, ref::matmul(a, ref::transpose(bt)), ref::gemm_bound<T>(a, ref::transpose(bt))) <= 1);
}

}  // namespace

TEST_CASE("A * B and A * transpose(B) match the reference within γ_k |A||B|", "[product]") {
  const auto [m, k, n] = GENERATE(table<std::size_t, std::size_t, std::size_t>({
      {1, 1, 1},     {1, 2, 3},     {3, 2, 1},     {2, 3, 17},   {17, 3, 2},   {7, 63, 65},   {65, 64, 63},
      {129, 17, 33}, {8, 129, 32},  {9, 257, 31},  {6, 385, 16}, {257, 5, 9},  {300, 31, 47}, {3, 5, 2050},
      {1, 64, 4097}, {100, 100, 100}, {0, 3, 4},   {3, 0, 4},    {3, 4, 0},
  }));
  check_product<float>(m, k, n, 1);
  check_product<double>(m, k, n, 2);
}

TEST_CASE("a product with k = 0 is zero whatever the destination held", "[product]") {
  matrix<float, dyn, dyn> A(3, 0), B(0, 4);
  matrix<float, dyn, dyn> C(3, 4);
  C(1, 1) = 5;
  C = A * B;
  CHECK(C(1, 1) == 0.0f);
}

TEST_CASE("products read views with row strides and write into them", "[product]") {
  ref::rng rng(3);
  std::vector<float> abuf(9 * 40), bbuf(40 * 33), cbuf(9 * 50, -7.0f);
  for (float& x : abuf) x = float(rng.uniform(-1, 1));
  for (float& x : bbuf) x = float(rng.uniform(-1, 1));
  matrix_view<const float, dyn, dyn> A(abuf.data(), 9, 37, 40);
  matrix_view<const float, dyn, dyn> B(bbuf.data(), 37, 31, 33);
  matrix_view<float, dyn, dyn> C(cbuf.data(), 9, 31, 50);
  eval_into(C, A * B);
  const auto a = ref::from(A), b = ref::from(B);
  CHECK(ref::worst_ratio(C, ref::matmul(a, b), ref::gemm_bound<float>(a, b)) <= 1);
  // The padding between rows is untouched.
  for (std::size_t i = 0; i < 9; ++i)
    for (std::size_t j = 31; j < 50; ++j) CHECK(cbuf[i * 50 + j] == -7.0f);
}

TEST_CASE("scaling and elementwise sums are exact roundings of the reference", "[product]") {
  ref::rng rng(4);
  matrix<float, 5, 19> A, B;
  rng.fill(A);
  rng.fill(B);
  const auto sum = eval(A + B), diff = eval(A - B), twice = eval(2 * A), half = eval(A / 2.0), third = eval(A * (1.0f / 3));
  const auto by_dim = eval(A / sqrt(dim<3>));
  const float s3 = std::sqrt(3.0f);
  for (std::size_t i = 0; i < 5; ++i)
    for (std::size_t j = 0; j < 19; ++j) {
      CHECK(sum(i, j) == A(i, j) + B(i, j));
      CHECK(diff(i, j) == A(i, j) - B(i, j));
      CHECK(twice(i, j) == 2 * A(i, j));
      CHECK(half(i, j) == A(i, j) / 2);
      CHECK(third(i, j) == A(i, j) * (1.0f / 3));
      CHECK(by_dim(i, j) == A(i, j) / s3);
    }
}

TEST_CASE("transpose evaluates to the transposed matrix for masks too", "[product]") {
  const matrix<float, 2, 3> A{{1, 2, 3}, {4, 5, 6}};
  const matrix<float, 3, 2> At = eval(transpose(A));
  CHECK(At(2, 1) == 6.0f);
  CHECK(At(1, 0) == 2.0f);
  const matrix<bool, 2, 3> M{{true, false, false}, {true, true, false}};
  const auto Mt = eval(transpose(M));
  STATIC_REQUIRE(std::is_same_v<std::remove_const_t<decltype(Mt)>, matrix<bool, 3, 2>>);
  CHECK(Mt(1, 1));
  CHECK(!Mt(1, 0));
  CHECK(eval(transpose(transpose(A)))(1, 2) == 6.0f);
}

TEST_CASE("assignment and eval_into are safe when the destination is an input", "[product]") {
  matrix<double, 2, 2> A{{1, 2}, {3, 4}};
  A = A * A;
  CHECK(A(0, 0) == 7);
  CHECK(A(0, 1) == 10);
  CHECK(A(1, 0) == 15);
  CHECK(A(1, 1) == 22);
  matrix<double, 2, 2> B{{1, 2}, {3, 4}};
  eval_into(B, transpose(B));
  CHECK(B(0, 1) == 3);
  CHECK(B(1, 0) == 2);

  // A dynamic matrix takes the shape of what is assigned to it.
  matrix<double, dyn, dyn> D;
  D = A * transpose(matrix<double, 3, 2>{});
  CHECK(D.rows() == 2);
  CHECK(D.cols() == 3);
}
