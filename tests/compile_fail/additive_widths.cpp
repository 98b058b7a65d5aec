// Compile-fail: additive(Wq, Wk, w) with Wq and Wk projecting to different widths
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 8, 16> Q; matrix<float, 12, 16> K; matrix<float, 16, 4> Wq; matrix<float, 16, 5> Wk5; matrix<float, 16, 4> Wk4; matrix<float, 1, 4> w;
#ifdef QKV_EXPECT_FAIL
  auto e = similarity(Q, K, additive(Wq, Wk5, w)); (void)e;
#else
  auto e = similarity(Q, K, additive(Wq, Wk4, w)); (void)e; (void)Wk5;
#endif
}
