// Compile-fail: 8 query heads against 3 key heads (neither equal, nor 1, nor a divisor)
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  tensor<float, 2, 8, 16, 64> Q; tensor<float, 2, 3, 16, 64> K3; tensor<float, 2, 2, 16, 64> K2;
#ifdef QKV_EXPECT_FAIL
  auto e = Q * transpose(K3); (void)e;
#else
  auto e = Q * transpose(K2); (void)e; (void)K3;  // grouped-query: 8 over 2 is fine
#endif
}
