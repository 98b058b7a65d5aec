// Compile-fail: A + B with different row counts
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 3, 4> A; matrix<float, 5, 4> B;
#ifdef QKV_EXPECT_FAIL
  auto e = A + B; (void)e;
#else
  auto e = A + A; (void)e; (void)B;
#endif
}
