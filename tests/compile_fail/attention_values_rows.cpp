// Compile-fail: V has fewer rows than there are keys
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 8, 64> Q; matrix<float, 16, 64> K; matrix<float, 15, 64> V;
#ifdef QKV_EXPECT_FAIL
  auto O = softmax(Q * transpose(K) / sqrt(dim<64>)) * V; (void)O;
#else
  auto O = softmax(Q * transpose(K) / sqrt(dim<64>)) * K; (void)O; (void)V;
#endif
}
