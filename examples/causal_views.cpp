// Causal self-attention over views of one interleaved buffer [T, 3·d], as a
// fused QKV projection leaves it, written into an existing matrix.
#include <qkv/qkv.hpp>

#include <cstdio>
#include <vector>

using namespace qkv;

int main() {
  constexpr std::size_t T = 128, d = 64;
  std::vector<float> qkv_buf(T * 3 * d);
  for (std::size_t k = 0; k < qkv_buf.size(); ++k) qkv_buf[k] = float(k % 17) / 17 - 0.5f;

  matrix_view<const float, dyn, d> Q(qkv_buf.data(), T, d, 3 * d);
  matrix_view<const float, dyn, d> K(qkv_buf.data() + d, T, d, 3 * d);
  matrix_view<const float, dyn, d> V(qkv_buf.data() + 2 * d, T, d, 3 * d);

  matrix<float, dyn, d> O(T);
  O = softmax(causal(Q * transpose(K) / sqrt(dim<d>))) * V;

  // The first query sees only the first key, so its output is the first value.
  bool first_is_v0 = true;
  for (std::size_t j = 0; j < d; ++j) first_is_v0 = first_is_v0 && O(0, j) == V(0, j);
  std::printf("O(0, :) == V(0, :): %s\n", first_is_v0 ? "yes" : "no");
  std::printf("O(%zu, 0) = %g\n", T - 1, O(T - 1, 0));
}
