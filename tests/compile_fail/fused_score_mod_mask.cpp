// Compile-fail: eval(e, fused) with a score modifier wrapping a mask (it would see −∞)
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 8, 16> Q; matrix<float, 12, 16> K, V; matrix<bool, 8, 12> M;
  auto cap = [](auto s, auto, auto) { using std::tanh; return 5.0f * tanh(s / 5.0f); };
#ifdef QKV_EXPECT_FAIL
  auto O = eval(softmax(score_mod(masked(Q * transpose(K), M), cap)) * V, fused); (void)O;
#else
  auto O = eval(softmax(masked(score_mod(Q * transpose(K), cap), M)) * V, fused); (void)O;
#endif
}
