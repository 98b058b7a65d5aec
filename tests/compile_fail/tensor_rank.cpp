// Compile-fail: a tensor of rank 2 (that is a matrix)
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
#ifdef QKV_EXPECT_FAIL
  tensor<float, 8, 64> t; (void)t;
#else
  tensor<float, 1, 8, 64> t; (void)t;
#endif
}
