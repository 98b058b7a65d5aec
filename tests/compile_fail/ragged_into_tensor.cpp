// Compile-fail: the result of an expression on ragged operands into a tensor
#include <qkv/qkv.hpp>
#include <cstdint>
#include <vector>
using namespace qkv;
int main() {
  const std::vector<std::int32_t> offsets{0, 3, 7};
  ragged<float, 2, 8> Q(offsets, {2, 8});
#ifdef QKV_EXPECT_FAIL
  tensor<float, 2, 2, dyn, 8> O(std::size_t(4));
  eval_into(O, softmax(Q * transpose(Q)) * Q);
#else
  ragged<float, 2, 8> O(offsets, {2, 8});
  eval_into(O, softmax(Q * transpose(Q)) * Q);
#endif
}
