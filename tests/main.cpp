// Catch2's main, compiled once. When QKV_ARCH names an instruction set this
// CPU or build lacks, the run is skipped (exit code 77), not failed. A
// QKV_ARCH that is no name at all runs: evaluations must then throw (the
// [arch_env] test checks they do).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <qkv/kernels/arch_list.hpp>

#include <cstdio>
#include <cstdlib>

int main(int argc, char* argv[]) {
  const char* forced = std::getenv("QKV_ARCH");
  if (forced != nullptr && *forced != '\0') {
    const std::size_t i = qkv::kernels::arch_index(forced);
    if (i != qkv::kernels::arch_count && !qkv::kernels::arch_runs_here(i)) {
      std::printf("skipped: QKV_ARCH=%s, which this CPU or build does not have\n", forced);
      return 77;
    }
  }
  return Catch::Session().run(argc, argv);
}
