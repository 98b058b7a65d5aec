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
// exponentials, P V 2·n·m·dv. Naive keeps the n×m weights (4 bytes each).
constexpr std::size_t flops(std::size_t n, std::size_t m, std::size_t dk, std::size_t dv) {
  return 2 * n * m * dk + n * m + 4 * n * m + 2 * n * m * dv;
}

// Fused, by hand, from the kernel's block sizes: K and V packed (m·(dk + dv)
// floats) with a flag per value row, a BR×512 score block, a BR×dv output
// block and 2·BR row statistics, each buffer rounded up to 64 bytes.
constexpr std::size_t round16(std::size_t x) { return (x + 15) / 16 * 16; }
constexpr std::size_t fused_floats(std::size_t br, std::size_t m, std::size_t dk, std::size_t dv) {
  return round16(m * dk) + round16(m * dv) + round16(m) + round16(br * 512) + round16(br * dv) + 2 * round16(br);
}

}  // namespace

TEST_CASE("cost of single-head attention, counted by hand", "[cost]") {
  constexpr cost_estimate c = static_cost<attention_t<1024, 1024, 64, 64>>();  // a constant expression
  STATIC_REQUIRE(c.flops == flops(1024, 1024, 64, 64));
  STATIC_REQUIRE(c.exps == 1024 * 1024);
  STATIC_REQUIRE(c.naive_bytes == 1024 * 1024 * 4);
  // In a constant expression: the widest instruction set's 64-row blocks
  // (8-row register tiles on AVX-512 and on NEON).
  STATIC_REQUIRE(c.fused_bytes == fused_floats(64, 1024, 64, 64) * 4);

  // Decoding: one query, no packing; a part of 1024 keys' scores and the
  // output row as scratch, and each of the 4 parts' maximum, sum and output
  // kept for the merge.
  constexpr cost_estimate d = static_cost<attention_t<1, 4096, 128, 128>>();
  STATIC_REQUIRE(d.naive_bytes == 4096 * 4);
  STATIC_REQUIRE(d.fused_bytes == (1024 + 128 + 4 * (16 + 128)) * 4);

  // Dynamic shapes: the same numbers at run time, with the blocks of the
  // instruction set that runs (66 rows on AVX2, six-row tiles).
  matrix<float, dyn, dyn> Q(1024, 64), K(1024, 64), V(1024, 64);
  const cost_estimate r = cost(softmax(Q * transpose(K) / sqrt(dim<64>)) * V);
  CHECK(r.flops == c.flops);
  CHECK(r.exps == c.exps);
  CHECK(r.naive_bytes == c.naive_bytes);
  const std::size_t br = kernels::active_blocking(sizeof(float)).query_rows;
  INFO("kernels: " << active_arch() << ", " << br << " query rows a block");
  CHECK(r.fused_bytes == fused_floats(br, 1024, 64, 64) * 4);
}

TEST_CASE("cost of causal attention counts the visible pairs", "[cost][mask]") {
  // n = m = T: T(T + 1)/2 pairs; n < m (bottom-right): row i sees i + m − n + 1.
  using causal_t = decltype(softmax(causal(std::declval<const matrix<float, 1024, 64>&>() *
                                           transpose(std::declval<const matrix<float, 1024, 64>&>()))) *
                            std::declval<const matrix<float, 1024, 64>&>());
  constexpr cost_estimate c = static_cost<causal_t>();
  constexpr std::size_t pairs = 1024 * 1025 / 2;
  // Per pair: 2·64 for the score, 4 for the softmax, 2·64 for the product with V.
  STATIC_REQUIRE(c.flops == pairs * (2 * 64 + 4 + 2 * 64));
  STATIC_REQUIRE(c.exps == pairs);
  STATIC_REQUIRE(c.naive_bytes == 1024 * 1024 * 4);  // node by node keeps every score

  matrix<float, dyn, dyn> Q(3, 8), K(5, 8), V(5, 8), Qt(7, 8);
  // Rows 0, 1, 2 see 3, 4, 5 keys; with 7 queries and 5 keys rows 2..6 see 1..5.
  CHECK(cost(softmax(causal(Q * transpose(K))) * V).exps == 12);
  CHECK(cost(softmax(causal(Qt * transpose(K))) * V).exps == 15);
  CHECK(cost(softmax(causal(Qt * transpose(K)) * 0.5f) * V).flops == 15 * (2 * 8 + 1 + 4 + 2 * 8));
  // A mask matrix counts every pair: its contents are data.
  matrix<bool, dyn, dyn> M(3, 5);
  CHECK(cost(softmax(masked(Q * transpose(K), M)) * V).exps == 15);
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
