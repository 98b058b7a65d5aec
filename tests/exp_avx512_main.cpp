// The main of the AVX-512 exponential's tests
// (softmax_exp_avx512_test.cpp), compiled without AVX-512. CTest runs the
// program through if_cpu.cpp, which skips it on a CPU without the set
// before any of its code runs; the check here is for a run by hand (which a
// sanitizers' build may still end in SIGILL, before main).
#include "catch_session.hpp"

#include <cstdio>

int main(int argc, char* argv[]) {
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) {
    std::printf("skipped: this CPU has no AVX-512\n");
    return 77;
  }
  return test::run_catch(argc, argv);
}
