// qkv::cost against counts derived by hand, and the lecture's bill (§3.3)
// and self-test (e).
#include <catch2/catch.hpp>

#include <qkv/qkv.hpp>

#include <utility>

using namespace qkv;

namespace {

// The type of single-head attention, without building any matrix.
template <std::size_t N, std::size_t M, std::size_t DK, std::size_t DV>
using attention_t = decltype(softmax(std::declval<const matrix<float, N, DK>&>() *
                                     transpose(std::declval<const matrix<float, M, DK>&>()) / sqrt(dim<DK>)) *
                             std::declval<const matrix<float, M, DV>&>());

// By hand: Q Kᵀ 2·n·m·dk, the scaling n·m, softmax 4·n·m and n·m
// exponentials, P V 2·n·m·dv. Naive keeps the n×m weights (4 bytes each);
// fused packs K and V (m·(dk + dv) floats) and keeps a 64×256 score block,
// a 64×dv output block and 2·64 row statistics.
constexpr std::size_t flops(std::size_t n, std::size_t m, std::size_t dk, std::size_t dv) {
  return 2 * n * m * dk + n * m + 4 * n * m + 2 * n * m * dv;
}

}  // namespace

TEST_CASE("cost of single-head attention, counted by hand", "[cost]") {
  constexpr cost_estimate c = static_cost<attention_t<1024, 1024, 64, 64>>();  // a constant expression
  STATIC_REQUIRE(c.flops == flops(1024, 1024, 64, 64));
  STATIC_REQUIRE(c.exps == 1024 * 1024);
  STATIC_REQUIRE(c.naive_bytes == 1024 * 1024 * 4);
  STATIC_REQUIRE(c.fused_bytes == (1024 * 128 + 64 * 256 + 64 * 64 + 128) * 4);

  // Decoding: one query, no packing.
  constexpr cost_estimate d = static_cost<attention_t<1, 4096, 128, 128>>();
  STATIC_REQUIRE(d.naive_bytes == 4096 * 4);
  STATIC_REQUIRE(d.fused_bytes == (4096 + 2 * 128) * 4);

  // Dynamic shapes: the same numbers, at run time.
  matrix<float, dyn, dyn> Q(1024, 64), K(1024, 64), V(1024, 64);
  CHECK(cost(softmax(Q * transpose(K) / sqrt(dim<64>)) * V) == c);
}

TEST_CASE("cost of other expressions", "[cost]") {
  matrix<float, dyn, dyn> A(30, 20), B(20, 10), C(30, 10), X(10, 5);
  // A product of two storage operands allocates nothing beyond its output.
  CHECK(cost(A * B) == cost_estimate{2 * 30 * 20 * 10, 0, 0, 0});
  // (A B) X: A B is materialised as an operand of the second product.
  CHECK(cost((A * B) * X) == cost_estimate{2 * 30 * 20 * 10 + 2 * 30 * 10 * 5, 0, 300 * 4, 300 * 4});
  // A B + C: written into the output, C read in place; one addition each.
  CHECK(cost(A * B + C) == cost_estimate{2 * 30 * 20 * 10 + 300, 0, 0, 0});
  // softmax of a masked product: no fused form, so fused bytes are naive bytes.
  matrix<bool, dyn, dyn> M(30, 10);
  CHECK(cost(softmax(masked(A * B, M))) == cost_estimate{2 * 30 * 20 * 10 + 4 * 300, 300, 0, 0});
  CHECK(cost(transpose(A)) == cost_estimate{});
}

TEST_CASE("the lecture's bill: §3.3 and self-test (e)", "[cost][lecture]") {
  // §3.1: T = 1024, d = 768, h = 12, so dk = dv = 64 per head.
  constexpr cost_estimate small = static_cost<attention_t<1024, 1024, 64, 64>>();
  STATIC_REQUIRE(small.naive_bytes == 4 << 20);  // the 1024×1024 score matrix, 4 MiB a head

  // Self-test (e): T = 4096, d = 4096; h = 32 heads of 128, or one of 4096.
  constexpr cost_estimate head = static_cost<attention_t<4096, 4096, 128, 128>>();
  constexpr cost_estimate single = static_cost<attention_t<4096, 4096, 4096, 4096>>();
  constexpr std::size_t T = 4096;
  // The products cost the same in total, 4·T²·d: 2.75·10¹¹ FLOPs.
  STATIC_REQUIRE(32 * (head.flops - 5 * T * T) == 4 * T * T * 4096);
  STATIC_REQUIRE(single.flops - 5 * T * T == 4 * T * T * 4096);
  // 32 heads do 32 softmaxes: more exponentials, slightly more FLOPs.
  STATIC_REQUIRE(32 * head.exps == 32 * single.exps);
  STATIC_REQUIRE(32 * head.flops > single.flops);
  // Score memory, evaluated naively: 32 matrices of T² floats (2 GiB) against one (64 MiB).
  STATIC_REQUIRE(32 * head.naive_bytes == std::size_t(2) << 30);
  STATIC_REQUIRE(single.naive_bytes == std::size_t(64) << 20);
  // Fused, neither keeps a score matrix: per head the packed K and V.
  STATIC_REQUIRE(head.fused_bytes < (std::size_t(5) << 20));
}
