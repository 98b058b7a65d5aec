// Compile-fail: a batched expression evaluated into a matrix
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  tensor<float, 2, 16, 8> Q; matrix<float, 16, 8> O; tensor<float, 2, 16, 8> O3;
#ifdef QKV_EXPECT_FAIL
  eval_into(O, softmax(Q * transpose(Q)) * Q);
#else
  eval_into(O3, softmax(Q * transpose(Q)) * Q); (void)O;
#endif
}
