// Compile-fail: a modifier given a table that it does not take
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 8, 16> Q; matrix<float, 12, 16> K, V;
  matrix<float, 1, 24> P;
#ifdef QKV_EXPECT_FAIL
  const auto rel = [](auto s, auto i, auto j) { return s - (i - j); };
#else
  const auto rel = [](auto s, auto i, auto j, auto p) { return s + p(i - j + decltype(i)(11)); };
#endif
  auto O = eval(softmax(score_mod(Q * transpose(K), rel, P)) * V); (void)O;
}
