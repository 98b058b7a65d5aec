// Compile-fail: arithmetic on a bool mask
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<bool, 3, 3> M;
#ifdef QKV_EXPECT_FAIL
  auto e = M * M; (void)e;
#else
  auto e = transpose(M); (void)e;
#endif
}
