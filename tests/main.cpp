// The suite's main. When QKV_ARCH names an instruction set this CPU or
// build lacks, the run is skipped (exit code 77), not failed. A QKV_ARCH
// that is no name at all runs: evaluations must then throw (the [arch_env]
// test checks they do). With QKV_TESTS_SKIP_IF_BEST set, a QKV_ARCH that
// names the set the CPU would pick anyway is skipped too: the unforced run
// of the suite has already run those kernels; and QKV_ARCH=avx512bw where
// the CPU picks avx512bf16 runs the [half] tests alone, since avx512bf16's
// table is avx512bw's but for its bf16 attention (src/arch_avx512bf16.cpp).
// QKV_BF16_PAIRS=1 without AVX512-BF16 is skipped too.
#include "catch_session.hpp"

#include <qkv/kernels/arch_list.hpp>

#include <cstdio>
#include <cstdlib>
#include <string_view>

int main(int argc, char* argv[]) {
  const char* forced = std::getenv("QKV_ARCH");
  if (forced != nullptr && *forced != '\0') {
    const std::size_t i = qkv::kernels::arch_index(forced);
    if (i != qkv::kernels::arch_count && !qkv::kernels::arch_runs_here(i)) {
      std::printf("skipped: QKV_ARCH=%s, which this CPU or build does not have\n", forced);
      return 77;
    }
    const char* skip_best = std::getenv("QKV_TESTS_SKIP_IF_BEST");
    std::size_t best = 0;
    while (best < qkv::kernels::arch_count && !qkv::kernels::arch_runs_here(best)) ++best;
    if (skip_best != nullptr && *skip_best != '\0' && i == best) {
      std::printf("skipped: QKV_ARCH=%s is what this CPU runs unforced\n", forced);
      return 77;
    }
    if (skip_best != nullptr && *skip_best != '\0' && i == qkv::kernels::arch_index("avx512bw") &&
        best == qkv::kernels::arch_index("avx512bf16")) {
      std::printf("QKV_ARCH=avx512bw under avx512bf16: the [half] tests, where the two differ\n");
      char half[] = "[half]";
      char* args[] = {argv[0], half, nullptr};
      return test::run_catch(2, args);
    }
  }
  // QKV_BF16_PAIRS=1 (forced_bf16_pairs) needs AVX512-BF16.
  const char* pairs = std::getenv("QKV_BF16_PAIRS");
  if (pairs != nullptr && std::string_view(pairs) == "1" &&
      !qkv::kernels::arch_runs_here(qkv::kernels::arch_index("avx512bf16"))) {
    std::printf("skipped: QKV_BF16_PAIRS=1 without AVX512-BF16\n");
    return 77;
  }
  return test::run_catch(argc, argv);
}
