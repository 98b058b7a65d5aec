// Compile-fail: eval(e, qkv::fused) on an expression that is not softmax(S) * V
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 8, 64> Q, K, V;
#ifdef QKV_EXPECT_FAIL
  auto S = eval(softmax(Q * transpose(K)), fused); (void)S;
#else
  auto O = eval(softmax(Q * transpose(K)) * V, fused); (void)O;
#endif
}
