// Compile-fail: a window on a bool mask, which is not a score matrix
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 4, 6> S; matrix<bool, 4, 6> M;
#ifdef QKV_EXPECT_FAIL
  auto e = window(M, 3); (void)e; (void)S;
#else
  auto e = window(S, 3); (void)e; (void)M;
#endif
}
