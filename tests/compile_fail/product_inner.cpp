// Compile-fail: the inner extents of a product differ
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 3, 4> A; matrix<float, 5, 6> B;
#ifdef QKV_EXPECT_FAIL
  auto e = A * B; (void)e;
#else
  auto e = A * transpose(A); (void)e; (void)B;
#endif
}
