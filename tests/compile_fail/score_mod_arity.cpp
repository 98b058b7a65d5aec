// Compile-fail: a score modifier that takes the score and one position, not f(s, i, j), evaluated
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 8, 16> Q; matrix<float, 12, 16> K, V;
#ifdef QKV_EXPECT_FAIL
  auto O = eval(softmax(score_mod(Q * transpose(K), [](auto s, auto i) { return s - i; })) * V); (void)O;
#else
  auto O = eval(softmax(score_mod(Q * transpose(K), [](auto s, auto i, auto j) { return s - (i - j); })) * V); (void)O;
#endif
}
