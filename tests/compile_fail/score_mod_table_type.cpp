// Compile-fail: a table of doubles read by a modifier of float scores
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 8, 16> Q; matrix<float, 12, 16> K, V;
#ifdef QKV_EXPECT_FAIL
  matrix<double, 1, 24> P;
#else
  matrix<float, 1, 24> P;
#endif
  const auto rel = [](auto s, auto i, auto j, auto p) { return s + p(i - j + decltype(i)(11)); };
  auto O = eval(softmax(score_mod(Q * transpose(K), rel, P)) * V); (void)O;
}
