// Runs the program it is given where the CPU has AVX-512 (F and BW), and
// exits with 77 (CTest's "skipped") elsewhere. A program compiled for
// AVX-512 may execute its instructions before main: its static
// initialisation is compiled with the same flags (the sanitizers' builds do
// use them there), so its own main cannot be the one to check.
#include <cstdio>

#include <unistd.h>

int main(int argc, char* argv[]) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: if_avx512 program [arguments]\n");
    return 2;
  }
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) {
    std::printf("skipped: this CPU has no AVX-512\n");
    return 77;
  }
  execv(argv[1], argv + 1);
  std::perror("if_avx512: cannot run the program");
  return 1;
}
