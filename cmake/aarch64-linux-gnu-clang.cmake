# Cross-compiling for AArch64 (NEON) with clang, on an x86-64 Debian machine;
# CTest runs the binaries under qemu-aarch64. clang targets AArch64 itself
# and takes the target's C++ library, start files and linker from
# g++-aarch64-linux-gnu, so it needs that package, clang and qemu-user.
# (cmake/aarch64-linux-gnu.cmake builds with g++ instead.)
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_CXX_COMPILER clang++)
set(CMAKE_CXX_COMPILER_TARGET aarch64-linux-gnu)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu)
# The header-only packages (xsimd, Boost, Catch2) are found where the host has them.
list(APPEND CMAKE_PREFIX_PATH /usr/lib/x86_64-linux-gnu/cmake /usr/lib/cmake /usr/share/cmake)
