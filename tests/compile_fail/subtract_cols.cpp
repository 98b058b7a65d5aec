// Compile-fail: A - B with different column counts
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<double, 3, 4> A; matrix<double, 3, 5> B;
#ifdef QKV_EXPECT_FAIL
  auto e = A - B; (void)e;
#else
  auto e = B - B; (void)e; (void)A;
#endif
}
