// The worked example of the lecture on scaled dot-product attention (§5):
// one query against three keys in d_k = d_v = 2, with and without the
// 1/sqrt(d_k) scale, and self-test (d), the query (0, 1).
#include <qkv/qkv.hpp>

#include <cstdio>

using namespace qkv;

template <std::size_t R, std::size_t C>
void print(const char* label, const matrix<double, R, C>& m) {
  std::printf("%-34s (", label);
  for (std::size_t j = 0; j < m.cols(); ++j) std::printf(j ? ", %.6f" : "%.6f", m(0, j));
  std::printf(")\n");
}

int main() {
  const matrix<double, 3, 2> K{{1, 0}, {0, 1}, {1, 1}};
  const matrix<double, 3, 2> V{{10, 0}, {0, 10}, {5, 5}};

  const matrix<double, 1, 2> q{{1, 0}};
  std::printf("q = (1, 0)\n");
  print("scores  Q K^T", eval(q * transpose(K)));
  print("scaled  Q K^T / sqrt(2)", eval(q * transpose(K) / sqrt(dim<2>)));
  print("weights softmax(Q K^T / sqrt(2))", eval(softmax(q * transpose(K) / sqrt(dim<2>))));
  print("output  Attn(Q, K, V)", eval(softmax(q * transpose(K) / sqrt(dim<2>)) * V));
  print("weights without the scale", eval(softmax(q * transpose(K))));
  print("output without the scale", eval(softmax(q * transpose(K)) * V));

  const matrix<double, 1, 2> q2{{0, 1}};
  std::printf("\nself-test (d): q = (0, 1)\n");
  print("weights softmax(Q K^T / sqrt(2))", eval(softmax(q2 * transpose(K) / sqrt(dim<2>))));
  print("output  Attn(Q, K, V)", eval(softmax(q2 * transpose(K) / sqrt(dim<2>)) * V));

  std::printf("\nkernels: %s\n", active_arch());
}
