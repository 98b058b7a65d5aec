// Compile-fail: Q * K without the transpose, d_k ≠ m
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 8, 64> Q; matrix<float, 16, 64> K;
#ifdef QKV_EXPECT_FAIL
  auto S = Q * K; (void)S;
#else
  auto S = Q * transpose(K); (void)S;
#endif
}
