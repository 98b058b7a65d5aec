// Compile-fail: quantizing rows whose static length is not a multiple of 32
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
#ifdef QKV_EXPECT_FAIL
  const matrix<float, 4, 48> x;
#else
  const matrix<float, 4, 64> x;
#endif
  const auto xq = quantize<q8>(x);
  return xq.bytes() > 0 ? 0 : 1;
}
