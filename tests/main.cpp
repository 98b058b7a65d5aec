// Catch2's main, compiled once. When QKV_ARCH forces an instruction set this
// CPU lacks, the run is skipped (exit code 77), not failed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <qkv/qkv.hpp>

#include <cstdio>
#include <cstring>

int main(int argc, char* argv[]) {
  if (std::strcmp(qkv::active_arch(), "none") == 0) {
    std::printf("skipped: QKV_ARCH asks for an instruction set this CPU or build does not have\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
