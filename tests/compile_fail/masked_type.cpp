// Compile-fail: a mask that is not bool
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 4, 6> S; matrix<float, 4, 6> M;
#ifdef QKV_EXPECT_FAIL
  auto e = masked(S, M); (void)e;
#else
  matrix<bool, 4, 6> B; auto e = masked(S, B); (void)e; (void)M;
#endif
}
