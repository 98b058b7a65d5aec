// Compile-fail: a score_mod whose f takes float and batch<float> only (not
// generic) works forward but cannot be differentiated.
#include <qkv/qkv.hpp>
using namespace qkv;
struct halve {
  float operator()(float s, float, float) const { return s / 2; }
  xsimd::batch<float> operator()(xsimd::batch<float> s, xsimd::batch<float>, xsimd::batch<float>) const { return s / 2; }
};
int main() {
  matrix<float, 4, 3> Q, K, V, dO;
#ifdef QKV_EXPECT_FAIL
  auto g = gradient(softmax(score_mod(Q * transpose(K), halve{})) * V, dO, wrt(Q)); (void)g;
#else
  auto g = gradient(softmax(score_mod(Q * transpose(K), [](auto s, auto, auto) { return s / 2.0f; })) * V, dO, wrt(Q)); (void)g;
#endif
}
