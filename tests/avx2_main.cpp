// The main of the tests compiled again for AVX2 and FMA (the fused
// backward with the user's functors, whose kernels are instantiated in the
// user's unit for the set it is compiled for), compiled without them. CTest
// runs the program through if_cpu.cpp, which skips it on a CPU without the
// set before any of its code runs.
#include "catch_session.hpp"

#include <cstdio>

int main(int argc, char* argv[]) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::printf("skipped: this CPU has no AVX2 and FMA\n");
    return 77;
  }
  return test::run_catch(argc, argv);
}
