// Compile-fail: a second positions in one score chain
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 4, 8> Q, K;
#ifdef QKV_EXPECT_FAIL
  auto e = causal(positions(causal(positions(Q * transpose(K), 0, 0)), 1, 1)); (void)e;
#else
  auto e = causal(positions(causal(Q * transpose(K)), 1, 1)); (void)e;
#endif
}
