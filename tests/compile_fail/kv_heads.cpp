// Compile-fail: K with 2 heads and V with 4 under 8 query heads
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  tensor<float, 2, 8, 16, 64> Q; tensor<float, 2, 2, 16, 64> K; tensor<float, 2, 4, 16, 64> V4; tensor<float, 2, 2, 16, 64> V2;
#ifdef QKV_EXPECT_FAIL
  auto e = softmax(Q * transpose(K)) * V4; (void)e; (void)V2;
#else
  auto e = softmax(Q * transpose(K)) * V2; (void)e; (void)V4;
#endif
}
