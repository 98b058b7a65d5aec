// Compile-fail: a mask predicate that does not take the two positions (i, j), evaluated
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 8, 16> Q; matrix<float, 12, 16> K, V;
#ifdef QKV_EXPECT_FAIL
  auto O = eval(softmax(masked(Q * transpose(K), [](std::size_t j) { return j < 4; })) * V); (void)O;
#else
  auto O = eval(softmax(masked(Q * transpose(K), [](std::size_t i, std::size_t j) { return j <= i + 4; })) * V); (void)O;
#endif
}
