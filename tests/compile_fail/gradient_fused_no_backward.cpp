// Compile-fail: qkv::fused asks for a fused backward that this expression has not
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 4, 3> Q, K, V, dO;
  const auto e = softmax(Q * transpose(K)) * V;
#ifdef QKV_EXPECT_FAIL
  const auto p = Q * transpose(K) * V;  // no softmax: not an attention
  auto g = gradient(p, dO, wrt(Q), fused); (void)g;
#else
  auto g = gradient(e, dO, wrt(Q), fused); (void)g;
#endif
}
