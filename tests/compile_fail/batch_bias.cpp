// Compile-fail: a bias of 4 heads added to scores of 8 (grouping is for products only)
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  tensor<float, 1, 8, 16, 64> Q; tensor<float, 1, 4, 16, 16> B4; tensor<float, 1, 1, 16, 16> B1;
#ifdef QKV_EXPECT_FAIL
  auto e = Q * transpose(Q) + B4; (void)e;
#else
  auto e = Q * transpose(Q) + B1; (void)e; (void)B4;  // broadcast over the heads is fine
#endif
}
