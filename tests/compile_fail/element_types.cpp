// Compile-fail: float times double
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 3, 4> A; matrix<double, 4, 3> B;
#ifdef QKV_EXPECT_FAIL
  auto e = A * B; (void)e;
#else
  auto e = A * transpose(A); (void)e; (void)B;
#endif
}
