// Compile-fail: a static view of a matrix of another shape
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 3, 4> A;
#ifdef QKV_EXPECT_FAIL
  matrix_view<float, 3, 5> v = A; (void)v;
#else
  matrix_view<float, 3, dyn> v = A; (void)v;
#endif
}
