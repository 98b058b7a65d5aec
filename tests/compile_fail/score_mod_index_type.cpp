// Compile-fail: a score_mod taking i and j as std::size_t (they arrive as the element type)
#include <qkv/qkv.hpp>
#include <cstddef>
using namespace qkv;
int main() {
  matrix<float, 4, 8> Q, K, V;
#ifdef QKV_EXPECT_FAIL
  auto O = eval(softmax(score_mod(Q * transpose(K), [](auto s, std::size_t i, std::size_t j) { return s - float(i - j); })) * V); (void)O;
#else
  auto O = eval(softmax(score_mod(Q * transpose(K), [](auto s, auto i, auto j) { return s - (i - j); })) * V); (void)O;
#endif
}
