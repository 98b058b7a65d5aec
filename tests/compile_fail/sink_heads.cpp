// Compile-fail: one sink per head, for 3 heads where the scores have 4
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  tensor<float, 2, 4, 8, 16> Q, K;
  matrix<float, 1, 3> three; matrix<float, 1, 4> four;
#ifdef QKV_EXPECT_FAIL
  auto e = softmax(Q * transpose(K), three); (void)e; (void)four;
#else
  auto e = softmax(Q * transpose(K), four); (void)e; (void)three;
#endif
}
