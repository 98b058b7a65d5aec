// The lecture's worked example, from outside the qkv tree.
#include <qkv/qkv.hpp>

#include <cstdio>

int main() {
  using namespace qkv;
  const matrix<double, 3, 2> K{{1, 0}, {0, 1}, {1, 1}};
  const matrix<double, 3, 2> V{{10, 0}, {0, 10}, {5, 5}};
  const matrix<double, 1, 2> q{{1, 0}};
  const auto O = eval(softmax(q * transpose(K) / sqrt(dim<2>)) * V);
  std::printf("(%.6f, %.6f) on %s\n", O(0, 0), O(0, 1), active_arch());
  return O(0, 0) > 6.0166 && O(0, 0) < 6.0167 ? 0 : 1;
}
