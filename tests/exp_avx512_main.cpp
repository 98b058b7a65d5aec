// Catch2's main for the AVX-512 exponential's tests
// (softmax_exp_avx512_test.cpp), compiled without AVX-512: on a CPU without
// it the run is skipped (exit code 77) before any AVX-512 code runs.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

int main(int argc, char* argv[]) {
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) {
    std::printf("skipped: this CPU has no AVX-512\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
