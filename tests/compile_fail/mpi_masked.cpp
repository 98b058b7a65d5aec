// Compile-fail: qkv::mpi::eval on a mask matrix, which holds one rank's scores only
#include <qkv/mpi.hpp>
using namespace qkv;
int main() {
  matrix<float, dyn, 8> Q(4), K(4), V(4);
  matrix<bool, dyn, dyn> M(4, 4);
#ifdef QKV_EXPECT_FAIL
  auto O = qkv::mpi::eval(softmax(masked(Q * transpose(K), M)) * V, MPI_COMM_WORLD); (void)O;
#else
  auto O = qkv::mpi::eval(softmax(causal(Q * transpose(K))) * V, MPI_COMM_WORLD); (void)O; (void)M;
#endif
}
