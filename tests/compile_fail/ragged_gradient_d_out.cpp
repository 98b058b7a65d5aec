// Compile-fail: dO of an expression on ragged operands as a tensor
#include <qkv/qkv.hpp>
#include <cstdint>
#include <vector>
using namespace qkv;
int main() {
  const std::vector<std::int32_t> offsets{0, 3, 7};
  ragged<float, 2, 8> Q(offsets, {2, 8});
#ifdef QKV_EXPECT_FAIL
  tensor<float, 2, 2, dyn, 8> dO(std::size_t(4));
#else
  ragged<float, 2, 8> dO(offsets, {2, 8});
#endif
  auto g = gradient(softmax(Q * transpose(Q)) * Q, dO, wrt(Q));
  (void)g;
}
