// Compile-fail: a matrix of the wrong static shape
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 3, 4> A;
#ifdef QKV_EXPECT_FAIL
  matrix<float, 3, 3> O = A; (void)O;
#else
  matrix<float, 3, 4> O = A; (void)O;
#endif
}
