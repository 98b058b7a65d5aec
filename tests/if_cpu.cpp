// Runs the program it is given where the CPU has the named instruction set
// (avx512: F and BW; avx2: AVX2 and FMA), and exits with 77 (CTest's
// "skipped") elsewhere. A program compiled for the set may execute its
// instructions before main: its static initialisation is compiled with the
// same flags (the sanitizers' builds do use them there), so its own main
// cannot be the one to check.
#include <cstdio>
#include <cstring>

#include <unistd.h>

namespace {

bool has(const char* set) {
  if (std::strcmp(set, "avx512") == 0) return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  if (std::strcmp(set, "avx2") == 0) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  std::fprintf(stderr, "if_cpu: unknown set %s (avx512 or avx2)\n", set);
  return false;
}

}  // namespace

int main(int argc, char* argv[]) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: if_cpu avx512|avx2 program [arguments]\n");
    return 2;
  }
  if (!has(argv[1])) {
    std::printf("skipped: this CPU has no %s\n", argv[1]);
    return 77;
  }
  execv(argv[2], argv + 2);
  std::perror("if_cpu: cannot run the program");
  return 1;
}
