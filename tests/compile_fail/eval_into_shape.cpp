// Compile-fail: eval_into a view of the wrong static shape
#include <qkv/qkv.hpp>
using namespace qkv;
int main() {
  matrix<float, 3, 4> A; matrix<float, 4, 4> O;
#ifdef QKV_EXPECT_FAIL
  eval_into(O, A);
#else
  eval_into(O, transpose(A) * A);
#endif
}
