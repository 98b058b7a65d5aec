// Compile-fail: similarity(Q, K, f) with rows of Q and of K of different static lengths
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 8, 16> Q; matrix<float, 12, 17> K; matrix<float, 12, 16> K16;
  auto l1 = [](auto q, auto k) { return -xsimd::abs(q - k); };
#ifdef QKV_EXPECT_FAIL
  auto e = similarity(Q, K, l1); (void)e;
#else
  auto e = similarity(Q, K16, l1); (void)e; (void)K;
#endif
}
