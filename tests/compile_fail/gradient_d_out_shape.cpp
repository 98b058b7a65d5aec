// Compile-fail: dO of another static shape than e
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 4, 3> Q, K, V; matrix<float, 4, 2> wrong; matrix<float, 4, 3> dO;
  const auto e = softmax(Q * transpose(K)) * V;
#ifdef QKV_EXPECT_FAIL
  auto g = gradient(e, wrong, wrt(Q)); (void)g; (void)dO;
#else
  auto g = gradient(e, dO, wrt(Q)); (void)g; (void)wrong;
#endif
}
