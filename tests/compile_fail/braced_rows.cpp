// Compile-fail: braces with the wrong row length
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {

#ifdef QKV_EXPECT_FAIL
  matrix<float, 2, 2> M{{1, 2, 3}, {4, 5, 6}}; (void)M;
#else
  matrix<float, 2, 3> M{{1, 2, 3}, {4, 5, 6}}; (void)M;
#endif
}
