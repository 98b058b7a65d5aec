// Compile-fail: a similarity functor that cannot be called on two numbers, evaluated
#include <qkv/qkv.hpp>
using namespace qkv;
struct not_a_term {
  int operator()(const char*) const { return 0; }
};
int main() {
  matrix<float, 8, 16> Q; matrix<float, 12, 16> K, V;
#ifdef QKV_EXPECT_FAIL
  auto O = eval(softmax(similarity(Q, K, not_a_term{})) * V); (void)O;
#else
  auto O = eval(softmax(similarity(Q, K, [](auto q, auto k) { return q * k; })) * V); (void)O; (void)not_a_term{};
#endif
}
