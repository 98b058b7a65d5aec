// Compile-fail: a mask of another shape
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 4, 6> S; matrix<bool, 4, 5> M;
#ifdef QKV_EXPECT_FAIL
  auto e = masked(S, M); (void)e;
#else
  matrix<bool, 6, 4> Mt; auto e = masked(transpose(S), Mt); (void)e; (void)M;
#endif
}
