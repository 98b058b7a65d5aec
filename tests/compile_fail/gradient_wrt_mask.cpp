// Compile-fail: a mask is a constant, not something to differentiate by
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 4, 3> Q, K, V, dO; matrix<bool, 4, 4> M;
  const auto e = softmax(masked(Q * transpose(K), M)) * V;
#ifdef QKV_EXPECT_FAIL
  auto g = gradient(e, dO, wrt(Q, M)); (void)g;
#else
  auto g = gradient(e, dO, wrt(Q, K)); (void)g;
#endif
}
