// Compile-fail: eval(e, qkv::fused) on scores biased outside a score_mod
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 8, 16> Q; matrix<float, 12, 16> K, V; matrix<bool, 8, 12> M; matrix<float, 8, 12> B;
  auto cap = [](auto s, auto, auto) { using std::tanh; return 5.0f * tanh(s / 5.0f); };
  auto near = [](std::size_t i, std::size_t j) { return j <= i + 4; };
  (void)M; (void)B; (void)cap; (void)near;
#ifdef QKV_EXPECT_FAIL
  auto O = eval(softmax(B + score_mod(Q * transpose(K), cap)) * V, fused); (void)O;
#else
  auto O = eval(softmax(score_mod(B + Q * transpose(K), cap)) * V, fused); (void)O;
#endif
}
