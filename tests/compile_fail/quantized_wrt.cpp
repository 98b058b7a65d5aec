// Compile-fail: a gradient with respect to a quantized K
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  const matrix<float, 4, 32> Q, K, V, dO;
  const auto Kq = quantize<q8>(K);
  const auto e = softmax(Q * transpose(Kq)) * V;
#ifdef QKV_EXPECT_FAIL
  const auto g = gradient(e, dO, wrt(Q, Kq));
#else
  const auto g = gradient(e, dO, wrt(Q, V));
#endif
  static_cast<void>(g);
}
