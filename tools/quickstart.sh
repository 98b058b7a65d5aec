#!/usr/bin/env bash
# Installs what is missing (Debian 12 packages), builds, and runs either the
# worked example or the whole test suite.
#   tools/quickstart.sh example    build and run the tour (examples/tour.cpp)
#   tools/quickstart.sh example --plots
#                                  the same, and draw its pictures (PNG, with
#                                  matplotlib) into build/tour
#   tools/quickstart.sh test       build and run every test (what CI runs)
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: tools/quickstart.sh example [--plots] | test" >&2; exit 2; }
what=${1:-}
plots=no
case "$what" in
  example)
    if [ "${2:-}" = --plots ]; then plots=yes; elif [ $# -gt 1 ]; then usage; fi ;;
  test) ;;
  *) usage ;;
esac

packages=(cmake make g++ libxsimd-dev libboost-dev)
# The tests also need Catch2, qemu-user to run the dispatch on emulated CPUs,
# OpenMPI for qkv::mpi (run under mpirun), and on x86-64 the AArch64 cross
# compiler (clang's cross builds take its C++ library and linker too), to
# test the NEON kernels under qemu.
# clang (Debian 12's clang 14, with its sanitizer runtime) builds the sanitizer run, so that both
# compilers build and pass every test.
if [ "$what" = test ]; then
  packages+=(catch2 clang libclang-rt-14-dev qemu-user libopenmpi-dev openmpi-bin)
  [ "$(uname -m)" = x86_64 ] && packages+=(g++-aarch64-linux-gnu)
fi
# The tour's pictures: bench/plot.py, run by Debian's python3.
[ "$plots" = no ] || packages+=(python3-matplotlib)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "== installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

build=${QKV_BUILD_DIR:-build}
jobs=$(nproc 2>/dev/null || echo 2)
if [ "$what" = example ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DQKV_BUILD_TESTS=OFF -DQKV_BUILD_EXAMPLES=ON >/dev/null
  cmake --build "$build" -j "$jobs" --target tour
  if [ "$plots" = yes ]; then
    "$build/examples/tour" --csv "$build/tour"
    /usr/bin/python3 bench/plot.py --tour "$build/tour"
  else
    "$build/examples/tour"
  fi
else
  # Each stage says how long it took: the whole run is meant to stay near 25 minutes.
  stage_start=$SECONDS
  stage() {
    echo "== (took $(((SECONDS - stage_start) / 60)) min $(((SECONDS - stage_start) % 60)) s)"
    stage_start=$SECONDS
    [ -z "$1" ] || echo "== $1"
  }
  echo "== release build: every test, every instruction set (forced and under qemu)"
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DQKV_BUILD_TESTS=ON -DQKV_BUILD_EXAMPLES=ON >/dev/null
  cmake --build "$build" -j "$jobs"
  ctest --test-dir "$build" -j "$jobs" --output-on-failure -LE long
  stage "AddressSanitizer + UndefinedBehaviorSanitizer build, with clang"
  # clang rather than g++: the second compiler costs no stage of its own.
  # -O1 without debug information: the reports name the functions (from the
  # symbol table), and a test file compiles in two thirds of the time -g1
  # takes. A report is traced to its line by building again with -g1.
  cmake -S . -B "$build-sanitize" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g0 -DNDEBUG" \
    -DQKV_SANITIZE=ON -DQKV_MPI=OFF -DQKV_BUILD_TESTS=ON -DQKV_BUILD_EXAMPLES=ON >/dev/null
  cmake --build "$build-sanitize" -j "$jobs" --target qkv_test_programs
  # qemu runs, compile-fail checks and the docs' code do not depend on the
  # build flags; the release run covers them, and qkv::mpi (OpenMPI's own
  # allocations are not the sanitizers' business). This build is also the
  # one without MPI: everything else must pass without it.
  ctest --test-dir "$build-sanitize" -j "$jobs" --output-on-failure -LE "qemu|compile_fail|docs|long" \
    -E headers_compile_alone
  if [ "$(uname -m)" = x86_64 ]; then
    stage "AArch64 (NEON) cross builds, run under qemu-aarch64"
    # -O2: the NEON kernels as a user's build has them, built faster than at -O3.
    # The suite with clang, which compiles it in two thirds of the time
    # Debian's cross g++ takes (built without the native one's profile-guided
    # optimisation).
    cmake -S . -B "$build-aarch64" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu-clang.cmake -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" -DQKV_MPI=OFF -DQKV_BUILD_TESTS=ON -DQKV_BUILD_EXAMPLES=ON >/dev/null
    cmake --build "$build-aarch64" -j "$jobs" --target qkv_test_programs
    ctest --test-dir "$build-aarch64" -j "$jobs" --output-on-failure -LE "compile_fail|docs|long" -E headers_compile_alone
    # The library's NEON kernels, and a user's functor fused in a user's unit,
    # with g++ as most AArch64 builds have them: the lecture's example (its
    # numbers checked) and the trained similarity run.
    cmake -S . -B "$build-aarch64-gcc" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" -DQKV_MPI=OFF -DQKV_BUILD_TESTS=OFF -DQKV_BUILD_EXAMPLES=ON >/dev/null
    cmake --build "$build-aarch64-gcc" -j "$jobs" --target worked_example train_similarity
    qemu_aarch64=(qemu-aarch64 -L /usr/aarch64-linux-gnu)
    "${qemu_aarch64[@]}" "$build-aarch64-gcc/examples/train_similarity" >/dev/null
    lecture=$("${qemu_aarch64[@]}" "$build-aarch64-gcc/examples/worked_example")
    if ! grep -q "0.401112, 0.197776, 0.401112" <<<"$lecture"; then
      echo "the lecture's example built by g++ for AArch64 printed:"
      echo "$lecture"
      exit 1
    fi
  fi
  stage ""
  echo "== all of it: $((SECONDS / 60)) min $((SECONDS % 60)) s"
fi
