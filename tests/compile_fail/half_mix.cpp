// Compile-fail: double with bf16 (float is the only type that mixes with a 2-byte one)
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<double, 3, 4> A; matrix<bf16, 4, 3> B; matrix<float, 3, 4> F;
#ifdef QKV_EXPECT_FAIL
  auto e = A * B; (void)e;
#else
  auto e = F * B; (void)e; (void)A;
#endif
}
